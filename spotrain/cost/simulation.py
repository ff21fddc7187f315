"""Replay spot availability against each strategy: what a run would cost, when it would
finish, whether it meets its deadline.

Model (the one of "Can't Be Late", NSDI '24): the job needs `work_h` hours of its gang's
compute; every move onto machines (a start, a restart after a preemption, a switch between
spot and on-demand) costs `changeover_h` of paid time without progress (restart + restore +
the work since the last checkpoint). A gang on spot is preempted in the first tick with fewer
spot instances available than it needs, and pays again to come back. Prices are per
instance-hour. Time is counted in whole milliseconds, so the policies see exact progress.

A start's window (its deadline, or without one its work) lies inside its trace: `replay`
spreads the starts over the ticks whose window fits, and refuses traces where too few fit,
unless asked to wrap around (`wrap=True`, then each wrapped window is flagged). A run that
outlives its trace (a missed deadline, a run without one) sees no spot after the trace's end,
and is flagged too.

Strategies:
- `on-demand`: the whole gang on on-demand from the start.
- `spot-greedy`: spot whenever there is some, on-demand only when the deadline forces it.
- `blueprint-mix`: what the fleet does without a deadline: the coordinator on on-demand for
  the whole run, the other machines on spot, covered by on-demand after a fixed wait
  (`fallback_after_h`, the handler's on-demand deadline) and given back when spot returns.
- `uniform-progress`: Uniform Progress (`spotrain.core.deadline_policy`), the study's policy.
- `outage-fill`: the deadline policy the interruption handler runs for runs with a deadline
  (`spotrain.core.outage_fill`), with the record of spot its checks keep, one check a tick.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from spotrain.core import capacity_policy, deadline_policy, handler_settings, outage_fill
from spotrain.core.deadline_policy import IDLE, MS_PER_HOUR, ON_DEMAND, SPOT, Progress, whole_ms
from spotrain.core.errors import CostInputError
from spotrain.cost.traces import Trace

if TYPE_CHECKING:
    from spotrain.cost.markov_policy import RegionRates

ON_DEMAND_ONLY = "on-demand"
SPOT_GREEDY = "spot-greedy"
BLUEPRINT_MIX = "blueprint-mix"
UNIFORM_PROGRESS = "uniform-progress"
OUTAGE_FILL = "outage-fill"
STRATEGIES = (ON_DEMAND_ONLY, SPOT_GREEDY, BLUEPRINT_MIX, UNIFORM_PROGRESS, OUTAGE_FILL)
MARKOV = "markov"
"""The policy the handler runs for a run given a plan (`spotrain.cost.markov_policy`), in one
region: replayed when named (a job with a deadline), not among every strategy's, as it needs
what the environment saw before the run to be planned."""
MAX_HOURS = 10_000
"""The longest work or deadline simulated (over a year): a replay walks every tick of it."""
DEFAULT_FALLBACK_AFTER_H = handler_settings.ON_DEMAND_DEADLINE_MINUTES / 60
"""The handler's fixed on-demand deadline, as it is deployed by default."""


def _finite(value: object, *, allow_zero: bool) -> bool:
    """A finite number (not a bool) above 0, or at 0 too."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return value >= 0 if allow_zero else value > 0


@dataclass(frozen=True, kw_only=True)
class Job:
    work_h: float
    """C: hours of the gang's compute the run needs."""
    deadline_h: float | None
    """R: hours from the start to the deadline; None: no deadline."""
    changeover_h: float
    """d: paid hours without progress after each move onto machines."""
    on_demand_price: float
    """USD per instance-hour."""
    spot_price: float
    """USD per instance-hour."""
    nodes: int = 1
    """Machines in the gang (all run, or none)."""
    fallback_after_h: float = DEFAULT_FALLBACK_AFTER_H
    checkpoint_every_h: float | None = None
    """Play checkpoints explicitly: every this many hours of progress the run stalls for
    `checkpoint_cost_h`, and a preemption loses the progress since the last one (then
    `changeover_h` is the restart and restore alone). None: `changeover_h` already counts the
    expected loss, as in the study's model."""
    checkpoint_cost_h: float = 0.0
    first_start_h: float | None = None
    """The first start's cost, when it differs from a changeover (nothing is lost yet); None:
    the changeover, as in the study's model."""

    def __post_init__(self) -> None:
        problems = []
        if not _finite(self.work_h, allow_zero=False):
            problems.append(f"the work is {self.work_h} hours: give a positive number of hours")
        if not _finite(self.changeover_h, allow_zero=True):
            problems.append(f"the changeover is {self.changeover_h} hours: use 0 or more")
        for label, price in (("on-demand", self.on_demand_price), ("spot", self.spot_price)):
            if not _finite(price, allow_zero=False):
                problems.append(f"the {label} price is {price} USD/h: give a positive price")
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1:
            problems.append(f"nodes is {self.nodes}: a run has at least one machine")
        if self.deadline_h is not None and not _finite(self.deadline_h, allow_zero=False):
            problems.append(
                f"the deadline is {self.deadline_h} hours away: give a positive number of hours"
            )
        for label, value, zero in (
            ("the fallback wait", self.fallback_after_h, True),
            ("the checkpoint interval", self.checkpoint_every_h, False),
            ("the checkpoint cost", self.checkpoint_cost_h, True),
            ("the first start", self.first_start_h, True),
        ):
            if value is not None and not _finite(value, allow_zero=zero):
                problems.append(f"{label} is {value} hours: give a finite number of hours")
        for label, value in (("the work", self.work_h), ("the deadline", self.deadline_h)):
            if _finite(value, allow_zero=False) and value > MAX_HOURS:  # type: ignore[operator]
                problems.append(f"{label} is {value:g} hours: plan runs of up to {MAX_HOURS:,} h")
        if (
            not problems
            and self.deadline_h is not None
            and (self.deadline_h < self.work_h + self.start_h)
        ):
            problems.append(
                f"the deadline ({self.deadline_h:g} h) is shorter than the work "
                f"({self.work_h:g} h) plus one start "
                f"({self.start_h:g} h): no strategy can meet it; move the deadline or use "
                "more machines"
            )
        if problems:
            raise CostInputError("; ".join(problems))

    @property
    def start_h(self) -> float:
        return self.first_start_h if self.first_start_h is not None else self.changeover_h

    def window_h(self) -> float:
        """The stretch of trace a start needs: up to its deadline, or without one its work."""
        return self.deadline_h if self.deadline_h is not None else self.work_h


@dataclass(frozen=True)
class Outcome:
    strategy: str
    cost: float
    """USD."""
    finish_h: float
    """Hours from the start to the end of the work (inf: it never finished in the horizon)."""
    deadline_met: bool
    spot_hours: float
    """Instance-hours on spot."""
    on_demand_hours: float
    """Instance-hours on on-demand."""
    preemptions: int
    goodput: float
    """Useful compute / paid compute."""
    wrapped: bool = False
    """Its window ran past the trace's end and went on from its beginning (asked for)."""
    past_trace: bool = False
    """It ran past the trace's end, where no spot is assumed."""
    optimum_cost: float | None = None
    """The cheapest schedule that meets the deadline from the same start (`optimum`), when
    the replay computed it; None too when no schedule meets it."""

    @property
    def finished(self) -> bool:
        return math.isfinite(self.finish_h)

    @property
    def vs_optimum(self) -> float | None:
        return versus_optimum(self.cost, self.optimum_cost, self.deadline_met)


def region_prices(
    job: Job, regions: int, prices: Sequence[tuple[float, float]] | None
) -> list[tuple[float, float]]:
    """Each of `regions` regions' spot and on-demand price an instance-hour: `prices` (one pair
    a region, home first, as the price book gives each region's), or else the job's in every
    region. CostInputError names every pair that is not one."""
    if prices is None:
        return [(job.spot_price, job.on_demand_price)] * regions
    problems = [] if len(prices) == regions else [
        f"{len(prices)} regions' prices for {regions} regions: give one spot and on-demand "
        "pair a region, home first"]  # fmt: skip
    problems += [
        f"region {r}'s prices are {pair}: give a positive spot and on-demand price an hour"
        for r, pair in enumerate(prices)
        if len(pair) != 2 or not all(_finite(p, allow_zero=False) for p in pair)
    ]
    if problems:
        raise CostInputError("; ".join(problems))
    return [(float(spot), float(on_demand)) for spot, on_demand in prices]


def versus_optimum(cost: float, optimum: float | None, deadline_met: bool) -> float | None:
    """A run's cost as a multiple of the optimum from its start, when it met its deadline
    (a run that missed it is not comparable: it was not held to the same bound)."""
    if optimum is None or not deadline_met:
        return None
    return cost / optimum if optimum else 1.0


def mean_and_worst(ratios: Sequence[float | None]) -> tuple[float | None, float | None]:
    """The mean and the largest of the runs' ratios to the optimum (None: none to count)."""
    counted = [r for r in ratios if r is not None]
    return (sum(counted) / len(counted) if counted else None), max(counted, default=None)


Decide = Callable[[Progress, str, bool], str]
"""(progress, current mode, spot available for the gang) -> mode."""


def _policy(function: Callable[..., deadline_policy.Choice]) -> Decide:
    def decide(progress: Progress, current: str, available: bool) -> str:
        return function(progress, current=current, spot_available=available).mode

    return decide


def _outage_fill() -> Decide:
    """The handler's deadline policy, keeping the record its checks would (a check a tick)."""
    record = outage_fill.SpotRecord()

    def decide(progress: Progress, current: str, available: bool) -> str:
        nonlocal record
        record = record.seen(progress.elapsed_h * 3600, available,
                             longest_gap_s=capacity_policy.longest_gap_s(
                                 progress.decision_interval_h))  # fmt: skip
        return outage_fill.outage_fill(progress, current=current, spot_available=available,
                                       record=record).mode  # fmt: skip

    return decide


def _fixed_fallback(after_ms: int, tick_ms: int) -> Decide:
    """Today's handler: on-demand after `after_ms` short of spot, back to spot when it returns."""
    short_for = 0

    def decide(progress: Progress, current: str, available: bool) -> str:
        nonlocal short_for
        if available:
            short_for = 0
            return SPOT
        if current == ON_DEMAND:
            return ON_DEMAND
        short_for += tick_ms
        return ON_DEMAND if short_for > after_ms else IDLE

    return decide


def _markov(job: Job, known: RegionRates | None, deadline_utc_h: float | None) -> Decide:
    """The Markov policy, its region's means `known` (what the environment saw before the run) or
    learned from the run's own checks; `deadline_utc_h`: the deadline's hour of the day, where
    the trace says when it starts."""
    from spotrain.cost import markov_policy  # numpy: the `cost` extra

    if job.deadline_h is None:
        raise CostInputError(f"strategy {MARKOV!r} plans to a deadline: give one")
    policy = markov_policy.MarkovPolicy(1, markov_policy.Prices.of(job),
                                        known=None if known is None else [known],
                                        deadline_utc_h=deadline_utc_h)  # fmt: skip

    def decide(progress: Progress, current: str, available: bool) -> str:
        return policy.decide(progress, region=0, current=current,
                             spot_available=[available]).mode  # fmt: skip

    return decide


def _strategy(job: Job, strategy: str | Decide, tick_ms: int, known: RegionRates | None = None,
              deadline_utc_h: float | None = None) -> tuple[Decide, int, int]:  # fmt: skip
    """The decision function, machines always on on-demand, and machines of the gang (a
    decision function given as the strategy decides for the whole gang)."""
    if callable(strategy):
        return strategy, 0, job.nodes
    if strategy == MARKOV:
        return _markov(job, known, deadline_utc_h), 0, job.nodes
    if strategy == ON_DEMAND_ONLY:
        return (lambda *_: ON_DEMAND), 0, job.nodes
    if strategy == SPOT_GREEDY:
        return _policy(deadline_policy.greedy), 0, job.nodes
    if strategy == UNIFORM_PROGRESS:
        return _policy(deadline_policy.uniform_progress), 0, job.nodes
    if strategy == OUTAGE_FILL:
        return _outage_fill(), 0, job.nodes
    if strategy == BLUEPRINT_MIX:
        if job.nodes == 1:
            return (lambda *_: ON_DEMAND), 1, 0
        return _fixed_fallback(whole_ms(job.fallback_after_h), tick_ms), 1, job.nodes - 1
    raise CostInputError(f"strategy {strategy!r} is unknown: use one of {', '.join(STRATEGIES)}")


def tick_ms(trace: Trace) -> int:
    return round(trace.gap_s * 1000)


def simulate(
    job: Job,
    trace: Trace,
    strategy: str | Decide,
    *,
    start_tick: int = 0,
    wrap: bool = False,
    timeline: list[tuple[float, float, bool, str]] | None = None,
    known: RegionRates | None = None,
) -> Outcome:
    """One run of `job` from tick `start_tick` of `trace` under `strategy`; past the trace's
    end it goes on from the beginning with `wrap`, else it sees no spot. `timeline`, when
    given, receives (hours since the start, compute done, spot available, mode chosen) for
    every tick. `known`: the market's means as the environment saw them before (for
    `markov`; `markov_policy.known_rates` makes them of a trace)."""
    tick = tick_ms(trace)
    deadline_hour = trace.utc_hour(start_tick, after_h=job.deadline_h or 0.0)
    decide, always_on_demand, gang_on_spot = _strategy(job, strategy, tick, known, deadline_hour)
    work, changeover, first_start = (whole_ms(job.work_h), whole_ms(job.changeover_h),
                                     whole_ms(job.start_h))  # fmt: skip
    deadline = whole_ms(job.deadline_h) if job.deadline_h is not None else None
    every = whole_ms(job.checkpoint_every_h) if job.checkpoint_every_h is not None else None
    checkpoint_cost = whole_ms(job.checkpoint_cost_h)
    length = len(trace.available)
    horizon = 10 * max(work, deadline or 0) + length * tick
    t = done = changeover_left = spot_ms = on_demand_ms = since_checkpoint = stall_left = 0
    started = wrapped = past_trace = False
    mode, preemptions, index = IDLE, 0, start_tick
    while done < work and t < horizon:
        if index < length:
            available = trace.available[index] >= gang_on_spot
        elif wrap:
            wrapped, available = True, trace.available[index % length] >= gang_on_spot
        else:
            past_trace, available = True, gang_on_spot == 0
        index += 1
        if mode == SPOT and not available:
            mode, preemptions = IDLE, preemptions + 1
            done -= since_checkpoint  # lost with the machines (explicit checkpoints only)
            since_checkpoint = stall_left = changeover_left = 0
        progress = Progress.from_ms(
            elapsed=t, deadline=deadline, work=work, done=done, changeover=changeover,
            changeover_left=changeover_left, decision_interval=tick,
        )  # fmt: skip
        chosen = decide(progress, mode, available)
        if chosen == SPOT and not available:
            raise AssertionError(f"{strategy} chose spot when none was available")  # a bug
        if chosen != mode and chosen != IDLE:
            changeover_left = changeover if started else first_start
            started = True
        if timeline is not None:
            timeline.append((t / MS_PER_HOUR, done / MS_PER_HOUR, available, chosen))
        mode = chosen
        used = tick
        if mode != IDLE:
            waiting = min(tick, changeover_left + stall_left)
            useful = tick - waiting
            if done + useful >= work:  # finishes inside this tick
                used, useful = waiting + (work - done), work - done
            from_changeover = min(changeover_left, waiting)
            changeover_left -= from_changeover
            stall_left -= waiting - from_changeover
            done += useful
            if every is not None:
                since_checkpoint += useful
                if since_checkpoint >= every and done < work:
                    since_checkpoint -= every
                    stall_left += checkpoint_cost
            if mode == SPOT:
                spot_ms += used * gang_on_spot
                on_demand_ms += used * always_on_demand
            else:
                on_demand_ms += used * (gang_on_spot + always_on_demand)
        elif always_on_demand:
            on_demand_ms += used * always_on_demand  # the coordinator waits, warm and paid
        t += used
    finished = done >= work
    spot_h, on_demand_h = spot_ms / MS_PER_HOUR, on_demand_ms / MS_PER_HOUR
    paid = spot_h + on_demand_h
    return Outcome(
        strategy=strategy if isinstance(strategy, str) else strategy.__name__,
        cost=spot_h * job.spot_price + on_demand_h * job.on_demand_price,
        finish_h=t / MS_PER_HOUR if finished else math.inf,
        deadline_met=finished and (deadline is None or t <= deadline),
        spot_hours=spot_h,
        on_demand_hours=on_demand_h,
        preemptions=preemptions,
        goodput=done / MS_PER_HOUR * job.nodes / paid if paid else 0.0,  # work done / paid
        wrapped=wrapped,
        past_trace=past_trace,
    )


@dataclass(frozen=True)
class Summary:
    """A strategy over many runs (starts, traces)."""

    strategy: str
    runs: int
    mean_cost: float
    mean_finish_h: float
    deadline_met: float
    """Share of runs that met the deadline."""
    mean_goodput: float
    mean_spot_hours: float
    mean_on_demand_hours: float
    mean_preemptions: float
    wrapped: int = 0
    """Runs whose window wrapped around its trace's end."""
    past_trace: int = 0
    """Runs that went on past their trace's end (and saw no spot there)."""
    mean_vs_optimum: float | None = None
    """Mean over its runs that met the deadline of cost / the optimum from the same start."""
    worst_vs_optimum: float | None = None


def summarise(outcomes: Sequence[Outcome]) -> Summary:
    count = len(outcomes)

    def mean(values: Sequence[float]) -> float:
        return sum(values) / count

    mean_vs, worst_vs = mean_and_worst([o.vs_optimum for o in outcomes])

    return Summary(
        strategy=outcomes[0].strategy,
        runs=count,
        mean_cost=mean([o.cost for o in outcomes]),
        mean_finish_h=mean([o.finish_h for o in outcomes]),
        deadline_met=mean([float(o.deadline_met) for o in outcomes]),
        mean_goodput=mean([o.goodput for o in outcomes]),
        mean_spot_hours=mean([o.spot_hours for o in outcomes]),
        mean_on_demand_hours=mean([o.on_demand_hours for o in outcomes]),
        mean_preemptions=mean([float(o.preemptions) for o in outcomes]),
        wrapped=sum(o.wrapped for o in outcomes),
        past_trace=sum(o.past_trace for o in outcomes),
        mean_vs_optimum=mean_vs,
        worst_vs_optimum=worst_vs,
    )


def start_ticks(job: Job, trace: Trace, starts: int, *, wrap: bool = False) -> list[int]:
    """`starts` start ticks spread evenly over those whose window (`Job.window_h`) lies inside
    the trace, or over the whole trace with `wrap`; CostInputError when too few fit."""
    if isinstance(starts, bool) or not isinstance(starts, int) or starts < 1:
        raise CostInputError(f"starts is {starts!r}: use 1 or more start offsets per trace")
    length = len(trace.available)
    if wrap:
        return [index * length // starts for index in range(starts)]
    window = -(-whole_ms(job.window_h()) // tick_ms(trace))  # ticks, rounded up
    fit = length - window + 1
    what = "deadline" if job.deadline_h is not None else "work"
    if fit < 1:
        raise CostInputError(
            f"trace {trace.name} covers {trace.hours:g} h, less than the {what} "
            f"({job.window_h():g} h): no start fits in it; give traces that cover the {what}, "
            "or --wrap to go on from a trace's beginning past its end"
        )
    if fit < starts:
        raise CostInputError(
            f"only {fit} start(s) of trace {trace.name} ({trace.hours:g} h) leave the "
            f"{what} ({job.window_h():g} h) before its end, fewer than the {starts} asked "
            f"for: give --starts {fit} or fewer, longer traces, or --wrap"
        )
    return [index * fit // starts for index in range(starts)]


def replay(
    job: Job,
    traces: Sequence[Trace],
    *,
    starts: int = 1,
    strategies: Sequence[str] = STRATEGIES,
    wrap: bool = False,
    optimum: bool = False,
    history: Sequence[Trace] | None = None,
) -> dict[str, list[Outcome]]:
    """Every strategy from `starts` evenly spaced start ticks of every trace (`start_ticks`),
    each outcome with the optimum from its start when asked (`spotrain.cost.optimum`; a job
    with a deadline only). `history`: for each trace, what the environment saw of its market
    before (for `markov`). The optimum moves the whole gang between markets, as every strategy
    does but `blueprint-mix` of several machines (its coordinator stays on on-demand while the
    others follow spot): that one is not measured against it."""
    cheapest: Callable[..., Any] | None = None
    if optimum and job.deadline_h is not None:
        from spotrain.cost import optimum as optimal  # numpy: the `cost` extra

        cheapest = optimal.cheapest
    results: dict[str, list[Outcome]] = {s: [] for s in strategies}
    for index, trace in enumerate(traces):
        known = None  # read once per trace, not per start
        if history is not None and MARKOV in strategies:
            from spotrain.cost.markov_policy import known_rates

            known = known_rates([history[index]], job.nodes)[0]
        for start in start_ticks(job, trace, starts, wrap=wrap):
            best = None if cheapest is None else cheapest(job, trace, start_tick=start,
                                                          wrap=wrap).cost  # fmt: skip
            for strategy in strategies:
                outcome = simulate(job, trace, strategy, start_tick=start, wrap=wrap,
                                   known=known)  # fmt: skip
                if strategy != BLUEPRINT_MIX or job.nodes == 1:
                    outcome = replace(outcome, optimum_cost=best)
                results[strategy].append(outcome)
    return results
