"""What a plan is given, gathered and checked: the work (flags, the training configuration,
its metrics file, the run's catalog), and the pools it may run in with their prices (flags or
the price book) and interruption rates (flags, the run's own events, the Advisor's band)."""

from __future__ import annotations

import argparse
import datetime
import math
from dataclasses import asdict, dataclass
from typing import Any

from spotrain.cli.arguments import (
    CATALOG_TABLE_FIX,
    EVENTS_TABLE_FIX,
    environment,
    finite,
    raise_all,
)
from spotrain.core import prices
from spotrain.core.errors import (
    CostInputError,
    SpotrainError,
    aws_errors,
    json_kind,
    read_json,
)
from spotrain.cost import planner

DEFAULT_ENVIRONMENT = "local"
"""Whose instance types and region a plan prices when given no --environment."""


@dataclass(frozen=True)
class Pool:
    label: str
    on_demand_price: float
    spot_price: float
    rate: float
    rate_source: str
    notes: tuple[str, ...] = ()


def pools(args: argparse.Namespace) -> tuple[list[Pool], list[str]]:
    """The pools the plan prices, and those it leaves out with why: every instance type in
    the `--region`s given, else in every region of the environment (a run may move to any);
    a pool of a region given, or of home, that cannot be priced is a problem, one of another
    region is left out."""
    explicit_rate = args.interruptions_per_hour
    given = _given_prices(args)
    if all(given) and not args.instance_type:
        if explicit_rate is None:
            raise CostInputError(
                "no interruption rate for given prices: add --interruptions-per-hour (per instance)"
            )
        given_pool = Pool("given prices", args.on_demand_price, args.spot_price, explicit_rate,
                          "--interruptions-per-hour")  # fmt: skip
        return [given_pool], []
    config = environment(args.environment or DEFAULT_ENVIRONMENT)
    types = args.instance_type or getattr(args, "run_types", None) or _declared_types(config.name)
    regions = args.region or list(config.region_names)
    book = prices.load(args.price_book) if args.price_book else prices.load()
    history = _history(args.events_table) if args.events_table else {}
    found_pools, problems, no_rate, left_out = [], [], [], []

    def required(region: str) -> bool:
        return bool(args.region) or region == config.primary_region

    for region in regions:
        for instance_type in types:
            # Prices given on the command line need nothing from the book but its Advisor band.
            try:
                found = None if all(given) else book.pool(instance_type, region)
            except CostInputError as error:
                (problems if required(region) else left_out).append(str(error))
                continue
            advisor = book.advisor_for(instance_type, region)
            notes = []
            stale = found and prices.staleness(found, today(), args.stale_after_days)
            if stale:
                notes.append(stale)
            rated = _rate(explicit_rate, history.get((instance_type, region)), advisor,
                          args.events_table)  # fmt: skip
            if rated is None:
                if required(region):
                    no_rate.append(f"{instance_type} in {region}")
                else:
                    left_out.append(f"no interruption rate for {instance_type} in {region}: "
                                    "the price book has no Advisor band for it")  # fmt: skip
                continue
            rate, source = rated
            on_demand = args.on_demand_price or (found and found.on_demand.usd_per_hour) or 0.0
            spot = args.spot_price or (found and found.spot_price) or 0.0
            found_pools.append(
                Pool(f"{instance_type} {region}", on_demand, spot, rate, source, tuple(notes))
            )
    if no_rate:
        them = "them" if len(no_rate) > 1 else "it"
        problems.append(f"no interruption rate for {', '.join(no_rate)}: the price book has "
                        f"no Advisor band for {them}; {RATE_FIX}")  # fmt: skip
    raise_all(problems)
    return found_pools, left_out


RATE_FIX = (
    "give --interruptions-per-hour (per instance), --events-table (the rates the "
    "environment saw), or fill the book's bands with `spotrain prices advisor`"
)


def _given_prices(args: argparse.Namespace) -> tuple[bool, bool]:
    """Which prices the command line gives (both or neither), its rate checked."""
    finite("--interruptions-per-hour", args.interruptions_per_hour,
           unit="interruptions per instance-hour", zero=True, error=CostInputError)  # fmt: skip
    given = args.on_demand_price is not None, args.spot_price is not None
    if any(given) and not all(given):
        raise CostInputError(
            "give both --on-demand-price and --spot-price, or neither (the "
            "price book then prices each instance type)"
        )
    return given


def _rate(
    explicit: float | None, seen: float | None, advisor: prices.Figure | None, events: str | None
) -> tuple[float, str] | None:  # fmt: skip
    """A pool's interruption rate and where it came from: the flag, the run's own
    interruptions, the Advisor's band; None when there is none."""
    if explicit is not None:
        return explicit, "--interruptions-per-hour"
    if seen is not None:
        return seen, f"the run's own interruptions ({events})"
    if advisor is not None and advisor.band:
        return (planner.advisor_rate_per_hour(advisor.band),
                f"Spot Instance Advisor {advisor.band} ({advisor.taken_at})")  # fmt: skip
    return None


def problems_of(error: SpotrainError) -> list[str]:
    """Each problem `error` names (a configuration's, several trace files'), or its message."""
    problems = getattr(error, "problems", None)
    return list(problems) if problems else [str(error)]


def _history(table_name: str) -> dict[tuple[str, str], float]:
    """Interruption rates per (type, region) from the environment's events table."""
    import time

    from spotrain.core import aws_clients

    table = aws_clients.resource("dynamodb").Table(table_name)
    scan: dict[str, Any] = {
        "ProjectionExpression": "#k, #p, #t",
        "ExpressionAttributeNames": {"#k": "kind", "#p": "pool", "#t": "occurred_at"},
    }
    items: list[dict[str, Any]] = []
    with aws_errors(f"the events table {table_name} cannot be read", EVENTS_TABLE_FIX):
        while True:
            page = table.scan(**scan)
            items += page["Items"]
            if "LastEvaluatedKey" not in page:
                break
            scan["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    return planner.history_rates(items, time.time())


def _pace(args: argparse.Namespace) -> Any:
    """The run's head and throughput from the checkpoint catalog."""
    from spotrain.core import aws_clients
    from spotrain.core.deadline_policy import read_pace

    if not args.run:
        raise CostInputError("--catalog-table needs --run: the run whose checkpoints to read")
    with aws_errors(f"the catalog table {args.catalog_table} cannot be read", CATALOG_TABLE_FIX):
        return read_pace(aws_clients.resource("dynamodb").Table(args.catalog_table), args.run)


def _training_config(path: str) -> dict[str, Any]:
    """The fields a plan reads from a training configuration, checked."""
    fix = "give the file `spotrain train` takes"
    config = read_json(path, "the training configuration", fix, CostInputError)
    if not isinstance(config, dict):
        raise CostInputError(
            f"the training configuration {path} holds {json_kind(config)}, not an object: {fix}"
        )
    for name in ("steps", "checkpoint_every"):
        value = config.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):  # fmt: skip
            raise CostInputError(
                f"the training configuration {path}: {name} is {value!r}, not a whole number "
                f"of steps (1 or more): correct it, or give --{name.replace('_', '-')}"
            )
    metrics = config.get("metrics_file")
    if metrics is not None and (not isinstance(metrics, str) or not metrics):
        raise CostInputError(
            f"the training configuration {path}: metrics_file is {metrics!r}, not a path: "
            "correct it, or give --metrics"
        )
    return config


def run_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """Work, step time, checkpoint cost and interval from flags, the training configuration
    and its metrics file (flags win)."""
    config = _training_config(args.config) if args.config else {}
    metrics_path = args.metrics or config.get("metrics_file")
    seen = planner.measured(metrics_path) if metrics_path else None
    pace = _pace(args) if args.catalog_table else None
    from_catalog = 3600 / pace.steps_per_hour if pace and pace.steps_per_hour else None
    step_s = args.step_seconds or (seen.step_s if seen else None) or from_catalog
    checkpoint_s = args.checkpoint_seconds or (seen.checkpoint_s if seen else None)
    steps = args.steps or config.get("steps")
    every = args.checkpoint_every or config.get("checkpoint_every")
    if args.work_hours is not None:
        work_h = args.work_hours
    elif steps and step_s:
        done = pace.step if pace else 0  # a run with history: the work left
        if done >= steps:
            raise CostInputError(
                f"the run's head is at step {done} of {steps}: nothing is "
                "left to plan; give --steps with the run's new total"
            )
        work_h = (steps - done) * step_s / 3600
    else:
        work_h = None
    problems = []
    if work_h is None:
        problems.append("no amount of work: give --work-hours, or --steps with "
                        "--step-seconds (or a --metrics file / --config whose metrics_file has "
                        "step times)")  # fmt: skip
    elif not 0 < work_h < math.inf:
        problems.append(f"the work is {work_h} hours: give a positive number of hours")
    if checkpoint_s is None:
        problems.append("no checkpoint cost: give --checkpoint-seconds (training lost per "
                        "checkpoint), or a --metrics file with published checkpoints")  # fmt: skip
    raise_all(problems)
    return {
        "work_h": work_h,
        "done_steps": pace.step if pace else 0,
        "step_s": step_s,
        "checkpoint_s": checkpoint_s,
        "checkpoint_every": every,
        "measured": asdict(seen) if seen else None,
    }


def plan_inputs(
    args: argparse.Namespace,
    run: dict[str, Any],
    pool: Pool,
    deadline_h: float | None,
    samples: int,
) -> planner.PlanInputs:
    return planner.PlanInputs(
        work_h=run["work_h"],
        nodes=args.nodes,
        deadline_h=deadline_h,
        checkpoint_s=run["checkpoint_s"],
        restart_h=args.restart_minutes / 60,
        interruptions_per_hour=pool.rate,
        recovery_h=args.recovery_hours,
        on_demand_price=pool.on_demand_price,
        spot_price=pool.spot_price,
        step_s=run["step_s"],
        checkpoint_every=run["checkpoint_every"],
        samples=samples,
        seed=args.seed,
    )


def today() -> datetime.date:
    """The date prices are judged stale against (UTC)."""
    return datetime.datetime.now(datetime.UTC).date()


def declared_fleet(args: argparse.Namespace) -> str:
    """Fill in what the plan was not given from the fleet the environment declares: the
    machines (`--nodes`) a run starts with (its `desired_size`), and the run's instance types.
    The run is `--run` when the environment declares it, else the environment's only run (or
    its runs, when they agree). Returns where the machine count came from, for the output."""
    from spotrain.stacks.runs import load_runs

    if args.environment is None and args.run is None:
        if args.nodes is None:
            args.nodes = 1
            return "1 by default (--environment ENV or --run RUN: as its run starts)"
        return "--nodes"
    env_name = environment(args.environment or DEFAULT_ENVIRONMENT).name
    runs = load_runs(env_name)
    named = [r for r in runs if r.name == args.run]
    if named:
        args.run_types = list(named[0].instance_types)
    if args.nodes is not None:
        return "--nodes"
    chosen = named or list(runs)
    sizes = {r.desired_size for r in chosen}
    if not chosen:
        args.nodes = 1
        return f"environment {env_name} declares no runs: 1 machine (give --nodes)"
    if len(sizes) > 1:
        sizes_by_run = ", ".join(f"{r.name}: {r.desired_size}" for r in chosen)
        raise CostInputError(
            f"the runs of environment {env_name} start different numbers of machines "
            f"({sizes_by_run}): name the run with --run, or give --nodes"
        )
    args.nodes = sizes.pop()
    which = f"run {chosen[0].name}'s" if len(chosen) == 1 else f"{env_name}'s runs'"
    return f"{which} desired_size"


def _declared_types(environment: str) -> list[str]:
    """The instance types the environment's runs declare, in their order, each once."""
    from spotrain.stacks.runs import load_runs

    types = list(dict.fromkeys(t for run in load_runs(environment) for t in run.instance_types))
    if not types:
        raise CostInputError(
            f"environment {environment!r} declares no runs (runs/{environment}/): name the "
            "types to plan with --instance-type"
        )
    return types
