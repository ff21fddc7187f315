"""Markov: a deadline policy that plans against a model of each region's spot market, for a run
in one region or several (`spotrain cost simulate`'s strategy `markov`), measured beside
`spotrain.core.outage_fill` in bench/cost.md. The interruption handler runs it for a run given
a plan: this module solves it (numpy, which the handler's Lambda does not have) where `spotrain
run deadline-plan` runs, and stores it (`Plan.slices`); the lookup, `deadline_plan.decide`,
lives in the core, and the simulator calls it on the plan it solves, so both decide alike.

The model: each region's spot comes in spells and outages, a two-state Markov chain per
decision tick (a spell ends with probability tick / mean spell, an outage with tick / mean
outage), the regions independent of each other. Against that model the policy is exact: a
finite-horizon dynamic programme over the ticks left to the deadline, whose state is the work
left (whole ticks), which regions have spot now, where the run is and on what (idle, on-demand
or spot), and the changeover ticks it still has to pay. Each tick an action is chosen: idle, go
on, on-demand in the region it is in, or spot in a region that has some. Starting or switching
pays the changeover at the new mode's price; a start in another region pays the move
(`move_usd`) too. A tick of spot whose region loses its capacity leaves the run idle there.
Missing the deadline costs `MISSED_USD`.

The programme is solved backwards once for the ticks left and the work left, and looked up at
each check. The means come from what the environment has seen of its regions before the run
(`known`: its records of earlier weeks), or else from the run's own checks
(`outage_fill.RegionRecords`, with the record's prior until the evidence is in); then the
programme is solved again whenever a region's means have moved by more than `RESOLVE_RATIO`.
Only the guard of `spotrain.core.deadline_policy`'s safety net goes first, in `decide`
(on-demand once a single changeover is all the slack left): the programme prices the
deadline itself, and the
net's 2d margin, which sends a run on on-demand to the end, cost 1.076x the optimum where the
programme alone cost 1.062x (across regions, the first two development seeds, 52 h, moves at
$0; no misses either way). Each decision carries its reason: the work and time left, each
region's spot now and the means the plan assumed, and the action.

Why two means per region and nothing more. Richer models were measured and were not worth their
size (bench/cost.py's runs across regions; mean cost over the optimum):
- An outage's age as state (each region's outage in two or three age buckets, their rates
  counted from the history: a semi-Markov chain, as outages are log-normal) and the regions'
  joint transitions (their shared dry spells) each moved the mean by at most 0.007. At $3 a
  move, 56 h, held out: 1.121x became 1.114-1.127x. At $0, 52 h, development: 1.069x became
  1.064-1.074x. The age buckets would have multiplied the plan by up to 8.
- The run's own checks added to the history's means (the history weighted as 48 h of checks,
  solved again when the means move) gained 0.005 at $3.
- Even each region's means taken from the run's own window, known in advance, cost 1.086x at
  $3 (56 h, held out) and 1.055x at $0 (52 h, development). Most of what is left is when spot
  comes and goes, which no model of the regions' means foresees.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from spotrain.core import capacity_policy, deadline_plan, outage_fill
from spotrain.core.deadline_plan import GO_ON, IDLE_THERE, ON_DEMAND_HERE, SPOT_IN
from spotrain.core.deadline_policy import Progress
from spotrain.core.outage_fill import Placement
from spotrain.cost.traces import Trace

if TYPE_CHECKING:
    from spotrain.cost.simulation import Job

MISSED_USD = 1e6
"""The model's price of a missed deadline: more than any schedule that meets it."""
RESOLVE_RATIO = deadline_plan.MOVED_RATIO
"""Solve again when a region's mean spell or outage has moved by more than this factor."""


@dataclass(frozen=True)
class RegionRates:
    """A region's spot market as the model sees it (hours)."""

    mean_spell_h: float
    mean_outage_h: float

    @classmethod
    def of(cls, record: outage_fill.SpotRecord) -> RegionRates:
        return cls(record.spell_h(), record.outage_h())

    def moved_from(self, other: RegionRates) -> bool:
        return deadline_plan.moved((other.mean_spell_h, other.mean_outage_h),
                                   (self.mean_spell_h, self.mean_outage_h))  # fmt: skip


def known_rates(history: Sequence[Trace], nodes: int) -> list[RegionRates]:
    """Each region's means as its record of `history` (one trace per region, what the
    environment saw before the run) gives them, for a gang of `nodes` machines."""
    rates = []
    for trace in history:
        record = outage_fill.SpotRecord()
        for index, capacity in enumerate(trace.available):
            record = record.seen(index * trace.gap_s, capacity >= nodes,
                                 longest_gap_s=trace.gap_s)  # fmt: skip
        rates.append(RegionRates.of(record))
    return rates


@dataclass(frozen=True)
class Prices:
    """What an hour of the run's gang costs on each market, and a move between regions (USD)."""

    spot_per_hour: float
    on_demand_per_hour: float
    move_usd: float
    regional: tuple[tuple[float, float], ...] = ()
    """Per region, home first, the gang's spot and on-demand price an hour where regions'
    prices differ (the price book's; spot often by half from one region to the next); empty:
    every region at the two above."""

    @classmethod
    def of(cls, job: Job, move_usd: float = 0.0) -> Prices:
        """The prices of `job`'s whole gang."""
        return cls(job.spot_price * job.nodes, job.on_demand_price * job.nodes, move_usd)

    @classmethod
    def per_region(cls, regional: Sequence[tuple[float, float]], move_usd: float) -> Prices:
        """Each region's spot and on-demand price an hour of the gang, home first."""
        regional = tuple((spot, on_demand) for spot, on_demand in regional)
        return cls(*regional[0], move_usd=move_usd, regional=regional)

    def in_region(self, region: int) -> tuple[float, float]:
        """Spot's and on-demand's price an hour in `region`."""
        return (
            self.regional[region]
            if self.regional
            else (self.spot_per_hour, self.on_demand_per_hour)
        )


class Plan:
    """The solved programme: the best action for every state up to `ticks` ticks left and
    `work` ticks of work left, in `len(rates)` regions."""

    def __init__(self, rates: Sequence[RegionRates], prices: Prices, *, tick_h: float,
                 ticks: int, work: int, changeover: int) -> None:  # fmt: skip
        self.rates, self.prices, self.tick_h = tuple(rates), prices, tick_h
        self.regions = len(self.rates)
        self.ticks, self.work, self.changeover = ticks, work, changeover
        self.action, self.first_region, self.idle_value = _solve(self)

    def header(self, names: Sequence[str] = (), source: str = "") -> deadline_plan.Header:
        """What the plan was solved for, as `spotrain.core.deadline_plan` reads it."""
        return deadline_plan.Header(
            regions=tuple(names) or tuple(f"region {r}" for r in range(self.regions)),
            means=tuple((r.mean_spell_h, r.mean_outage_h) for r in self.rates),
            spot_per_hour=self.prices.spot_per_hour,
            on_demand_per_hour=self.prices.on_demand_per_hour, move_usd=self.prices.move_usd,
            regional_prices=self.prices.regional,
            tick_h=self.tick_h, ticks=self.ticks, work=self.work, changeover=self.changeover,
            source=source,
        )  # fmt: skip

    def at(self, left: int) -> tuple[memoryview, memoryview]:
        """The slice at `left` ticks left (`deadline_plan.Slices`), without a copy."""
        return (
            memoryview(self.action[left].reshape(-1)),
            memoryview(self.first_region[left].reshape(-1)),
        )

    def slices(self) -> Iterator[tuple[bytes, bytes]]:
        """Every slice, by ticks left, one at a time (a plan is up to 250 MB raw): what
        `deadline_plan.store` stores."""
        for t in range(self.ticks + 1):
            yield self.action[t].tobytes(), self.first_region[t].tobytes()


def _solve(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Backward induction over the ticks left: the action of every state (int8, indexed
    [ticks left, work left, spot bits, mode, changeover left]), the best region to be idle in
    for a run that has not started ([ticks left, work left, spot bits]), and the expected cost
    of a run not started with every tick of the plan left ([work left, spot bits]: what the
    expectimax test checks; the earlier ticks' are not kept)."""
    regions, changeover = plan.regions, plan.changeover
    states = 1 << regions
    modes = 3 * regions
    work = plan.work
    spot_of = np.array([[(bits >> r) & 1 for r in range(regions)] for bits in range(states)],
                       dtype=bool)  # fmt: skip
    transition = np.ones((states, states))
    for r, rates in enumerate(plan.rates):
        ends = min(1.0, plan.tick_h / rates.mean_spell_h)
        returns = min(1.0, plan.tick_h / rates.mean_outage_h)
        chain = np.array([[1 - returns, returns], [ends, 1 - ends]])  # [now][next]: 0 gone
        transition *= chain[spot_of[:, r].astype(int)][:, spot_of[:, r].astype(int)]
    price = np.zeros(modes)
    for r in range(regions):
        spot, on_demand = plan.prices.in_region(r)
        price[regions + r], price[2 * regions + r] = on_demand * plan.tick_h, spot * plan.tick_h
    region_of = np.arange(modes) % regions
    move = np.where(region_of[:, None] != np.arange(regions)[None, :], plan.prices.move_usd, 0.0)
    actions = SPOT_IN + regions
    # The value of every state with no ticks left: done, or the deadline missed.
    value = np.zeros((work + 1, states, modes, changeover + 1))
    value[1:] = MISSED_USD
    policy = np.zeros((plan.ticks + 1, work + 1, states, modes, changeover + 1), dtype=np.int8)
    first_region = np.zeros((plan.ticks + 1, work + 1, states), dtype=np.int8)
    idle_value = value[:, :, np.arange(regions), 0].min(axis=2)
    mode_idx = np.arange(modes)
    for left in range(1, plan.ticks + 1):
        # A run on spot whose region lost its capacity is idle there: that state needs no
        # remapping, as it has exactly the idle state's choices (going on is barred below).
        expected = np.einsum("ab,wbmk->wamk", transition, value)
        # Running mode m for this tick with c changeover ticks still to pay.
        running = np.empty_like(expected)
        running[:, :, :, 1:] = expected[:, :, :, :-1]
        running[1:, :, :, 0] = expected[:-1, :, :, 0]
        running[0] = 0.0
        running += price[None, None, :, None]
        q = np.full((work + 1, states, modes, changeover + 1, actions), np.inf)
        q[..., IDLE_THERE] = expected[:, :, region_of, 0][:, :, :, None]
        go_on = np.where((mode_idx >= regions)[None, None, :, None], running, np.inf)
        for r in range(regions):  # going on with spot needs spot there
            go_on[:, ~spot_of[:, r], 2 * regions + r, :] = np.inf
        q[..., GO_ON] = go_on
        q[..., ON_DEMAND_HERE] = running[:, :, regions + region_of, changeover][:, :, :, None]
        for r in range(regions):
            start = running[:, :, 2 * regions + r, changeover][:, :, None] + move[None, None, :, r]
            start = np.where(spot_of[None, :, r, None], start, np.inf)
            q[..., SPOT_IN + r] = start[:, :, :, None]
        q[0] = 0.0  # done: nothing more to decide
        policy[left] = q.argmin(axis=4)
        value = q.min(axis=4)
        value[0] = 0.0
        idle = value[:, :, np.arange(regions), 0]
        first_region[left] = idle.argmin(axis=2)
        idle_value = idle.min(axis=2)
    return policy, first_region, idle_value


_solved: dict[tuple[object, ...], Plan] = {}
"""The last plan solved, by what it was solved for: runs of one environment with known means
(and a replay's runs from several starts) share it, when it reaches as far as they need."""


class MarkovPolicy:
    """The policy for one run: keeps the regions' records and its plan, solving again when
    the records move (`decide` is called at every check, in order)."""

    def __init__(self, regions: int, prices: Prices, *, names: Sequence[str] = (),
                 known: Sequence[RegionRates] | None = None) -> None:  # fmt: skip
        self.records = outage_fill.RegionRecords.empty(regions)
        self.prices, self.names = prices, tuple(names)
        self.known = None if known is None else tuple(known)
        self.plan: Plan | None = None
        self.header: deadline_plan.Header | None = None
        """Its plan's, as `deadline_plan.decide` reads it."""
        self.solves = 0

    def decide(self, progress: Progress, *, region: int | None, current: str,
               spot_available: Sequence[bool]) -> Placement:  # fmt: skip
        """Where and on what the run should be now (`deadline_plan.decide` on its plan);
        `region` None: it has not started."""
        if self.known is None:  # its own checks are all it knows
            gap = capacity_policy.longest_gap_s(progress.decision_interval_h)
            self.records = self.records.seen(progress.elapsed_h * 3600, spot_available,
                                             longest_gap_s=gap)  # fmt: skip
        plan = self._plan(progress)
        assert self.header is not None
        return deadline_plan.decide(self.header, plan, progress, region=region,
                                    current=current, spot_available=spot_available)  # fmt: skip

    def _plan(self, progress: Progress) -> Plan:
        rates = self.known or [RegionRates.of(r) for r in self.records.regions]
        plan = self.plan
        tick = progress.decision_interval_h
        left, work = deadline_plan.in_ticks(progress, tick)
        if plan is None or any(new.moved_from(old) for new, old in zip(rates, plan.rates,
                                                                        strict=True)):  # fmt: skip
            changeover = max(0, math.ceil(progress.changeover_h / tick - 1e-9))
            plan = _solved.get((tuple(rates), self.prices, tick, changeover))
            if plan is None or plan.ticks < left or plan.work < work:
                plan = Plan(rates, self.prices, tick_h=tick, ticks=max(1, left),
                            work=max(1, work), changeover=changeover)  # fmt: skip
                _solved.clear()  # one kept: each is tens of megabytes
                _solved[(tuple(rates), self.prices, tick, changeover)] = plan
                self.solves += 1
            self.plan, self.header = plan, plan.header(self.names)
        return plan
