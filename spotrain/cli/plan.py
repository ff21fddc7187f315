"""`spotrain cost plan`: a run's cost per strategy before it starts, and how often it should
checkpoint."""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from spotrain.cli.arguments import (
    MAX_REPLAYS,
    environment,
    figure_path,
    finite,
    number,
    run_name,
)
from spotrain.cli.output import json_text, say
from spotrain.cli.plan_inputs import (
    DEFAULT_ENVIRONMENT,
    Pool,
    declared_fleet,
    plan_inputs,
    pools,
    problems_of,
    raise_all,
    run_inputs,
)
from spotrain.cli.simulate import common_flags
from spotrain.core import prices
from spotrain.core.errors import CostInputError, SpotrainError
from spotrain.cost import planner, regions_price, report, simulation

Plans = list[tuple[Pool, planner.Plan]]


def cmd_plan(args: argparse.Namespace) -> int:
    if args.run is not None:
        run_name(args.run)
    args.nodes_from = declared_fleet(args)
    _check_plan_flags(args)
    problems: list[str] = []
    try:
        run = run_inputs(args)
    except SpotrainError as error:
        problems += problems_of(error)
    else:
        if args.deadline_hours is not None and args.deadline_hours < run["work_h"]:
            problems.append(f"the deadline ({args.deadline_hours:g} h) is shorter than the work "
                            f"({run['work_h']:g} h on {args.nodes} machine(s)): move the "
                            "deadline or add machines")  # fmt: skip
    left_out: list[str] = []
    try:
        found_pools, left_out = pools(args)
    except SpotrainError as error:
        problems += problems_of(error)
    raise_all(problems)
    plans = [
        (pool, planner.plan(plan_inputs(args, run, pool, args.deadline_hours, args.samples)))
        for pool in found_pools
    ]
    best_pool, best = min(
        plans,
        key=lambda p: (
            -min(1.0, max(s.deadline_met for s in p[1].summaries)),
            next(s.mean_cost for s in p[1].summaries if s.strategy == p[1].recommended),
        ),
    )
    regions = _regions(args, run, best_pool, best)
    if args.json:
        document = _plan_document(args, run, plans, best_pool, best)
        say(json_text({**document, "regions": asdict(regions) if regions else None,
                       "not_priced": left_out}))  # fmt: skip
    else:
        _say_plans(args, plans, best_pool, best)
        for reason in left_out:
            say(f"not priced (another region of the environment): {reason}")
        for line in regions_price.describe(regions, _gang(args, best_pool)) if regions else []:
            say(line)
    if args.plot:
        _plan_figure(args, run, best_pool, best)
    return 0


def _regions(
    args: argparse.Namespace, run: dict[str, Any], best_pool: Pool, best: planner.Plan
) -> regions_price.RegionsPrice | None:
    """What the environment's other regions add to the run (None: it has one region)."""
    config = environment(args.environment or DEFAULT_ENVIRONMENT)
    if not config.replica_regions:
        return None
    sent = (run["measured"] or {}).get("checkpoint_bytes")
    return regions_price.regions_price(
        config.primary_region, config.replica_regions, work_h=run["work_h"],
        interval_s=best.used_interval_s, changeover_h=best.changeover_h,
        checkpoint_gb=args.checkpoint_gb if args.checkpoint_gb is not None
        else sent / 1e9 if sent is not None else None,
        gang_usd_per_h=best_pool.spot_price * args.nodes,
        given_usd_per_gb=args.transfer_usd_per_gb, dataset_gb=args.dataset_gb,
    )  # fmt: skip


def _gang(args: argparse.Namespace, pool: Pool) -> str:
    return f"{args.nodes} machine(s) at {pool.label}'s spot price"


def _check_plan_flags(args: argparse.Namespace) -> None:
    if args.nodes < 1:
        raise CostInputError(f"--nodes is {args.nodes}: a run has at least one machine")
    if args.deadline_hours is not None and not 0 < args.deadline_hours < math.inf:
        raise CostInputError(f"--deadline-hours is {args.deadline_hours}: give a positive number")
    finite("--restart-minutes", args.restart_minutes, unit="minutes", zero=True,
           error=CostInputError)  # fmt: skip
    figure_path(args.plot)


def _plan_document(
    args: argparse.Namespace, run: dict[str, Any], plans: Plans, best_pool: Pool,
    best: planner.Plan,
) -> dict[str, Any]:  # fmt: skip
    return {
        "work_hours": run["work_h"],
        "done_steps": run["done_steps"],
        "measured": run["measured"],
        "nodes": args.nodes,
        "nodes_from": args.nodes_from,
        "deadline_hours": args.deadline_hours,
        "pools": [
            {
                "pool": pool.label,
                "on_demand_price": pool.on_demand_price,
                "spot_price": pool.spot_price,
                "interruptions_per_hour": pool.rate,
                "rate_source": pool.rate_source,
                "notes": list(pool.notes),
                "mtbf_hours": p.mtbf_h,
                "checkpoint_interval_s": p.interval_s,
                "checkpoint_interval_steps": p.interval_steps,
                "changeover_hours": p.changeover_h,
                "warnings": p.warnings,
                "recommended": p.recommended,
                "why": p.why,
                "strategies": [asdict(s) for s in p.summaries],
            }
            for pool, p in plans
        ],
        "recommended": {"pool": best_pool.label, "strategy": best.recommended},
    }


def _say_plans(args: argparse.Namespace, plans: Plans, best_pool: Pool, best: planner.Plan) -> None:
    for pool, p in plans:
        say(
            f"\n{pool.label}: on-demand ${pool.on_demand_price:.4f}/h, spot "
            f"${pool.spot_price:.4f}/h, {pool.rate:.4g} interruptions/h per instance "
            f"({pool.rate_source}); gang MTBF {_hours(p.mtbf_h)}"
        )
        for note in pool.notes:
            say(f"  WARNING: {note}")
        interval = (
            "none needed (no interruptions expected)"
            if math.isinf(p.interval_s)
            else f"{p.interval_s / 60:.1f} min"
            + (f" = {p.interval_steps} steps" if p.interval_steps else "")
        )
        say(f"  checkpoint every {interval} (Young/Daly); changeover {p.changeover_h:.2f} h")
        for warning in p.warnings:
            say(f"  WARNING: {warning}")
        say(report.table(p.summaries, recommended=p.recommended))
    say(
        f"\nrecommended: {best.recommended} on {best_pool.label}: {best.why} "
        f"({args.samples} sampled interruption traces, seed {args.seed}; {args.nodes} "
        f"machine(s): {args.nodes_from})"
    )


def _plan_figure(
    args: argparse.Namespace, run: dict[str, Any], best_pool: Pool, best: planner.Plan
) -> None:
    def at(slack: float) -> list[simulation.Summary]:
        # The work as the run does it (checkpoint stalls included) x (1 + slack), + a start.
        stalls = 1 + run["checkpoint_s"] / best.used_interval_s
        deadline = run["work_h"] * stalls * (1 + slack) + best.changeover_h
        return planner.plan(
            plan_inputs(args, run, best_pool, deadline, max(20, args.samples // 4))
        ).summaries

    stalls = 1 + run["checkpoint_s"] / best.used_interval_s
    given = args.deadline_hours
    report.plot(
        report.sweep(at),
        Path(args.plot),
        f"{best_pool.label}, {run['work_h']:.1f} h of work on {args.nodes} machine(s)",
        deadline_slack=(given - best.changeover_h) / (run["work_h"] * stalls) - 1
        if given is not None else None,
        deadline_label=f"{given:g} h" if given is not None else "",
    )  # fmt: skip
    say(f"figure: {args.plot}")


def _hours(value: float) -> str:
    return f"{value:,.1f} h" if math.isfinite(value) else "none expected"


def add_parser(actions: Any) -> None:
    plan = _add_work_arguments(actions)
    _add_pool_arguments(plan)


def _add_work_arguments(actions: Any) -> argparse.ArgumentParser:
    plan = actions.add_parser("plan", help="expected cost per strategy, checkpoint interval")
    work = plan.add_argument_group("the work")
    work.add_argument("--work-hours", type=float, help="hours of the gang's compute")
    work.add_argument("--steps", type=number(int), help="training steps (x the step time)")
    work.add_argument("--step-seconds", type=number(), help="seconds per step")
    work.add_argument(
        "--config", help="training configuration: steps, checkpoint_every, metrics_file"
    )
    work.add_argument("--metrics", help="a run's metrics file: step time, checkpoint cost")
    work.add_argument("--catalog-table", help="the checkpoint catalog: the run's pace, work left")
    work.add_argument("--run", help="the run: its machines and instance types when "
                      "--environment declares it; its pace from --catalog-table")  # fmt: skip
    work.add_argument(
        "--checkpoint-seconds",
        type=number(),
        help="seconds of training a checkpoint costs (delta: its stall and the steps slowed "
        "beside its publish; a --metrics file measures it)",
    )
    work.add_argument(
        "--checkpoint-every",
        type=number(int),
        help="the run's checkpoint interval in steps (checked)",
    )
    work.add_argument("--nodes", type=int, help="machines in the gang (default: the run's "
                      "desired_size, as the environment declares it)")  # fmt: skip
    work.add_argument("--deadline-hours", type=float, help="hours from the start")
    work.add_argument(
        "--restart-minutes",
        type=float,
        default=5.0,
        help="restart + restore after a move (default 5)",
    )
    return plan


def _add_pool_arguments(plan: argparse.ArgumentParser) -> None:
    pools = plan.add_argument_group("where and at what price")
    pools.add_argument(
        "--environment",
        help="instance types and regions of this environment (default: local), and "
        "the machines its run starts with",
    )
    pools.add_argument("--instance-type", action="append", help="instead of the environment's")
    pools.add_argument("--region", action="append",
                       help="instead of every region of the environment")  # fmt: skip
    pools.add_argument(
        "--checkpoint-gb", type=number(),
        help="new bytes a checkpoint sends, in GB (default: a --metrics file's): what "
             "replication copies to every other region")  # fmt: skip
    pools.add_argument(
        "--dataset-gb", type=number(),
        help="the run's dataset, in GB (`spotrain data prepare` says what it stored): what "
             "replication copied once to every other region")  # fmt: skip
    pools.add_argument(
        "--transfer-usd-per-gb",
        type=number(),
        help="USD per GB sent between the environment's regions, instead of AWS's rate",
    )
    pools.add_argument("--on-demand-price", type=number(), help="USD/h, instead of the book")
    pools.add_argument("--spot-price", type=number(), help="USD/h, instead of the book")
    pools.add_argument(
        "--interruptions-per-hour", type=float, help="per instance, instead of the Advisor band"
    )
    pools.add_argument(
        "--events-table", help="the environment's events table: the run's own interruption rates"
    )
    pools.add_argument(
        "--recovery-hours",
        type=number(),
        default=1.0,
        help="how long spot stays gone once taken (default 1)",
    )
    common_flags(plan)
    plan.add_argument("--price-book", help="instead of the checked-in snapshot")
    plan.add_argument(
        "--stale-after-days",
        type=number(int),
        default=prices.DEFAULT_STALE_AFTER_DAYS,
        help="flag prices older than this (default 30)",
    )
    plan.add_argument(
        "--samples",
        type=number(int, maximum=MAX_REPLAYS),
        default=200,
        help="sampled interruption traces (default 200)",
    )
    plan.set_defaults(handler=cmd_plan)
