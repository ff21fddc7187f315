"""`spotrain fleet status|scale|exit|may-start|reset-crashes|release|coordinator|unhealthy`: the
run's Auto Scaling groups and its fleet state. The boot script calls `exit`, `may-start`,
`coordinator` and `unhealthy` on every machine; on-call calls the rest."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spotrain.cli.arguments import run_name, whole
from spotrain.cli.output import say
from spotrain.core import aws_clients
from spotrain.core.errors import SpotrainError, aws_errors
from spotrain.core.fleet_state import Coordinator


@dataclass(frozen=True)
class _Fleet:
    """What every action works on: the region's Auto Scaling, and the events table when one
    is named (the run's fleet state)."""

    autoscaling: Any
    table: Any


def _status(fleet: _Fleet, args: argparse.Namespace) -> int:
    from spotrain.core import fleet_state

    found = _groups(fleet.autoscaling, args.group)
    say(f"{'group':<44} {'desired':>7} {'min':>4} {'max':>4} {'in service':>10}")
    for group in found:
        in_service = sum(i["LifecycleState"] == "InService" for i in group.get("Instances", []))
        say(f"{group['AutoScalingGroupName']:<44} {group['DesiredCapacity']:>7} "
            f"{group['MinSize']:>4} {group['MaxSize']:>4} {in_service:>10}")  # fmt: skip
    if fleet.table is not None and args.run:
        state = fleet_state.run_state(fleet.table, args.run)
        short = (
            f"short of spot capacity for {time.time() - state.short_since:.0f} s"
            if state.short_since is not None else "not short of spot capacity"
        )  # fmt: skip
        say(f"run {args.run}: {state.crashes} crash(es){' (held)' if state.failed else ''}, "
            f"{short}")  # fmt: skip
        for item in fleet_state.instances(fleet.table, args.run):
            say(f"  {item['sk'].split('#', 1)[1]:<22} {fleet_state.shown_status(item):<13} pool "
                f"{item.get('pool', '-')} since {item.get('updated_at', '-')}")  # fmt: skip
    return 0


def _exit(fleet: _Fleet, args: argparse.Namespace) -> int:
    from spotrain.core import fleet_state

    if args.instance is None or args.code is None:
        raise SpotrainError("`spotrain fleet exit` needs --instance ID and --code N")
    if args.spot_notice:
        _mark_reclaimed(fleet.table, args)
    verdict = fleet_state.record_exit(fleet.table, args.run, args.instance, args.code,
                                      asked_to_stop=args.asked_to_stop,
                                      reason=args.reason)  # fmt: skip
    held = ", and is held: too many" if verdict.failed else ""
    say(f"trainer exit {args.code} on {args.instance}: {verdict.kind}; run {args.run} has "
        f"{verdict.crashes} crash(es){held}")  # fmt: skip
    if verdict.failed:
        return 3
    return 5 if verdict.kind == "crash" else 0


def _unhealthy(fleet: _Fleet, args: argparse.Namespace) -> int:
    if not args.instance or not (args.reason or "").strip():
        raise SpotrainError("`spotrain fleet unhealthy` needs --instance ID and --reason TEXT")
    fleet.autoscaling.set_instance_health(
        InstanceId=args.instance, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False
    )
    say(f"{args.instance} marked unhealthy ({args.reason}): its group replaces it")
    return 0


def _reset_crashes(fleet: _Fleet, args: argparse.Namespace) -> int:
    from spotrain.core import fleet_state

    if fleet_state.run_state(fleet.table, args.run).crashes == 0:
        raise SpotrainError(f"run {args.run} has no crash since its last release in "
                            f"{args.events_table}: nothing to release (check the run's name: "
                            "`spotrain run list ENV`)")  # fmt: skip
    forgiven = fleet_state.reset_crashes(fleet.table, args.run, released_by=caller_arn())
    say(f"run {args.run}: released ({forgiven} crash record(s) forgiven); it may start and "
        "be requeued again")  # fmt: skip
    return 0


def _may_start(fleet: _Fleet, args: argparse.Namespace) -> int:
    from spotrain.core import fleet_state, run_lifecycle, spend_ledger

    state = fleet_state.run_state(fleet.table, args.run)
    spend = spend_ledger.read(fleet.table, args.run)
    lifecycle = run_lifecycle.read(fleet.table, args.run)
    if lifecycle.stopped:
        say(f"run {args.run} may not start: {lifecycle.why_stopped}")
        return 3
    if state.failed:
        say(f"run {args.run} is held after repeated crashes: fix the cause, then "
            "`spotrain fleet reset-crashes`")  # fmt: skip
    elif spend.held:
        say(f"run {args.run} is held: it spent ${spend.spend_usd:,.2f} of its "
            f"${spend.cap_usd or 0:,.2f} cap; `spotrain fleet release --max-spend-usd N` "
            "raises it")  # fmt: skip
    else:
        say(f"run {args.run} may start")
        if args.store and args.catalog_table:
            _follow_move_order(fleet, args)
    return 3 if state.failed or spend.held else 0


def _follow_move_order(fleet: _Fleet, args: argparse.Namespace) -> None:
    """The run's region stopped answering and this region's handler ordered the move here
    (`core.failover`): the first machine to boot claims the run here from its newest checkpoint
    whose every piece replicated and verifies (restored where the trainer restores, in
    `--work-dir`: it fetches none of it again); the others find it claimed. A move that cannot
    be made yet is said, and the trainer, refused, has the group replace the machine."""
    import tempfile
    from pathlib import Path

    from spotrain.core import fleet_state

    here = fleet.autoscaling.meta.region_name
    order = fleet_state.failover_state(fleet.table, args.run, here).move_order
    if order is None:
        return
    from spotrain.trainer.run_checkpoints import RESTORE_FOLDER, RunCheckpoints  # no PyTorch

    checkpoints = RunCheckpoints.open(
        run=args.run, store=args.store, catalog_table=args.catalog_table,
        kms_key_id=args.kms_key_id, lease_owner=f"machine {args.instance}", say=say,
    )  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as passing:  # without --work-dir, checked there
            into = Path(args.work_dir or passing) / RESTORE_FOLDER
            say(f"run {args.run}: {checkpoints.follow_order(order, into)}")
    except SpotrainError as error:
        say(f"run {args.run}: the ordered move to {here} did not happen: {error}")


def _mark_reclaimed(table: Any, args: argparse.Namespace) -> None:
    """The machine's own spot notice marks it as interrupted, as the handler's event would:
    the machine may exit before the event arrives, or the event may never come."""
    from spotrain.core import fleet_state
    from spotrain.core.catalog_schema import INSTANCE_STATUS_INTERRUPTING, UNKNOWN_POOL

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
    say(f"{args.instance} was reclaimed ({notice.get('action', 'terminate')} at {at})")


def _scale(fleet: _Fleet, args: argparse.Namespace) -> int:
    """One group's desired capacity (and minimum), within its bounds as AWS keeps them."""
    if len(args.group) != 1 or args.desired is None:
        raise SpotrainError("`spotrain fleet scale` needs one --group and --desired N")
    autoscaling = fleet.autoscaling
    (group,) = _groups(autoscaling, args.group)
    name, low, high = args.group[0], group["MinSize"], group["MaxSize"]
    low = low if args.min_size is None else args.min_size
    if args.desired > high:
        raise SpotrainError(f"{name}: desired {args.desired} is above the group's maximum "
                            f"{high}: give --desired {high} or less (the maximum is the "
                            "run file's max_size, changed by a deploy)")  # fmt: skip
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
    say(f"{name}: desired capacity set to {args.desired}"
         + (f", minimum {args.min_size}" if args.min_size is not None else ""))  # fmt: skip
    return 0


def _release_spend(fleet: _Fleet, args: argparse.Namespace) -> int:
    """Raise a run's spend cap (operator credentials: machines cannot write caps); the next
    capacity check lets a run held at its old cap start again from its head."""
    from spotrain.core import spend_ledger

    if args.max_spend_usd is None:
        raise SpotrainError("`spotrain fleet release` needs --max-spend-usd N: the run's new cap")
    if not 0 < args.max_spend_usd < float("inf"):
        raise SpotrainError(f"--max-spend-usd is {args.max_spend_usd}: give a positive amount "
                            "in USD above what the run has spent")  # fmt: skip
    ledger = spend_ledger.read(fleet.table, args.run)
    if ledger.as_of is None:
        raise SpotrainError(f"run {args.run!r} has no spend ledger in {fleet.table.name}: "
                            "check --run and --events-table (the environment's events "
                            "table)")  # fmt: skip
    if args.max_spend_usd <= ledger.spend_usd:
        raise SpotrainError(f"run {args.run} has spent ${ledger.spend_usd:,.2f} already: give "
                            f"--max-spend-usd above that")  # fmt: skip
    spend_ledger.raise_cap(fleet.table, args.run, args.max_spend_usd, raised_by=caller_arn(),
                           now=time.time())  # fmt: skip
    then = "; the next capacity check (within 5 minutes) lets it start again from its head"
    say(f"run {args.run}: cap raised to ${args.max_spend_usd:,.2f} (spent "
         f"${ledger.spend_usd:,.2f}){then if ledger.held else ''}")  # fmt: skip
    return 0


def caller_arn() -> str:
    """Who is asking, for the audit trail ("" when the identity service cannot say)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return str(aws_clients.client("sts").get_caller_identity()["Arn"])
    except (BotoCoreError, ClientError):
        return ""


def _coordinator(fleet: _Fleet, args: argparse.Namespace) -> int:
    """Claim the run's coordinator role (on-demand machines), or find the coordinator (every
    other machine). Prints the rendezvous endpoint, HOST:PORT, alone on its line."""
    from spotrain.core import fleet_state

    if args.release:
        if not args.instance:
            raise SpotrainError("`spotrain fleet coordinator --release` needs --instance "
                                "(this machine's)")  # fmt: skip
        released = fleet_state.release_coordinator(fleet.table, args.run,
                                                   instance_id=args.instance)  # fmt: skip
        say(
            f"run {args.run}: {args.instance} "
            + ("no longer coordinates it" if released else "did not coordinate it")
        )
        return 0
    if args.claim:
        if not (args.instance and args.address and args.port):
            raise SpotrainError("`spotrain fleet coordinator --claim` needs --instance, "
                                "--address and --port (this machine's)")  # fmt: skip
        if not fleet_state.claim_coordinator(
            fleet.table, args.run, instance_id=args.instance, address=args.address, port=args.port
        ):
            print(f"run {args.run}: another machine coordinates it", file=sys.stderr)
            return 4
        say(f"{args.address}:{args.port}")
        return 0
    deadline = time.monotonic() + args.wait
    while True:
        found = fleet_state.coordinator(fleet.table, args.run)
        if found is not None and found.fresh(time.time()):
            _wait_until_it_answers(found, deadline, args.run)
            say(found.endpoint)
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
                            "this region: check --group and AWS_DEFAULT_REGION")  # fmt: skip
    return found


ACTIONS: dict[str, Callable[[_Fleet, argparse.Namespace], int]] = {
    "status": _status, "scale": _scale, "exit": _exit, "may-start": _may_start,
    "reset-crashes": _reset_crashes, "release": _release_spend, "coordinator": _coordinator,
    "unhealthy": _unhealthy,
}  # fmt: skip
NEEDS_THE_RUN = {"exit", "reset-crashes", "may-start", "coordinator", "release"}


def cmd_fleet(args: argparse.Namespace) -> int:
    with aws_errors(
        f"`spotrain fleet {args.action}`",
        "check the --group and --events-table names, AWS_DEFAULT_REGION (the fleet's region) and "
        "your credentials",
    ):
        if args.run is not None:
            run_name(args.run)
        events = args.events_table
        table = aws_clients.resource("dynamodb").Table(events) if events else None
        if args.action in NEEDS_THE_RUN and (table is None or not args.run):
            raise SpotrainError(f"`spotrain fleet {args.action}` needs --events-table and --run")
        return ACTIONS[args.action](_Fleet(aws_clients.client("autoscaling"), table), args)


def add_parsers(commands: Any) -> None:
    fleet = commands.add_parser(
        "fleet",
        help="the run's Auto Scaling groups and fleet state (AWS_DEFAULT_REGION: their region)",
    )
    fleet.add_argument(
        "action",
        choices=list(ACTIONS),
        help="status: groups and the run's state; scale: set one group's desired capacity; "
        "exit: account for a trainer exit (boot service; exit 3 if the run is now held, 5 for "
        "a crash); may-start: exit 3 if the run is held after crashes; reset-crashes: release "
        "a held run (operator credentials: machines cannot); release: raise the run's spend cap "
        "(--max-spend-usd N; operator credentials); coordinator: claim the run's "
        "rendezvous (--claim), give it up (--release) or print where it is (HOST:PORT); "
        "unhealthy: have the group replace --instance (a machine that cannot train)",
    )
    fleet.add_argument("--group", action="append", default=[], help="Auto Scaling group name")
    fleet.add_argument("--desired", type=whole(0), help="desired capacity for `scale`")
    fleet.add_argument("--min-size", type=whole(0),
                       help="scale: the group's new minimum too (AWS refuses a desired "
                       "capacity below the minimum: lower both to stop a group)")  # fmt: skip
    fleet.add_argument("--events-table", help="interruption events table (fleet state)")
    fleet.add_argument("--run", help="run name")
    fleet.add_argument("--instance", help="instance id for `exit`, `unhealthy`, `coordinator`")
    fleet.add_argument(
        "--reason",
        help="unhealthy: why (shown in the boot log); exit: why the "
        "trainer could not train (kept with the crash, shown by run status)",
    )
    fleet.add_argument("--code", type=int, help="trainer exit status for `exit`")
    fleet.add_argument("--spot-notice", metavar="JSON",
                       help="exit: the machine's own interruption notice (the metadata "
                       "service's spot/instance-action): the exit is a preemption")  # fmt: skip
    fleet.add_argument("--asked-to-stop", action="store_true",
                       help="exit: the machine was sent SIGTERM (it is being stopped): "
                       "not a crash, whatever the trainer's status")  # fmt: skip
    fleet.add_argument("--max-spend-usd", type=float,
                       help="release: the run's new spend cap in USD")  # fmt: skip
    fleet.add_argument("--pool", metavar="TYPE#ZONE",
                       help="exit --spot-notice: the machine's capacity pool")  # fmt: skip
    fleet.add_argument("--claim", action="store_true",
                       help="coordinator: take or renew the role for this machine")  # fmt: skip
    fleet.add_argument("--release", action="store_true",
                       help="coordinator: give up the role this machine holds (it is "
                       "leaving): the next on-demand machine takes it at once")  # fmt: skip
    fleet.add_argument("--address", help="coordinator --claim: this machine's private address")
    fleet.add_argument("--port", type=whole(1, 65535), help="coordinator --claim: its port")
    for flag, what in (
        ("--store", "s3://BUCKET"),
        ("--catalog-table", "the catalog table"),
        ("--kms-key-id", "the bucket's key"),
        ("--work-dir", "the trainer's work_dir on this machine (where it restores)"),
    ):
        fleet.add_argument(flag, help=f"may-start: {what}, to carry out a move its region's "
                           "handler ordered (the run's region stopped answering)")  # fmt: skip
    fleet.add_argument("--wait", type=whole(0), default=0,
                       help="coordinator: seconds to wait for one to claim the role and "
                       "answer on its port")  # fmt: skip
    fleet.set_defaults(handler=cmd_fleet)
