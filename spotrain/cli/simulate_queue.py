"""`spotrain cost queue`: replay a queue of runs (teams, priorities, a vCPU ceiling) against a
capacity trace with the queue's own decision, and report each run's wait and cost, per team
and per priority, and how much of what was paid for trained."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from spotrain.cli.arguments import number
from spotrain.cli.output import json_text, say
from spotrain.core import prices
from spotrain.cost import queue_replay, traces


def cmd_queue(args: argparse.Namespace) -> int:
    setup = queue_replay.load(args.queue_file)
    market = traces.load(args.trace) if args.trace else None
    book = prices.load(args.price_book) if args.price_book else None
    outcome = queue_replay.replay(setup, market, hours=args.hours, gap_s=args.gap_seconds,
                                  book=book)  # fmt: skip
    if args.json:
        say(json_text(_document(outcome)))
        return 0
    say(f"{'run':<16} {'team':<10} {'prio':>4} {'submitted':>9} {'started':>8} {'finished':>8} "
        f"{'waited':>7} {'preempted':>9} {'reclaimed':>9} {'cost':>11}")  # fmt: skip
    for run in outcome.runs:
        say(f"{run.name:<16} {run.team or '-':<10} {run.priority:>4} {run.submitted_h:>8.1f}h "
            f"{_hour(run.started_h):>8} {_hour(run.finished_h):>8} {run.waited_h:>6.1f}h "
            f"{run.preemptions:>9} {run.reclaims:>9} {f'${run.cost_usd:,.2f}':>11}")  # fmt: skip
    for key, label in (("priority", "priority"), ("team", "team")):
        for value, figures in outcome.by(key).items():
            say(f"{label} {value if value != '' else '-'}: {figures['finished']:.0f} of "
                f"{figures['runs']:.0f} finished, waited {figures['mean_wait_h']:.1f} h on "
                f"average (longest {figures['longest_wait_h']:.1f} h), "
                f"${figures['cost_usd']:,.2f}")  # fmt: skip
    held = sum(r.held_machine_h for r in outcome.runs)
    offered = outcome.machine_h_available
    used = f" of the {offered:,.0f} the market offered" if offered else ""
    say(f"over {outcome.hours:.1f} h: {held:,.1f} machine-hours paid for{used}, "
        f"{outcome.training_share:.0%} of them training (the rest: changeovers)")  # fmt: skip
    return 0


def _hour(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}h"


def _document(outcome: queue_replay.QueueOutcome) -> dict[str, Any]:
    return {"hours": outcome.hours, "runs": [asdict(r) for r in outcome.runs],
            "by_priority": {str(k): v for k, v in outcome.by("priority").items()},
            "by_team": outcome.by("team"), "training_share": outcome.training_share,
            "machine_h_available": outcome.machine_h_available}  # fmt: skip


def add_parser(actions: Any) -> None:
    queue = actions.add_parser(
        "queue", help="replay a queue of runs (teams, priorities, a ceiling) on a capacity trace"
    )
    queue.add_argument("queue_file", help="the queue: region, ceilings, teams and runs (TOML)")
    queue.add_argument("--trace", help="spot machines available per tick (Can't Be Late JSON); "
                       "without one the market never runs out")  # fmt: skip
    queue.add_argument("--hours", type=number(), help="replay this long (default: the "
                       "trace's length, else until every run finishes)")  # fmt: skip
    queue.add_argument("--gap-seconds", type=number(), default=600.0,
                       help="tick without a trace (default 600)")  # fmt: skip
    queue.add_argument("--price-book", help="instead of the checked-in snapshot")
    queue.add_argument("--json", action="store_true", help="print JSON")
    queue.set_defaults(handler=cmd_queue)
