"""`spotrain local up|down|status|fault` (the local cloud) and `spotrain rehearse` (the whole
story on it)."""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path
from typing import Any

from spotrain.cli.arguments import raise_all, whole
from spotrain.cli.output import say
from spotrain.core.errors import SpotrainError
from spotrain.core.gpu_types import INSTANCE_QUOTAS
from spotrain.core.handler_settings import CAPACITY_CHECK_MINUTES
from spotrain.localcloud import control, faults


def cmd_local(args: argparse.Namespace) -> int:
    if args.action == "up":
        cloud = control.up(port=args.port, schedule_speedup=args.schedule_speedup)
        control.set_schedule_speedup(args.schedule_speedup)  # a running cloud changes pace
        pace = ("keeps no time (schedules do not run)" if args.schedule_speedup == 0 else
                f"runs schedules at {args.schedule_speedup:g}x AWS's pace (the handler's "
                f"capacity check every {60 * CAPACITY_CHECK_MINUTES / args.schedule_speedup:g} "
                "s)")  # fmt: skip
        say(
            f"local cloud running at {cloud.endpoint} (pid {cloud.pid}, log {cloud.log}); it {pace}"
        )
        say("point a shell at it with `eval \"$(spotrain local env)\"`, which runs:\n"
            f"{control.shell_exports(cloud.endpoint)}")  # fmt: skip
    elif args.action == "down":
        say("local cloud stopped" if control.down() else "local cloud was not running")
    elif args.action == "fault":
        changes = _fault_changes(args.fault)  # a mistake is named before anything else
        control.require()
        say(_describe_faults(control.set_faults(**changes)))
    else:
        cloud = control.status()
        if cloud is None:
            say("local cloud is not running (start it with `spotrain local up`)")
            return 1
        if args.action == "env":  # for eval: the exports alone
            print(control.shell_exports(cloud.endpoint))
            return 0
        say(f"local cloud running at {cloud.endpoint} (pid {cloud.pid})")
    return 0


FAULT_USAGE = (
    "name a fault: region-down REGION, region-up REGION, partition REGION, rejoin REGION, "
    "table-lag SECONDS, replication-pending BUCKET/KEY-PATTERN, replication-resumed, "
    "unavailable BUCKET/KEY-PATTERN REQUESTS, spot-gone REGION [TYPE-PATTERN], spot-back "
    "REGION [TYPE-PATTERN], quota REGION QUOTA-KEY VCPUS, or clear"
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
        case ["partition", region]:
            return {"regions_partitioned": [*current.regions_partitioned, _region(region)]}
        case ["rejoin", region]:
            return {"regions_partitioned": [r for r in current.regions_partitioned
                                            if r != _region(region)]}  # fmt: skip
        case ["table-lag", seconds]:
            return {"table_replication_lag_seconds": _seconds(seconds)}
        case ["replication-pending", pattern]:
            return {"replication_pending": [*current.replication_pending, _object_pattern(pattern)]}
        case ["replication-resumed"]:
            return {"replication_pending": []}
        case ["unavailable", pattern, requests]:
            entry = {"id": uuid.uuid4().hex, "pattern": _object_pattern(pattern),
                     "requests": _positive_int(requests, "REQUESTS")}  # fmt: skip
            return {"unavailable": [*current.unavailable, entry]}
        case ["spot-gone", region, *types] if len(types) <= 1:
            pool = f"{_region(region)}/{types[0] if types else '*'}"
            return {"spot_capacity_gone": [*current.spot_capacity_gone, pool]}
        case ["spot-back", region, *types] if len(types) <= 1:
            pool = f"{_region(region)}/{types[0] if types else '*'}"
            return {"spot_capacity_gone": [p for p in current.spot_capacity_gone if p != pool]}
        case ["quota", region, key, vcpus]:
            return {"vcpu_quotas": {**current.vcpu_quotas, **_quota(region, key, vcpus)}}
        case ["clear"]:  # every fault, and the quotas set back to the account's defaults
            return {"regions_down": [], "regions_partitioned": [],
                    "table_replication_lag_seconds": 0.0, "replication_pending": [],
                    "unavailable": [], "spot_capacity_gone": [], "vcpu_quotas": {}}  # fmt: skip
    raise SpotrainError(f"`spotrain local fault {' '.join(words)}`: {FAULT_USAGE}")


def _quota(region: str, key: str, vcpus: str) -> dict[str, int]:
    """`quota REGION QUOTA-KEY VCPUS` as the faults keep it; every problem of the three at
    once."""
    problems = []
    try:
        _region(region)
    except SpotrainError as error:
        problems.append(str(error))
    if key not in INSTANCE_QUOTAS:
        problems.append(f"{key!r} is not a GPU quota: use one of "
                        f"{', '.join(sorted(INSTANCE_QUOTAS))}")  # fmt: skip
    if not vcpus.isdigit():
        problems.append(f"VCPUS is {vcpus!r}: give a whole number of vCPUs, 0 or more")
    raise_all(problems, "`spotrain local fault quota`")
    return {f"{region}/{key}": int(vcpus)}


def _describe_faults(current: faults.Faults) -> str:
    unavailable = ", ".join(f"{u['pattern']} (next {u['requests']} requests)"
                            for u in current.unavailable)  # fmt: skip
    return (
        f"regions down: {', '.join(current.regions_down) or 'none'}; partitioned: "
        f"{', '.join(current.regions_partitioned) or 'none'}; table replication lag: "
        f"{current.table_replication_lag_seconds:g} s; replication pending for: "
        f"{', '.join(current.replication_pending) or 'nothing'}; unavailable: "
        f"{unavailable or 'nothing'}; spot capacity gone: "
        f"{', '.join(current.spot_capacity_gone) or 'none'}; GPU quotas set: "
        f"{', '.join(f'{k} {v} vCPUs' for k, v in current.vcpu_quotas.items()) or 'none'}"
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise SpotrainError(f"SECONDS is {text!r}: give a number from 0 to 3600")
    return value


def _positive_int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise SpotrainError(f"{what} is {text!r}: give a whole number of 1 or more")
    return value


def cmd_rehearse(args: argparse.Namespace) -> int:
    import shutil

    from spotrain.tools.fleet_rehearsal import FleetRehearsal
    from spotrain.tools.rehearsal import Rehearsal

    work = control.state_dir().parent / ("fleet-rehearsal" if args.fleet else "rehearsal")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    began = time.monotonic()
    price_book = None
    if args.price_book:
        from spotrain.core import prices

        price_book = Path(args.price_book)
        prices.load(price_book)  # a book that cannot be read is refused before anything starts
    rehearsal = FleetRehearsal if args.fleet else Rehearsal
    report = rehearsal(work, say=say, price_book=price_book).run(
        keep_cloud=args.keep_cloud, port=args.port
    )
    say(f"\n{report.render()}\n")
    say(
        f"{'fleet ' if args.fleet else ''}rehearsal {'passed' if report.passed else 'FAILED'} in "
        f"{time.monotonic() - began:.0f} s (logs and configurations: {work})"
    )
    cloud = control.status() if args.keep_cloud else None
    if cloud is not None:
        say("\nthe local cloud is still running with the environment deployed; point a shell at "
            f"it with `eval \"$(spotrain local env)\"`, which runs:\n"
            f"{control.shell_exports(cloud.endpoint)}\n"
            "then e.g. `spotrain run list local`; `spotrain local down` stops it")  # fmt: skip
    return 0 if report.passed else 1


def _speedup(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number, 0 or more (1 is AWS's pace)")
    return value


def add_parsers(commands: Any) -> None:
    local = commands.add_parser("local", help="start, stop or inspect the local cloud")
    local.add_argument(
        "action",
        choices=["up", "down", "status", "env", "fault"],
        help="what to do (`env`: the exports that point a shell at it, for "
        '`eval "$(spotrain local env)"`; `fault`: see below)',
    )
    local.add_argument(
        "fault",
        nargs="*",
        metavar="FAULT",
        help="with `fault`: region-down REGION | region-up REGION | partition REGION (it "
        "serves its clients, replicates nothing) | rejoin REGION | table-lag SECONDS (global "
        "tables' replication lag) | replication-pending BUCKET/KEY-PATTERN | replication-resumed "
        "| unavailable BUCKET/KEY-PATTERN REQUESTS (the next REQUESTS requests for those objects "
        "get 503) | spot-gone REGION [TYPE-PATTERN] (no spot machine of those types launches) | "
        "spot-back REGION [TYPE-PATTERN] | quota REGION QUOTA-KEY VCPUS (the account's GPU "
        "quota, e.g. spot/P5) | clear",
    )
    local.add_argument(
        "--port",
        type=whole(0, 65535),
        default=control.DEFAULT_PORT,
        help="loopback port for `up` (0 picks a free one)",
    )
    local.add_argument(
        "--schedule-speedup",
        type=_speedup,
        default=1.0,
        metavar="N",
        help="with `up`: run EventBridge schedules N times faster than AWS (default 1, AWS's "
        "pace; 60 runs the 5-minute capacity check every 5 s; 0 runs none)",
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
    rehearse.add_argument("--keep-cloud", action="store_true",
                          help="leave the local cloud running afterwards")  # fmt: skip
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
