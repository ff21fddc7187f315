"""Markov: a deadline policy that plans against a model of each region's spot market, for a run
in one region or several (`spotrain cost simulate`'s strategy `markov`), measured beside
`spotrain.core.outage_fill` in bench/cost.md. The interruption handler runs it for a run given
a plan: this module solves it (numpy, which the handler's Lambda does not have) where `spotrain
run deadline-plan` runs, and stores it (`Plan.slices`); the lookup, `deadline_plan.decide`,
lives in the core, and the simulator calls it on the plan it solves, so both decide alike.

The model: each region's spot comes in spells and outages, a two-state Markov chain per
decision tick (a spell ends with probability tick / mean spell, an outage with tick / mean
outage), the regions independent of each other. Where the history says when it was seen (a
trace's `start`), a region's spells end more often at some hours of the day than at others
(`swing_of`: a cosine's swing and peak hour), and the plan, lined up with the run's deadline,
takes each tick's chance of a spell ending at that tick's hour. Against that model the policy
is exact: a finite-horizon dynamic programme over the ticks left to the deadline, whose state is
the work left (whole ticks), which regions have spot now, where the run is and on what (idle,
on-demand or spot), and the changeover ticks it still has to pay. Each tick an action is
chosen: idle, go on, on-demand in the region it is in, or spot in a region that has some.
Starting or switching pays the changeover at the new mode's price; a start in another region
pays the move (`move_usd`) too. A tick of spot whose region loses its capacity leaves the run
idle there. Missing the deadline costs `MISSED_USD`.

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

Why two means and a daily swing per region, and nothing more. Richer models were measured
(bench/cost.py's runs across regions; mean cost over the optimum):
- The day's swing of spells' ending (kept): at $3 a move, held out, 1.072-1.130x became
  1.064-1.122x (56 h: 1.121x to 1.095x); on development at $3 it moved both ways (52 h
  1.149x to 1.160x, 72 h 1.083x to 1.072x); at $0 within 0.006 either way (held out, 52 h:
  1.034x to 1.040x); in one region within 0.001. The swing taken from the traces' own model
  (not read from the history) did no better: 1.103x at $3, 56 h, held out. It costs a solve
  per run (a plan lined up with one deadline's hour serves no other): bench/cost.py took 50
  minutes instead of 14.
- An outage's age as state (each region's outage in two or three age buckets, their rates
  counted from the history: a semi-Markov chain, as outages are log-normal) and the regions'
  joint transitions (their shared dry spells) each moved the mean by at most 0.007. At $3 a
  move, 56 h, held out: 1.121x became 1.114-1.127x. At $0, 52 h, development: 1.069x became
  1.064-1.074x. The age buckets would have multiplied the plan by up to 8.
- The run's own checks added to the history's means (the history weighted as 48 h of checks,
  solved again when the means move) gained 0.005 at $3.
- A move priced above its cost in the plan (a hedge against a model too hopeful of the region
  moved to), development: at $3 a move (56 h) planned at 1.5x it, the runs moved 0.06 times
  instead of 1.4 and cost 1.138x against 1.145x; at $0.5 (52 h) planned at 2x, 1.079x against
  1.090x; at $0 (52 h) planned at $1, 1.060x against 1.066x. Within the runs' spread, and a
  factor fitted to the development traces: not kept. At $3, staying in the first region is
  about as good as moving, and the best single region known in advance is 1.087x there.
- Even each region's means taken from the run's own window, known in advance, cost 1.086x at
  $3 (56 h, held out) and 1.055x at $0 (52 h, development). Most of what is left is when spot
  comes and goes, which no model of the regions' means foresees.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
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
    spell_swing: float = 0.0
    """0 to 1: how much more often than on average spells end at `spell_peak_utc_h` (and less
    often twelve hours away), as a cosine over the day; 0: alike at every hour."""
    spell_peak_utc_h: float = 0.0

    @classmethod
    def of(cls, record: outage_fill.SpotRecord) -> RegionRates:
        return cls(record.spell_h(), record.outage_h())

    @classmethod
    def seen_by(cls, record: outage_fill.SpotRecord) -> RegionRates:
        """The means of the handler's record of a region (its checks' times are Unix
        seconds), with the day's swing of its spells' ending where it holds a week of them
        (`DAILY_EVIDENCE_DAYS`)."""
        rates = cls.of(record)
        if record.observed_s < DAILY_EVIDENCE_DAYS * 86400 or not record.spot_s_by_hour:
            return rates
        swing, peak = swing_of(record.ends_by_hour, [s / 3600 for s in record.spot_s_by_hour])
        return replace(rates, spell_swing=swing, spell_peak_utc_h=peak)

    def spell_end_rate(self, utc_h: float | None) -> float:
        """Spells ending an hour at `utc_h` (the hour of the day, UTC; None: the mean)."""
        if utc_h is None or not self.spell_swing:
            return 1 / self.mean_spell_h
        swing = self.spell_swing * math.cos(2 * math.pi * (utc_h - self.spell_peak_utc_h) / 24)
        return (1 + swing) / self.mean_spell_h

    def moved_from(self, other: RegionRates) -> bool:
        return deadline_plan.moved((other.mean_spell_h, other.mean_outage_h),
                                   (self.mean_spell_h, self.mean_outage_h))  # fmt: skip


def known_rates(history: Sequence[Trace], nodes: int) -> list[RegionRates]:
    """Each region's means as its record of `history` (one trace per region, what the
    environment saw before the run) gives them, for a gang of `nodes` machines: the handler's
    record (`outage_fill.SpotRecord`) fed each tick as a check. Where a trace says when it
    starts, the checks are at its ticks' own times, so the record also counts the day's swing
    of its spells' ending (`RegionRates.seen_by`); without a start, the hours are alike."""
    rates = []
    for trace in history:
        record = outage_fill.SpotRecord()
        begin_s = trace.start_s or 0.0
        # Each tick lasts its gap, the last too: a check after it sees what it saw.
        for index, capacity in enumerate([*trace.available, *trace.available[-1:]]):
            record = record.seen(begin_s + index * trace.gap_s, capacity >= nodes,
                                 longest_gap_s=trace.gap_s)  # fmt: skip
        known = trace.start_s is not None
        rates.append(RegionRates.seen_by(record) if known else RegionRates.of(record))
    return rates


DAILY_EVIDENCE_DAYS = 7.0
"""The least history whose spells' ending is read by the hour: a few days' endings, a handful
an hour, are mostly noise."""
MOST_SWING = 0.9
"""A swing read past this is taken as this: spells never stop ending at any hour."""


def swing_of(endings: Sequence[float], spot_h: Sequence[float]) -> tuple[float, float]:
    """(swing, peak UTC hour) as `RegionRates` takes them, from the spells seen ending in each
    hour of the day and the hours of spot seen in it: fitted by least squares to each hour's
    endings as its hours of spot times a rate of 1 + swing times the cosine of the hours from
    the peak. (0, 0) without an ending to read."""
    endings, spot_h = np.asarray(endings, dtype=float), np.asarray(spot_h, dtype=float)
    if not endings.sum():
        return 0.0, 0.0
    # An hour without spot in the whole history (a market that dries up every afternoon)
    # weighs nothing: its hours of spot are 0.
    angle = 2 * np.pi * (np.arange(24) + 0.5) / 24
    terms = np.stack([spot_h, spot_h * np.cos(angle), spot_h * np.sin(angle)], axis=1)
    (rate, cos, sin), *_ = np.linalg.lstsq(terms, endings, rcond=None)
    if rate <= 0:
        return 0.0, 0.0
    peak = (math.atan2(sin, cos) * 24 / (2 * math.pi)) % 24
    return float(min(MOST_SWING, math.hypot(cos, sin) / rate)), peak


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
                 ticks: int, work: int, changeover: int,
                 deadline_utc_h: float | None = None) -> None:  # fmt: skip
        self.rates, self.prices, self.tick_h = tuple(rates), prices, tick_h
        self.regions = len(self.rates)
        self.ticks, self.work, self.changeover = ticks, work, changeover
        self.deadline_utc_h = _planned_hour(self.rates, deadline_utc_h)
        """The hour of the day (UTC) of the deadline it plans to, where a region's spells end
        by the hour: the tick `left` ticks before it is at that hour less `left` ticks."""
        self._transition: np.ndarray | None = None
        self.action, self.first_region, self.idle_value = _solve(self)

    def transition(self, left: int, spot_of: np.ndarray) -> np.ndarray:
        """The chance of each set of regions with spot (bits) a tick after each, over the tick
        that starts `left` ticks before the deadline ([now][next]): the same for every tick
        unless spells end by the hour (at the tick's middle)."""
        if self._transition is not None:
            return self._transition
        utc_h = None if self.deadline_utc_h is None else self.deadline_utc_h - (
            left - 0.5) * self.tick_h  # fmt: skip
        found = np.ones((len(spot_of), len(spot_of)))
        for r, rates in enumerate(self.rates):
            ends = min(1.0, self.tick_h * rates.spell_end_rate(utc_h))
            returns = min(1.0, self.tick_h / rates.mean_outage_h)
            chain = np.array([[1 - returns, returns], [ends, 1 - ends]])  # [now][next]: 0 gone
            found *= chain[spot_of[:, r].astype(int)][:, spot_of[:, r].astype(int)]
        if utc_h is None:
            self._transition = found
        return found

    def header(self, names: Sequence[str] = (), source: str = "") -> deadline_plan.Header:
        """What the plan was solved for, as `spotrain.core.deadline_plan` reads it."""
        return deadline_plan.Header(
            regions=tuple(names) or tuple(f"region {r}" for r in range(self.regions)),
            means=tuple((r.mean_spell_h, r.mean_outage_h) for r in self.rates),
            daily=tuple((r.spell_swing, r.spell_peak_utc_h) for r in self.rates)
            if self.deadline_utc_h is not None else (),
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


def _planned_hour(rates: Sequence[RegionRates], deadline_utc_h: float | None) -> float | None:
    """The deadline's hour of the day a plan of `rates` depends on: None where no region's
    spells end by the hour (or the hour is not known)."""
    if deadline_utc_h is None or not any(r.spell_swing for r in rates):
        return None
    return deadline_utc_h % 24


def _solve(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Backward induction over the ticks left: the action of every state (int8, indexed
    [ticks left, work left, spot bits, mode, changeover left]), the best region to be idle in
    for a run that has not started ([ticks left, work left, spot bits]), and the expected cost
    of a run not started with every tick of the plan left ([work left, spot bits]: what the
    expectimax test checks; the earlier ticks' are not kept).

    Of the actions, only going on depends on the whole state: idling, on-demand and spot in a
    region are a start (or a stay idle) whose value depends on the region the run is in, not
    on its mode or changeover. So each tick the best start is chosen once per region
    ([work left, spot bits, region]) and only then set against going on, state by state, which
    is the same choice as the least of every action in every state (ties go to the action
    listed first, as `argmin` gives them) at a fraction of the arrays."""
    regions, changeover = plan.regions, plan.changeover
    states = 1 << regions
    modes = 3 * regions
    work = plan.work
    spot_of = np.array([[(bits >> r) & 1 for r in range(regions)] for bits in range(states)],
                       dtype=bool)  # fmt: skip
    price = np.zeros(modes)
    for r in range(regions):
        spot, on_demand = plan.prices.in_region(r)
        price[regions + r], price[2 * regions + r] = on_demand * plan.tick_h, spot * plan.tick_h
    region_of = np.arange(modes) % regions
    # A start's move: from the region the run is in (rows) to the one it starts in.
    move = np.where(~np.eye(regions, dtype=bool), plan.prices.move_usd, 0.0)
    # The starts, in the order of their actions' values (`argmin`'s ties go to the first).
    starts = np.array([IDLE_THERE, ON_DEMAND_HERE, *(SPOT_IN + r for r in range(regions))],
                      dtype=np.int8)  # fmt: skip
    # The value of every state with no ticks left: done, or the deadline missed.
    value = np.zeros((work + 1, states, modes, changeover + 1))
    value[1:] = MISSED_USD
    policy = np.zeros((plan.ticks + 1, work + 1, states, modes, changeover + 1), dtype=np.int8)
    first_region = np.zeros((plan.ticks + 1, work + 1, states), dtype=np.int8)
    idle_value = value[:, :, np.arange(regions), 0].min(axis=2)
    # A tick of each mode's price, in each set of regions with spot; going on is barred
    # (infinite) where there is nothing to go on with: idle, or spot its region lacks.
    tick_price = np.broadcast_to(price, (states, modes)).copy()
    tick_price[:, :regions] = np.inf
    tick_price[:, 2 * regions :][~spot_of] = np.inf
    start_value = np.empty((len(starts), work + 1, states, regions))
    expected, going_on = np.empty_like(value), np.empty_like(value)  # each tick's, reused
    for left in range(1, plan.ticks + 1):
        # A run on spot whose region lost its capacity is idle there: that state needs no
        # remapping, as it has exactly the idle state's choices (going on is barred).
        np.einsum("ab,wbmk->wamk", plan.transition(left, spot_of), value, out=expected)
        # Running mode m for this tick with c changeover ticks still to pay.
        going_on[:, :, :, 1:] = expected[:, :, :, :-1]
        going_on[1:, :, :, 0] = expected[:-1, :, :, 0]
        going_on[0] = 0.0
        going_on += tick_price[None, :, :, None]
        # Each start from each region ([start, work left, spot bits, region in]), from the
        # running values with the whole changeover to pay (spot's infinite where there is none).
        start_value[0] = expected[:, :, :regions, 0]  # idle there: idle mode r is region r
        start_value[1] = going_on[:, :, regions : 2 * regions, changeover]
        for r in range(regions):
            spot_there = going_on[:, :, 2 * regions + r, changeover]
            start_value[2 + r] = spot_there[:, :, None] + move[None, None, :, r]
        best = start_value.argmin(axis=0)
        best_value = np.take_along_axis(start_value, best[None], axis=0)[0]
        # Going on is listed after idling and before every other start: it wins a tie with
        # any start but idling (the least float above the value makes `<` a `<=`).
        beaten_below = np.where(best == 0, best_value, np.nextafter(best_value, np.inf))
        go_on = going_on < beaten_below[:, :, region_of, None]
        started = starts[best][:, :, region_of, None]
        policy[left] = started + go_on * (np.int8(GO_ON) - started)  # twice where's speed
        np.minimum(going_on, best_value[:, :, region_of, None], out=value)
        policy[left, 0] = IDLE_THERE  # done: nothing more to decide
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
                 known: Sequence[RegionRates] | None = None,
                 deadline_utc_h: float | None = None) -> None:  # fmt: skip
        self.records = outage_fill.RegionRecords.empty(regions)
        self.prices, self.names = prices, tuple(names)
        self.known = None if known is None else tuple(known)
        self.deadline_utc_h = deadline_utc_h
        """The hour of the day (UTC) of the run's deadline, where known: plans with the known
        means' daily swing (`Plan`)."""
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
            hour = _planned_hour(rates, self.deadline_utc_h)  # None: one plan serves every hour
            solved_for = (tuple(rates), self.prices, tick, changeover, hour)
            plan = _solved.get(solved_for)
            if plan is None or plan.ticks < left or plan.work < work:
                plan = Plan(rates, self.prices, tick_h=tick, ticks=max(1, left),
                            work=max(1, work), changeover=changeover,
                            deadline_utc_h=self.deadline_utc_h)  # fmt: skip
                _solved.clear()  # one kept: each is tens of megabytes
                _solved[solved_for] = plan
                self.solves += 1
            self.plan, self.header = plan, plan.header(self.names)
        return plan
