"""`spotrain cost simulate`: replay spot availability traces (the public format of the "Can't
Be Late" study, or generated from a rate) against every strategy."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spotrain.cli import simulate_prices, simulate_regions
from spotrain.cli.arguments import MAX_REPLAYS, figure_path, number, raise_all
from spotrain.cli.output import json_text, say
from spotrain.cli.plan_inputs import problems_of
from spotrain.core.errors import CostInputError, SpotrainError
from spotrain.cost import planner, report, simulation, traces


def _traces(
    args: argparse.Namespace, hours: float, given: list[traces.Trace] | None = None
) -> list[traces.Trace]:
    """The traces replayed, in --tick's ticks: `given` (the files of --trace, read), or
    generated for `hours`."""
    if given is not None:
        found = given
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


def _history_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with `--history` for a replay in one region (one trace of the market's
    past: the Markov policy's means, which plans to a deadline)."""
    problems = []
    if args.history and len(args.history) != 1:
        problems.append(f"--history is given {len(args.history)} times: give one trace of the "
                        "market's past (one per region with --across-regions)")  # fmt: skip
    if args.history and not args.deadline_hours:
        problems.append("--history is what the Markov policy plans with, and it plans to a "
                        "deadline: give --deadline-hours, or leave out --history")  # fmt: skip
    return problems


@dataclass(frozen=True)
class _Inputs:
    job: simulation.Job
    sampled: list[traces.Trace]
    history: list[traces.Trace] | None
    """What the environment saw of the market before (`--history`): the Markov policy's
    means; one trace per region across regions."""


def _inputs(args: argparse.Namespace) -> _Inputs:
    """The run, its traces and its history; or one error naming every problem with them (the
    flags' and each file's), before anything is replayed."""
    problems: list[str] = []

    def attempt(make: Callable[[], Any]) -> Any:
        try:
            return make()
        except SpotrainError as error:
            problems.extend(problems_of(error))
            return None

    priced = simulate_prices.resolve(args)
    problems.extend(priced)
    # The run's other problems too, where its prices are not known yet (stand-ins).
    job = attempt(lambda: _job(args, args.deadline_hours, stand_in_prices=bool(priced)))
    # Every file at once (the format said once, after them all), whatever else is wrong.
    trace_files, history_files = args.trace or [], args.history or []
    files = attempt(lambda: traces.load_all([*trace_files, *history_files])) or []
    given, history = files[: len(trace_files)], files[len(trace_files) :] or None
    if args.across_regions:
        problems.extend(f"--across-regions: {p}" for p in simulate_regions.problems(args))
    else:
        problems.extend(_history_problems(args))
    sampled = given
    # Traces are generated for a run that is one, in one region.
    if trace_files or (job is not None and not args.across_regions):
        window = args.deadline_hours or 3 * args.work_hours
        sampled = attempt(lambda: _traces(args, _length_for(args, window),
                                          given if trace_files else None))  # fmt: skip
    raise_all(problems, "the replay")
    return _Inputs(job, sampled, history)


def _generated_for(args: argparse.Namespace) -> bool:
    """Traces are generated for each deadline (not given as files, nor of a fixed length)."""
    return not args.trace and not args.trace_hours


def _length_for(args: argparse.Namespace, window_h: float) -> float:
    """Generated traces hold the window (the deadline, or without one 3x the work) and half
    as much again, and at least one tick more than it for every start."""
    return window_h + max(0.5 * window_h, args.starts * args.gap_seconds / 3600)


def _job(args: argparse.Namespace, deadline_h: float | None, *,
         stand_in_prices: bool = False) -> simulation.Job:  # fmt: skip
    return simulation.Job(
        work_h=args.work_hours,
        deadline_h=deadline_h,
        changeover_h=args.changeover_minutes / 60,
        nodes=args.nodes,
        on_demand_price=3.0 if stand_in_prices else args.on_demand_price,
        spot_price=1.0 if stand_in_prices else args.spot_price,
    )


def cmd_simulate(args: argparse.Namespace) -> int:
    given = _inputs(args)
    if args.across_regions:
        return simulate_regions.cmd_across(args, given.job, given.sampled, given.history)
    figure_path(args.plot)
    # Markov too where a deadline is given (recommended only on history: `planner.recommend`).
    strategies = simulation.STRATEGIES + ((simulation.MARKOV,) if args.deadline_hours else ())
    history = given.history[:1] * len(given.sampled) if given.history else None
    results = simulation.replay(
        given.job,
        given.sampled,
        starts=args.starts,
        wrap=args.wrap,
        optimum=True,
        strategies=strategies,
        history=history,
    )
    if args.json:
        say(json_text(_document(args, given.sampled, results)))
    else:
        _say_results(args, given.sampled, [simulation.summarise(o) for o in results.values()])
    if args.plot:
        _figure(args, given.sampled)
    return 0


def _document(
    args: argparse.Namespace, sampled: list[traces.Trace],
    results: dict[str, list[simulation.Outcome]],
) -> dict[str, Any]:  # fmt: skip
    def run(o: simulation.Outcome) -> dict[str, Any]:
        return {
            "cost": o.cost, "finish_hours": o.finish_h if o.finished else None,
            "deadline_met": o.deadline_met, "spot_hours": o.spot_hours,
            "on_demand_hours": o.on_demand_hours, "preemptions": o.preemptions,
            "wrapped": o.wrapped, "past_trace": o.past_trace,
            "optimum_cost": o.optimum_cost, "vs_optimum": o.vs_optimum,
        }  # fmt: skip

    summaries = [simulation.summarise(outcomes) for outcomes in results.values()]
    recommended, why = planner.recommend(
        summaries, has_deadline=bool(args.deadline_hours), plannable=bool(args.history)
    )
    return {
        "recommended": {"strategy": recommended, "why": why},
        "traces": [
            {"name": t.name, "hours": t.hours, "tick_seconds": t.gap_s,
             "availability": t.availability(args.nodes)}
            for t in sampled
        ],
        "wrap": args.wrap,
        "prices": {"spot": args.spot_price, "on_demand": args.on_demand_price},
        "strategies": {
            name: {"summary": asdict(simulation.summarise(outcomes)),
                   "runs": [run(o) for o in outcomes]}
            for name, outcomes in results.items()
        },
    }  # fmt: skip


def _say_results(
    args: argparse.Namespace, sampled: list[traces.Trace], summaries: list[simulation.Summary]
) -> None:
    for t in sampled[:3]:
        say(
            f"trace {t.name}: {t.hours:.1f} h in ticks of {t.gap_s:g} s, spot for "
            f"{args.nodes} machine(s) {t.availability(args.nodes):.0%} of the time"
        )
    if len(sampled) > 3:
        mean = sum(t.availability(args.nodes) for t in sampled) / len(sampled)
        say(
            f"... {len(sampled)} traces, spot for {args.nodes} machine(s) {mean:.0%} of "
            "the time on average"
        )
    say(
        f"{len(sampled) * args.starts} runs per strategy of {args.work_hours:g} h on "
        f"{args.nodes} machine(s)"
        + (f", deadline {args.deadline_hours:g} h" if args.deadline_hours else "")
        + f", ${args.spot_price:,.2f}/h spot and ${args.on_demand_price:,.2f}/h on-demand a "
        "machine"
        + (f" ({args.instance_type} in {args.region[0]}, the price book's)" if args.instance_type
           else "")
    )  # fmt: skip
    recommended, why = planner.recommend(
        summaries, has_deadline=bool(args.deadline_hours), plannable=bool(args.history)
    )
    say(report.table(summaries, recommended=recommended))
    for note in _window_notes(summaries, args.wrap):
        say(note)
    say(f"\nrecommended over these traces: {recommended}: {why}")


def _figure(args: argparse.Namespace, sampled: list[traces.Trace]) -> None:
    """Cost against deadline slack, for the slacks whose deadlines the traces hold."""

    def deadline(slack: float) -> float:
        return args.work_hours * (1 + slack) + args.changeover_minutes / 60

    fitting, left_out = [], []
    for slack in report.SLACKS:
        try:
            for t in sampled if not _generated_for(args) else []:
                simulation.start_ticks(_job(args, deadline(slack)), t, args.starts, wrap=args.wrap)
        except CostInputError:
            left_out.append(slack)
        else:
            fitting.append(slack)
    if not fitting:
        raise CostInputError(
            "no deadline of the figure fits in the traces: give longer traces or --wrap"
        )

    def at(slack: float) -> list[simulation.Summary]:
        length = _length_for(args, deadline(slack))
        replayed = _traces(args, length) if _generated_for(args) else sampled
        found = simulation.replay(_job(args, deadline(slack)), replayed, starts=args.starts,
                                  wrap=args.wrap)  # fmt: skip
        return [simulation.summarise(outcomes) for outcomes in found.values()]

    given = args.deadline_hours
    report.plot(
        report.sweep(at, fitting),
        Path(args.plot),
        f"{len(sampled)} trace(s), {args.work_hours:g} h of work on {args.nodes} machine(s)",
        deadline_slack=(given - args.changeover_minutes / 60) / args.work_hours - 1
        if given else None,
        deadline_label=f"{given:g} h" if given else "",
    )  # fmt: skip
    if not args.json:
        say(f"figure: {args.plot}")
        if left_out:
            slacks = ", ".join(f"{s:g}" for s in left_out)
            say(f"  slacks {slacks} are left out: their deadlines do not fit in the traces "
                "(give longer ones, or --wrap)")  # fmt: skip


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


def add_parser(actions: Any) -> None:
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
    simulate_prices.add_flags(simulate)
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
    simulate_regions.add_flags(simulate)
    common_flags(simulate)
    simulate.set_defaults(handler=cmd_simulate)


def common_flags(command: argparse.ArgumentParser) -> None:
    command.add_argument("--seed", type=int, default=0, help="seed of sampled traces")
    command.add_argument("--json", action="store_true", help="print JSON instead of a table")
    command.add_argument("--plot", help="draw cost per strategy against deadline slack (PNG)")
