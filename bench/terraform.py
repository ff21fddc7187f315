"""CPU of Terraform and its AWS provider at Go's default garbage collection (GOGC=100) and at
the GOGC that `spotrain` gives them (`terraform.GO_GC_PERCENT`), side by side.

    .venv/bin/python bench/terraform.py     # writes bench/terraform.md (about 20 minutes)

First `terraform validate` of the `local` environment's budget stack (one provider
configuration, no cloud needed): a schema fetch and a validate walk, each starting the
provider, which is what every walk of every stack pays. Then whole commands: `spotrain deploy`,
`plan` and `destroy` of `local`, each setting on a fresh local cloud of its own.
"""

from __future__ import annotations

import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spotrain.tools import deploy, terraform

RUNS = 3
STACK = "local-budget"
ROOT = Path(__file__).resolve().parents[1]
"""Where the commands run: the checkout, whose runs/ they deploy."""
COMMANDS = ("deploy", "plan", "destroy")
SETTINGS = {"Go's default": "100", "spotrain's": terraform.GO_GC_PERCENT}
"""Label -> GOGC."""


def measured(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, float]:
    """CPU-seconds of `command` and every process it waited for, its wall seconds and the
    largest of those processes' peak memory (MB)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed ({process.returncode})")
    return usage.ru_utime + usage.ru_stime, time.perf_counter() - started, usage.ru_maxrss / 1024


def validate_rows() -> list[tuple[str, float, float, float]]:
    with tempfile.TemporaryDirectory() as scratch:
        stack = deploy.synth(Path(scratch) / "cdktf.out", only="local") / "stacks" / STACK
        base = terraform.terraform_env(terraform.write_cli_config(Path(scratch) / "terraform"))
        measured(["terraform", "init", "-backend=false", "-input=false", "-no-color"], stack, base)
        found: dict[str, list[tuple[float, float, float]]] = {label: [] for label in SETTINGS}
        for _ in range(RUNS):  # alternate the settings so machine noise hits both alike
            for label, gogc in SETTINGS.items():
                found[label].append(measured(["terraform", "validate", "-no-color"], stack,
                                             {**base, "GOGC": gogc}))  # fmt: skip
    return [(label, *(statistics.median(m[i] for m in runs) for i in range(3)))
            for label, runs in found.items()]  # fmt: skip


def deployment(gogc: str) -> dict[str, tuple[float, float, float]]:
    """Each of COMMANDS on `local`, on a local cloud of its own (whose server's CPU is not
    counted: it is not the command's)."""
    spotrain = [sys.executable, "-m", "spotrain.cli"]
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "SPOTRAIN_HOME": home, "GOGC": gogc}
        subprocess.run([*spotrain, "local", "up", "--port", "0"], env=env, check=True,
                       capture_output=True)  # fmt: skip
        try:
            exports = subprocess.run([*spotrain, "local", "env"], env=env, check=True,
                                     capture_output=True, text=True).stdout  # fmt: skip
            env.update(item.split("=", 1) for item in shlex.split(exports)[1:])
            out = ["--out", f"{home}/cdktf.out"]
            return {c: measured([*spotrain, c, "local", *out], ROOT, env) for c in COMMANDS}
        finally:
            subprocess.run([*spotrain, "local", "down"], env=env, capture_output=True)


def main() -> None:
    validated = validate_rows()
    commands = {label: deployment(gogc) for label, gogc in SETTINGS.items()}
    default, ours = (commands[label] for label in SETTINGS)
    gogc = terraform.GO_GC_PERCENT
    lines = [
        "# Terraform's CPU: Go's garbage collection for Terraform and its AWS provider",
        "",
        "Command: `.venv/bin/python bench/terraform.py`",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}",
        "",
        f"`terraform validate` of `{STACK}` (two starts of the provider; median of {RUNS} "
        "runs of each, alternating):",
        "",
        "| GOGC | CPU-s | wall s | largest process, MB | CPU ratio to Go's default |",
        "|---|---|---|---|---|",
        *(
            f"| {SETTINGS[label]} ({label}) | {cpu:.1f} | {wall:.1f} | {mb:.0f} | "
            f"{cpu / validated[0][1]:.2f}x |"
            for label, cpu, wall, mb in validated
        ),
        "",
        "Whole commands on the `local` environment (one run each, synthesis included):",
        "",
        f"| `spotrain ... local` | CPU-s at 100 | CPU-s at {gogc} | ratio | wall s at 100 | "
        f"wall s at {gogc} | largest process, MB, at 100 / {gogc} |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {c} | {default[c][0]:.0f} | {ours[c][0]:.0f} | {ours[c][0] / default[c][0]:.2f}x "
            f"| {default[c][1]:.0f} | {ours[c][1]:.0f} | {default[c][2]:.0f} / {ours[c][2]:.0f} |"
            for c in COMMANDS
        ),
        "",
        "Target: each command at most 0.8x its CPU at Go's default.",
    ]
    path = Path(__file__).with_name("terraform.md")
    path.write_text("\n".join(lines) + "\n")
    print(path.read_text())


if __name__ == "__main__":
    main()
