"""`spotrain cost simulate --across-regions`: the given traces are one region each (home
first, the same tick); a run may train in any of them, one at a time, a move paying the
changeover and `--move-usd`. Every strategy against the exact optimum across the regions."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

from spotrain.cli.output import json_text, say
from spotrain.cost import across_regions, planner, report, simulation, traces


def add_flags(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--across-regions",
        action="store_true",
        help="the traces are one region each (home first): a run may move between them",
    )
    command.add_argument(
        "--move-usd",
        type=float,
        default=0.0,
        help="with --across-regions: what a move transfers, in USD (default 0)",
    )
    command.add_argument(
        "--region-price",
        action="append",
        type=_price_pair,
        metavar="SPOT,ON_DEMAND",
        help="with --across-regions: one per region after home, in the order of the --traces: "
        "its spot and on-demand USD/h per machine (home's are --spot-price and "
        "--on-demand-price; default: every region at home's)",
    )
    command.add_argument(
        "--history",
        action="append",
        metavar="FILE",
        help="what the environment saw before the runs (a trace, or with --across-regions one "
        "per region, home first): the Markov policy's means; without, it learns them from "
        "each run's checks",
    )


def _price_pair(text: str) -> tuple[float, float]:
    """An argparse type: `SPOT,ON_DEMAND`, two positive finite prices."""
    parts = text.split(",")
    try:
        pair = tuple(float(part) for part in parts)
    except ValueError:
        pair = ()
    if len(pair) != 2 or not all(math.isfinite(p) and p > 0 for p in pair):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a region's prices: give SPOT,ON_DEMAND, two USD/h above 0 "
            "(e.g. 13.23,21.96)"
        )
    return pair[0], pair[1]


def region_prices(args: argparse.Namespace) -> list[tuple[float, float]] | None:
    """Each region's (spot, on-demand) USD/h per machine, home first; None: all at home's."""
    if not args.region_price:
        return None
    return [(args.spot_price, args.on_demand_price), *args.region_price]


def problems(args: argparse.Namespace) -> list[str]:
    """What the flags lack for a replay across regions, all at once."""
    found = []
    if not args.trace or len(args.trace) < 2:
        found.append("give a --trace per region (two or more; home first)")
    if args.deadline_hours is None:
        found.append("give --deadline-hours (the policies across regions keep a deadline)")
    if args.wrap:
        found.append("leave out --wrap (every region's window must fit in its trace)")
    if args.plot:
        found.append("leave out --plot (the figure is drawn for one region)")
    if args.move_usd < 0:
        found.append(f"--move-usd is {args.move_usd:g}: give the move's transfer in USD, 0 or more")
    others = max(0, len(args.trace or []) - 1)
    if args.region_price and len(args.region_price) != others:
        found.append(f"give one --region-price per region after home, in the order of the "
                     f"--traces ({len(args.region_price)} for {others})")  # fmt: skip
    if args.history and len(args.history) != len(args.trace or []):
        found.append(f"give one --history per --trace, in the same order ({len(args.history)} "
                     f"for {len(args.trace or [])})")  # fmt: skip
    return found


def cmd_across(
    args: argparse.Namespace, job: simulation.Job, sampled: list[traces.Trace],
    history: list[traces.Trace] | None,
) -> int:  # fmt: skip
    """The replay of the traces and history `cost simulate` read (`problems` found none)."""
    prices = region_prices(args)
    results = across_regions.replay_across(job, sampled, move_usd=args.move_usd,
                                           starts=args.starts, history=history,
                                           region_prices=prices)  # fmt: skip
    priced = simulation.region_prices(job, len(sampled), prices)
    summary = {name: _summary(outcomes) for name, outcomes in results.items()}
    # Among what the handler runs across regions: outage fill, and Markov for a run planned
    # with the history given (`planner.recommend`).
    recommended, why = planner.recommend(
        [_Compared(name, s["mean_cost"], s["deadline_met"]) for name, s in summary.items()],
        has_deadline=True, plannable=history is not None,
    )  # fmt: skip
    if args.json:
        say(json_text({
            "recommended": {"strategy": recommended, "why": why},
            "regions": [{"trace": t.name, "availability": t.availability(args.nodes),
                         "spot_price": spot, "on_demand_price": on_demand,
                         **({"region": args.region[index], "instance_type": args.instance_type}
                            if args.instance_type else {})}
                        for index, (t, (spot, on_demand)) in enumerate(
                            zip(sampled, priced, strict=True))],
            "move_usd": args.move_usd,
            "strategies": {name: {"summary": summary[name],
                                  "runs": [_run(o) for o in results[name]]}
                           for name in results},
        }))  # fmt: skip
        return 0
    for index, (t, (spot, on_demand)) in enumerate(zip(sampled, priced, strict=True)):
        say(f"region {index}{' (home)' if index == 0 else ''}: {t.name}, spot for "
            f"{args.nodes} machine(s) {t.availability(args.nodes):.0%} of the time, "
            f"${spot:,.2f}/h spot, ${on_demand:,.2f}/h on-demand"
            + (f" ({args.instance_type} in {args.region[index]}, the price book's)"
               if args.instance_type else ""))  # fmt: skip
    say(f"{args.starts} runs per strategy of {args.work_hours:g} h by {args.deadline_hours:g} h, "
        f"a move ${args.move_usd:,.2f} and a changeover")  # fmt: skip
    say(f"{'strategy':<18} {'cost':>11} {'deadline':>9} {'moves':>6} {'vs optimum':>16}")
    for name, s in summary.items():
        ratio = report.versus(s["mean_vs_optimum"], s["worst_vs_optimum"])
        say(f"{name:<18} {'$' + format(s['mean_cost'], ',.2f'):>11} {s['deadline_met']:>9.0%} "
            f"{s['mean_moves']:>6.1f} {ratio:>16}")  # fmt: skip
    say(
        "vs optimum: the mean (worst) of each run's cost over the cheapest schedule across the "
        "regions that meets the deadline from the same start, known in advance"
    )
    say(f"\nrecommended over these traces: {recommended}: {why}")
    return 0


@dataclass(frozen=True)
class _Compared:
    """A strategy's runs as `planner.recommend` weighs them."""

    strategy: str
    mean_cost: float
    deadline_met: float
    mean_finish_h: float = math.nan
    """Not weighed: a replay across regions always has a deadline."""


def _run(o: across_regions.RegionsOutcome) -> dict[str, Any]:
    return {"cost": o.cost, "finish_hours": o.finish_h if o.deadline_met else None,
            "deadline_met": o.deadline_met, "moves": o.moves, "spot_hours": o.spot_hours,
            "on_demand_hours": o.on_demand_hours, "optimum_cost": o.optimum_cost,
            "vs_optimum": o.vs_optimum}  # fmt: skip


def _summary(outcomes: list[across_regions.RegionsOutcome]) -> dict[str, Any]:
    count = len(outcomes)
    mean_vs, worst_vs = simulation.mean_and_worst([o.vs_optimum for o in outcomes])
    return {
        "runs": count,
        "mean_cost": sum(o.cost for o in outcomes) / count,
        "deadline_met": sum(o.deadline_met for o in outcomes) / count,
        "mean_moves": sum(o.moves for o in outcomes) / count,
        "mean_vs_optimum": mean_vs,
        "worst_vs_optimum": worst_vs,
    }
