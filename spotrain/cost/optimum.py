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
(numpy), about 20 ms for 48 h of work in 6-minute ticks.

States that cannot beat the best finish found so far (what they cost plus the rest of the
work at the spot price) are dropped as the programme goes, so it ends early on easy traces.
"""

from __future__ import annotations

import math
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
    wrapped: bool = False
    """Its window went past the trace's end and on from its beginning (asked for)."""


class _Programme:
    """The states after each tick: mode -> changeover still to pay (ms) -> least cost by units
    of compute done (inf: not reachable, or not worth keeping)."""

    def __init__(self, job: Job, tick: int) -> None:
        self.tick = tick
        self.work = whole_ms(job.work_h)
        self.changeover = whole_ms(job.changeover_h)
        self.first_start = whole_ms(job.start_h)
        self.unit = math.gcd(tick, self.changeover, self.first_start)
        self.units = -(-self.work // self.unit)  # states hold unfinished work: done < work
        per_ms = job.nodes / MS_PER_HOUR
        self.rate = {SPOT: job.spot_price * per_ms, ON_DEMAND: job.on_demand_price * per_ms}
        self.cheapest_rate = min(self.rate.values())
        self.idle = self._empty()
        self.modes: dict[str, dict[int, np.ndarray]] = {SPOT: {}, ON_DEMAND: {}}
        self.best = math.inf
        # What the work left would cost at the cheapest rate, from each unit done: the bound
        # below which a state is still worth keeping.
        done = np.arange(self.units) * self.unit
        self.rest = (self.work - done) * self.cheapest_rate

    def _empty(self) -> np.ndarray:
        return np.full(self.units, math.inf)

    def step(self, at: int, available: bool, deadline: int | None) -> None:
        """Tick starting at `at` ms, with spot for the gang or not."""
        everything = [self.idle, *(a for by in self.modes.values() for a in by.values())]
        new_idle = np.minimum.reduce(everything)
        new: dict[str, dict[int, np.ndarray]] = {SPOT: {}, ON_DEMAND: {}}
        for mode in (SPOT, ON_DEMAND):
            if mode == SPOT and not available:
                continue
            for left, costs in self.modes[mode].items():  # goes on, paying what is left
                self._advance(costs, mode, left, at, deadline, new)
            others = [self.idle, *self.modes[ON_DEMAND if mode == SPOT else SPOT].values()]
            entering = np.minimum.reduce(others)
            self._advance(entering, mode, self.changeover, at, deadline, new)
            fresh = self._empty()  # the run's first start: it has done nothing, paid nothing
            fresh[0] = 0.0
            self._advance(fresh, mode, self.first_start, at, deadline, new)
        self.idle = self._kept(new_idle)
        self.modes = {m: {k: self._kept(a) for k, a in by.items()} for m, by in new.items()}

    def _advance(
        self, costs: np.ndarray, mode: str, left: int, at: int, deadline: int | None,
        into: dict[str, dict[int, np.ndarray]],
    ) -> None:  # fmt: skip
        """A tick on `mode` from the states `costs`, `left` ms of changeover still to pay."""
        waiting = min(self.tick, left)
        useful = self.tick - waiting
        shift = useful // self.unit
        rate = self.rate[mode]
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
        target = into[mode]
        key = left - waiting
        target[key] = moved if key not in target else np.minimum(target[key], moved)

    def _kept(self, costs: np.ndarray) -> np.ndarray:
        costs[costs + self.rest >= self.best] = math.inf
        return costs

    def hopeless(self) -> bool:
        """No state left can beat the best finish, and neither can a first start now."""
        return (
            self.work * self.cheapest_rate >= self.best
            and bool(np.isinf(self.idle).all())
            and all(bool(np.isinf(a).all()) for by in self.modes.values() for a in by.values())
        )


def cheapest(job: Job, trace: Trace, *, start_tick: int = 0, wrap: bool = False) -> Optimum:
    """The optimum for `job` from tick `start_tick` of `trace` (module docstring). Jobs with
    explicit checkpoints (`checkpoint_every_h`) are not modelled: CostInputError."""
    from spotrain.cost.simulation import tick_ms

    if job.checkpoint_every_h is not None:
        raise CostInputError(
            "the optimum is computed for the study's model, where the changeover counts the "
            "work lost: leave checkpoint_every_h unset"
        )
    tick = tick_ms(trace)
    programme = _Programme(job, tick)
    deadline = whole_ms(job.deadline_h) if job.deadline_h is not None else None
    length = len(trace.available)
    horizon = deadline if deadline is not None else 10 * programme.work + length * tick
    wrapped, index, at = False, start_tick, 0
    while at < horizon and not (math.isfinite(programme.best) and programme.hopeless()):
        if index < length:
            count = trace.available[index]
        elif wrap:
            wrapped, count = True, trace.available[index % length]
        else:
            count = 0
        programme.step(at, count >= job.nodes, deadline)
        index, at = index + 1, at + tick
    best = programme.best
    return Optimum(best if math.isfinite(best) else None, wrapped)
