"""Replay a run over several regions at once (one availability trace per region, the same
ticks), in the single-region simulator's model (`spotrain.cost.simulation`) with one more
choice: where. The run trains in one region at a time; a start in another region than the one
it was last in pays the changeover and the move's transfer (`move_usd`: the checkpoint's and
dataset's bytes at the inter-region price, `spotrain.core.inter_region`).

Strategies:
- `outage-fill@home`: the handler's policy confined to the first region (what a run does
  today, without moves).
- `spot-anywhere`: the plain rule: spot here while there is some; when it is gone here and
  there is some in another region, move there if the time left is more than the work and two
  changeovers (the move's and the net's margin); else wait; the deadline's safety net as
  every policy's.
- `outage-fill`: the handler's policy across regions (`spotrain.core.outage_fill.across`).
- `markov`: the policy that plans against a model of each region's market
  (`spotrain.cost.markov_policy`), its means from `history` (what the environment saw of its
  regions before the run) or, without, from the run's own checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spotrain.core import capacity_policy, outage_fill
from spotrain.core.deadline_policy import (
    IDLE,
    MS_PER_HOUR,
    ON_DEMAND,
    SPOT,
    Progress,
    as_seen,
    safety_net,
    whole_ms,
)
from spotrain.core.errors import CostInputError
from spotrain.cost.simulation import Job, tick_ms, versus_optimum
from spotrain.cost.simulation import region_prices as region_prices_of
from spotrain.cost.traces import Trace

if TYPE_CHECKING:
    from spotrain.cost.markov_policy import RegionRates

HOME_ONLY = "outage-fill@home"
SPOT_ANYWHERE = "spot-anywhere"
OUTAGE_FILL = "outage-fill"
MARKOV = "markov"
STRATEGIES = (HOME_ONLY, SPOT_ANYWHERE, OUTAGE_FILL, MARKOV)

Where = tuple[int, str]
"""(region index, mode)."""
DecideWhere = Callable[[Progress, Where, Sequence[bool]], Where]
"""(progress, where the run is, spot for the gang in each region) -> where it goes."""


@dataclass(frozen=True)
class RegionsOutcome:
    strategy: str
    cost: float
    """USD, the moves' transfers included."""
    finish_h: float
    deadline_met: bool
    moves: int
    """Starts in another region than the run was last in."""
    spot_hours: float
    on_demand_hours: float
    optimum_cost: float | None = None

    @property
    def vs_optimum(self) -> float | None:
        return versus_optimum(self.cost, self.optimum_cost, self.deadline_met)


def _home_only(job: Job) -> DecideWhere:
    record = outage_fill.SpotRecord()

    def decide(progress: Progress, where: Where, available: Sequence[bool]) -> Where:
        nonlocal record
        gap = capacity_policy.longest_gap_s(progress.decision_interval_h)
        record = record.seen(progress.elapsed_h * 3600, available[0], longest_gap_s=gap)
        choice = outage_fill.outage_fill(progress, current=where[1],
                                         spot_available=available[0], record=record)  # fmt: skip
        return 0, choice.mode

    return decide


def _spot_anywhere(job: Job) -> DecideWhere:
    def decide(progress: Progress, where: Where, available: Sequence[bool]) -> Where:
        region, current = where
        here = available[region]
        forced = safety_net(progress, as_seen(current, here), here)
        if forced is not None:
            return region, forced.mode
        if here:
            return region, SPOT
        if current == ON_DEMAND:
            return region, ON_DEMAND
        elsewhere = [r for r, spot in enumerate(available) if spot]
        left = progress.deadline_h - progress.elapsed_h
        if elsewhere and left > progress.work_h - progress.done_h + 2 * progress.changeover_h:
            return elsewhere[0], SPOT
        return region, IDLE

    return decide


def _outage_fill(move_usd: float, gang: Sequence[tuple[float, float]]) -> DecideWhere:
    records = outage_fill.RegionRecords.empty(0)

    def decide(progress: Progress, where: Where, available: Sequence[bool]) -> Where:
        nonlocal records
        gap = capacity_policy.longest_gap_s(progress.decision_interval_h)
        records = records.seen(progress.elapsed_h * 3600, available, longest_gap_s=gap)
        choice = outage_fill.across(
            progress, region=where[0], current=where[1], spot_available=available,
            records=records, move_usd=move_usd, prices=gang,
        )  # fmt: skip
        return choice.region, choice.mode

    return decide


def _markov(move_usd: float, gang: Sequence[tuple[float, float]],
            known: Sequence[RegionRates] | None,
            deadline_utc_h: float | None) -> DecideWhere:  # fmt: skip
    from spotrain.cost import markov_policy  # numpy: the `cost` extra

    planned = markov_policy.Prices.per_region(gang, move_usd)
    policy = markov_policy.MarkovPolicy(len(gang), planned, known=known,
                                        deadline_utc_h=deadline_utc_h)  # fmt: skip
    started = False

    def decide(progress: Progress, where: Where, available: Sequence[bool]) -> Where:
        nonlocal started
        decision = policy.decide(progress, region=where[0] if started else None,
                                 current=where[1], spot_available=available)  # fmt: skip
        started = started or decision.mode != IDLE
        return decision.region, decision.mode

    return decide


def _strategy(name: str | DecideWhere, job: Job, move_usd: float,
              gang: Sequence[tuple[float, float]], known: Sequence[RegionRates] | None,
              deadline_utc_h: float | None) -> DecideWhere:  # fmt: skip
    """`gang`: each region's spot and on-demand price an hour of the whole gang;
    `deadline_utc_h`: the deadline's hour of the day, where the traces say when they start."""
    if callable(name):  # a decision function of the caller's
        return name
    if name == MARKOV:
        return _markov(move_usd, gang, known, deadline_utc_h)
    if name == HOME_ONLY:
        return _home_only(job)
    if name == SPOT_ANYWHERE:
        return _spot_anywhere(job)
    if name == OUTAGE_FILL:
        return _outage_fill(move_usd, gang)
    raise CostInputError(f"strategy {name!r} is unknown: use one of {', '.join(STRATEGIES)}")


def simulate_across(
    job: Job, sampled: Sequence[Trace], strategy: str | DecideWhere, *, move_usd: float,
    start_tick: int = 0, known: Sequence[RegionRates] | None = None,
    region_prices: Sequence[tuple[float, float]] | None = None,
) -> RegionsOutcome:  # fmt: skip
    """One run of `job` from tick `start_tick` of every region's trace under `strategy`; past
    the traces' end no spot anywhere. `known`: the regions' means the environment has seen
    (for `markov`). `region_prices`: each region's spot and on-demand price an instance-hour
    (`simulation.region_prices`; None: the job's everywhere), which `markov` plans with and
    `outage-fill` weighs its moves by, as the handler does with the price book's."""
    if job.checkpoint_every_h is not None or job.deadline_h is None:
        raise CostInputError(
            "a replay across regions is of a job with a deadline and the study's model: give "
            "a deadline, leave checkpoint_every_h unset"
        )
    tick = tick_ms(sampled[0])
    prices = region_prices_of(job, len(sampled), region_prices)
    gang = [(spot * job.nodes, on_demand * job.nodes) for spot, on_demand in prices]
    decide = _strategy(strategy, job, move_usd, gang, known,
                       sampled[0].utc_hour(start_tick, after_h=job.deadline_h))  # fmt: skip
    work, changeover, first_start = (whole_ms(job.work_h), whole_ms(job.changeover_h),
                                     whole_ms(job.start_h))  # fmt: skip
    deadline = whole_ms(job.deadline_h)
    length = min(len(t.available) for t in sampled)
    horizon = 10 * max(work, deadline) + length * tick
    t = done = changeover_left = spot_ms = on_demand_ms = moves = 0
    paid = 0.0  # USD for machines, each tick at its region's price
    region: int | None = None
    mode, index = IDLE, start_tick
    while done < work and t < horizon:
        available = [index < length and trace.available[index] >= job.nodes
                     for trace in sampled]  # fmt: skip
        index += 1
        if mode == SPOT and not available[region or 0]:
            mode, changeover_left = IDLE, 0  # preempted
        progress = Progress.from_ms(elapsed=t, deadline=deadline, work=work, done=done,
                                    changeover=changeover, changeover_left=changeover_left,
                                    decision_interval=tick)  # fmt: skip
        to, chosen = decide(progress, (region or 0, mode), available)
        if chosen == SPOT and not available[to]:
            raise AssertionError(f"{strategy} chose spot in region {to}, which had none")
        if chosen != IDLE and (chosen != mode or to != region):
            changeover_left = first_start if region is None else changeover
            moves += region is not None and to != region
            region = to
        mode = chosen
        used = tick
        if mode != IDLE:
            waiting = min(tick, changeover_left)
            useful = tick - waiting
            if done + useful >= work:
                used, useful = waiting + (work - done), work - done
            changeover_left -= waiting
            done += useful
            if mode == SPOT:
                spot_ms += used * job.nodes
            else:
                on_demand_ms += used * job.nodes
            price = prices[region or 0][0 if mode == SPOT else 1]
            paid += used * job.nodes / MS_PER_HOUR * price
        t += used
    spot_h, on_demand_h = spot_ms / MS_PER_HOUR, on_demand_ms / MS_PER_HOUR
    finished = done >= work
    return RegionsOutcome(
        strategy=strategy if isinstance(strategy, str) else strategy.__name__,
        cost=paid + moves * move_usd,
        finish_h=t / MS_PER_HOUR if finished else math.inf,
        deadline_met=finished and t <= deadline,
        moves=moves,
        spot_hours=spot_h,
        on_demand_hours=on_demand_h,
    )


def replay_across(
    job: Job, sampled: Sequence[Trace], *, move_usd: float, starts: int,
    strategies: Sequence[str] = STRATEGIES, history: Sequence[Trace] | None = None,
    region_prices: Sequence[tuple[float, float]] | None = None,
) -> dict[str, list[RegionsOutcome]]:  # fmt: skip
    """Every strategy from `starts` start ticks spread over those whose deadline fits in
    every region's trace, each outcome with the optimum across the regions from its start.
    `history`: a trace per region of what the environment saw before (for `markov`);
    `region_prices`: as `simulate_across` takes them."""
    from dataclasses import replace

    from spotrain.cost import optimum
    from spotrain.cost.simulation import start_ticks

    if len({tick_ms(t) for t in sampled}) > 1:
        raise CostInputError("the regions' traces have different ticks: give traces of one "
                             "tick (--tick coarsens them alike)")  # fmt: skip
    known = None
    if history is not None:
        from spotrain.cost.markov_policy import known_rates

        known = known_rates(history, job.nodes)
    shortest = min(sampled, key=lambda t: len(t.available))
    results: dict[str, list[RegionsOutcome]] = {s: [] for s in strategies}
    for start in start_ticks(job, shortest, starts):
        best = optimum.cheapest_across(sampled, job, move_usd=move_usd, start_tick=start,
                                       region_prices=region_prices).cost  # fmt: skip
        for strategy in strategies:
            outcome = simulate_across(job, sampled, strategy, move_usd=move_usd,
                                      start_tick=start, known=known,
                                      region_prices=region_prices)  # fmt: skip
            results[strategy].append(replace(outcome, optimum_cost=best))
    return results
