"""Spot availability traces drawn from per-region availability models, for developing and
measuring the deadline policy where no long public traces of today's GPU pools exist.

A region's spot pool alternates between spells with capacity and outages without:
- spells end at a rate that follows the region's day (`diurnal`: how much more often spot is
  taken back at the region's 15:00 than on average, and less at 03:00), mean
  `mean_available_h`;
- outages last a log-normal time (median `outage_median_h`, spread `outage_spread`: the
  standard deviation of its logarithm), so most are short and a few last many hours, as in the
  public traces of the "Can't Be Late" study;
- a market's regions dry up together now and then (`shared_per_day` such events a day, each
  lasting a log-normal time; each region joins one with probability `joins`): the outages
  that make moving between regions worth less than independent pools would suggest.

The traces are the public format (`spotrain.cost.traces.Trace`): in a spell every tick holds
the region's `capacity`, in an outage 0. Seeded: one seed gives every region of a market its
trace over the same hours, starting at the same hour of `FIRST_DAY_S` (its `start_s`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from spotrain.cost.traces import Trace

FIRST_DAY_S = 1_767_225_600.0
"""2026-01-01T00:00:00Z: the day every sampled trace starts in (at its seed's hour)."""


@dataclass(frozen=True)
class RegionModel:
    name: str
    mean_available_h: float
    outage_median_h: float
    outage_spread: float
    diurnal: float = 0.0
    """0 to 1: the spell-ending rate swings by this share over the region's day."""
    utc_offset_h: float = 0.0
    capacity: int = 8

    def ending_rate(self, utc_hour: float) -> float:
        """Spells ending per hour at `utc_hour` (its peak at 15:00 of the region's day)."""
        local = (utc_hour + self.utc_offset_h) % 24
        swing = self.diurnal * math.cos(2 * math.pi * (local - 15) / 24)
        return (1 + swing) / self.mean_available_h

    def outage_h(self, rng: random.Random) -> float:
        return rng.lognormvariate(math.log(self.outage_median_h), self.outage_spread)


@dataclass(frozen=True)
class Market:
    name: str
    regions: tuple[RegionModel, ...]
    shared_per_day: float = 0.0
    shared_median_h: float = 2.0
    shared_spread: float = 0.8
    joins: float = 0.0
    """Probability that a region joins a shared dry spell."""


def sample(market: Market, *, hours: float, gap_s: float, seed: int) -> list[Trace]:
    """One trace per region of `market` over the same `hours` (see the module's note)."""
    rng = random.Random(seed)
    ticks = math.ceil(hours * 3600 / gap_s)
    gap_h = gap_s / 3600
    start_utc = rng.uniform(0, 24)  # a trace starts at any time of day
    gone_until = [0.0] * len(market.regions)  # hours from the start; in an outage while after
    counts: list[list[int]] = [[] for _ in market.regions]
    shared_chance = 1 - math.exp(-market.shared_per_day * gap_h / 24)  # a tick's
    for tick in range(ticks):
        now = tick * gap_h
        if shared_chance and rng.random() < shared_chance:
            length = rng.lognormvariate(math.log(market.shared_median_h), market.shared_spread)
            for index in range(len(market.regions)):
                if rng.random() < market.joins:
                    gone_until[index] = max(gone_until[index], now + length)
        for index, region in enumerate(market.regions):
            if now >= gone_until[index]:
                rate = region.ending_rate(start_utc + now)
                if rng.random() < 1 - math.exp(-rate * gap_h):
                    gone_until[index] = now + region.outage_h(rng)
            counts[index].append(region.capacity if now >= gone_until[index] else 0)
    return [
        Trace(
            f"{market.name}/{region.name} seed {seed}",
            float(gap_s),
            tuple(values),
            start_s=FIRST_DAY_S + start_utc * 3600,
        )
        for region, values in zip(market.regions, counts, strict=True)
    ]


US = Market(
    name="us",
    regions=(
        RegionModel("us-east-1", mean_available_h=4.0, outage_median_h=1.5, outage_spread=1.0,
                    diurnal=0.6, utc_offset_h=-5),
        RegionModel("us-east-2", mean_available_h=8.0, outage_median_h=1.0, outage_spread=1.1,
                    diurnal=0.4, utc_offset_h=-5),
        RegionModel("us-west-2", mean_available_h=6.0, outage_median_h=2.5, outage_spread=0.9,
                    diurnal=0.5, utc_offset_h=-8),
    ),
    shared_per_day=0.4, shared_median_h=3.0, shared_spread=0.7, joins=0.6,
)  # fmt: skip
"""Three regions of one market: a busy one, a steady one, one with long outages, drying up
together about every 2.5 days."""

SCARCE = Market(
    name="scarce",
    regions=(
        RegionModel("eu-west-1", mean_available_h=2.0, outage_median_h=3.0, outage_spread=1.2,
                    diurnal=0.5, utc_offset_h=0),
        RegionModel("eu-central-1", mean_available_h=3.0, outage_median_h=2.0, outage_spread=1.3,
                    diurnal=0.7, utc_offset_h=1),
    ),
    shared_per_day=0.8, shared_median_h=4.0, shared_spread=0.8, joins=0.7,
)  # fmt: skip
"""Two regions where spot is the exception: about a third of the time."""

MARKETS = (US, SCARCE)
