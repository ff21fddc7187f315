"""`spotrain`: the command line.

spotrain local up|down|status     the local cloud (AWS emulator on loopback)
spotrain synth                    synthesize every environment into cdktf.out/
spotrain deploy ENV               apply ENV's stacks (local starts the local cloud)
spotrain plan ENV                 show whether ENV's stacks would change
spotrain destroy ENV              destroy ENV's stacks
spotrain scan                     checkov over every synthesized stack, reasoned skips only
spotrain train CONFIG             train (torchrun on this machine, or one node of many)
spotrain config put|get|history   the run's configuration, stored where the fleet reads it
spotrain data prepare|show        datasets: text into token shards in the store
spotrain checkpoints ...          list, show, verify, restore, gc a run's checkpoints
spotrain cost plan|simulate       a run's cost per strategy before it starts; trace replay
spotrain prices refresh|show      the price book (on-demand, spot per zone, Advisor bands)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from spotrain.arguments import run_name, whole
from spotrain.cost import commands as cost_commands
from spotrain.errors import SpotrainError, aws_errors
from spotrain.fleet_state import Coordinator
from spotrain.localcloud import control, faults


def _say(message: str) -> None:
    print(message, flush=True)


def cmd_local(args: argparse.Namespace) -> int:
    if args.action == "up":
        cloud = control.up(port=args.port)
        _say(f"local cloud running at {cloud.endpoint} (pid {cloud.pid}, log {cloud.log})")
        _say(
            f"use it with: export AWS_ENDPOINT_URL={cloud.endpoint} "
            f"AWS_CA_BUNDLE={cloud.ca_bundle} AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local"
        )
    elif args.action == "down":
        _say("local cloud stopped" if control.down() else "local cloud was not running")
    elif args.action == "fault":
        changes = _fault_changes(args.fault)  # a mistake is named before anything else
        control.require()
        _say(_describe_faults(control.set_faults(**changes)))
    else:
        cloud = control.status()
        if cloud is None:
            _say("local cloud is not running (start it with `spotrain local up`)")
            return 1
        _say(f"local cloud running at {cloud.endpoint} (pid {cloud.pid})")
    return 0


FAULT_USAGE = (
    "name a fault: region-down REGION, region-up REGION, replication-pending BUCKET/KEY-PATTERN, "
    "replication-resumed, unavailable BUCKET/KEY-PATTERN REQUESTS, or clear"
)


def _region(region: str) -> str:
    from spotrain.stacks.config import KNOWN_REGIONS

    if region not in KNOWN_REGIONS:
        raise SpotrainError(
            f"{region!r} is not an AWS region spotrain knows: use one of "
            f"{', '.join(sorted(KNOWN_REGIONS))}"
        )
    return region


def _object_pattern(pattern: str) -> str:
    if "/" not in pattern.strip("/"):
        raise SpotrainError(
            f"{pattern!r} names no objects: write BUCKET/KEY-PATTERN, e.g. my-bucket/runs/*"
        )
    return pattern


def _fault_changes(words: list[str]) -> dict[str, Any]:
    """The `control.set_faults` arguments `spotrain local fault WORDS` asks for."""
    current = faults.read(control.faults_file())
    match words:
        case ["region-down", region]:
            return {"regions_down": [*current.regions_down, _region(region)]}
        case ["region-up", region]:
            return {"regions_down": [r for r in current.regions_down if r != _region(region)]}
        case ["replication-pending", pattern]:
            return {"replication_pending": [*current.replication_pending, _object_pattern(pattern)]}
        case ["replication-resumed"]:
            return {"replication_pending": []}
        case ["unavailable", pattern, requests]:
            entry = {"id": uuid.uuid4().hex, "pattern": _object_pattern(pattern),
                     "requests": _positive_int(requests, "REQUESTS")}  # fmt: skip
            return {"unavailable": [*current.unavailable, entry]}
        case ["clear"]:
            return {"regions_down": [], "replication_pending": [], "unavailable": []}
    raise SpotrainError(f"`spotrain local fault {' '.join(words)}`: {FAULT_USAGE}")


def _describe_faults(current: faults.Faults) -> str:
    unavailable = ", ".join(f"{u['pattern']} (next {u['requests']} requests)"
                            for u in current.unavailable)  # fmt: skip
    return (
        f"regions down: {', '.join(current.regions_down) or 'none'}; replication pending for: "
        f"{', '.join(current.replication_pending) or 'nothing'}; unavailable: "
        f"{unavailable or 'nothing'}"
    )


def _positive_int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise SpotrainError(f"{what} is {text!r}: give a whole number of 1 or more")
    return value


def _deployment(  # type: ignore[no-untyped-def]
    env_name: str, outdir: Path, *, start_local: bool, verbose: bool
):
    from spotrain import deploy

    config = deploy.environment(env_name)
    if config.is_local:
        cloud = control.up() if start_local else control.require()
        _say(f"local cloud at {cloud.endpoint}")
        config = deploy.local_environment_ready(cloud.endpoint)
        endpoint = cloud.endpoint
    else:
        endpoint = deploy.resolve_local_endpoint()
    started = time.monotonic()
    deploy.synth(outdir, local_endpoint=endpoint)
    _say(f"synthesized {outdir}/ in {time.monotonic() - started:.1f}s")
    return deploy.Deployment(config=config, outdir=outdir, log=_say, verbose=verbose)


def cmd_rehearse(args: argparse.Namespace) -> int:
    import shutil

    from spotrain.fleet_rehearsal import FleetRehearsal
    from spotrain.rehearsal import Rehearsal

    work = control.state_dir().parent / ("fleet-rehearsal" if args.fleet else "rehearsal")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    began = time.monotonic()
    price_book = None
    if args.price_book:
        from spotrain.cost import prices

        price_book = Path(args.price_book)
        prices.load(price_book)  # a book that cannot be read is refused before anything starts
    rehearsal = FleetRehearsal if args.fleet else Rehearsal
    report = rehearsal(work, say=_say, price_book=price_book).run(
        keep_cloud=args.keep_cloud, port=args.port
    )
    _say(f"\n{report.render()}\n")
    _say(
        f"{'fleet ' if args.fleet else ''}rehearsal {'passed' if report.passed else 'FAILED'} in "
        f"{time.monotonic() - began:.0f} s (logs and configurations: {work})"
    )
    return 0 if report.passed else 1


def _mark_reclaimed(table: Any, args: argparse.Namespace) -> None:
    """The machine's own spot notice marks it as interrupted, as the handler's event would:
    the machine may exit before the event arrives, or the event may never come."""
    from spotrain import fleet_state
    from spotrain.catalog_schema import INSTANCE_STATUS_INTERRUPTING, UNKNOWN_POOL

    try:
        notice = json.loads(args.spot_notice)
        at = str(notice["time"])
        stops = datetime.datetime.fromisoformat(fleet_state.event_time(at).replace("Z", "+00:00"))
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise SpotrainError(
            f"--spot-notice {args.spot_notice!r} is not the metadata service's "
            '`spot/instance-action` document ({"action": ..., "time": ISO 8601})'
        ) from error
    warned = stops - datetime.timedelta(seconds=fleet_state.SPOT_WARNING_LEAD_S)
    fleet_state.mark_instance(
        table, args.run, args.instance, status=INSTANCE_STATUS_INTERRUPTING,
        pool=args.pool or UNKNOWN_POOL, event_id=f"instance-action:{args.instance}:{at}", at=at,
        warned_at=warned.isoformat(),
    )  # fmt: skip
    _say(f"{args.instance} was reclaimed ({notice.get('action', 'terminate')} at {at})")


def cmd_fleet(args: argparse.Namespace) -> int:
    with aws_errors(
        f"`spotrain fleet {args.action}`",
        "check the --group and --events-table names, AWS_REGION (the fleet's region) and "
        "your credentials",
    ):
        return _fleet(args)


def _fleet(args: argparse.Namespace) -> int:
    import boto3

    from spotrain import fleet_state

    if args.run is not None:
        run_name(args.run)

    autoscaling = boto3.client("autoscaling")
    table = boto3.resource("dynamodb").Table(args.events_table) if args.events_table else None
    if args.action in ("exit", "reset-crashes", "may-start", "coordinator", "release") and (
        table is None or not args.run
    ):
        raise SpotrainError(f"`spotrain fleet {args.action}` needs --events-table and --run")
    if args.action == "scale":
        return _scale(autoscaling, args)
    if args.action == "exit":
        if args.instance is None or args.code is None:
            raise SpotrainError("`spotrain fleet exit` needs --instance ID and --code N")
        if args.spot_notice:
            _mark_reclaimed(table, args)
        verdict = fleet_state.record_exit(table, args.run, args.instance, args.code)
        held = ", and is held: too many" if verdict.failed else ""
        _say(f"trainer exit {args.code} on {args.instance}: {verdict.kind}; run {args.run} has "
             f"{verdict.crashes} crash(es){held}")  # fmt: skip
        if verdict.failed:
            return 3
        return 5 if verdict.kind == "crash" else 0
    if args.action == "coordinator":
        return _coordinator(args, table)
    if args.action == "unhealthy":
        if not args.instance or not (args.reason or "").strip():
            raise SpotrainError("`spotrain fleet unhealthy` needs --instance ID and --reason TEXT")
        autoscaling.set_instance_health(
            InstanceId=args.instance, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False
        )
        _say(f"{args.instance} marked unhealthy ({args.reason}): its group replaces it")
        return 0
    if args.action == "reset-crashes":
        forgiven = fleet_state.reset_crashes(table, args.run, released_by=_caller_arn())
        _say(f"run {args.run}: released ({forgiven} crash record(s) forgiven); it may start and "
             "be requeued again")  # fmt: skip
        return 0
    if args.action == "release":
        return _release_spend(args, table)
    if args.action == "may-start":
        from spotrain import spend_ledger

        failed = fleet_state.run_state(table, args.run).failed
        spend = spend_ledger.read(table, args.run)
        if failed:
            _say(f"run {args.run} is held after repeated crashes: fix the cause, then "
                 "`spotrain fleet reset-crashes`")  # fmt: skip
        elif spend.held:
            _say(f"run {args.run} is held: it spent ${spend.spend_usd:,.2f} of its "
                 f"${spend.cap_usd or 0:,.2f} cap; `spotrain fleet release --max-spend-usd N` "
                 "raises it")  # fmt: skip
        else:
            _say(f"run {args.run} may start")
        return 3 if failed or spend.held else 0
    found = _groups(autoscaling, args.group)
    _say(f"{'group':<44} {'desired':>7} {'min':>4} {'max':>4} {'in service':>10}")
    for group in found:
        in_service = sum(i["LifecycleState"] == "InService" for i in group.get("Instances", []))
        _say(f"{group['AutoScalingGroupName']:<44} {group['DesiredCapacity']:>7} "
             f"{group['MinSize']:>4} {group['MaxSize']:>4} {in_service:>10}")  # fmt: skip
    if table is not None and args.run:
        state = fleet_state.run_state(table, args.run)
        short = (
            f"short of spot capacity for {time.time() - state.short_since:.0f} s"
            if state.short_since is not None else "not short of spot capacity"
        )  # fmt: skip
        _say(f"run {args.run}: {state.crashes} crash(es){' (held)' if state.failed else ''}, "
             f"{short}")  # fmt: skip
        for item in fleet_state.instances(table, args.run):
            _say(f"  {item['sk'].split('#', 1)[1]:<22} {item['status']:<13} pool "
                 f"{item.get('pool', '-')} since {item.get('updated_at', '-')}")  # fmt: skip
    return 0


def _scale(autoscaling: Any, args: argparse.Namespace) -> int:
    """One group's desired capacity (and minimum), within its bounds as AWS keeps them."""
    if len(args.group) != 1 or args.desired is None:
        raise SpotrainError("`spotrain fleet scale` needs one --group and --desired N")
    (group,) = _groups(autoscaling, args.group)
    name, low, high = args.group[0], group["MinSize"], group["MaxSize"]
    low = low if args.min_size is None else args.min_size
    if args.desired > high:
        raise SpotrainError(f"{name}: desired {args.desired} is above the group's maximum "
                            f"{high}: give --desired {high} or less (the maximum is the "
                            "environment's fleet_max_size, changed by a deploy)")  # fmt: skip
    if args.min_size is not None and args.min_size > args.desired:
        raise SpotrainError(f"--min-size {args.min_size} is above --desired {args.desired}: a "
                            "group's minimum is at most its desired capacity")  # fmt: skip
    if low > args.desired:
        raise SpotrainError(f"{name}: desired {args.desired} is below the group's minimum {low}: "
                            f"add --min-size {args.desired} to lower both (a later scale with "
                            f"--min-size {low} puts the minimum back)")  # fmt: skip
    if args.min_size is None:
        autoscaling.set_desired_capacity(
            AutoScalingGroupName=name, DesiredCapacity=args.desired, HonorCooldown=False
        )
    else:
        autoscaling.update_auto_scaling_group(
            AutoScalingGroupName=name, MinSize=args.min_size, DesiredCapacity=args.desired
        )
    _say(f"{name}: desired capacity set to {args.desired}"
         + (f", minimum {args.min_size}" if args.min_size is not None else ""))  # fmt: skip
    return 0


def _release_spend(args: argparse.Namespace, table: Any) -> int:
    """Raise a run's spend cap (operator credentials: machines cannot write caps); the next
    capacity check lets a run held at its old cap start again from its head."""
    from spotrain import spend_ledger

    if args.max_spend_usd is None:
        raise SpotrainError("`spotrain fleet release` needs --max-spend-usd N: the run's new cap")
    if not 0 < args.max_spend_usd < float("inf"):
        raise SpotrainError(f"--max-spend-usd is {args.max_spend_usd}: give a positive amount "
                            "in USD above what the run has spent")  # fmt: skip
    ledger = spend_ledger.read(table, args.run)
    if ledger.as_of is None:
        raise SpotrainError(f"run {args.run!r} has no spend ledger in {table.name}: check --run "
                            "and --events-table (the environment's events table)")  # fmt: skip
    if args.max_spend_usd <= ledger.spend_usd:
        raise SpotrainError(f"run {args.run} has spent ${ledger.spend_usd:,.2f} already: give "
                            f"--max-spend-usd above that")  # fmt: skip
    spend_ledger.raise_cap(table, args.run, args.max_spend_usd, raised_by=_caller_arn(),
                           now=time.time())  # fmt: skip
    then = "; the next capacity check (within 5 minutes) lets it start again from its head"
    _say(f"run {args.run}: cap raised to ${args.max_spend_usd:,.2f} (spent "
         f"${ledger.spend_usd:,.2f}){then if ledger.held else ''}")  # fmt: skip
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from spotrain import machine_logs

    with aws_errors(f"the log stream {args.group}/{args.stream} cannot be opened",
                    "check --group, AWS_REGION and the machine's credentials"):  # fmt: skip
        return machine_logs.main_ship(args.group, args.stream, args.echo)


def _caller_arn() -> str:
    """Who is asking, for the audit trail ("" when the identity service cannot say)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return str(boto3.client("sts").get_caller_identity()["Arn"])
    except (BotoCoreError, ClientError):
        return ""


def _coordinator(args: argparse.Namespace, table: Any) -> int:
    """Claim the run's coordinator role (on-demand machines), or find the coordinator (every
    other machine). Prints the rendezvous endpoint, HOST:PORT, alone on its line."""
    from spotrain import fleet_state

    if args.claim:
        if not (args.instance and args.address and args.port):
            raise SpotrainError("`spotrain fleet coordinator --claim` needs --instance, "
                                "--address and --port (this machine's)")  # fmt: skip
        if not fleet_state.claim_coordinator(
            table, args.run, instance_id=args.instance, address=args.address, port=args.port
        ):
            print(f"run {args.run}: another machine coordinates it", file=sys.stderr)
            return 4
        _say(f"{args.address}:{args.port}")
        return 0
    deadline = time.monotonic() + args.wait
    while True:
        found = fleet_state.coordinator(table, args.run)
        if found is not None and found.fresh(time.time()):
            _wait_until_it_answers(found, deadline, args.run)
            _say(found.endpoint)
            return 0
        if time.monotonic() >= deadline:
            state = "its claim went stale" if found else "none has claimed the role"
            raise SpotrainError(
                f"run {args.run} has no coordinator after {args.wait} s ({state}): the "
                "on-demand group's machine claims it when it boots; check that it runs "
                f"(`spotrain fleet status --group ...`) and its boot log"
            )
        time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))


def _wait_until_it_answers(found: Coordinator, deadline: float, run: str) -> None:
    """The claim is written before the coordinator's torchrun listens (it checks the
    configuration and fetches the data first): wait for the port to answer, and say so
    plainly if it never does rather than leave torch to time out with a traceback."""
    import socket

    while True:
        try:
            with socket.create_connection((found.address, found.port), timeout=5):
                return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise SpotrainError(
                    f"run {run}'s coordinator {found.endpoint} ({found.instance_id}) claimed "
                    f"the role but does not answer ({error.strerror or error}): check that "
                    "the fleet's security group lets its machines reach each other on the "
                    "rendezvous port, and the coordinator's boot log"
                ) from error
        time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))


def _groups(autoscaling: Any, names: list[str]) -> list[dict[str, Any]]:
    """The named groups (every group in the region if none is named), or an error naming the
    ones that do not exist."""
    found: list[dict[str, Any]] = autoscaling.describe_auto_scaling_groups(
        AutoScalingGroupNames=names
    )["AutoScalingGroups"]
    missing = set(names) - {g["AutoScalingGroupName"] for g in found}
    if missing:
        raise SpotrainError(f"no Auto Scaling group named {', '.join(sorted(missing))} in "
                            "this region: check --group and AWS_REGION")  # fmt: skip
    return found


def cmd_budget(args: argparse.Namespace) -> int:
    with aws_errors(
        f"budget {args.name!r}",
        "budgets are named spotrain-<env>-monthly (the budget stack's output); check your "
        "credentials",
    ):
        return _budget(args)


def _budget(args: argparse.Namespace) -> int:
    import boto3

    account = boto3.client("sts").get_caller_identity()["Account"]
    budget = boto3.client("budgets").describe_budget(AccountId=account, BudgetName=args.name)[
        "Budget"
    ]
    limit = budget["BudgetLimit"]
    spend = budget.get("CalculatedSpend", {})
    actual = spend.get("ActualSpend", {}).get("Amount", "0")
    forecast = spend.get("ForecastedSpend", {}).get("Amount", "n/a")
    period = budget["TimeUnit"].lower()
    _say(f"{args.name}: limit {float(limit['Amount']):,.2f} {limit['Unit']} per {period}; "
         f"actual {float(actual):,.2f}; forecast {forecast}")  # fmt: skip
    filters = budget.get("CostFilters", {})
    if filters:
        _say(f"  counts costs tagged {filters}")
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from spotrain import deploy

    started = time.monotonic()
    out = deploy.synth(Path(args.out), local_endpoint=deploy.resolve_local_endpoint())
    stacks = sorted(p.name for p in (out / "stacks").iterdir())
    _say(f"synthesized {len(stacks)} stacks into {out}/ in {time.monotonic() - started:.1f}s:")
    for name in stacks:
        _say(f"  {name}")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    deployment = _deployment(args.env, Path(args.out), start_local=True, verbose=args.verbose)
    started = time.monotonic()
    results = deployment.apply()
    _say(
        f"\n{args.env}: {sum(len(r.resources) for r in results)} resources in "
        f"{len(results)} stacks, applied in {time.monotonic() - started:.0f}s"
    )
    for result in results:
        _say(f"\n{result.name} ({len(result.resources)} resources)")
        for key, value in sorted(result.outputs.items()):
            _say(f"  {key:<28} {value}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    deployment = _deployment(args.env, Path(args.out), start_local=False, verbose=args.verbose)
    changes = deployment.plan_has_changes()
    for name, changed in changes.items():
        _say(f"{name}: {'changes' if changed else 'no changes'}")
    return 2 if any(changes.values()) else 0


def cmd_destroy(args: argparse.Namespace) -> int:
    deployment = _deployment(args.env, Path(args.out), start_local=False, verbose=args.verbose)
    deployment.destroy()
    _say(f"{args.env}: destroyed")
    return 0


def cmd_scan(args: argparse.Namespace) -> int:
    from spotrain import deploy, scan

    out = Path(args.out)
    if not (out / "stacks").exists() or args.synth:
        deploy.synth(out, local_endpoint=deploy.resolve_local_endpoint())
    report = scan.scan(out / "stacks")
    _say(
        f"checkov: {report.passed} passed, {len(report.findings)} findings, "
        f"{len(report.explained)} explained by checkov-skips.yaml"
    )
    for finding in report.unexplained:
        _say(f"  FAILED {finding.check_id} {finding.stack}: {finding.resource}")
    for skip_id in report.unused_skips:
        _say(f"  STALE  {skip_id}: matches no finding; remove it from checkov-skips.yaml")
    return 0 if report.ok else 1


def _checkpointer(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from spotrain.trainer.checkpointer import Checkpointer

    run_name(args.run)
    owner = f"spotrain checkpoints {args.action} ({os.environ.get('USER', 'unknown')})"
    return Checkpointer(run=args.run, store=args.store, catalog_table=args.catalog_table,
                        kms_key_id=args.kms_key_id, lease_owner=owner, say=_say)  # fmt: skip


def cmd_checkpoints(args: argparse.Namespace) -> int:
    import tempfile

    checkpointer = _checkpointer(args)
    if args.action == "list":
        head = checkpointer.head()
        entries = checkpointer.entries()
        if not entries:
            _say(f"run {args.run!r} has no checkpoints in {checkpointer.storage.uri}")
            return 1
        _say(f"{'step':>10}  {'status':<12} {'bytes':>14}  parent")
        for entry in entries:
            marker = "  <- head" if head is not None and entry.step == head.step else ""
            reason = f"  ({entry.reason})" if entry.reason and entry.status != "COMPLETE" else ""
            _say(f"{entry.step:>10}  {entry.status:<12} {entry.total_bytes:>14,}  "
                 f"{entry.parent or '-'}{marker}{reason}")  # fmt: skip
        return 0
    if args.action == "gc":
        report = checkpointer.collect_garbage(args.keep)
        _say(f"kept steps {report.kept}; collected {report.collected or 'nothing'}; "
             f"freed {report.freed_bytes:,} bytes")  # fmt: skip
        return 0
    if args.action == "restore":
        if not args.to:
            raise SpotrainError("restore needs --to DIR (an empty or new folder, or one an "
                                "earlier restore of this run filled)")  # fmt: skip
        result = checkpointer.restore_into(Path(args.to), roll_back=not args.no_roll_back)
        _say(f"restored step {result.manifest.step} ({result.manifest.total_bytes:,} bytes, "
             f"{len(result.manifest.shards)} files) into {args.to}")  # fmt: skip
        if result.fell_back and result.rolled_back_from is None:
            _say(f"the head is still step {result.head_step}: "
                 + ("--no-roll-back was given" if args.no_roll_back else
                    "the catalog could not be read"))  # fmt: skip
        return 0
    if args.action in ("quarantine", "rollback"):
        if args.step is None or not (args.reason or "").strip():
            raise SpotrainError(f"{args.action} needs --step N and --reason TEXT (kept with the "
                                "checkpoint for whoever looks next)")  # fmt: skip
        if args.action == "quarantine":
            checkpointer.quarantine(args.step, args.reason)
            _say(f"step {args.step} quarantined: restores pass over it")
            return 0
        undone = checkpointer.roll_back(args.step, args.reason)  # a writer still running: stale
        _say(f"head of {args.run} is step {args.step}; rolled back {undone or 'nothing'}")
        return 0
    entry = checkpointer.entry_at(args.step)
    if args.action == "show":
        _say(checkpointer.manifest(entry).to_json().decode())
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        manifest, notes = checkpointer.verify(entry, Path(scratch) / "shards")
    for note in notes:
        _say(f"damaged copy (another copy of the same bytes is good): {note}")
    copies = sum(len(s.stored_keys) for s in manifest.shards)
    _say(f"step {entry.step}: all {len(manifest.shards)} files present and match their SHA-256 "
         f"({copies} stored objects checked)")  # fmt: skip
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from spotrain.trainer import run_config
    from spotrain.trainer.storage import open_storage

    storage = open_storage(args.store, kms_key_id=args.kms_key_id)
    if args.action == "put":
        if args.config is None:
            raise SpotrainError("`spotrain config put` needs the configuration file: "
                                "spotrain config put CONFIG --store URI")  # fmt: skip
        from spotrain.trainer.train import load_config

        config = load_config(args.config, args.set)  # every problem, before anything is stored
        stored = run_config.put(storage, asdict(config))
        _say(f"run {config.run}: configuration stored as {storage.uri}/{stored.key}; machines "
             "that start from now on train with it")  # fmt: skip
        return 0
    run = run_name(args.run)
    if args.action == "get":
        if not args.to:
            raise SpotrainError("`spotrain config get` needs --to FILE (where to write it)")
        if Path(args.to).is_dir():
            raise SpotrainError(f"--to {args.to} is a folder: give the file to write, e.g. "
                                f"{Path(args.to) / 'config.json'}")  # fmt: skip
        stored = run_config.newest(storage, run)
        run_config.write(stored, Path(args.to))
        _say(f"run {run}: {storage.uri}/{stored.key} -> {args.to}")
        return 0
    versions = run_config.history(storage, run)
    if not versions:
        _say(f"run {run!r} has no stored configuration in {storage.uri}")
        return 1
    for key in versions:
        _say(f"{key}{'  <- machines use this one' if key == versions[-1] else ''}")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    import tempfile

    from spotrain.catalog_schema import run_name_problem
    from spotrain.trainer import datasets
    from spotrain.trainer.storage import open_storage

    problem = run_name_problem(args.name, "dataset")
    if problem:
        raise SpotrainError(f"--name: {problem}")
    storage = open_storage(args.store, kms_key_id=args.kms_key_id)
    if args.action == "show":
        manifest = datasets.read_manifest(storage, args.name)
        _say(manifest.to_json().decode())
        return 0
    from tqdm import tqdm

    sources = [Path(p) for p in args.inputs]
    with tempfile.TemporaryDirectory() as scratch, tqdm(
        total=len(sources), unit="file", desc=f"tokenizing ({args.tokenizer})", disable=None
    ) as bar:  # fmt: skip
        report = datasets.prepare(
            sources, storage=storage, name=args.name, tokenizer=args.tokenizer,
            vocab_size=args.vocab_size, text_field=args.text_field,
            shard_tokens=args.shard_tokens, workers=args.workers, scratch=Path(scratch),
            progress=lambda done: bar.update(done - bar.n),
        )  # fmt: skip
    manifest = report.manifest
    _say(f"dataset {manifest.name}: {manifest.documents:,} documents, {manifest.tokens:,} "
         f"{manifest.tokenizer['kind']} tokens (vocabulary {manifest.vocab_size:,}) in "
         f"{len(manifest.shards)} shard(s), {report.uploaded_bytes:,} bytes stored; train on "
         f'it with "data": "dataset:{manifest.name}"')  # fmt: skip
    return 0


DEFAULT_SHUTDOWN_TIMEOUT_S = 90
MAX_REGROUPS = 20


def _nnodes(text: str) -> str:
    """N, or MIN:MAX, machines (whole numbers, 1 <= MIN <= MAX)."""
    parts = text.split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) not in (1, 2) or min(numbers) < 1 or numbers != sorted(numbers):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give N machines, or MIN:MAX for an elastic run (1 <= MIN <= MAX)"
        )
    return text


def _endpoint(text: str) -> str:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: write HOST:PORT, e.g. 10.0.1.5:29400")
    return text


def torchrun_command(args: argparse.Namespace) -> list[str]:
    """The torchrun command line `spotrain train` runs."""
    launcher = [sys.executable, "-m", "spotrain.trainer.launch",  # torchrun, repaired
                "--nproc-per-node", str(args.nproc_per_node),
                # SIGTERM -> emergency checkpoint -> exit: torchrun must wait that long before
                # it SIGKILLs the ranks (its own default is 30 s).
                "--shutdown-timeout", str(args.shutdown_timeout)]  # fmt: skip
    if args.nnodes == "1":
        launcher.append("--standalone")
    else:
        if not args.rdzv_endpoint:
            raise SpotrainError(
                f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (the coordinator's "
                "address that every node can reach)"
            )
        rdzv_conf = [f"last_call_timeout={args.rdzv_last_call}"]
        if args.rdzv_host is not None:
            # Said, not guessed: torch guesses from the endpoint's address, and every machine
            # played on one host (all on loopback) would otherwise race to host the store.
            rdzv_conf.append(f"is_host={str(args.rdzv_host).lower()}")
        launcher += ["--nnodes", args.nnodes, "--rdzv-backend", "c10d",
                     "--rdzv-endpoint", args.rdzv_endpoint, "--rdzv-id", args.rdzv_id,
                     # A machine of the group that leaves (its ranks exit 0) or stays while
                     # another leaves (they exit REJOIN_EXIT) re-forms the group this many
                     # times before torchrun gives up.
                     "--max-restarts", str(MAX_REGROUPS),
                     "--rdzv-conf", ",".join(rdzv_conf)]  # fmt: skip
    launcher += ["-m", "spotrain.trainer.train", str(args.config)]
    for override in args.set:
        launcher += ["--set", override]
    return launcher


def cmd_train(args: argparse.Namespace) -> int:
    from spotrain.trainer.engine import preflight
    from spotrain.trainer.train import load_config

    config = load_config(args.config, args.set)  # every problem now, before any process starts
    preflight(config)  # and the store, data and folders, before any rank takes the run's lease
    if args.nproc_per_node is None:
        import torch

        args.nproc_per_node = torch.cuda.device_count() or 1
    command = torchrun_command(args)
    _say(f"training {config.run}: {' '.join(command[1:])}")
    sys.stdout.flush()
    os.execv(sys.executable, command)  # torchrun takes this process: signals reach it directly
    return 0  # not reached


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="spotrain", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    root.add_argument(
        "--debug", action="store_true", help="show the traceback of any error (for bug reports)"
    )
    commands = root.add_subparsers(dest="command", required=True)

    local = commands.add_parser("local", help="start, stop or inspect the local cloud")
    local.add_argument(
        "action", choices=["up", "down", "status", "fault"], help="what to do (`fault`: see below)"
    )
    local.add_argument(
        "fault",
        nargs="*",
        metavar="FAULT",
        help="with `fault`: region-down REGION | region-up REGION | replication-pending "
        "BUCKET/KEY-PATTERN | replication-resumed | unavailable BUCKET/KEY-PATTERN REQUESTS "
        "(the next REQUESTS requests for those objects get 503) | clear",
    )
    local.add_argument(
        "--port",
        type=whole(0, 65535),
        default=control.DEFAULT_PORT,
        help="loopback port for `up` (0 picks a free one)",
    )
    local.set_defaults(handler=cmd_local)

    rehearse = commands.add_parser(
        "rehearse",
        help="the whole story on the local cloud: deploy, train, spot interruption, resume, "
        "replica-region restore, report",
    )
    rehearse.add_argument(
        "--fleet", action="store_true",
        help="the fleet story instead: 3 machines booted from the deployed launch template "
        "train one run, one is reclaimed, its replacement joins",
    )  # fmt: skip
    rehearse.add_argument(
        "--keep-cloud", action="store_true", help="leave the local cloud running afterwards"
    )
    rehearse.add_argument(
        "--port",
        type=whole(0, 65535),
        default=control.DEFAULT_PORT,
        help="loopback port for the local cloud if it is not running (0 picks a free one)",
    )
    rehearse.add_argument(
        "--price-book",
        help="prices the local cloud answers with, for the report's spend (default: the "
        "checked-in snapshot; `spotrain prices refresh --price-book FILE` writes one)",
    )
    rehearse.set_defaults(handler=cmd_rehearse)

    fleet = commands.add_parser(
        "fleet", help="the run's Auto Scaling groups and fleet state (AWS_REGION: their region)"
    )
    fleet.add_argument(
        "action",
        choices=[
            "status",
            "scale",
            "exit",
            "may-start",
            "reset-crashes",
            "release",
            "coordinator",
            "unhealthy",
        ],
        help="status: groups and the run's state; scale: set one group's desired capacity; "
        "exit: account for a trainer exit (boot service; exit 3 if the run is now held, 5 for "
        "a crash); may-start: exit 3 if the run is held after crashes; reset-crashes: release "
        "a held run (operator credentials: machines cannot); release: raise the run's spend cap "
        "(--max-spend-usd N; operator credentials); coordinator: claim the run's "
        "rendezvous (--claim) or print where it is (HOST:PORT); unhealthy: have the group "
        "replace --instance (a machine that cannot train)",
    )
    fleet.add_argument("--group", action="append", default=[], help="Auto Scaling group name")
    fleet.add_argument("--desired", type=whole(0), help="desired capacity for `scale`")
    fleet.add_argument("--min-size", type=whole(0),
                       help="scale: the group's new minimum too (AWS refuses a desired "
                       "capacity below the minimum: lower both to stop a group)")  # fmt: skip
    fleet.add_argument("--events-table", help="interruption events table (fleet state)")
    fleet.add_argument("--run", help="run name")
    fleet.add_argument("--instance", help="instance id for `exit`, `unhealthy`, `coordinator`")
    fleet.add_argument("--reason", help="unhealthy: why (shown in the boot log)")
    fleet.add_argument("--code", type=int, help="trainer exit status for `exit`")
    fleet.add_argument("--spot-notice", metavar="JSON",
                       help="exit: the machine's own interruption notice (the metadata "
                       "service's spot/instance-action): the exit is a preemption")  # fmt: skip
    fleet.add_argument("--max-spend-usd", type=float,
                       help="release: the run's new spend cap in USD")  # fmt: skip
    fleet.add_argument("--pool", metavar="TYPE#ZONE",
                       help="exit --spot-notice: the machine's capacity pool")  # fmt: skip
    fleet.add_argument("--claim", action="store_true",
                       help="coordinator: take or renew the role for this machine")  # fmt: skip
    fleet.add_argument("--address", help="coordinator --claim: this machine's private address")
    fleet.add_argument("--port", type=whole(1, 65535), help="coordinator --claim: its port")
    fleet.add_argument("--wait", type=whole(0), default=0,
                       help="coordinator: seconds to wait for one to claim the role and "
                       "answer on its port")  # fmt: skip
    fleet.set_defaults(handler=cmd_fleet)

    logs = commands.add_parser(
        "logs", help="a machine's output to the run's CloudWatch log group (the boot script)"
    )
    logs.add_argument("action", choices=["ship"],
                      help="ship: send standard input, line by line, to the stream")  # fmt: skip
    logs.add_argument("--group", required=True, help="log group (the compute stack's)")
    logs.add_argument("--stream", required=True, help="log stream, e.g. the instance id")
    logs.add_argument("--echo", action="store_true",
                      help="also copy each line to standard output (the journal)")  # fmt: skip
    logs.set_defaults(handler=cmd_logs)

    budget = commands.add_parser("budget", help="a budget's limit, actual and forecast spend")
    budget.add_argument("name", help="budget name, e.g. spotrain-prod-monthly")
    budget.set_defaults(handler=cmd_budget)

    cost_commands.add_parsers(commands)

    synth = commands.add_parser("synth", help="synthesize every environment")
    synth.add_argument("--out", default="cdktf.out", help="output folder")
    synth.set_defaults(handler=cmd_synth)

    scan = commands.add_parser("scan", help="checkov over the synthesized stacks")
    scan.add_argument("--out", default="cdktf.out", help="synthesis folder")
    scan.add_argument("--synth", action="store_true", help="synthesize first even if present")
    scan.set_defaults(handler=cmd_scan)

    train = commands.add_parser("train", help="train: torchrun over spotrain.trainer")
    train.add_argument("config", type=Path, help="training configuration (JSON)")
    train.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                       help="override one configuration field (model.width=128)")  # fmt: skip
    train.add_argument("--nproc-per-node", type=whole(1),
                       help="ranks on this machine (default: its GPUs, or 1 without)")  # fmt: skip
    train.add_argument("--nnodes", default="1", type=_nnodes,
                       help="machines: N, or MIN:MAX for an elastic run")  # fmt: skip
    train.add_argument("--rdzv-endpoint", type=_endpoint,
                       help="HOST:PORT every machine meets at (nnodes > 1)")  # fmt: skip
    train.add_argument("--rdzv-id", default="spotrain", help="rendezvous id shared by the run")
    train.add_argument("--rdzv-host", action=argparse.BooleanOptionalAction,
                       help="this machine hosts the rendezvous (the run's coordinator), or not; "
                       "default: when the endpoint's address is this machine's")  # fmt: skip
    train.add_argument("--rdzv-last-call", type=whole(1), default=30,
                       help="seconds the rendezvous waits for more machines once the fewest "
                       "it needs have come")  # fmt: skip
    train.add_argument("--shutdown-timeout", type=whole(1), default=DEFAULT_SHUTDOWN_TIMEOUT_S,
                       help="seconds between SIGTERM and SIGKILL of the ranks; longer than an "
                       "emergency checkpoint takes to publish")  # fmt: skip
    train.set_defaults(handler=cmd_train)

    config = commands.add_parser(
        "config", help="the run's training configuration, stored where the fleet reads it"
    )
    config.add_argument(
        "action", choices=["put", "get", "history"],
        help="put: check CONFIG and store it as the run's newest version; get: write the newest "
        "to --to FILE (the boot script does); history: list every version",
    )  # fmt: skip
    config.add_argument("config", nargs="?", type=Path, help="put: the configuration (JSON)")
    config.add_argument(
        "--store", required=True, help="the run's store: s3://BUCKET or file:///PATH"
    )
    config.add_argument("--run", help="run name (get, history)")
    config.add_argument("--to", help="get: file to write the configuration to")
    config.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="put: override one field before storing")  # fmt: skip
    config.add_argument("--kms-key-id", help="the bucket's KMS key (default: its default key)")
    config.set_defaults(handler=cmd_config)

    data = commands.add_parser("data", help="datasets: text into token shards in the store")
    data.add_argument("action", choices=["prepare", "show"],
                      help="prepare: tokenize INPUTS and store them as dataset NAME; show: "
                      "its manifest")  # fmt: skip
    data.add_argument("inputs", nargs="*", metavar="INPUT",
                      help="prepare: text files, or JSONL (.jsonl) with a text field")  # fmt: skip
    data.add_argument("--store", required=True, help="s3://BUCKET or file:///PATH")
    data.add_argument("--name", required=True, help="the dataset's name (never overwritten)")
    data.add_argument("--tokenizer", choices=["bytes", "bpe"], default="bytes",
                      help="bytes: one token per byte; bpe: a byte-pair tokenizer trained on "
                      "the input (kept with the dataset)")  # fmt: skip
    data.add_argument("--vocab-size", type=whole(257), default=8192,
                      help="bpe: vocabulary size")  # fmt: skip
    data.add_argument("--text-field", default="text", help="JSONL: the field holding the text")
    data.add_argument("--shard-tokens", type=whole(1), default=64 * 1024 * 1024,
                      help="tokens per shard file")  # fmt: skip
    data.add_argument("--workers", type=whole(1), default=os.cpu_count() or 1,
                      help="tokenizing processes")  # fmt: skip
    data.add_argument("--kms-key-id", help="the bucket's KMS key (default: its default key)")
    data.set_defaults(handler=cmd_data)

    checkpoints = commands.add_parser("checkpoints", help="a run's checkpoints")
    checkpoints.add_argument(
        "action",
        choices=["list", "show", "verify", "restore", "gc", "quarantine", "rollback"],
        help="what to do",
    )
    checkpoints.add_argument(
        "--store", required=True, help="where checkpoints live: s3://BUCKET or file:///PATH"
    )
    checkpoints.add_argument("--run", required=True, help="run name")
    checkpoints.add_argument("--catalog-table", help="DynamoDB catalog table (default: manifests)")
    checkpoints.add_argument(
        "--step",
        type=whole(0),
        help="checkpoint step for show/verify (default: head), quarantine, rollback (the step "
        "that becomes the head)",
    )
    checkpoints.add_argument(
        "--to",
        help="restore: folder to restore into (empty, new, or an earlier restore of the run)",
    )
    checkpoints.add_argument(
        "--no-roll-back",
        action="store_true",
        help="restore: leave the head where it is even when the restore fell back past damaged "
        "checkpoints (by default the head moves back, as when a run restarts, fencing any "
        "writer still running)",
    )
    checkpoints.add_argument("--reason", help="quarantine/rollback: why, kept in the catalog")
    checkpoints.add_argument(
        "--kms-key-id", help="the bucket's KMS key, for actions that write to an s3:// store"
    )
    checkpoints.add_argument(
        "--keep", type=whole(2), default=2, help="gc: complete checkpoints to keep (2 or more)"
    )
    checkpoints.set_defaults(handler=cmd_checkpoints)

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
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except SpotrainError as error:
        if args.debug:
            traceback.print_exc()
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as error:  # the last line of defence: one line, not a trace
        from botocore.exceptions import BotoCoreError, ClientError

        if args.debug:
            traceback.print_exc()
        if isinstance(error, ClientError | BotoCoreError):
            print(f"error: AWS refused or could not be reached: {error}; check your "
                  "credentials, AWS_REGION and the names you gave", file=sys.stderr)  # fmt: skip
            return 2
        print(
            f"error: {type(error).__name__}: {error}\nThis is a bug in spotrain "
            f"{_version()}: please report it with the command you ran and its output with "
            "--debug (which shows where it happened).",
            file=sys.stderr,
        )
        return 70


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("spotrain")
    except PackageNotFoundError:
        return "(not installed)"


if __name__ == "__main__":
    sys.exit(main())
