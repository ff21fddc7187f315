"""`spotrain run deadline-plan ENV RUN (--spot-history FILE... | --spot-seen-by RUN...)`: solve a
run's deadline plan (`spotrain.cost.markov_policy`, the Markov policy) and store it where the
interruption handler's checks read it (`spotrain.core.deadline_plan`). `run submit` does the
same for a run with a deadline when given either.

The plan models each region's spot as spells and outages whose means are what the environment
saw of its market before the run: a trace per region of the environment (home first; the
public trace format `spotrain cost simulate` replays; one that says when it starts also gives
the hours of the day at which that region's spells end most), or the records of spot in each
region the handler's checks kept for runs with a deadline (earlier runs, together, or this
one, to plan again with what it has seen; a week of them gives those hours too).
bench/cost.md measures the policy with a month of history. Without a plan, outage fill
decides, as before."""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

from spotrain.cli.arguments import raise_all
from spotrain.cli.output import say

MAX_PLAN_STATES = 250_000_000
"""The most states a plan may hold (a byte each raw, about 1% of that compressed; a solve of
up to about twenty seconds): a longer deadline gets a coarser tick than the handler's check
(three regions and a 20-minute changeover: 10 minutes for 72 h, 25 for three weeks)."""


def plan_tick_minutes(check_minutes: float, deadline_h: float, regions: int,
                      changeover_minutes: float) -> float:  # fmt: skip
    """The plan's tick: the handler's check interval, or a whole multiple of it where the
    deadline is too far for that many states (`MAX_PLAN_STATES`)."""
    multiple = 1
    while True:
        tick = check_minutes * multiple
        ticks = math.floor(deadline_h * 60 / tick)
        changeover = math.ceil(changeover_minutes / tick - 1e-9)
        states = (ticks + 1) ** 2 * (1 << regions) * 3 * regions * (changeover + 1)
        if states <= MAX_PLAN_STATES:
            return tick
        multiple += 1


@dataclasses.dataclass(frozen=True)
class Means:
    """Each region's mean spell and outage of spot a plan is solved with, and whence."""

    rates: tuple[Any, ...]
    """`markov_policy.RegionRates`, one per region of the environment, home first."""
    source: str


def means(where: Any, run: Any, history: list[str], seen_by: list[str]) -> Means:
    """The means the run's plan is solved with: of `history` (one trace file per region), or
    of the records the checks of the runs `seen_by` kept, together; every problem at once,
    with its fix."""
    from spotrain.core import fleet_state
    from spotrain.core.deadline_plan import SEEN_ENOUGH_H
    from spotrain.core.outage_fill import SpotRecord
    from spotrain.cost import markov_policy, traces

    regions = where.regions or (where.region,)
    found = []
    if run.deadline is None:
        found.append(f"run {run.name} has no deadline: a plan is for a run with one (give the "
                     "run's file a [deadline] table)")  # fmt: skip
    if bool(history) == bool(seen_by):
        found.append("give what the environment saw of spot: --spot-history FILE... (one "
                     "trace per region) or --spot-seen-by RUN (a run whose checks kept it), "
                     "one of the two")  # fmt: skip
    elif history and len(history) != len(regions):
        found.append(f"--spot-history is given {len(history)} time(s): give one trace per "
                     f"region of the environment, in its order ({', '.join(regions)})")  # fmt: skip
    records = [SpotRecord() for _ in regions]
    for other in seen_by if not found else ():
        kept = fleet_state.run_state(where.events, other).region_records(len(regions))
        records = [r.and_seen(k) for r, k in zip(records, kept, strict=True)]
    short = [r for r, record in zip(regions, records, strict=True)
             if record.observed_s < SEEN_ENOUGH_H * 3600]  # fmt: skip
    if seen_by and not found and short:
        found.append(f"the checks of {', '.join(seen_by)} kept less than {SEEN_ENOUGH_H:g} h "
                     f"of spot in {', '.join(short)}: name runs with a deadline that trained "
                     "longer in the environment, or give --spot-history")  # fmt: skip
    seen: list[traces.Trace] = []
    try:
        seen = traces.load_all([] if seen_by else (history or []))
    except traces.TraceError as error:
        found.extend(error.problems)
    raise_all(found, "the deadline plan's history")
    if seen_by:
        hours = min(r.observed_s for r in records) / 3600
        whence = f"as the checks of {', '.join(seen_by)} saw them over {hours:.0f} h"
        return Means(tuple(markov_policy.RegionRates.seen_by(r) for r in records), whence)
    days = sum(len(t.available) * t.gap_s for t in seen) / len(seen) / 86400
    return Means(tuple(markov_policy.known_rates(seen, run.desired_size)),
                 f"from {days:.0f} days of history")  # fmt: skip


def _regions_prices(run: Any, regions: Sequence[str]) -> tuple[tuple[float, float], ...]:
    """The run's gang's spot and on-demand price an hour in each region (the price book's:
    spot differs from region to region, and the plan weighs where to train by it); every
    region without a usable price named at once, with the refresh that gives it."""
    from spotrain.core import prices
    from spotrain.core.errors import CostInputError

    book, kind = prices.load(), run.instance_types[0]
    found, problems = [], []
    for region in regions:
        try:
            pool = book.pool(kind, region, otherwise="refresh the price book")
        except CostInputError as missing:
            problems.append(str(missing))
            continue
        spot, on_demand = pool.spot_price, pool.on_demand.usd_per_hour or 0.0
        if spot <= 0 or on_demand <= 0:  # a plan would take the unpriced market as free
            problems.append(f"the price book has no usable price of {kind} in {region} (spot "
                            f"${spot:g}, on-demand ${on_demand:g} an hour): run `spotrain prices "
                            f"refresh --instance-type {kind} --region {region}`")  # fmt: skip
        found.append((spot * run.desired_size, on_demand * run.desired_size))
    raise_all(problems, "the deadline plan")
    return tuple(found)


def deadline_utc_h(deadline: Any) -> float:
    """The hour of the day (UTC) of a run's `finish_by`: what lines a plan's ticks up with the
    hours at which each region's spells end most (where its history says when it was seen)."""
    from spotrain.core.deadline_policy import instant

    return instant(deadline.finish_by) / 3600 % 24


def solve_and_store(where: Any, run: Any, given: Means) -> str:
    """Solve the run's plan with the means `given` and store it in the environment's events
    table; what was stored, in a sentence."""
    from spotrain.core import deadline_plan
    from spotrain.core.handler_settings import CAPACITY_CHECK_MINUTES
    from spotrain.cost import markov_policy

    regions = where.regions or (where.region,)
    deadline = run.deadline
    regional = _regions_prices(run, regions)
    gang = markov_policy.Prices.per_region(regional, move_usd=0.0)
    tick = plan_tick_minutes(CAPACITY_CHECK_MINUTES, deadline.deadline_h, len(regions),
                             deadline.changeover_minutes)  # fmt: skip
    ticks = max(1, math.floor(deadline.deadline_h * 60 / tick))
    started = time.monotonic()
    changeover = math.ceil(deadline.changeover_minutes / tick - 1e-9)
    plan = markov_policy.Plan(given.rates, gang, tick_h=tick / 60, ticks=ticks, work=ticks,
                              changeover=changeover,
                              deadline_utc_h=deadline_utc_h(deadline))  # fmt: skip
    header = plan.header(regions, source=given.source)
    # A new id for every plan: a warm handler keeps the parts it read by it.
    header = dataclasses.replace(header, plan_id=uuid.uuid4().hex[:12],
                                 deadline=deadline_plan.solved_for(deadline))  # fmt: skip
    stored = deadline_plan.store(where.events, run.name, header, plan.slices())
    daily = header.daily or ((0.0, 0.0),) * len(regions)
    said = "; ".join(f"{r}: spells of {m[0]:.1f} h"
                     + (f" ending {swing:.0%} more often near {round(peak) % 24:02d}:00 UTC"
                        if swing else "")
                     + f", outages of {m[1]:.1f} h"
                     for r, m, (swing, peak) in zip(regions, header.means, daily,
                                                    strict=True))  # fmt: skip
    took = time.monotonic() - started
    return (f"its deadline plan solved in {took:.0f} s ({ticks} ticks of {tick:g} minutes, "
            f"{len(stored.parts)} part(s)) and stored: {said} ({given.source}); the "
            "interruption handler decides by it from its next check")  # fmt: skip


def declared_deadline(where: Any, run: str) -> tuple[str | None, str | None]:
    """The run's deadline as its stack declared it to the handler, and what decides it: its
    plan (when solved for that deadline and the environment's regions), or outage fill."""
    import json

    from botocore.exceptions import ClientError

    from spotrain.core import deadline_plan
    from spotrain.core.deadline_policy import RunDeadline
    from spotrain.core.handler_settings import run_parameter_name

    try:
        found = where.ssm.get_parameter(Name=run_parameter_name(where.environment, run),
                                        WithDecryption=True)  # fmt: skip
        declared = json.loads(found["Parameter"]["Value"]).get("run_deadline") or {}
    except (ClientError, ValueError):
        return None, None
    if not declared.get("finish_by"):
        return None, None
    try:
        solved_for = deadline_plan.solved_for(RunDeadline(**declared))
        header = deadline_plan.read_header(where.events, run)
    except (ClientError, TypeError):
        header = None
    regions = tuple(where.regions or (where.region,))
    if header is None or (header.regions, header.deadline) != (regions, solved_for):
        return declared["finish_by"], "outage fill"
    return declared["finish_by"], f"its plan (the means {header.source})"


def deadline_plan_action(where: Any, args: Any, run: Any) -> int:
    """`spotrain run deadline-plan`: the run's plan, solved and stored."""
    given = means(where, run, args.spot_history or [], args.spot_seen_by or [])
    say(f"run {run.name}: " + solve_and_store(where, run, given))
    return 0
