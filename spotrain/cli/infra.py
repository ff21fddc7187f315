"""`spotrain synth|deploy|plan|destroy|scan`: the environments' stacks through Terraform and
checkov."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from spotrain.cli.output import say
from spotrain.core.errors import SpotrainError
from spotrain.localcloud import control


def _deployment(  # type: ignore[no-untyped-def]
    env_name: str, outdir: Path, *, start_local: bool, verbose: bool
):
    from spotrain.tools import deploy

    config = deploy.environment(env_name)
    if config.is_local:
        cloud = control.up() if start_local else control.require()
        say(f"local cloud at {cloud.endpoint}")
        config = deploy.local_environment_ready(cloud.endpoint)
        endpoint = cloud.endpoint
    else:
        endpoint = deploy.resolve_local_endpoint()
    started = time.monotonic()
    deploy.synth(outdir, local_endpoint=endpoint, only=config.name)
    say(f"synthesized {outdir}/ in {time.monotonic() - started:.1f}s")
    return deploy.Deployment(config=config, outdir=outdir, log=say, verbose=verbose)


def cmd_synth(args: argparse.Namespace) -> int:
    from spotrain.tools import deploy

    started = time.monotonic()
    out = deploy.synth(Path(args.out), local_endpoint=deploy.resolve_local_endpoint())
    stacks = sorted(p.name for p in (out / "stacks").iterdir())
    say(f"synthesized {len(stacks)} stacks into {out}/ in {time.monotonic() - started:.1f}s:")
    for name in stacks:
        say(f"  {name}")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    deployment = _deployment(args.env, Path(args.out), start_local=True, verbose=args.verbose)
    started = time.monotonic()
    results = deployment.apply()
    say(
        f"\n{args.env}: {sum(len(r.resources) for r in results)} resources in "
        f"{len(results)} stacks, applied in {time.monotonic() - started:.0f}s"
    )
    for result in results:
        say(f"\n{result.name} ({len(result.resources)} resources)")
        for key, value in sorted(result.outputs.items()):
            say(f"  {key:<28} {value}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    deployment = _deployment(args.env, Path(args.out), start_local=False, verbose=args.verbose)
    changes = deployment.plan_has_changes()
    for name, changed in changes.items():
        say(f"{name}: {'changes' if changed else 'no changes'}")
    return 2 if any(changes.values()) else 0


def cmd_destroy(args: argparse.Namespace) -> int:
    problems = _what_destroy_would_break(args.env)
    if problems:  # every one at once, before anything is synthesized or destroyed
        raise SpotrainError(f"{args.env} is not destroyed, nothing changed:\n  "
                            + "\n  ".join(problems))  # fmt: skip
    deployment = _deployment(args.env, Path(args.out), start_local=False, verbose=args.verbose)
    deployment.destroy()
    say(f"{args.env}: destroyed")
    return 0


def _what_destroy_would_break(env_name: str) -> list[str]:
    """Every reason not to destroy the environment now, read from its groups in every region.
    A run with machines in service: destroying its fleet stops them mid-step, while `run
    cancel` has them publish and leave. A run deployed but not declared in the run files
    destroy synthesizes (submitted from an ML engineer's own repository): its stack is not
    destroyed, so its fleet stays, billed for what it holds, in a network destroy then fails
    to remove halfway through."""
    import os
    from unittest import mock

    from spotrain.cli.run_status import in_service, run_groups, where_of
    from spotrain.stacks.runs import load_runs, runs_dir
    from spotrain.tools import deploy

    config = deploy.environment(env_name)
    exports = {}
    if config.is_local:  # read from the local cloud, whatever this shell points at
        exports = control.aws_environment(control.require().endpoint, config.primary_region)
    declared = {run.name for run in load_runs(config.name)}
    with mock.patch.dict(os.environ, exports):  # restored after, as the shell had it
        deployed = run_groups(where_of(config.name))
    problems = []
    for run, groups in sorted(deployed.items()):
        machines = sum(in_service(group) for group in groups)
        if machines:
            problems.append(f"run {run} has {machines} machine(s) in service: `spotrain "
                            f"run cancel {config.name} {run}` first (they publish and "
                            "leave)")  # fmt: skip
        if run not in declared:
            problems.append(f"run {run} is deployed but not declared in "
                            f"{runs_dir() / config.name} (submitted from elsewhere): `spotrain "
                            f"run retire {config.name} {run}` from where it was submitted "
                            "first")  # fmt: skip
    return problems


def cmd_scan(args: argparse.Namespace) -> int:
    from spotrain.tools import deploy, scan

    out = Path(args.out)
    if not (out / "stacks").exists() or args.synth:
        deploy.synth(out, local_endpoint=deploy.resolve_local_endpoint())
    report = scan.scan(out / "stacks")
    say(
        f"checkov: {report.passed} passed, {len(report.findings)} findings, "
        f"{len(report.explained)} explained by checkov-skips.yaml"
    )
    for finding in report.unexplained:
        say(f"  FAILED {finding.check_id} {finding.stack}: {finding.resource}")
    for skip_id in report.unused_skips:
        say(f"  STALE  {skip_id}: matches no finding; remove it from checkov-skips.yaml")
    return 0 if report.ok else 1


def add_synth_parsers(commands: Any) -> None:
    synth = commands.add_parser("synth", help="synthesize every environment")
    synth.add_argument("--out", default="cdktf.out", help="output folder")
    synth.set_defaults(handler=cmd_synth)

    scan = commands.add_parser("scan", help="checkov over the synthesized stacks")
    scan.add_argument("--out", default="cdktf.out", help="synthesis folder")
    scan.add_argument("--synth", action="store_true", help="synthesize first even if present")
    scan.set_defaults(handler=cmd_scan)


def add_environment_parsers(commands: Any) -> None:
    for name, run, text in (
        ("deploy", cmd_deploy, "apply an environment's stacks"),
        ("plan", cmd_plan, "show whether an environment's stacks would change (exit 2 if so)"),
        ("destroy", cmd_destroy, "destroy an environment's stacks"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("env", help="environment name: local, dev, prod")
        command.add_argument("--out", default="cdktf.out", help="synthesis folder")
        command.add_argument(
            "--verbose", action="store_true", help="show Terraform's output, not per-stack logs"
        )
        command.set_defaults(handler=run)
