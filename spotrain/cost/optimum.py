"""The exact optimum a strategy is measured against: for a trace known in advance, the
cheapest schedule of spot, on-demand and idle ticks that does the work by the deadline, in the
simulator's own model (`spotrain.cost.simulation`): a decision per tick, a changeover paid
at every start and switch (the first start's own cost at the first), spot only in a tick with
enough of it for the gang, past the trace's end none (or the trace again, wrapped).

A dynamic programme over the ticks. After each tick the state is the mode the gang is in, what
it still has to pay of its changeover, and the compute done; each state keeps the least it can
have cost. Compute done is counted in whole units of the greatest common divisor of the tick,
the changeover and the first start, so every schedule's progress is a whole number of units
and the programme is exact (the simulator's milliseconds). A schedule ends in the tick that
finishes the work, paying that tick's used part only; the cheapest that ends by the deadline
is the optimum. Its cost is O(ticks x changeover phases x work units) array operations
(numpy): about 0.1 s for 48 h of work in 6-minute ticks, 1.7 s in 1-minute ones.

States that cannot beat the best finish found so far (what they cost plus the rest of the
work at the spot price) are dropped as the programme goes, so it ends early on easy traces.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from spotrain.core.deadline_policy import MS_PER_HOUR, ON_DEMAND, SPOT, whole_ms
from spotrain.core.errors import CostInputError

if TYPE_CHECKING:
    from spotrain.cost.simulation import Job
    from spotrain.cost.traces import Trace


@dataclass(frozen=True)
class Optimum:
    cost: float | None
    """USD of the cheapest schedule that meets the deadline; None: none does."""


class _Programme:
    """The states after each tick, per region: idle, or mode -> changeover still to pay (ms)
    -> least cost by units of compute done (inf: not reachable, or not worth keeping)."""

    def __init__(self, job: Job, tick: int, prices: Sequence[tuple[float, float]],
                 move_usd: float) -> None:  # fmt: skip
        """`prices`: each region's spot and on-demand price an instance-hour."""
        regions = len(prices)
        self.tick = tick
        self.work = whole_ms(job.work_h)
        self.changeover = whole_ms(job.changeover_h)
        self.first_start = whole_ms(job.start_h)
        self.unit = math.gcd(tick, self.changeover, self.first_start)
        self.units = -(-self.work // self.unit)  # states hold unfinished work: done < work
        self.move_usd = move_usd
        per_ms = job.nodes / MS_PER_HOUR
        self.rates = [{SPOT: spot * per_ms, ON_DEMAND: on_demand * per_ms}
                      for spot, on_demand in prices]  # fmt: skip
        self.cheapest_rate = min(rate for by in self.rates for rate in by.values())
        self.idle = [self._empty() for _ in range(regions)]
        self.modes: list[dict[str, dict[int, np.ndarray]]] = [
            {SPOT: {}, ON_DEMAND: {}} for _ in range(regions)
        ]
        self.best = math.inf
        # What the work left would cost at the cheapest rate, from each unit done: the bound
        # below which a state is still worth keeping.
        done = np.arange(self.units) * self.unit
        self.rest = (self.work - done) * self.cheapest_rate
        # The run's first start: it has done nothing and paid nothing.
        self.fresh = self._empty()
        self.fresh[0] = 0.0

    def _empty(self) -> np.ndarray:
        return np.full(self.units, math.inf)

    def _all(self, region: int) -> list[np.ndarray]:
        return [self.idle[region], *(a for by in self.modes[region].values() for a in by.values())]

    def step(self, at: int, available: Sequence[bool], deadline: int | None) -> None:
        """Tick starting at `at` ms, with spot for the gang in each region or not."""
        regions = range(len(self.idle))
        anywhere = [np.minimum.reduce(self._all(r)) for r in regions]
        new: list[dict[str, dict[int, np.ndarray]]] = [{SPOT: {}, ON_DEMAND: {}} for _ in regions]
        for region in regions:
            # Arriving from another region: its best state, and the move's transfer.
            moved_in = [anywhere[r] + self.move_usd for r in regions if r != region]
            for mode in (SPOT, ON_DEMAND):
                if mode == SPOT and not available[region]:
                    continue
                for left, costs in self.modes[region][mode].items():  # goes on, paying the rest
                    self._advance(costs, region, mode, left, at, deadline, new)
                other = ON_DEMAND if mode == SPOT else SPOT
                entering = np.minimum.reduce(
                    [self.idle[region], *self.modes[region][other].values(), *moved_in]
                )
                self._advance(entering, region, mode, self.changeover, at, deadline, new)
                self._advance(self.fresh, region, mode, self.first_start, at, deadline, new)
        self.idle = [self._kept(a) for a in anywhere]  # idle stays where it was
        self.modes = [{m: {k: self._kept(a) for k, a in by.items()} for m, by in r.items()}
                      for r in new]  # fmt: skip

    def _advance(
        self, costs: np.ndarray, region: int, mode: str, left: int, at: int,
        deadline: int | None, into: list[dict[str, dict[int, np.ndarray]]],
    ) -> None:  # fmt: skip
        """A tick on `mode` in `region` from the states `costs`, `left` ms of changeover still
        to pay."""
        waiting = min(self.tick, left)
        useful = self.tick - waiting
        shift = useful // self.unit
        rate = self.rates[region][mode]
        # The states this tick finishes: done + useful >= work, paying the used part only.
        first = max(0, -(-(self.work - useful) // self.unit))
        if first < self.units:
            done = np.arange(first, self.units) * self.unit
            used = waiting + (self.work - done)
            cost = costs[first:] + used * rate
            if deadline is not None:
                cost = np.where(at + used <= deadline, cost, math.inf)
            self.best = min(self.best, float(cost.min()))
        if first <= 0:
            return
        moved = self._empty()
        moved[shift : first + shift] = costs[:first] + self.tick * rate
        target = into[region][mode]
        key = left - waiting
        target[key] = moved if key not in target else np.minimum(target[key], moved)

    def _kept(self, costs: np.ndarray) -> np.ndarray:
        costs[costs + self.rest >= self.best] = math.inf
        return costs

    def hopeless(self) -> bool:
        """No state left can beat the best finish, and neither can a first start now."""
        return self.work * self.cheapest_rate >= self.best and all(
            bool(np.isinf(a).all()) for r in range(len(self.idle)) for a in self._all(r)
        )


def cheapest(job: Job, trace: Trace, *, start_tick: int = 0, wrap: bool = False) -> Optimum:
    """The optimum for `job` from tick `start_tick` of `trace` (module docstring). Jobs with
    explicit checkpoints (`checkpoint_every_h`) are not modelled: CostInputError."""
    return cheapest_across([trace], job, move_usd=0.0, start_tick=start_tick, wrap=wrap)


def cheapest_across(
    sampled: Sequence[Trace], job: Job, *, move_usd: float, start_tick: int = 0,
    wrap: bool = False, region_prices: Sequence[tuple[float, float]] | None = None,
) -> Optimum:  # fmt: skip
    """The optimum over several regions, one trace each (the same ticks): the run trains in
    one region at a time, and starting in another region than the one it was last in pays
    `move_usd` besides the changeover. `region_prices`: each region's spot and on-demand price
    an instance-hour (`simulation.region_prices`); None: the job's in every region."""
    from spotrain.cost.simulation import region_prices as priced
    from spotrain.cost.simulation import tick_ms

    if job.checkpoint_every_h is not None:
        raise CostInputError(
            "the optimum is computed for the study's model, where the changeover counts the "
            "work lost: leave checkpoint_every_h unset"
        )
    tick = tick_ms(sampled[0])
    if any(tick_ms(t) != tick for t in sampled):
        raise CostInputError("the regions' traces have different ticks: give traces of one tick "
                             "(--tick coarsens them alike)")  # fmt: skip
    programme = _Programme(job, tick, priced(job, len(sampled), region_prices), move_usd)
    deadline = whole_ms(job.deadline_h) if job.deadline_h is not None else None
    length = min(len(t.available) for t in sampled)
    horizon = deadline if deadline is not None else 10 * programme.work + length * tick
    index, at = start_tick, 0
    while at < horizon and not (math.isfinite(programme.best) and programme.hopeless()):
        available = [_count(t, index, length, wrap) >= job.nodes for t in sampled]
        programme.step(at, available, deadline)
        index, at = index + 1, at + tick
    best = programme.best
    return Optimum(best if math.isfinite(best) else None)


def _count(trace: Trace, index: int, length: int, wrap: bool) -> int:
    """Spot instances at tick `index`: none past the trace's end, unless it wraps."""
    if index < length:
        return trace.available[index]
    return trace.available[index % length] if wrap else 0
