"""`spotrain cost status` (a run's spend so far, from its ledger) and `spotrain cost report` (its
spend, goodput, preemptions and checkpoint overhead, after or while it runs)."""

from __future__ import annotations

import argparse
import datetime
from dataclasses import asdict
from pathlib import Path
from typing import Any

from spotrain.cli.arguments import (
    CATALOG_TABLE_FIX,
    EVENTS_TABLE_FIX,
    environment,
    figure_path,
    run_name,
)
from spotrain.cli.output import json_text, say
from spotrain.core.errors import CostInputError, aws_errors


def cmd_status(args: argparse.Namespace) -> int:
    import time

    from spotrain.core import aws_clients, spend_ledger

    run_name(args.run)
    with aws_errors(f"the events table {args.events_table} cannot be read", EVENTS_TABLE_FIX):
        ledger = spend_ledger.read(
            aws_clients.resource("dynamodb").Table(args.events_table), args.run
        )
    if ledger.as_of is None:
        say(
            f"run {args.run}: no spend counted yet (the interruption handler's capacity check "
            "counts it every 5 minutes once the run's machines are up)"
        )
        return 0
    age = time.time() - ledger.as_of
    if args.json:
        say(json_text({"run": args.run, **asdict(ledger), "saved": ledger.saved}))
        return 0
    say(
        f"run {args.run}: ${ledger.spend_usd:,.2f} spent, ${ledger.on_demand_usd:,.2f} on "
        f"on-demand prices ({ledger.saved:.0%} saved), counted to "
        f"{datetime.datetime.fromtimestamp(ledger.as_of, datetime.UTC):%Y-%m-%d %H:%M:%S} UTC "
        f"({age / 60:.0f} min ago)"
    )
    for pool, figures in sorted(ledger.per_pool.items()):
        say(
            f"  {pool:<36} {figures['seconds'] / 3600:8.2f} h  ${figures['spend_usd']:,.2f}  "
            f"(on-demand ${figures['on_demand_usd']:,.2f})"
        )
    if ledger.cap_usd is not None:
        say(
            f"  cap ${ledger.cap_usd:,.2f}: {ledger.spend_usd / ledger.cap_usd:.0%} spent"
            + (
                "; HELD: the run may not start and its groups are at 0 until "
                "`spotrain fleet release --max-spend-usd N`"
                if ledger.held
                else ""
            )
        )
    for region, since in sorted(ledger.behind.items()):
        when = (f"since {datetime.datetime.fromtimestamp(since, datetime.UTC):%Y-%m-%d %H:%M} UTC"
                if since else "ever")  # fmt: skip
        say(f"  NOT COUNTED: {region} has not answered the checks {when}: its machines' time "
            "is counted when it answers again (machines that ended over an hour before then "
            "are no longer listed: their time is lost to the ledger)")  # fmt: skip
    if ledger.unpriced_seconds:
        say(
            f"  WARNING: {ledger.unpriced_seconds / 3600:.2f} machine-hours have no price in "
            "the account's price sources and are not in the dollars"
        )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from spotrain.core import aws_clients, run_epochs, spend_ledger
    from spotrain.cost import run_report

    run_name(args.run)
    figure_path(args.plot)
    # An unknown environment is refused before anything is read.
    regions = environment(args.environment).region_names if args.environment else ()
    dynamodb = aws_clients.resource("dynamodb")
    events = dynamodb.Table(args.events_table)
    with aws_errors(f"the events table {args.events_table} cannot be read", EVENTS_TABLE_FIX):
        ledger = spend_ledger.read(events, args.run)
        points, notices = spend_ledger.read_history(events, args.run)
        interruptions = run_report.read_interruptions(events, args.run)
    checkpoints, head_step, epochs = None, 0, []
    if args.catalog_table:
        with aws_errors(
            f"the catalog table {args.catalog_table} cannot be read", CATALOG_TABLE_FIX
        ):
            catalog = dynamodb.Table(args.catalog_table)
            epochs = run_epochs.read_chain(catalog, args.run)  # its moves, read once
            checkpoints, head_step = run_report.read_checkpoints(catalog, args.run, epochs)
    if ledger.as_of is None and not interruptions and not checkpoints:
        raise CostInputError(
            f"run {args.run!r} left nothing in {args.events_table}"
            + (f" or {args.catalog_table}" if args.catalog_table else "")
            + ": check the run's name (its environment's run_name) and that these are its "
            "environment's tables"
        )
    found = run_report.build(
        args.run, ledger=ledger, points=points, notices=notices, checkpoints=checkpoints,
        head_step=head_step, interruptions=interruptions, epochs=epochs, regions=regions,
    )  # fmt: skip
    say(json_text(found.as_json()) if args.json else run_report.render(found))
    if args.plot:
        run_report.plot(found, Path(args.plot))
        if not args.json:
            say(f"figure: {args.plot}")
    return 0


def add_status_parser(actions: Any) -> None:
    status = actions.add_parser("status", help="a run's spend so far (the spend ledger)")
    status.add_argument("--run", required=True, help="the run")
    status.add_argument(
        "--events-table",
        required=True,
        help="the environment's events table (spotrain-<env>-events)",
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of lines")
    status.set_defaults(handler=cmd_status)


def add_report_parser(actions: Any) -> None:
    summary = actions.add_parser(
        "report", help="a run's spend, goodput, preemptions and checkpoint overhead"
    )
    summary.add_argument("--run", required=True, help="the run")
    summary.add_argument(
        "--events-table",
        required=True,
        help="the environment's events table (spotrain-<env>-events)",
    )
    summary.add_argument(
        "--catalog-table",
        help="its checkpoint table (spotrain-<env>-checkpoints): goodput, preemptions, "
        "checkpoint overhead",
    )
    summary.add_argument(
        "--environment",
        help="the run's environment: prices the replication of its checkpoints to its regions",
    )
    summary.add_argument("--json", action="store_true", help="print JSON instead of lines")
    summary.add_argument(
        "--plot", help="draw spend against on-demand over time, preemptions and notices (PNG)"
    )
    summary.set_defaults(handler=cmd_report)
