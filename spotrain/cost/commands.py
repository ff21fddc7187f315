"""`spotrain cost plan|simulate|status|report|estimate` and `spotrain prices refresh|show`."""

from __future__ import annotations

import argparse
import datetime
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spotrain.arguments import figure_path, finite, number, run_name
from spotrain.cost import planner, prices, report, simulation, traces
from spotrain.errors import CostInputError, aws_errors, json_kind, read_json

MAX_REPLAYS = 10_000
"""The most traces, starts or samples a command replays (each one walks every tick)."""
EVENTS_TABLE_FIX = (
    "give the catalog stack's events table (spotrain-<env>-events) and credentials that may read it"
)
CATALOG_TABLE_FIX = (
    "give the catalog stack's checkpoint table (spotrain-<env>-checkpoints) and credentials that "
    "may read it"
)


def _say(message: str) -> None:
    print(message, flush=True)


def _today() -> datetime.date:
    return datetime.datetime.now(datetime.UTC).date()


def _environment(name: str) -> Any:
    from spotrain.stacks.environments import all_environments

    found = {e.name: e for e in all_environments()}
    if name not in found:
        raise CostInputError(f"environment {name!r} is unknown: use one of {', '.join(found)}")
    return found[name]


# --- plan --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Pool:
    label: str
    on_demand_price: float
    spot_price: float
    rate: float
    rate_source: str
    notes: tuple[str, ...] = ()


def _pools(args: argparse.Namespace) -> list[_Pool]:
    explicit_rate = args.interruptions_per_hour
    finite("--interruptions-per-hour", explicit_rate, unit="interruptions per instance-hour",
           zero=True, error=CostInputError)  # fmt: skip
    given = args.on_demand_price is not None, args.spot_price is not None
    if any(given) and not all(given):
        raise CostInputError(
            "give both --on-demand-price and --spot-price, or neither (the "
            "price book then prices each instance type)"
        )
    if all(given) and not args.instance_type:
        if explicit_rate is None:
            raise CostInputError(
                "no interruption rate for given prices: add --interruptions-per-hour (per instance)"
            )
        return [
            _Pool(
                "given prices",
                args.on_demand_price,
                args.spot_price,
                explicit_rate,
                "--interruptions-per-hour",
            )
        ]
    environment = _environment(args.environment)
    types = args.instance_type or list(environment.instance_types)
    regions = args.region or [environment.primary_region]
    book = prices.load(args.price_book) if args.price_book else prices.load()
    history = _history(args.events_table) if args.events_table else {}
    pools = []
    for region in regions:
        for instance_type in types:
            # Prices given on the command line need nothing from the book but its Advisor band.
            found = None if all(given) else book.pool(instance_type, region)
            advisor = book.advisor_for(instance_type, region)
            notes = []
            stale = found and prices.staleness(found, _today(), args.stale_after_days)
            if stale:
                notes.append(stale)
            if explicit_rate is not None:
                rate, source = explicit_rate, "--interruptions-per-hour"
            elif (instance_type, region) in history:
                rate = history[(instance_type, region)]
                source = f"the run's own interruptions ({args.events_table})"
            elif advisor is not None and advisor.band:
                rate = planner.advisor_rate_per_hour(advisor.band)
                source = f"Spot Instance Advisor {advisor.band} ({advisor.taken_at})"
            else:
                raise CostInputError(
                    f"no interruption rate for {instance_type} in {region}: the price book has "
                    "no Advisor band for it; give --interruptions-per-hour (per instance)"
                )
            on_demand = args.on_demand_price or (found and found.on_demand.usd_per_hour) or 0.0
            spot = args.spot_price or (found and found.spot_price) or 0.0
            pools.append(
                _Pool(f"{instance_type} {region}", on_demand, spot, rate, source, tuple(notes))
            )
    return pools


def _history(table_name: str) -> dict[tuple[str, str], float]:
    """Interruption rates per (type, region) from the environment's events table."""
    import time

    import boto3

    table = boto3.resource("dynamodb").Table(table_name)
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
    import boto3

    from spotrain.deadline_policy import read_pace

    if not args.run:
        raise CostInputError("--catalog-table needs --run: the run whose checkpoints to read")
    with aws_errors(f"the catalog table {args.catalog_table} cannot be read", CATALOG_TABLE_FIX):
        return read_pace(boto3.resource("dynamodb").Table(args.catalog_table), args.run)


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


def _run_inputs(args: argparse.Namespace) -> dict[str, Any]:
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
        raise CostInputError(
            "no amount of work: give --work-hours, or --steps with --step-seconds (or a "
            "--metrics file / --config whose metrics_file has step times)"
        )
    if not 0 < work_h < math.inf:
        raise CostInputError(f"the work is {work_h} hours: give a positive number of hours")
    if checkpoint_s is None:
        raise CostInputError(
            "no checkpoint cost: give --checkpoint-seconds (training stalled per "
            "checkpoint), or a --metrics file with published checkpoints"
        )
    return {
        "work_h": work_h,
        "done_steps": pace.step if pace else 0,
        "step_s": step_s,
        "checkpoint_s": checkpoint_s,
        "checkpoint_every": every,
        "measured": asdict(seen) if seen else None,
    }


def _plan_inputs(
    args: argparse.Namespace,
    run: dict[str, Any],
    pool: _Pool,
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


def cmd_plan(args: argparse.Namespace) -> int:
    if args.nodes < 1:
        raise CostInputError(f"--nodes is {args.nodes}: a run has at least one machine")
    if args.deadline_hours is not None and not 0 < args.deadline_hours < math.inf:
        raise CostInputError(f"--deadline-hours is {args.deadline_hours}: give a positive number")
    finite("--restart-minutes", args.restart_minutes, unit="minutes", zero=True,
           error=CostInputError)  # fmt: skip
    figure_path(args.plot)
    if args.run is not None:
        run_name(args.run)
    run = _run_inputs(args)
    if args.deadline_hours is not None and args.deadline_hours < run["work_h"]:
        raise CostInputError(
            f"the deadline ({args.deadline_hours:g} h) is shorter than the work "
            f"({run['work_h']:g} h on {args.nodes} machine(s)): move the deadline or add machines"
        )
    plans = []
    for pool in _pools(args):
        result = planner.plan(_plan_inputs(args, run, pool, args.deadline_hours, args.samples))
        plans.append((pool, result))
    best_pool, best = min(
        plans,
        key=lambda p: (
            -min(1.0, max(s.deadline_met for s in p[1].summaries)),
            next(s.mean_cost for s in p[1].summaries if s.strategy == p[1].recommended),
        ),
    )
    if args.json:
        _say(
            _json(
                {
                    "work_hours": run["work_h"],
                    "done_steps": run["done_steps"],
                    "measured": run["measured"],
                    "nodes": args.nodes,
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
                },
            )
        )
    else:
        for pool, p in plans:
            _say(
                f"\n{pool.label}: on-demand ${pool.on_demand_price:.4f}/h, spot "
                f"${pool.spot_price:.4f}/h, {pool.rate:.4g} interruptions/h per instance "
                f"({pool.rate_source}); gang MTBF {_hours(p.mtbf_h)}"
            )
            for note in pool.notes:
                _say(f"  WARNING: {note}")
            interval = (
                "none needed (no interruptions expected)"
                if math.isinf(p.interval_s)
                else f"{p.interval_s / 60:.1f} min"
                + (f" = {p.interval_steps} steps" if p.interval_steps else "")
            )
            _say(f"  checkpoint every {interval} (Young/Daly); changeover {p.changeover_h:.2f} h")
            for warning in p.warnings:
                _say(f"  WARNING: {warning}")
            _say(report.table(p.summaries, recommended=p.recommended))
        _say(
            f"\nrecommended: {best.recommended} on {best_pool.label}: {best.why} "
            f"({args.samples} sampled interruption traces, seed {args.seed})"
        )
    if args.plot:

        def at(slack: float) -> list[simulation.Summary]:
            # The work as the run does it (checkpoint stalls included) x (1 + slack), + a start.
            stalls = 1 + run["checkpoint_s"] / best.used_interval_s
            deadline = run["work_h"] * stalls * (1 + slack) + best.changeover_h
            return planner.plan(
                _plan_inputs(args, run, best_pool, deadline, max(20, args.samples // 4))
            ).summaries

        report.plot(
            report.sweep(at),
            Path(args.plot),
            f"{best_pool.label}, {run['work_h']:.1f} h of work on {args.nodes} machine(s)",
        )
        _say(f"figure: {args.plot}")
    return 0


def _hours(value: float) -> str:
    return f"{value:,.1f} h" if math.isfinite(value) else "none expected"


def _json(document: Any) -> str:
    """JSON without the non-standard Infinity: a time or interval that never comes is null."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(document), indent=1, allow_nan=False)


# --- simulate ----------------------------------------------------------------------------------
def _traces(args: argparse.Namespace, hours: float) -> list[traces.Trace]:
    if args.trace:
        found = [traces.load(path) for path in args.trace]
    elif args.interruptions_per_hour is None:
        raise CostInputError(
            "no traces: give --trace FILE (the Can't Be Late format), or "
            "--interruptions-per-hour to generate them"
        )
    else:
        found = traces.generate_many(
            args.traces,
            seed=args.seed,
            hours=args.trace_hours or hours,
            capacity=args.nodes,
            interruptions_per_hour=args.interruptions_per_hour,
            recovery_h=args.recovery_hours,
            gap_s=args.gap_seconds,
        )
    return [traces.coarsen(t, args.tick) for t in found] if args.tick else found


def _generated_for(args: argparse.Namespace) -> bool:
    """Traces are generated for each deadline (not given as files, nor of a fixed length)."""
    return not args.trace and not args.trace_hours


def _length_for(args: argparse.Namespace, window_h: float) -> float:
    """Generated traces hold the window (the deadline, or without one 3x the work) and half
    as much again, and at least one tick more than it for every start."""
    return window_h + max(0.5 * window_h, args.starts * args.gap_seconds / 3600)


def cmd_simulate(args: argparse.Namespace) -> int:
    figure_path(args.plot)

    def job(deadline_h: float | None) -> simulation.Job:
        return simulation.Job(
            work_h=args.work_hours,
            deadline_h=deadline_h,
            changeover_h=args.changeover_minutes / 60,
            nodes=args.nodes,
            on_demand_price=args.on_demand_price,
            spot_price=args.spot_price,
        )

    base = job(args.deadline_hours)
    sampled = _traces(args, _length_for(args, args.deadline_hours or 3 * args.work_hours))
    results = simulation.replay(base, sampled, starts=args.starts, wrap=args.wrap)
    summaries = [simulation.summarise(outcomes) for outcomes in results.values()]
    if args.json:
        _say(
            _json(
                {
                    "traces": [
                        {
                            "name": t.name,
                            "hours": t.hours,
                            "tick_seconds": t.gap_s,
                            "availability": t.availability(args.nodes),
                        }
                        for t in sampled
                    ],
                    "wrap": args.wrap,
                    "strategies": {
                        name: {
                            "summary": asdict(simulation.summarise(outcomes)),
                            "runs": [
                                {
                                    "cost": o.cost,
                                    "finish_hours": o.finish_h if o.finished else None,
                                    "deadline_met": o.deadline_met,
                                    "spot_hours": o.spot_hours,
                                    "on_demand_hours": o.on_demand_hours,
                                    "preemptions": o.preemptions,
                                    "wrapped": o.wrapped,
                                    "past_trace": o.past_trace,
                                }
                                for o in outcomes
                            ],
                        }
                        for name, outcomes in results.items()
                    },
                },
            )
        )
    else:
        for t in sampled[:3]:
            _say(
                f"trace {t.name}: {t.hours:.1f} h in ticks of {t.gap_s:g} s, spot for "
                f"{args.nodes} machine(s) {t.availability(args.nodes):.0%} of the time"
            )
        if len(sampled) > 3:
            mean = sum(t.availability(args.nodes) for t in sampled) / len(sampled)
            _say(
                f"... {len(sampled)} traces, spot for {args.nodes} machine(s) {mean:.0%} of "
                "the time on average"
            )
        _say(
            f"{len(sampled) * args.starts} runs per strategy of {args.work_hours:g} h on "
            f"{args.nodes} machine(s)"
            + (f", deadline {args.deadline_hours:g} h" if args.deadline_hours else "")
        )
        _say(report.table(summaries))
        for note in _window_notes(summaries, args.wrap):
            _say(note)
    if args.plot:
        fitting, left_out = [], []
        for slack in report.SLACKS:
            deadline = args.work_hours * (1 + slack) + args.changeover_minutes / 60
            try:
                for t in sampled if not _generated_for(args) else []:
                    simulation.start_ticks(job(deadline), t, args.starts, wrap=args.wrap)
            except CostInputError:
                left_out.append(slack)
            else:
                fitting.append(slack)
        if not fitting:
            raise CostInputError(
                "no deadline of the figure fits in the traces: give longer traces or --wrap"
            )

        def at(slack: float) -> list[simulation.Summary]:
            deadline = args.work_hours * (1 + slack) + args.changeover_minutes / 60
            replayed = (
                _traces(args, _length_for(args, deadline)) if _generated_for(args) else sampled
            )
            found = simulation.replay(job(deadline), replayed, starts=args.starts, wrap=args.wrap)
            return [simulation.summarise(outcomes) for outcomes in found.values()]

        report.plot(
            report.sweep(at, fitting),
            Path(args.plot),
            f"{len(sampled)} trace(s), {args.work_hours:g} h of work on {args.nodes} machine(s)",
        )
        if not args.json:
            _say(f"figure: {args.plot}")
            if left_out:
                slacks = ", ".join(f"{s:g}" for s in left_out)
                _say(f"  slacks {slacks} are left out: their deadlines do not fit in the traces "
                     "(give longer ones, or --wrap)")  # fmt: skip
    return 0


def _window_notes(summaries: list[simulation.Summary], wrap: bool) -> list[str]:
    """What the table's runs saw beyond their traces, said where the figures are."""
    notes = []
    wrapped = max((s.wrapped for s in summaries), default=0)
    past = max((s.past_trace for s in summaries), default=0)
    runs = summaries[0].runs if summaries else 0
    if wrap:
        notes.append(f"--wrap: up to {wrapped} of {runs} runs per strategy went past their "
                     "trace's end and on from its beginning")  # fmt: skip
    if past:
        notes.append(f"WARNING: up to {past} of {runs} runs per strategy outlived their trace "
                     "and saw no spot after its end: give longer traces (or --wrap)")  # fmt: skip
    return notes


# --- status ------------------------------------------------------------------------------------
def cmd_status(args: argparse.Namespace) -> int:
    import time

    import boto3

    from spotrain import spend_ledger

    run_name(args.run)
    with aws_errors(f"the events table {args.events_table} cannot be read", EVENTS_TABLE_FIX):
        ledger = spend_ledger.read(boto3.resource("dynamodb").Table(args.events_table), args.run)
    if ledger.as_of is None:
        _say(
            f"run {args.run}: no spend counted yet (the interruption handler's capacity check "
            "counts it every 5 minutes once the run's machines are up)"
        )
        return 0
    age = time.time() - ledger.as_of
    if args.json:
        _say(_json({"run": args.run, **asdict(ledger), "saved": ledger.saved}))
        return 0
    _say(
        f"run {args.run}: ${ledger.spend_usd:,.2f} spent, ${ledger.on_demand_usd:,.2f} on "
        f"on-demand prices ({ledger.saved:.0%} saved), counted to "
        f"{datetime.datetime.fromtimestamp(ledger.as_of, datetime.UTC):%Y-%m-%d %H:%M:%S} UTC "
        f"({age / 60:.0f} min ago)"
    )
    for pool, figures in sorted(ledger.per_pool.items()):
        _say(
            f"  {pool:<36} {figures['seconds'] / 3600:8.2f} h  ${figures['spend_usd']:,.2f}  "
            f"(on-demand ${figures['on_demand_usd']:,.2f})"
        )
    if ledger.cap_usd is not None:
        _say(
            f"  cap ${ledger.cap_usd:,.2f}: {ledger.spend_usd / ledger.cap_usd:.0%} spent"
            + (
                "; HELD: the run may not start and its groups are at 0 until "
                "`spotrain fleet release --max-spend-usd N`"
                if ledger.held
                else ""
            )
        )
    if ledger.unpriced_seconds:
        _say(
            f"  WARNING: {ledger.unpriced_seconds / 3600:.2f} machine-hours have no price in "
            "the account's price sources and are not in the dollars"
        )
    return 0


# --- report ------------------------------------------------------------------------------------
def cmd_report(args: argparse.Namespace) -> int:
    import boto3

    from spotrain import spend_ledger
    from spotrain.cost import run_report

    run_name(args.run)
    figure_path(args.plot)
    dynamodb = boto3.resource("dynamodb")
    events = dynamodb.Table(args.events_table)
    with aws_errors(f"the events table {args.events_table} cannot be read", EVENTS_TABLE_FIX):
        ledger = spend_ledger.read(events, args.run)
        points, notices = spend_ledger.read_history(events, args.run)
        interruptions = run_report.read_interruptions(events, args.run)
    checkpoints, head_step = None, 0
    if args.catalog_table:
        with aws_errors(
            f"the catalog table {args.catalog_table} cannot be read", CATALOG_TABLE_FIX
        ):
            checkpoints, head_step = run_report.read_checkpoints(
                dynamodb.Table(args.catalog_table), args.run
            )
    if ledger.as_of is None and not interruptions and not checkpoints:
        raise CostInputError(
            f"run {args.run!r} left nothing in {args.events_table}"
            + (f" or {args.catalog_table}" if args.catalog_table else "")
            + ": check the run's name (its environment's run_name) and that these are its "
            "environment's tables"
        )
    found = run_report.build(
        args.run, ledger=ledger, points=points, notices=notices, checkpoints=checkpoints,
        head_step=head_step, interruptions=interruptions,
    )  # fmt: skip
    _say(_json(found.as_json()) if args.json else run_report.render(found))
    if args.plot:
        run_report.plot(found, Path(args.plot))
        if not args.json:
            _say(f"figure: {args.plot}")
    return 0


# --- estimate ----------------------------------------------------------------------------------
def cmd_estimate(args: argparse.Namespace) -> int:
    from spotrain.cost import estimate

    book = prices.load(args.price_book) if args.price_book else prices.load()
    head = estimate.estimate(_environment(args.environment), book)
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
        _say(_json({
            "head": head.as_json() if head else None,
            "base": base.as_json() if base else None, "base_note": base_note,
        }))  # fmt: skip
    else:
        _say(estimate.markdown(head, base, base_note=base_note))
    return 0


# --- prices ------------------------------------------------------------------------------------
def cmd_prices(args: argparse.Namespace) -> int:
    path = Path(args.price_book) if args.price_book else prices.SNAPSHOT
    if args.action == "refresh" and not path.parent.is_dir():
        raise CostInputError(
            f"--price-book {path}: the folder {path.parent} does not exist; create it or "
            "give a file in a folder that does"
        )
    # A book given to `show` must be there; `refresh` starts a new one where none is yet.
    fresh_book = args.action == "refresh" and not path.exists()
    book = prices.PriceBook(path=str(path)) if fresh_book else prices.load(path)
    environments = [_environment(n) for n in (args.environment or ["local", "dev", "prod"])]
    types = args.instance_type or sorted({t for e in environments for t in e.instance_types})
    regions = args.region or sorted(
        {r for e in environments for r in (e.primary_region, e.replica_region)}
    )
    if args.action == "show":
        if not (book.on_demand or book.spot):
            _say(
                f"the price book {path} holds no prices yet: run `spotrain prices refresh` "
                "with credentials for an AWS account"
            )
            return 0
        for region in regions:
            for instance_type in types:
                try:
                    found = book.pool(instance_type, region)
                except CostInputError as error:
                    _say(f"{instance_type} {region}: {error}")
                    continue
                zones = ", ".join(
                    f"{f.availability_zone} ${f.usd_per_hour:.4f}" for f in found.spot
                )
                band = found.advisor.band if found.advisor else "no Advisor band"
                stale = prices.staleness(found, _today(), args.stale_after_days)
                _say(
                    f"{instance_type} {region}: on-demand ${found.on_demand.usd_per_hour:.4f}/h; "
                    f"spot {zones}; {band}; taken {found.oldest()}"
                    + (f"\n  WARNING: {stale}" if stale else "")
                )
        return 0
    import boto3

    clients: dict[str, Any] = {}

    def ec2_for(region: str) -> Any:
        if region not in clients:
            clients[region] = boto3.client("ec2", region_name=region)
        return clients[region]

    pricing = boto3.client("pricing", region_name=prices.PRICE_LIST_REGION)
    fresh, missing = prices.refresh(
        book,
        instance_types=types,
        regions=regions,
        ec2_for=ec2_for,
        pricing=pricing,
        now=datetime.datetime.now(datetime.UTC),
    )
    prices.write(fresh, path)
    _say(
        f"price book {path}: {len(fresh.on_demand)} on-demand and {len(fresh.spot)} spot "
        f"prices for {len(types)} instance type(s) in {', '.join(regions)}"
    )
    for line in missing:
        _say(f"  WARNING: {line} (is the type offered there?)")
    return 0 if not missing else 1


# --- the parsers -------------------------------------------------------------------------------
def add_parsers(commands: Any) -> None:
    cost = commands.add_parser("cost", help="what a run will cost: plan one, or replay traces")
    actions = cost.add_subparsers(dest="cost_action", required=True)

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
    work.add_argument("--run", help="the run to read from --catalog-table")
    work.add_argument(
        "--checkpoint-seconds",
        type=number(),
        help="seconds a checkpoint stalls training (delta)",
    )
    work.add_argument(
        "--checkpoint-every",
        type=number(int),
        help="the run's checkpoint interval in steps (checked)",
    )
    work.add_argument("--nodes", type=int, default=1, help="machines in the gang")
    work.add_argument("--deadline-hours", type=float, help="hours from the start")
    work.add_argument(
        "--restart-minutes",
        type=float,
        default=5.0,
        help="restart + restore after a move (default 5)",
    )
    pools = plan.add_argument_group("where and at what price")
    pools.add_argument(
        "--environment",
        default="local",
        help="instance types and primary region of this environment",
    )
    pools.add_argument("--instance-type", action="append", help="instead of the environment's")
    pools.add_argument("--region", action="append", help="instead of the primary region")
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
    _common(plan)
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

    simulate = actions.add_parser("simulate", help="replay availability traces per strategy")
    simulate.add_argument(
        "--trace", action="append", help="availability trace (Can't Be Late JSON); repeatable"
    )
    simulate.add_argument(
        "--interruptions-per-hour",
        type=float,
        help="generate traces from this rate per instance instead",
    )
    simulate.add_argument("--recovery-hours", type=number(), default=1.0)
    simulate.add_argument(
        "--traces",
        type=number(int, maximum=MAX_REPLAYS),
        default=20,
        help="generated traces (default 20)",
    )
    simulate.add_argument("--trace-hours", type=number(), help="length of generated traces")
    simulate.add_argument(
        "--gap-seconds",
        type=number(),
        default=300.0,
        help="tick of generated traces (default 300)",
    )
    simulate.add_argument("--work-hours", type=float, required=True, help="C: hours of compute")
    simulate.add_argument("--deadline-hours", type=float, help="R: hours from the start")
    simulate.add_argument(
        "--changeover-minutes",
        type=float,
        default=15.0,
        help="d: restart + restore + lost work per move (default 15)",
    )
    simulate.add_argument("--on-demand-price", type=number(), required=True, help="USD/h")
    simulate.add_argument("--spot-price", type=number(), required=True, help="USD/h")
    simulate.add_argument("--nodes", type=int, default=1, help="a gang needs this many")
    simulate.add_argument(
        "--starts",
        type=number(int, maximum=MAX_REPLAYS),
        default=10,
        help="start offsets per trace (default 10)",
    )
    simulate.add_argument(
        "--tick",
        type=number(),
        metavar="SECONDS",
        help="replay in coarser ticks than the traces' own: a coarse tick has spot only if "
        "every tick in it had (faster replays; traces of different ticks compared alike)",
    )
    simulate.add_argument(
        "--wrap",
        action="store_true",
        help="let a start's window run past its trace's end and on from its beginning (said "
        "in the output); by default starts are spread over the ticks whose window fits",
    )
    _common(simulate)
    simulate.set_defaults(handler=cmd_simulate)

    status = actions.add_parser("status", help="a run's spend so far (the spend ledger)")
    status.add_argument("--run", required=True, help="the run")
    status.add_argument(
        "--events-table",
        required=True,
        help="the environment's events table (spotrain-<env>-events)",
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of lines")
    status.set_defaults(handler=cmd_status)

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
    summary.add_argument("--json", action="store_true", help="print JSON instead of lines")
    summary.add_argument(
        "--plot", help="draw spend against on-demand over time, preemptions and notices (PNG)"
    )
    summary.set_defaults(handler=cmd_report)

    book = commands.add_parser("prices", help="the price book: refresh it from AWS, show it")
    book.add_argument("action", choices=["refresh", "show"])
    book.add_argument(
        "--environment",
        action="append",
        help="types and regions of these environments (default: all)",
    )
    book.add_argument("--instance-type", action="append", help="instead of the environments'")
    book.add_argument("--region", action="append", help="instead of the environments'")
    book.add_argument("--price-book", help="file to read and write (default: the snapshot)")
    book.add_argument(
        "--stale-after-days", type=number(int), default=prices.DEFAULT_STALE_AFTER_DAYS
    )
    book.set_defaults(handler=cmd_prices)


def _common(command: argparse.ArgumentParser) -> None:
    command.add_argument("--seed", type=int, default=0, help="seed of sampled traces")
    command.add_argument("--json", action="store_true", help="print JSON instead of a table")
    command.add_argument("--plot", help="draw cost per strategy against deadline slack (PNG)")
