"""Running Terraform on synthesized stacks: CLI configuration, environment, dependency order.

The aws provider comes from a filesystem mirror when one is configured (`SPOTRAIN_PROVIDER_MIRROR`,
or found under a conventional plugin folder), else from the public registry. Either way the
project writes its own Terraform CLI configuration, so a user's ~/.terraformrc never changes
what gets installed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spotrain.core.errors import TerraformError

PROVIDER_SOURCE = "registry.terraform.io/hashicorp/aws"
PROVIDER_VERSION = "5.100.0"
# Conventional places for plugin mirrors; searched a few levels deep when no mirror is named.
_MIRROR_ROOTS = ("/opt", "/usr/share/terraform", "/usr/local/share/terraform", "~/.terraform.d")


def find_provider_mirror() -> Path | None:
    """The filesystem mirror that holds aws 5.100.0, or None to use the registry."""
    named = os.environ.get("SPOTRAIN_PROVIDER_MIRROR")
    if named:
        mirror = Path(named).expanduser()
        if not (mirror / PROVIDER_SOURCE / PROVIDER_VERSION).is_dir():
            raise TerraformError(
                f"SPOTRAIN_PROVIDER_MIRROR={named} has no {PROVIDER_SOURCE}/{PROVIDER_VERSION}: "
                "point it at the folder that contains registry.terraform.io/, or unset it to "
                "download the provider from the registry"
            )
        return mirror
    for root in _MIRROR_ROOTS:
        base = Path(root).expanduser()
        for pattern in ("", "*/", "*/*/"):
            for candidate in sorted(base.glob(f"{pattern}{PROVIDER_SOURCE}/{PROVIDER_VERSION}")):
                if candidate.is_dir():
                    return candidate.parents[3]
    return None


def write_cli_config(directory: Path) -> Path:
    """A Terraform CLI configuration that installs aws from the mirror when there is one."""
    directory = directory.resolve()  # terraform runs inside each stack's folder
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "terraform.rc"
    mirror = find_provider_mirror()
    plugin_cache = directory / "plugin-cache"
    plugin_cache.mkdir(exist_ok=True)
    # Without the second line, every init of a stack whose lock file is new (each synthesized
    # stack's) installs the provider into the shared cache again, removing the entry first:
    # a stack applying meanwhile found its link into the cache dangling ("no package for
    # hashicorp/aws cached in .terraform/providers"). With it, inits link to the entry there.
    lines = [f'plugin_cache_dir = "{plugin_cache}"',
             "plugin_cache_may_break_dependency_lock_file = true"]  # fmt: skip
    if mirror is not None:
        lines += [
            "provider_installation {",
            "  filesystem_mirror {",
            f'    path    = "{mirror}"',
            f'    include = ["{PROVIDER_SOURCE}"]',
            "  }",
            "  direct {",
            f'    exclude = ["{PROVIDER_SOURCE}"]',
            "  }",
            "}",
        ]
    path.write_text("\n".join(lines) + "\n")
    return path


GO_GC_PERCENT = "400"
"""Go's GOGC for Terraform and the provider processes it starts, unless the caller set one.
Each walk of a stack starts the aws provider afresh, which builds its schemas and checks its
configuration (a few CPU-seconds, a fifth of it collecting garbage at Go's default, 100).
At 400 a deploy, plan and destroy of the local environment took 18-21% less CPU, with no
larger peak for the largest process (bench/terraform.md)."""


def terraform_env(cli_config: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOGC", GO_GC_PERCENT)
    env.update(
        {
            "TF_CLI_CONFIG_FILE": str(cli_config),
            "CHECKPOINT_DISABLE": "1",
            "TF_IN_AUTOMATION": "1",
            "TF_INPUT": "0",
        }
    )
    env.update(extra or {})
    return env


MINIMUM_VERSION = (1, 10)
"""The oldest Terraform the stacks work with: their state backend locks with S3 itself
(`use_lockfile`), which an older Terraform refuses at init; the handler stacks' `removed`
block needs 1.7."""

INSTALL_HINT = "install Terraform 1.10 or newer (the state backend's S3 locking needs it)"


def require_version(env: Mapping[str, str]) -> str:
    """The installed Terraform's version; TerraformError naming the fix if it is too old, asked
    before any stack is touched (an older one would fail at each stack's init)."""
    answer = run(Path.cwd(), ["version", "-json"], env, capture=True).stdout
    try:
        version = str(json.loads(answer)["terraform_version"])
        numbers = tuple(int(part) for part in version.split("-")[0].split(".")[:2])
    except (ValueError, KeyError, TypeError):  # before 0.13, `version` had no JSON form
        version, numbers = answer.strip().splitlines()[0] if answer.strip() else "?", (0,)
    if numbers < MINIMUM_VERSION:
        raise TerraformError(
            f"Terraform {version} is too old for these stacks: {INSTALL_HINT}, and try again"
        )
    return version


def run(
    stack_dir: Path,
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    capture: bool = False,
    log: Path | None = None,
    success_codes: tuple[int, ...] = (0,),
) -> subprocess.CompletedProcess[str]:
    """Run `terraform <args>` in a synthesized stack folder; TerraformError if it fails.

    `capture` returns the output; `log` appends it to a file instead of the terminal, and a
    failure then quotes the end of that file. `success_codes` are the exit statuses that are not
    failures (`plan -detailed-exitcode` exits 2 when there are changes)."""
    command = ["terraform", *args]
    try:
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a") as sink:
                sink.write(f"\n$ {' '.join(command)}\n")
                sink.flush()
                result = subprocess.run(
                    command, cwd=stack_dir, env=dict(env), text=True, stdout=sink,
                    stderr=subprocess.STDOUT, check=False,
                )  # fmt: skip
        else:
            result = subprocess.run(
                command, cwd=stack_dir, env=dict(env), text=True, capture_output=capture,
                check=False,
            )  # fmt: skip
    except FileNotFoundError as error:
        raise TerraformError(f"terraform is not on PATH: {INSTALL_HINT}, and try again") from error
    if result.returncode not in success_codes:
        if log is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            detail = f"\n{tail}\n(whole log: {log})"
        elif capture:
            detail = "\n" + (result.stderr or result.stdout or "")[-4000:]
        else:
            detail = " See the output above."
        raise TerraformError(
            f"`{' '.join(command)}` failed in {stack_dir.name} (exit {result.returncode}).{detail}"
        )
    return result


def state_addresses(state: Mapping[str, Any]) -> list[str]:
    """The addresses `terraform state list` prints for a state (`terraform state pull`'s JSON,
    format 4), managed resources and data sources alike: one command reads a stack's resources
    and outputs where `state list` and `output -json` took two."""
    addresses = []
    for resource in state.get("resources", []):
        prefix = f"{resource['module']}." if resource.get("module") else ""
        if resource["mode"] == "data":
            prefix += "data."
        base = f"{prefix}{resource['type']}.{resource['name']}"
        for instance in resource.get("instances", []):
            key = instance.get("index_key")
            if key is None:
                addresses.append(base)
            elif isinstance(key, int):
                addresses.append(f"{base}[{key}]")
            else:
                addresses.append(f"{base}[{json.dumps(key, ensure_ascii=False)}]")
    return addresses


def stack_dependencies(outdir: Path, selector: str | None = None) -> dict[str, frozenset[str]]:
    """The stacks `selector` chooses (in `stacks_in_order`), each with the chosen stacks it
    depends on: it may be applied once those are, and destroyed once every stack that depends
    on it is. A dependency outside the choice is taken as already there."""
    manifest = json.loads((outdir / "manifest.json").read_text())["stacks"]
    chosen = stacks_in_order(outdir, selector)
    return {name: frozenset(manifest[name]["dependencies"]) & set(chosen) for name in chosen}


def dependents(dependencies: dict[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    """The same stacks, each with those that depend on it: the order to destroy them in."""
    return {name: frozenset(other for other, needs in dependencies.items() if name in needs)
            for name in dependencies}  # fmt: skip


def stacks_in_order(outdir: Path, selector: str | None = None) -> list[str]:
    """Stack names from the cdktf manifest, dependencies first; `selector` is an `env-*` glob
    or a stack name."""
    import fnmatch

    manifest = json.loads((outdir / "manifest.json").read_text())["stacks"]
    names = [n for n in manifest if selector is None or fnmatch.fnmatch(n, selector)]
    if not names:
        raise TerraformError(
            f"no stack matches {selector!r}: choose from {', '.join(sorted(manifest))}"
        )
    ordered: list[str] = []

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if name in ordered:
            return
        if name in trail:
            raise TerraformError(f"stack dependency cycle: {' -> '.join((*trail, name))}")
        for dependency in manifest[name]["dependencies"]:
            visit(dependency, (*trail, name))
        ordered.append(name)

    for name in sorted(names):
        visit(name, ())
    return [n for n in ordered if n in names] if selector else ordered
