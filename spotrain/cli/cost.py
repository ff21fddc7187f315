"""`spotrain cost plan|simulate|queue|status|estimate|report`: what a run will cost, what it costs,
what it cost. Each subcommand lives in its own module and registers its own parser here."""

from __future__ import annotations

from typing import Any

from spotrain.cli import estimate, plan, simulate, simulate_queue, spend


def add_parsers(commands: Any) -> None:
    cost = commands.add_parser("cost", help="what a run will cost: plan one, or replay traces")
    actions = cost.add_subparsers(dest="cost_action", required=True)
    plan.add_parser(actions)
    simulate.add_parser(actions)
    simulate_queue.add_parser(actions)
    spend.add_status_parser(actions)
    estimate.add_parser(actions)
    spend.add_report_parser(actions)
