"""`spotrain run deadline-plan ENV RUN --spot-history FILE...`: solve a run's deadline plan
(`spotrain.cost.markov_policy`, the Markov policy) and store it where the interruption
handler's checks read it (`spotrain.core.deadline_plan`). `run submit` does the same for a
run with a deadline when given `--spot-history`.

The plan models each region's spot as spells and outages whose means come from the history
given: a trace per region of the environment (home first; the public trace format `spotrain
cost simulate` replays), what the environment saw of its market before the run. bench/cost.md
measures the policy with a month of it. Without a plan, outage fill decides, as before."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from spotrain.cli.output import say
from spotrain.core.errors import SpotrainError

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


def problems(run: Any, regions: tuple[str, ...], history: list[str]) -> list[str]:
    """Every reason the run's plan cannot be solved, with its fix."""
    found = []
    if run.deadline is None:
        found.append(f"run {run.name} has no deadline: a plan is for a run with one (give the "
                     "run's file a [deadline] table)")  # fmt: skip
    if len(history) != len(regions):
        found.append(f"--spot-history is given {len(history)} time(s): give one trace per "
                     f"region of the environment, in its order ({', '.join(regions)})")  # fmt: skip
    return found


def solve_and_store(where: Any, run: Any, history: list[str]) -> str:
    """Solve the run's plan from `history` (one trace file per region) and store it in the
    environment's events table; what was stored, in a sentence."""
    from spotrain.core import deadline_plan, prices
    from spotrain.core.handler_settings import CAPACITY_CHECK_MINUTES
    from spotrain.cost import markov_policy, traces

    regions = where.regions or (where.region,)
    found = problems(run, regions, history)
    if found:
        raise SpotrainError("; ".join(found))
    deadline = run.deadline
    seen = [traces.load(path) for path in history]
    rates = markov_policy.known_rates(seen, run.desired_size)
    book = prices.load()
    pool = book.pool(run.instance_types[0], regions[0], otherwise="refresh the price book")
    gang = markov_policy.Prices(pool.spot_price * run.desired_size,
                                (pool.on_demand.usd_per_hour or 0.0) * run.desired_size,
                                move_usd=0.0)  # fmt: skip
    tick = plan_tick_minutes(CAPACITY_CHECK_MINUTES, deadline.deadline_h, len(regions),
                             deadline.changeover_minutes)  # fmt: skip
    ticks = math.floor(deadline.deadline_h * 60 / tick)
    started = time.monotonic()
    changeover = math.ceil(deadline.changeover_minutes / tick - 1e-9)
    plan = markov_policy.Plan(rates, gang, tick_h=tick / 60, ticks=ticks, work=ticks,
                              changeover=changeover)  # fmt: skip
    days = sum(len(t.available) * t.gap_s for t in seen) / len(seen) / 86400
    header = plan.header(regions, source=f"from {days:.0f} days of history")
    header = dataclasses.replace(header, plan_id=str(int(time.time())))
    stored = deadline_plan.store(where.events, run.name, header, plan.slices())
    means = "; ".join(f"{r}: spells of {m[0]:.1f} h, outages of {m[1]:.1f} h"
                      for r, m in zip(regions, header.means, strict=True))  # fmt: skip
    return (f"its deadline plan solved in {time.monotonic() - started:.0f} s ({ticks} ticks of "
            f"{tick:g} minutes, {len(stored.parts)} part(s)) and stored: {means}; the "
            "interruption handler decides by it from its next check")  # fmt: skip


def deadline_plan_action(where: Any, args: Any, run: Any) -> int:
    """`spotrain run deadline-plan`: the run's plan, solved and stored."""
    say(f"run {run.name}: " + solve_and_store(where, run, args.spot_history or []))
    return 0
