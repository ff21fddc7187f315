"""`spotrain cost estimate ENV`: an environment's planned run, priced by the planner, against a
base branch's (the section each pull request's plan comment carries)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from spotrain.cli.arguments import environment
from spotrain.cli.output import json_text, say
from spotrain.core import prices
from spotrain.core.errors import CostInputError


def cmd_estimate(args: argparse.Namespace) -> int:
    from spotrain.cost import estimate

    book = prices.load(args.price_book) if args.price_book else prices.load()
    head = estimate.estimate(environment(args.environment), book)
    base, base_note = None, ""
    if args.base:
        try:
            theirs = estimate.environments_at(Path(args.base))
        except CostInputError as error:
            base_note = str(error)
        else:
            if args.environment in theirs:
                base = estimate.estimate(theirs[args.environment], book)
            else:
                base_note = f"the base has no environment {args.environment!r}."
    if args.json:
        say(json_text({
            "head": head.as_json() if head else None,
            "base": base.as_json() if base else None, "base_note": base_note,
        }))  # fmt: skip
    else:
        say(estimate.markdown(head, base, base_note=base_note))
    return 0


def add_parser(actions: Any) -> None:
    forecast = actions.add_parser(
        "estimate",
        help="an environment's planned run, priced (the pull-request plan comment's section)",
    )
    forecast.add_argument("environment", help="the environment whose planned_run to price")
    forecast.add_argument(
        "--base", help="a checkout of the base branch: show the change against its environment"
    )
    forecast.add_argument("--price-book", help="instead of the checked-in snapshot")
    forecast.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    forecast.set_defaults(handler=cmd_estimate)
