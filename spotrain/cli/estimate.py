"""`spotrain cost estimate ENV`: each run of an environment, priced by the planner, against a
base branch's (the section each pull request's plan comment carries)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from spotrain.cli.arguments import environment
from spotrain.cli.output import json_text, say
from spotrain.core import prices
from spotrain.core.errors import ConfigError, CostInputError
from spotrain.stacks.runs import load_runs


def cmd_estimate(args: argparse.Namespace) -> int:
    from spotrain.cost import estimate

    book = prices.load(args.price_book) if args.price_book else prices.load()
    config = environment(args.environment)
    theirs: dict[str, Any] | None = None
    base_note = ""
    if args.base:
        try:
            theirs = runs_at(Path(args.base), args.environment)
        except CostInputError as error:
            base_note = str(error)
    sections, documents = [], []
    for run in load_runs(args.environment):
        head = estimate.estimate(config, run, book)
        base, note = None, base_note
        if theirs is not None:
            if run.name in theirs:
                base = estimate.estimate(config, theirs[run.name], book)
            else:
                note = f"the base has no run {run.name!r} (it is new)."
        sections.append(estimate.markdown(head, base, base_note=note, run=run.name))
        documents.append({
            "run": run.name, "head": head.as_json() if head else None,
            "base": base.as_json() if base else None, "base_note": note,
        })  # fmt: skip
    if not sections:
        sections.append(f"#### Run estimate\nEnvironment {args.environment} declares no runs "
                        f"(runs/{args.environment}/): nothing to price.")  # fmt: skip
    sections.append(estimate.standing_markdown(config))
    standing = [{"region": r.region, "home": r.home, "interface_endpoints": r.endpoints,
                 "usd_per_hour": round(r.usd_per_hour, 4)}
                for r in estimate.standing(config)]  # fmt: skip
    say(json_text({"runs": documents, "standing": standing}) if args.json
        else "\n\n".join(sections))  # fmt: skip
    return 0


def runs_at(checkout: Path, environment: str) -> dict[str, Any]:
    """The runs another checkout (a pull request's base branch) declares for `environment`,
    read with this version's run files reader."""
    if not Path(checkout).is_dir():
        raise CostInputError(f"{checkout} does not exist: give the root of a spotrain checkout")
    try:
        return {r.name: r for r in load_runs(environment, Path(checkout) / "runs")}
    except ConfigError as error:
        raise CostInputError(
            f"the runs at {checkout} cannot be read by this version ({error.problems[0]}): "
            "the estimate shows this side alone"
        ) from None


def add_parser(actions: Any) -> None:
    forecast = actions.add_parser(
        "estimate",
        help="each run of an environment, priced (the pull-request plan comment's section)",
    )
    forecast.add_argument("environment", help="the environment whose runs to price")
    forecast.add_argument(
        "--base", help="a checkout of the base branch: show the change against its runs"
    )
    forecast.add_argument("--price-book", help="instead of the checked-in snapshot")
    forecast.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    forecast.set_defaults(handler=cmd_estimate)
