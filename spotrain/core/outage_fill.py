"""Outage Fill: the deadline policy the interruption handler runs for a run with a deadline and
no plan (a plan is `spotrain.core.deadline_plan`'s), and `spotrain cost simulate` replays
(strategy `outage-fill`).

Spot is cheaper than on-demand whenever it is there, so a run takes it whenever it is there;
an hour of on-demand displaces nothing only while spot is gone. What is left to decide is how
much on-demand the run needs, and when. From what the run's checks have seen of its spot
market (`SpotRecord`: how much of the time spot was there, a, and how many spells it came
in), riding spot alone would train for the share rho of the time left T (each spell pays a
changeover d before it trains):

    deficit = work left - rho x T         (on-demand hours the run should expect to need)
    outages = (1 - a) x T                 (the time spot is expected to be gone)

1. The safety net and guard of `deadline_policy` first, as for every deadline policy.
2. Spot there: spot (from idle, and back from on-demand).
3. Spot gone, the run on on-demand: it stays until spot returns. (Going idle and coming back
   pays a changeover each time: on the development traces, leaving on-demand as soon as the
   deficit allowed cost 1.08-1.09x the optimum, staying 1.03-1.06x.)
4. Spot gone, the run idle: on-demand once the deficit is more than `FILL_SHARE` of the
   outages to come, else wait. Filling every outage as soon as there is any deficit spends
   on-demand on a run that spot would have carried; waiting until the deficit takes all the
   outages leaves nothing for a bad spell and ends on on-demand through spot (Uniform
   Progress's and greedy's losses). Two thirds lies between the two best shares measured on
   the development traces (0.6 and 0.7; 0 and 1 cost 1.04-1.15x and 1.14-1.32x the optimum;
   bench/cost.md's held-out traces were drawn after).

What the policy knows is what a check can know: the run's progress and pace, spot there now,
and the record of what earlier checks saw. Until a day of checks is in, the record leans on a
prior (half the time, a spell every `PRIOR_SPELL_H`), worth `PRIOR_H` of checks.

Standard library only: it ships in the interruption handler's Lambda zip.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from spotrain.core.deadline_policy import (
    IDLE,
    ON_DEMAND,
    SPOT,
    Choice,
    Progress,
    as_seen,
    safety_net,
)

FILL_SHARE = 2 / 3
"""Rule 4: on-demand once the deficit is more than this share of the outages to come."""
PRIOR_H = 12.0
"""How many hours of checks the prior is worth."""
PRIOR_AVAILABLE = 0.5
PRIOR_SPELL_H = 4.0


@dataclass(frozen=True)
class SpotRecord:
    """What a run's checks have seen of its spot market (for the whole gang), since the run
    started. The handler keeps it with the run's state; the simulator keeps it per replay."""

    observed_s: float = 0.0
    available_s: float = 0.0
    spells: int = 0
    """Spells of spot that began while the checks looked (riding each costs a changeover)."""
    last_at: float | None = None
    last_available: bool = False
    spot_s_by_hour: tuple[float, ...] = ()
    """Seconds of spot seen in each hour of the day (UTC; 24 once any), and below the spells
    seen ending in each: how spells end by the hour, which a plan reads from a week of them
    (`markov_policy.RegionRates.seen_by`). The hours are those of `now` as the handler gives
    it, Unix seconds; a simulator's replay counts from its start, and nothing reads its
    hours."""
    ends_by_hour: tuple[int, ...] = ()

    def seen(self, now: float, available: bool, *, longest_gap_s: float) -> SpotRecord:
        """The record after a check at `now` (seconds) that found spot there or not. The time
        since the previous check counts as that check found it, up to `longest_gap_s` (checks
        that did not happen are not evidence), in the hour of the day the previous check was
        at; a spell that ended between the two ended at their middle."""
        if self.last_at is not None and now < self.last_at:
            return self  # an older check, delivered late: already counted past it
        gap = 0.0 if self.last_at is None else min(now - self.last_at, longest_gap_s)
        begins = available and not (self.last_at is not None and self.last_available)
        by_hour = {}
        if self.last_at is not None and self.last_available:
            spot_s = list(self.spot_s_by_hour or (0.0,) * 24)
            spot_s[_utc_hour(self.last_at)] += gap
            by_hour["spot_s_by_hour"] = tuple(spot_s)
            if not available:
                ends = list(self.ends_by_hour or (0,) * 24)
                ends[_utc_hour((self.last_at + now) / 2)] += 1
                by_hour["ends_by_hour"] = tuple(ends)
        return replace(
            self,
            observed_s=self.observed_s + gap,
            available_s=self.available_s + (gap if self.last_available else 0.0),
            spells=self.spells + int(begins),
            last_at=now,
            last_available=available,
            **by_hour,  # type: ignore[arg-type]
        )

    def and_seen(self, other: SpotRecord) -> SpotRecord:
        """What two records saw of one market, together (runs that looked at the same
        region): their hours, hours of spot and spells added, hour by hour too."""
        return SpotRecord(observed_s=self.observed_s + other.observed_s,
                          available_s=self.available_s + other.available_s,
                          spells=self.spells + other.spells,
                          spot_s_by_hour=_added(self.spot_s_by_hour, other.spot_s_by_hour),
                          ends_by_hour=_added(self.ends_by_hour, other.ends_by_hour))  # fmt: skip

    # The record's totals with the prior's (hours, hours of spot, spells): every estimate
    # below is a ratio of two of them.
    def _hours(self) -> float:
        return self.observed_s / 3600 + PRIOR_H

    def _spot_h(self) -> float:
        return self.available_s / 3600 + PRIOR_H * PRIOR_AVAILABLE

    def _spells(self) -> float:
        return self.spells + PRIOR_H * PRIOR_AVAILABLE / PRIOR_SPELL_H

    def available_share(self) -> float:
        """a: the share of the time spot was there, with the prior."""
        return self._spot_h() / self._hours()

    def training_share(self, changeover_h: float) -> float:
        """rho: the share of the time riding spot alone would train, with the prior."""
        return max(0.0, self._spot_h() - self._spells() * changeover_h) / self._hours()

    def spell_h(self) -> float:
        """The mean spell of spot, with the prior (hours)."""
        return self._spot_h() / self._spells()

    def outage_h(self) -> float:
        """The mean outage, with the prior (hours)."""
        return (self._hours() - self._spot_h()) / self._spells()

    def to_item(self) -> dict[str, object]:
        return {"observed_s": self.observed_s, "available_s": self.available_s,
                "spells": self.spells, "last_at": self.last_at,
                "last_available": self.last_available,
                "spot_s_by_hour": list(self.spot_s_by_hour),
                "ends_by_hour": list(self.ends_by_hour)}  # fmt: skip

    @classmethod
    def from_item(cls, item: Mapping[str, Any] | None) -> SpotRecord:
        if not item:
            return cls()
        last_at = item.get("last_at")
        return cls(
            observed_s=float(item.get("observed_s", 0)),
            available_s=float(item.get("available_s", 0)),
            spells=int(item.get("spells", 0)),
            last_at=None if last_at is None else float(last_at),
            last_available=bool(item.get("last_available", False)),
            # Records kept before the hours were counted have none.
            spot_s_by_hour=tuple(float(v) for v in item.get("spot_s_by_hour") or ()),
            ends_by_hour=tuple(int(v) for v in item.get("ends_by_hour") or ()),
        )


def _utc_hour(at_s: float) -> int:
    return int(at_s // 3600 % 24)


Count = TypeVar("Count", int, float)
"""Seconds of spot by the hour (float) or spells ended by the hour (int)."""


def _added(one: tuple[Count, ...], other: tuple[Count, ...]) -> tuple[Count, ...]:
    """Two counts by the hour, added (either may be empty: none counted)."""
    if not one or not other:
        return one or other
    return tuple(a + b for a, b in zip(one, other, strict=True))


def outage_fill(
    progress: Progress, *, current: str, spot_available: bool, record: SpotRecord
) -> Choice:
    """What the run should be on now (the module's rules), given what it is on, whether spot
    is there for the whole gang, and the record of earlier checks (this one included)."""
    current = as_seen(current, spot_available)
    forced = safety_net(progress, current, spot_available)
    if forced is not None:
        return forced
    if spot_available:
        back = " (back from on-demand)" if current == ON_DEMAND else ""
        return Choice(SPOT, f"spot is available{back}")
    if current == ON_DEMAND:
        return Choice(ON_DEMAND, "no spot capacity: stays on on-demand until spot returns")
    if math.isinf(progress.deadline_h):
        return Choice(IDLE, "no spot capacity and no deadline: wait for spot")
    left_h = progress.deadline_h - progress.elapsed_h
    work_h = progress.work_h - progress.done_h
    rho = record.training_share(progress.changeover_h)
    deficit, outages = _deficit_and_outages(progress, record)
    facts = (
        f"{work_h:.2f} h of work in {left_h:.2f} h; spot alone trains {rho:.0%} of the time "
        f"as seen, leaving {deficit:.2f} h to on-demand, against {outages:.2f} h of outages "
        "to come"
    )
    if deficit > FILL_SHARE * outages:
        return Choice(ON_DEMAND, f"no spot capacity; {facts}: on-demand while spot is gone")
    return Choice(IDLE, f"no spot capacity; {facts}: wait for spot")


# --- across regions -----------------------------------------------------------------------
@dataclass(frozen=True)
class RegionRecords:
    """A record of spot per region of the run's environment, and one of spot anywhere (in at
    least one region): what a run that may move sees of its market."""

    regions: tuple[SpotRecord, ...] = ()
    anywhere: SpotRecord = SpotRecord()

    @classmethod
    def empty(cls, regions: int) -> RegionRecords:
        return cls(tuple(SpotRecord() for _ in range(regions)))

    def to_item(self) -> dict[str, object]:
        return {"regions": [r.to_item() for r in self.regions],
                "anywhere": self.anywhere.to_item()}  # fmt: skip

    @classmethod
    def from_item(cls, item: dict[str, Any] | None, regions: int) -> RegionRecords:
        """The records kept for a run of `regions` regions (empty ones when none were kept, or
        kept for another number of regions)."""
        kept = (item or {}).get("regions") or []
        if len(kept) != regions:
            return cls.empty(regions)
        return cls(tuple(SpotRecord.from_item(r) for r in kept),
                   SpotRecord.from_item(item.get("anywhere") if item else None))  # fmt: skip

    def seen(self, now: float, available: Sequence[bool], *, longest_gap_s: float) -> RegionRecords:
        regions = self.regions or tuple(SpotRecord() for _ in available)
        each = tuple(
            r.seen(now, spot, longest_gap_s=longest_gap_s)
            for r, spot in zip(regions, available, strict=True)
        )
        return RegionRecords(
            each, self.anywhere.seen(now, any(available), longest_gap_s=longest_gap_s)
        )


def _deficit_and_outages(progress: Progress, record: SpotRecord) -> tuple[float, float]:
    """The on-demand hours the run should expect to need (work left less what spot alone
    would train in the time left), and the hours spot is expected to be gone in it."""
    left_h = progress.deadline_h - progress.elapsed_h
    rho = record.training_share(progress.changeover_h)
    return progress.work_h - progress.done_h - rho * left_h, (1 - record.available_share()) * left_h


def _need_for_on_demand(progress: Progress, record: SpotRecord) -> float:
    """How close a run idle in the record's region is to filling outages there with
    on-demand (rule 4): its deficit over `FILL_SHARE` of the outages to come, from 0 (spot
    there is expected to carry it) to 1 (it fills them)."""
    deficit, outages = _deficit_and_outages(progress, record)
    limit = FILL_SHARE * outages
    return 1.0 if limit <= 0 else min(1.0, max(0.0, deficit / limit))


SPOT_LIKELY_SCORE = 7
"""A region's spot placement score (EC2 `GetSpotPlacementScores`, 1 to 10) from which the
handler takes spot to be there for a run's gang in a region it does not train in (it sees its
own region's spot in its groups). AWS calls a high score likely, not certain: below 7 a move
would pay its changeover for a maybe."""


@dataclass(frozen=True)
class Placement:
    region: int
    """Index in the environment's regions (home first)."""
    mode: str
    reason: str


def across(
    progress: Progress, *, region: int, current: str, spot_available: Sequence[bool],
    records: RegionRecords, move_usd: float, prices: Sequence[tuple[float, float]],
    names: Sequence[str] = (),
) -> Placement:  # fmt: skip
    """Outage fill for a run that may train in any region of its environment: where and on
    what it should be now. `prices`: each region's spot and on-demand price an hour for the
    run's gang (the price book's); empty when they are not known, and then no move is made on
    a guess. A move pays a changeover and its transfer (`move_usd`), and is made only while a
    changeover more still fits. (`names`: the regions' names for the reason; by index without.)

    1. The safety net, in the region it is in (a move would pay a changeover it may not have).
    2. Spot here: spot here, unless spot is cheaper in a region that has some and a spell there
       (after its changeover) saves more than twice what the move costs (its changeover at
       spot there, and the transfer): then it moves there. With regions at one price a run
       never leaves spot for spot. (Measured with the price book's p4d.24xlarge regions, held
       out: 1.08-1.13x the optimum before this rule and rule 3 weighed each region's price,
       1.03-1.06x with them.)
    3. Spot elsewhere only: it moves to the region where the on-demand the move is expected to
       save is largest (ties: the longest spells), if that is more than the transfer. An hour
       there saves on-demand here less spot there: over a spell there (after the changeover),
       but no longer than an outage here lasts (then spot is back here), and only as far as
       the run would need on-demand here (on on-demand: fully; idle: as close as rule 4 is to
       sending it). Moving for spot a run would not have needed on-demand for buys time it
       has: measured, runs moved three times as often as the optimum, each move a changeover
       and a transfer.
    4. Otherwise, outage fill here, with the record of spot anywhere: stays on on-demand
       until spot returns; idle, on-demand once the deficit is more than `FILL_SHARE` of the
       outages to come.
    """
    here = spot_available[region]
    current = as_seen(current, here)
    forced = safety_net(progress, current, here)
    if forced is not None:
        return Placement(region, forced.mode, forced.reason)
    left_h = progress.deadline_h - progress.elapsed_h
    fits = left_h > progress.work_h - progress.done_h + 3 * progress.changeover_h
    elsewhere = [r for r, spot in enumerate(spot_available) if spot and r != region]
    named = (lambda r: names[r]) if names else (lambda r: f"region {r}")
    if here:
        cheaper = _cheaper_spot(progress, region, elsewhere, records, prices, move_usd)
        if fits and cheaper is not None:
            to, saves = cheaper
            return Placement(to, SPOT, (
                f"spot here, cheaper spot in {named(to)}: a spell there saves about "
                f"${saves:,.2f}, more than twice the move's changeover and transfer: move"
            ))  # fmt: skip
        return Placement(region, SPOT, "spot is available here")
    if elsewhere and prices:
        own = records.regions[region]

        def trains_h(r: int) -> float:
            return max(0.0, min(records.regions[r].spell_h() - progress.changeover_h,
                                own.outage_h()))  # fmt: skip

        def saving(r: int) -> float:
            return trains_h(r) * max(0.0, prices[region][1] - prices[r][0])

        to = max(elsewhere, key=lambda r: (saving(r), records.regions[r].spell_h(), -r))
        need = 1.0 if current == ON_DEMAND else _need_for_on_demand(progress, own)
        saves = saving(to) * need
        if fits and saves > move_usd:
            return Placement(to, SPOT, (
                f"no spot here, spot in {named(to)}: training there for {trains_h(to):.1f} h (a "
                f"spell there, at most an outage here) saves about ${saves:,.2f} of the "
                f"on-demand this run would need ({need:.0%}), more than the move's "
                f"${move_usd:,.2f}: move"
            ))  # fmt: skip
    choice = outage_fill(progress, current=current, spot_available=False,
                         record=records.anywhere)  # fmt: skip
    return Placement(region, choice.mode, choice.reason)


def _cheaper_spot(
    progress: Progress, region: int, elsewhere: Sequence[int], records: RegionRecords,
    prices: Sequence[tuple[float, float]], move_usd: float,
) -> tuple[int, float] | None:  # fmt: skip
    """Rule 2: the region with spot cheaper than here whose spell saves the most, and what it
    saves, if that is more than twice the move's cost; else None."""
    if not prices:
        return None
    best: tuple[int, float] | None = None
    for r in elsewhere:
        cheaper_by = prices[region][0] - prices[r][0]
        spell_h = records.regions[r].spell_h() - progress.changeover_h
        saves = spell_h * cheaper_by
        cost = progress.changeover_h * prices[r][0] + move_usd
        if cheaper_by > 0 and saves > 2 * cost and (best is None or saves > best[1]):
            best = (r, saves)
    return best
