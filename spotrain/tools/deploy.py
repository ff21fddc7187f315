"""Synthesize the blueprint and drive Terraform over one environment's stacks, in dependency
order (the same order `cdktf deploy '<env>-*'` uses)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotrain.core.errors import ConfigError, SpotrainError
from spotrain.localcloud import control
from spotrain.stacks.config import EnvironmentConfig
from spotrain.stacks.environments import DEFAULT_LOCAL_ENDPOINT, all_environments
from spotrain.tools import terraform

DEFAULT_OUTDIR = Path("cdktf.out")


def environments(local_endpoint: str = DEFAULT_LOCAL_ENDPOINT) -> dict[str, EnvironmentConfig]:
    return {c.name: c for c in all_environments(local_endpoint=local_endpoint)}


def environment(name: str, local_endpoint: str = DEFAULT_LOCAL_ENDPOINT) -> EnvironmentConfig:
    known = environments(local_endpoint)
    if name not in known:
        raise ConfigError(
            f"environment {name!r}", [f"it is not defined: choose one of {', '.join(known)}"]
        )
    return known[name]


def synth(
    outdir: Path = DEFAULT_OUTDIR,
    local_endpoint: str = DEFAULT_LOCAL_ENDPOINT,
    *,
    only: str | None = None,
) -> Path:
    """Synthesize every environment (or the one named `only`, for a command that deploys it)
    into `outdir` (replacing what was there)."""
    from spotrain.stacks.app import build_app

    configs = [c for c in all_environments(local_endpoint=local_endpoint)
               if only is None or c.name == only]  # fmt: skip
    runs = check_runs(configs)  # every run file, before anything is written
    if outdir.exists():
        shutil.rmtree(outdir)
    # CDKTF makes the folder but not its parents (`--out build/cdktf.out` on a fresh checkout).
    outdir.parent.mkdir(parents=True, exist_ok=True)
    # Absolute: the synthesizer (a node process) keeps the folder it was started in.
    build_app(configs, outdir=str(outdir.resolve()), runs=runs).synth()
    return outdir


def check_runs(configs: list[EnvironmentConfig]) -> dict[str, tuple[Any, ...]]:
    """Every run the repository declares, per environment, each checked as a whole (against
    its environment, and its built-in training configuration as the trainer checks it where
    the trainer is installed: a pull request's plan then refuses what `run submit` would):
    every problem of every environment's files at once."""
    from spotrain.stacks.runs import load_runs

    try:
        from spotrain.trainer.train import training_problems
    except ImportError:  # the infrastructure extra alone: `run submit` checks it
        training_problems = None
    runs, errors = {}, []
    for config in configs:
        try:
            runs[config.name] = load_runs(config.name, against=config,
                                          training_problems=training_problems)  # fmt: skip
        except ConfigError as error:
            errors.append(error)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise SpotrainError("\n".join(str(error) for error in errors))
    return runs


PLAN_WORKERS = 4
"""Stacks planned at once (8 at once was slower here: 41 s against 35 s)."""


def each_when_ready(
    waits_for: dict[str, frozenset[str]],
    action: Callable[[str], Any],
    *,
    before: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """`action` on each name as soon as every name it waits for has succeeded, as many at once
    as are ready (the standard library's topological sorter orders them and refuses a cycle);
    `before` runs first for each, one at a time (Terraform's inits share the provider cache).
    After a failure nothing new starts, and the first failure is raised once every started
    action has ended. Results by name."""
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
    from graphlib import TopologicalSorter

    order = TopologicalSorter(waits_for)
    order.prepare()
    results: dict[str, Any] = {}
    running: dict[Future[Any], str] = {}
    failure: BaseException | None = None
    with ThreadPoolExecutor(max(1, len(waits_for))) as pool:
        while True:
            for name in [] if failure else order.get_ready():
                try:
                    before(name)
                except Exception as error:
                    failure = error
                    break
                running[pool.submit(action, name)] = name
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                name = running.pop(future)
                try:
                    results[name] = future.result()
                    order.done(name)
                except Exception as error:
                    failure = failure or error
    if failure is not None:
        raise failure
    return results


@dataclass
class StackResult:
    name: str
    resources: list[str] = field(default_factory=list)
    outputs: dict[str, object] = field(default_factory=dict)


@dataclass
class Deployment:
    """Terraform over one environment's synthesized stacks."""

    config: EnvironmentConfig
    outdir: Path = DEFAULT_OUTDIR
    log: Callable[[str], None] = print
    verbose: bool = False
    """Stream Terraform's output to the terminal instead of per-stack log files."""
    only: str | None = None
    """One stack of the environment (a run's, `<env>-run-<run>`) instead of all of them."""
    environment: dict[str, str] = field(init=False, default_factory=dict)
    """Process environment Terraform runs with (CLI configuration, credentials, endpoint)."""

    _version: str | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        cli_config = terraform.write_cli_config(self.outdir.parent / ".spotrain" / "terraform")
        extra = {}
        if self.config.local is not None:
            extra = control.aws_environment(self.config.local.endpoint, self.config.primary_region)
        self.environment = terraform.terraform_env(cli_config, extra)
        if self.config.local is not None:
            # A real profile must never be used against the local cloud, or vice versa.
            self.environment.pop("AWS_PROFILE", None)

    def require_terraform(self) -> str:
        """The installed Terraform's version, refused before any stack is touched if it is
        older than the stacks need (asked once)."""
        if self._version is None:
            self._version = terraform.require_version(self.environment)
        return self._version

    @property
    def stacks(self) -> list[str]:
        return terraform.stacks_in_order(self.outdir, self.only or f"{self.config.name}-*")

    def stack_dir(self, name: str) -> Path:
        return self.outdir / "stacks" / name

    def init(self, name: str) -> None:
        lock = self.stack_dir(name) / ".terraform.lock.hcl"
        if not (self.stack_dir(name) / ".terraform").exists() or not lock.exists():
            self._tf(name, ["init", "-input=false", "-no-color", "-reconfigure"])

    def log_file(self, name: str) -> Path:
        return (self.outdir.parent / ".spotrain" / "logs" / f"{name}.log").resolve()

    def apply(self) -> list[StackResult]:
        """Apply every stack, each as soon as the stacks it depends on are applied, several
        at once (each mostly waits on the cloud's API). Results in `stacks` order."""

        def apply_one(name: str) -> StackResult:
            started = time.monotonic()
            self.log(
                f"==> {name}: applying" + ("" if self.verbose else f" (log: {self.log_file(name)})")
            )
            self._tf(name, ["apply", "-auto-approve", "-input=false", "-no-color"])
            result = self.describe(name)
            self.log(f"    {name}: {len(result.resources)} resources, "
                     f"{time.monotonic() - started:.0f}s")  # fmt: skip
            return result

        self.require_terraform()
        results = each_when_ready(self._dependencies(), apply_one, before=self.init)
        return [results[name] for name in self.stacks]

    def _dependencies(self) -> dict[str, frozenset[str]]:
        return terraform.stack_dependencies(self.outdir, self.only or f"{self.config.name}-*")

    def plan_has_changes(self) -> dict[str, bool]:
        """Per stack: does `terraform plan` want to change anything? Plans change nothing, so
        several run at once (each mostly waits on the cloud's API); inits first, one at a
        time, as they share the provider cache."""
        from concurrent.futures import ThreadPoolExecutor

        self.require_terraform()
        names = self.stacks
        for name in names:
            self.init(name)
        plan = ["plan", "-detailed-exitcode", "-input=false", "-no-color", "-lock=false"]

        def changed(name: str) -> bool:
            return bool(self._tf(name, plan, success_codes=(0, 2)).returncode == 2)

        with ThreadPoolExecutor(PLAN_WORKERS) as pool:
            return dict(zip(names, pool.map(changed, names), strict=True))

    def destroy(self) -> None:
        """Destroy every stack, each as soon as every stack that depends on it is destroyed,
        several at once. Without reading every resource back first (`-refresh=false`): that
        is a whole walk of the stack, a start of the AWS provider for each region, a fifth of
        the local destroy's time; a resource someone already deleted is deleted again, which
        AWS answers "not found" and the provider takes as done."""

        def destroy_one(name: str) -> None:
            self.log(f"==> {name}: destroying")
            self._tf(name, ["destroy", "-auto-approve", "-input=false", "-no-color",
                            "-refresh=false"])  # fmt: skip

        self.require_terraform()
        each_when_ready(terraform.dependents(self._dependencies()), destroy_one, before=self.init)

    def describe(self, name: str) -> StackResult:
        state = json.loads(self._tf(name, ["state", "pull"], capture=True).stdout or "{}")
        raw = state.get("outputs", {})
        return StackResult(
            name=name,
            resources=[a for a in terraform.state_addresses(state) if not a.startswith("data.")],
            # cdktf's own cross-stack plumbing outputs are not for people.
            outputs={
                key: value["value"]
                for key, value in raw.items()
                if not key.startswith("cross-stack-output-")
            },
        )

    def _tf(  # type: ignore[no-untyped-def]
        self,
        name: str,
        args: list[str],
        capture: bool = False,
        success_codes: tuple[int, ...] = (0,),
    ):
        log = None if capture or self.verbose else self.log_file(name)
        return terraform.run(
            self.stack_dir(name), args, self.environment, capture=capture, log=log,
            success_codes=success_codes,
        )  # fmt: skip


REHEARSAL_RUN = "demo"
"""The `local` environment's run the rehearsals train (runs/local/demo.toml)."""


def outputs_of(
    config: EnvironmentConfig, results: list[StackResult], run: str = REHEARSAL_RUN
) -> dict[str, Any]:
    """The environment's stacks' outputs in one mapping, with its configuration under
    "config", the stacks of each region beyond home (`<part>-<region>`) under "regions" by
    region, each run's stack's outputs under "runs" by run, and `run`'s (its RunConfig under
    "run") also at the top, where a rehearsal of that run reads them."""
    from spotrain.stacks.runs import load_runs

    runs = {r.name: r for r in load_runs(config.name)}
    outputs: dict[str, Any] = {"config": config, "runs": {},
                               "regions": {r: {} for r in config.replica_regions}}  # fmt: skip
    prefix = config.stack_name("run-")
    for result in results:
        region = next((r for r in config.replica_regions if result.name.endswith(f"-{r}")), None)
        if result.name.startswith(prefix):
            outputs["runs"][result.name.removeprefix(prefix)] = result.outputs
        elif region is not None:
            outputs["regions"][region].update(result.outputs)
        else:
            outputs.update(result.outputs)
    if run in outputs["runs"]:
        outputs.update(outputs["runs"][run])
        outputs["run"] = runs[run]
    return outputs


def local_environment_ready(endpoint: str) -> EnvironmentConfig:
    """The `local` environment for a running local cloud, with its account prepared."""
    from spotrain.core.resource_names import image_parameter

    config = environment("local", local_endpoint=endpoint)
    assert config.state is not None
    control.prepare_account(
        endpoint,
        state_bucket=config.state.bucket,
        region=config.state.region,
        image_parameter=image_parameter(config.name),
        image_regions=config.region_names,
    )
    return config


def resolve_local_endpoint() -> str:
    cloud = control.status()
    return (
        cloud.endpoint
        if cloud
        else os.environ.get("SPOTRAIN_LOCAL_ENDPOINT", DEFAULT_LOCAL_ENDPOINT)
    )
