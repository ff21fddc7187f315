"""Replay spot availability against each strategy: what a run would cost, when it would
finish, whether it meets its deadline.

Model (the one of "Can't Be Late", NSDI '24): the job needs `work_h` hours of its gang's
compute; every move onto machines (a start, a restart after a preemption, a switch between
spot and on-demand) costs `changeover_h` of paid time without progress (restart + restore +
the work since the last checkpoint). A gang on spot is preempted in the first tick with fewer
spot instances available than it needs, and pays again to come back. Prices are per
instance-hour; a trace shorter than the run wraps around.

Strategies:
- `on-demand`: the whole gang on on-demand from the start.
- `spot-greedy`: spot whenever there is some, on-demand only when the deadline forces it.
- `blueprint-mix`: what the fleet does without a deadline: the coordinator on on-demand for
  the whole run, the other machines on spot, covered by on-demand after a fixed wait
  (`fallback_after_h`, the handler's on-demand deadline) and given back when spot returns.
- `uniform-progress`: the deadline-aware policy (`spotrain.deadline_policy`), the one the
  interruption handler runs for runs with a deadline.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spotrain import deadline_policy
from spotrain.cost.traces import Trace
from spotrain.deadline_policy import IDLE, ON_DEMAND, SPOT, Progress
from spotrain.errors import CostInputError

ON_DEMAND_ONLY = "on-demand"
SPOT_GREEDY = "spot-greedy"
BLUEPRINT_MIX = "blueprint-mix"
UNIFORM_PROGRESS = "uniform-progress"
STRATEGIES = (ON_DEMAND_ONLY, SPOT_GREEDY, BLUEPRINT_MIX, UNIFORM_PROGRESS)
DEFAULT_FALLBACK_AFTER_H = 10 / 60
"""The handler's fixed on-demand deadline (InterruptionHandlerProps.on_demand_deadline_minutes)."""


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
        if not self.work_h > 0:
            problems.append(f"the work is {self.work_h} hours: give a positive number of hours")
        if self.changeover_h < 0:
            problems.append(f"the changeover is {self.changeover_h} hours: use 0 or more")
        for label, price in (("on-demand", self.on_demand_price), ("spot", self.spot_price)):
            if not price > 0:
                problems.append(f"the {label} price is {price} USD/h: give a positive price")
        if self.nodes < 1:
            problems.append(f"nodes is {self.nodes}: a run has at least one machine")
        if self.deadline_h is not None and self.work_h > 0:
            if not self.deadline_h > 0:
                problems.append(
                    f"the deadline is {self.deadline_h} hours away: give a positive number of hours"
                )
            elif self.deadline_h < self.work_h + self.start_h:
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

    def progress(self, elapsed_h: float, done_h: float) -> Progress:
        return Progress(
            elapsed_h=elapsed_h,
            deadline_h=self.deadline_h if self.deadline_h is not None else math.inf,
            work_h=self.work_h,
            done_h=done_h,
            changeover_h=self.changeover_h,
        )


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

    @property
    def finished(self) -> bool:
        return math.isfinite(self.finish_h)


Decide = Callable[[Progress, str, bool, float], str]
"""(progress, current mode, spot available for the gang, tick hours) -> mode."""


def _policy(function: Callable[..., deadline_policy.Choice]) -> Decide:
    def decide(progress: Progress, current: str, available: bool, _tick_h: float) -> str:
        return function(progress, current=current, spot_available=available).mode

    return decide


def _fixed_fallback(after_h: float) -> Decide:
    """Today's handler: on-demand after `after_h` short of spot, back to spot when it returns."""
    short_for = 0.0

    def decide(progress: Progress, current: str, available: bool, tick_h: float) -> str:
        nonlocal short_for
        if available:
            short_for = 0.0
            return SPOT
        if current == ON_DEMAND:
            return ON_DEMAND
        short_for += tick_h
        return ON_DEMAND if short_for > after_h else IDLE

    return decide


def simulate(
    job: Job,
    trace: Trace,
    strategy: str,
    *,
    start_tick: int = 0,
    timeline: list[tuple[float, float, bool, str]] | None = None,
) -> Outcome:
    """One run of `job` from tick `start_tick` of `trace` under `strategy`; `timeline`, when
    given, receives (hours since the start, compute done, spot available, mode chosen) for
    every tick."""
    always_on_demand, gang_on_spot = 0, job.nodes
    if strategy == ON_DEMAND_ONLY:
        decide: Decide = lambda *_: ON_DEMAND  # noqa: E731
    elif strategy == SPOT_GREEDY:
        decide = _policy(deadline_policy.greedy)
    elif strategy == UNIFORM_PROGRESS:
        decide = _policy(deadline_policy.uniform_progress)
    elif strategy == BLUEPRINT_MIX:
        always_on_demand, gang_on_spot = 1, job.nodes - 1
        decide = _fixed_fallback(job.fallback_after_h) if gang_on_spot else lambda *_: ON_DEMAND
    else:
        raise CostInputError(
            f"strategy {strategy!r} is unknown: use one of {', '.join(STRATEGIES)}"
        )
    tick_h = trace.gap_s / 3600
    horizon_h = 10 * max(job.work_h, job.deadline_h or 0.0) + trace.hours
    t = done = changeover_left = spot_h = on_demand_h = 0.0
    since_checkpoint = stall_left = 0.0
    started = False
    mode, preemptions, tick = IDLE, 0, start_tick
    while done < job.work_h and t < horizon_h:
        available = trace.available[tick % len(trace.available)] >= gang_on_spot
        tick += 1
        if mode == SPOT and not available:
            mode, preemptions = IDLE, preemptions + 1
            done -= since_checkpoint  # lost with the machines (explicit checkpoints only)
            since_checkpoint = stall_left = 0.0
        chosen = decide(job.progress(t, done), mode, available, tick_h)
        if chosen == SPOT and not available:
            raise AssertionError(f"{strategy} chose spot when none was available")  # a bug
        if chosen != mode and chosen != IDLE:
            changeover_left = job.changeover_h if started else job.start_h
            started = True
        if timeline is not None:
            timeline.append((t, done, available, chosen))
        mode = chosen
        used = tick_h
        if mode != IDLE:
            waiting = min(tick_h, changeover_left + stall_left)
            useful = tick_h - waiting
            if done + useful >= job.work_h:  # finishes inside this tick
                used = waiting + (job.work_h - done)
                useful = job.work_h - done
            from_changeover = min(changeover_left, waiting)
            changeover_left -= from_changeover
            stall_left -= waiting - from_changeover
            done += useful
            if job.checkpoint_every_h is not None:
                since_checkpoint += useful
                if since_checkpoint >= job.checkpoint_every_h and done < job.work_h:
                    since_checkpoint -= job.checkpoint_every_h
                    stall_left += job.checkpoint_cost_h
            if mode == SPOT:
                spot_h += used * gang_on_spot
                on_demand_h += used * always_on_demand
            else:
                on_demand_h += used * (gang_on_spot + always_on_demand)
        elif always_on_demand:
            on_demand_h += used * always_on_demand  # the coordinator waits, warm and paid
        t += used
    finish = t if done >= job.work_h else math.inf
    paid = spot_h + on_demand_h
    return Outcome(
        strategy=strategy,
        cost=spot_h * job.spot_price + on_demand_h * job.on_demand_price,
        finish_h=finish,
        deadline_met=(job.deadline_h is None and math.isfinite(finish))
        or (job.deadline_h is not None and finish <= job.deadline_h + 1e-9),
        spot_hours=spot_h,
        on_demand_hours=on_demand_h,
        preemptions=preemptions,
        goodput=job.work_h * job.nodes / paid if paid else 0.0,
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


def summarise(outcomes: Sequence[Outcome]) -> Summary:
    count = len(outcomes)

    def mean(values: Sequence[float]) -> float:
        return sum(values) / count

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
    )


def replay(
    job: Job, traces: Sequence[Trace], *, starts: int = 1, strategies: Sequence[str] = STRATEGIES
) -> dict[str, list[Outcome]]:
    """Every strategy from `starts` evenly spaced start ticks of every trace."""
    if starts < 1:
        raise CostInputError(f"starts is {starts}: use 1 or more start offsets per trace")
    results: dict[str, list[Outcome]] = {s: [] for s in strategies}
    for trace in traces:
        for index in range(starts):
            start = index * len(trace.available) // starts
            for strategy in strategies:
                results[strategy].append(simulate(job, trace, strategy, start_tick=start))
    return results
