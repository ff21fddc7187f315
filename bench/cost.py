"""Cost figures: each strategy's expected cost as a share of on-demand, and its deadline
misses, on generated spot availability traces at several availability levels and deadline
slacks; and the planner's checkpoint interval (Young/Daly) against a brute-force search of the
simulator.

    .venv/bin/python bench/cost.py            # writes bench/cost.md and bench/cost.png

Deterministic (seeded traces): the figures change only when the model or the policies do.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from spotrain.cost import (
    across_regions,
    optimum,
    planner,
    report,
    simulation,
    trace_models,
    traces,
)

HERE = Path(__file__).parent
WORK_H = 24.0
CHANGEOVER_H = 0.25
ON_DEMAND_PRICE, SPOT_PRICE = 3.0, 1.0  # shares of on-demand depend on the ratio only
SLACKS = (0.1, 0.25, 0.5, 1.0)
# (per-instance interruptions per hour, hours spot stays gone): three availability levels.
MARKETS = ((0.05, 1.0), (0.2, 2.0), (0.5, 2.0))
TRACES, STARTS = 20, 5


def strategies_table() -> tuple[
    list[str], dict[str, list[tuple[float, float, float]]], list[dict[str, float]]
]:
    lines = [
        "| nodes | spot available | slack | " + " | ".join(simulation.STRATEGIES) + " |",
        "|---|---|---|" + "---|" * len(simulation.STRATEGIES),
    ]
    curves: dict[str, list[tuple[float, float, float]]] = {}
    cells_seen: list[dict[str, float]] = []
    for nodes in (1, 4):
        for rate, recovery in MARKETS:
            sampled = [
                traces.generate(hours=3 * WORK_H, interruptions_per_hour=rate,
                                recovery_h=recovery, capacity=nodes, gap_s=300, seed=seed)
                for seed in range(TRACES)
            ]  # fmt: skip
            availability = sum(t.availability(nodes) for t in sampled) / len(sampled)
            for slack in SLACKS:
                job = simulation.Job(
                    work_h=WORK_H, deadline_h=WORK_H * (1 + slack) + CHANGEOVER_H,
                    changeover_h=CHANGEOVER_H, nodes=nodes, on_demand_price=ON_DEMAND_PRICE,
                    spot_price=SPOT_PRICE,
                )  # fmt: skip
                summaries = {
                    name: simulation.summarise(outcomes)
                    for name, outcomes in simulation.replay(job, sampled, starts=STARTS).items()
                }
                baseline = summaries[simulation.ON_DEMAND_ONLY].mean_cost
                cells_seen.append({"slack": slack, **{
                    f"{name}:cost": s.mean_cost / baseline for name, s in summaries.items()
                }, **{f"{name}:missed": (1 - s.deadline_met) * s.runs
                      for name, s in summaries.items()}})  # fmt: skip
                cells = []
                for name in simulation.STRATEGIES:
                    s = summaries[name]
                    missed = round((1 - s.deadline_met) * s.runs)
                    cells.append(f"{s.mean_cost / baseline:.0%}"
                                 + (f" ({missed} missed)" if missed else ""))  # fmt: skip
                    if nodes == 4 and (rate, recovery) == MARKETS[1]:
                        curves.setdefault(name, []).append(
                            (slack, s.mean_cost / baseline, s.deadline_met)
                        )
                lines.append(f"| {nodes} | {availability:.0%} | {slack:.2f} | "
                             + " | ".join(cells) + " |")  # fmt: skip
    return lines, curves, cells_seen


def reading(cells: list[dict[str, float]]) -> str:
    """What the table says, counted from it (so it cannot drift from the figures)."""
    up, greedy = simulation.UNIFORM_PROGRESS, simulation.SPOT_GREEDY
    cheaper = [c for c in cells if c[f"{up}:cost"] < c[f"{greedy}:cost"] - 0.005]
    dearer = [c for c in cells if c[f"{up}:cost"] > c[f"{greedy}:cost"] + 0.005]
    misses = {name: int(sum(c[f"{name}:missed"] for c in cells)) for name in simulation.STRATEGIES}
    slacks = lambda found: ", ".join(f"{v:g}" for v in sorted({c["slack"] for c in found}))  # noqa: E731
    return (
        f"Reading (counted from the table): `{up}` is cheaper than `{greedy}` in "
        f"{len(cheaper)} of {len(cells)} cells (slacks {slacks(cheaper) or '-'}) and dearer in "
        f"{len(dearer)} (slacks {slacks(dearer) or '-'}). Runs that missed their deadline, of "
        f"{len(cells) * TRACES * STARTS} per strategy: "
        + ", ".join(f"`{name}` {count}" for name, count in misses.items())
        + ". `blueprint-mix` is the fleet without a deadline (coordinator on on-demand, "
        "workers on spot, on-demand after a fixed 10-minute wait, back to spot as soon as it "
        "returns): on one machine it is on-demand only, and on scarce markets its moves back "
        "and forth cost it changeovers and deadlines."
    )


def _cells(markdown: str) -> dict[tuple[str, ...], list[str]]:
    """The strategies table of a cost.md: (nodes, spot available, slack) -> its cells."""
    rows = {}
    for line in markdown.splitlines():
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if len(parts) == 3 + len(simulation.STRATEGIES) and parts[2][:1].isdigit():
            rows[tuple(parts[:3])] = parts[3:]
    return rows


def changes(previous: str, table: list[str]) -> str:
    """What moved since the figures this run replaces, counted cell by cell."""
    before, after = _cells(previous), _cells("\n".join(table))
    if not before:
        return "No earlier figures to compare with."
    moved = []
    for key, cells in after.items():
        for name, old, new in zip(simulation.STRATEGIES, before.get(key, []), cells, strict=False):
            if old != new:
                moved.append(f"{name} at {key[0]} machine(s), {key[1]} spot, slack {key[2]}: "
                             f"{old} -> {new}")  # fmt: skip
    if not moved:
        return "Every cell is as it was in the figures this run replaced."
    shown = "\n".join(f"- {line}" for line in moved)
    cells = len(after) * len(simulation.STRATEGIES)
    return f"{len(moved)} of {cells} cells moved since the figures this run replaced:\n\n{shown}"


def interval_table() -> list[str]:
    """Daly's interval against the best of a grid, simulated with explicit checkpoints: a
    preemption loses the work since the last one (no notice), each checkpoint stalls delta."""
    delta_h, restart_h = 2 / 60, 5 / 60
    lines = [
        "| MTBF | Daly interval | its expected cost | best on the grid | at | Daly / best |",
        "|---|---|---|---|---|---|",
    ]
    for rate in (0.5, 0.2, 0.05):
        daly = planner.daly_interval(delta_h, 1 / rate)
        sampled = [
            traces.generate(hours=3 * WORK_H, interruptions_per_hour=rate, recovery_h=0.05,
                            capacity=1, gap_s=60, seed=seed)
            for seed in range(40)
        ]  # fmt: skip

        def cost(interval: float, sampled: list[traces.Trace] = sampled) -> float:
            job = simulation.Job(
                work_h=WORK_H, deadline_h=None, changeover_h=restart_h,
                on_demand_price=ON_DEMAND_PRICE, spot_price=SPOT_PRICE,
                checkpoint_every_h=interval, checkpoint_cost_h=delta_h,
            )  # fmt: skip
            found = [simulation.simulate(job, t, simulation.SPOT_GREEDY) for t in sampled]
            return sum(o.cost for o in found) / len(found)

        grid = [daly * f for f in (0.25, 0.4, 0.55, 0.7, 0.85, 1.2, 1.5, 2.0, 2.5, 3.0)]
        at_daly = cost(daly)
        best_cost, best_at = min((cost(g), g) for g in [*grid, daly])
        lines.append(
            f"| {1 / rate:.0f} h | {daly * 60:.1f} min | ${at_daly:.2f} | ${best_cost:.2f} | "
            f"{best_at * 60:.1f} min | {at_daly / best_cost:.3f} |"
        )
    return lines


# The deadline policies against the exact optimum, on traces of the availability models
# (`spotrain.cost.trace_models`), as in the "Can't Be Late" study: 48 h of work, 12-minute
# changeovers, on-demand at 3x spot, deadlines 52 to 72 h.
DEADLINE_WORK_H, DEADLINE_CHANGEOVER_H, DEADLINES_H = 48.0, 0.2, (52.0, 56.0, 60.0, 72.0)
MODEL_TICK_S, MODEL_STARTS = 360, 4
DEVELOPMENT_SEEDS, HELD_OUT_SEEDS = range(0, 6), range(100, 112)
"""The policy's one setting (`outage_fill.FILL_SHARE`) was chosen on the development seeds
only; the held-out seeds were drawn once, after."""
COMPARED = (
    simulation.UNIFORM_PROGRESS,
    simulation.SPOT_GREEDY,
    simulation.OUTAGE_FILL,
    simulation.MARKOV,
)


HISTORY_DAYS, HISTORY_SEED = 30, 10_000
"""What the environment saw of its regions before a run (`markov`'s means): a month of each
region, drawn from the market's model with the run's seed plus this."""


def deadline_job(deadline_h: float) -> simulation.Job:
    return simulation.Job(work_h=DEADLINE_WORK_H, deadline_h=deadline_h,
                          changeover_h=DEADLINE_CHANGEOVER_H, on_demand_price=ON_DEMAND_PRICE,
                          spot_price=SPOT_PRICE)  # fmt: skip


def model_traces(seeds: range, *, history: bool = False) -> list[traces.Trace]:
    """Every region's trace of every market, per seed: a deadline's window and a day more (or
    with `history`, what the environment saw of each before: `HISTORY_DAYS`, another seed)."""
    hours = HISTORY_DAYS * 24 if history else max(DEADLINES_H) + 24
    shift = HISTORY_SEED if history else 0
    return [
        t
        for market in trace_models.MARKETS
        for seed in seeds
        for t in trace_models.sample(market, hours=hours, gap_s=MODEL_TICK_S, seed=seed + shift)
    ]


Replayed = dict[float, dict[str, list[Any]]]
"""Each deadline's outcomes by strategy, as a table's cells take them."""


def _extend(into: Replayed, found: Replayed) -> None:
    for deadline_h, by_name in found.items():
        for name, outcomes in by_name.items():
            into.setdefault(deadline_h, {}).setdefault(name, []).extend(outcomes)


def _replay_one_region(trace: traces.Trace, history: traces.Trace) -> Replayed:
    """One trace's runs at every deadline, longest first (`markov` solves once for them all)."""
    found: Replayed = {}
    for deadline_h in sorted(DEADLINES_H, reverse=True):
        replayed = simulation.replay(deadline_job(deadline_h), [trace], starts=MODEL_STARTS,
                                     strategies=COMPARED, optimum=True,
                                     history=[history])  # fmt: skip
        _extend(found, {deadline_h: replayed})
    return found


def optimum_table(pool: Executor) -> list[str]:
    lines = [
        "| traces | deadline | " + " | ".join(f"`{name}`" for name in COMPARED) + " |",
        "|---|---|" + "---|" * len(COMPARED),
    ]
    for label, seeds in (("development", DEVELOPMENT_SEEDS), ("held out", HELD_OUT_SEEDS)):
        sampled, histories = model_traces(seeds), model_traces(seeds, history=True)
        by_deadline: Replayed = {}
        for found in pool.map(_replay_one_region, sampled, histories):
            _extend(by_deadline, found)
        for deadline_h in DEADLINES_H:
            found = by_deadline[deadline_h]
            cells = []
            for name in COMPARED:
                s = simulation.summarise(found[name])
                missed = round((1 - s.deadline_met) * s.runs)
                cells.append(report.versus(s.mean_vs_optimum, s.worst_vs_optimum)
                             + (f", {missed} missed" if missed else ""))  # fmt: skip
            lines.append(f"| {label} ({len(sampled) * MODEL_STARTS} runs) | {deadline_h:g} h | "
                         + " | ".join(cells) + " |")  # fmt: skip
    return lines


ACROSS_DEVELOPMENT, ACROSS_HELD_OUT = range(0, 4), range(100, 108)
MOVES_USD = (0.0, 0.5, 3.0)
"""A move's transfer. $0 is spotrain's own: the buckets replicate each checkpoint as it is
published and the dataset once, so a move sends nothing and pays its changeover alone
(docs/cost.md), and the handler prices it so. $0.5 and $3 are what a move would cost if it
sent its checkpoint (25 GB at $0.02/GB, or 150 GB: in spot-hours of this bench's prices, a
move at $3 costs three hours of spot), as where the checkpoints do not replicate."""
BEST_REGION_KNOWN = "best region, known"
WINDOW_KNOWN = "markov, window known"
"""The across table's other reference: the Markov policy told each region's mean spell and
outage over the run's own window (start to deadline), which no run can know: what a model
whose means were exactly right would give (the timing of spells still unforeseen). Not a
bound: the model is not the traces'."""
"""The across table's reference column (`best_region`): no policy, a bound on staying put."""


def _market_runs(
    market: trace_models.Market, seed: int
) -> tuple[list[traces.Trace], list[traces.Trace]]:
    """A market's regions over a deadline's window and a day more, and what the environment
    saw of them before (`HISTORY_DAYS`, another seed)."""
    return (trace_models.sample(market, hours=max(DEADLINES_H) + 24, gap_s=MODEL_TICK_S,
                                seed=seed),
            trace_models.sample(market, hours=HISTORY_DAYS * 24, gap_s=MODEL_TICK_S,
                                seed=seed + HISTORY_SEED))  # fmt: skip


def _window_known(job: simulation.Job, sampled: list[traces.Trace], move_usd: float,
                  outcomes: list[across_regions.RegionsOutcome]) -> list[Any]:  # fmt: skip
    """`markov` from each start of `outcomes` (`replay_across`'s, in its starts' order), its
    means each region's over the run's own window (`WINDOW_KNOWN`), against the same optimum."""
    from spotrain.cost.markov_policy import known_rates

    shortest = min(sampled, key=lambda t: len(t.available))
    assert job.deadline_h is not None
    ticks = round(job.deadline_h * 3600 / sampled[0].gap_s)  # the window, as start_ticks fits it
    found = []
    starts = simulation.start_ticks(job, shortest, MODEL_STARTS)
    for start, replayed in zip(starts, outcomes, strict=True):
        windows = [replace(t, available=t.available[start : start + ticks]) for t in sampled]
        known = known_rates(windows, job.nodes)
        outcome = across_regions.simulate_across(job, sampled, across_regions.MARKOV,
                                                 move_usd=move_usd, start_tick=start,
                                                 known=known)  # fmt: skip
        found.append(replace(outcome, strategy=WINDOW_KNOWN, optimum_cost=replayed.optimum_cost))
    return found


def _replay_across_one_market(
    market: trace_models.Market, seed: int
) -> tuple[dict[float, list[float | None]], dict[float, Replayed]]:
    """One market's runs across its regions: the best single region's cost from each start,
    by deadline, and each move's outcomes by deadline and strategy."""
    sampled, history = _market_runs(market, seed)
    confined = {deadline_h: best_region(deadline_job(deadline_h), sampled)
                for deadline_h in DEADLINES_H}  # fmt: skip
    by_move: dict[float, Replayed] = {}
    for move_usd in MOVES_USD:
        found: Replayed = {}
        # The deadlines longest first: `markov` solves once for all of them.
        for deadline_h in sorted(DEADLINES_H, reverse=True):
            replayed = across_regions.replay_across(deadline_job(deadline_h), sampled,
                                                    move_usd=move_usd, starts=MODEL_STARTS,
                                                    history=history)  # fmt: skip
            replayed[WINDOW_KNOWN] = _window_known(deadline_job(deadline_h), sampled, move_usd,
                                                   replayed[across_regions.MARKOV])  # fmt: skip
            _extend(found, {deadline_h: replayed})
        by_move[move_usd] = found
    return confined, by_move


def across_table(pool: Executor) -> tuple[list[str], dict[tuple[str, float, float, str], float]]:
    """The strategies across each market's regions against the optimum across them: the rows,
    and each cell's mean by traces, move, deadline and strategy."""
    lines = [
        "| traces | move | deadline | " + " | ".join(f"`{s}`" for s in across_regions.STRATEGIES)
        + f" | {WINDOW_KNOWN} | {BEST_REGION_KNOWN} |",
        "|---|---|---|" + "---|" * (len(across_regions.STRATEGIES) + 2),
    ]  # fmt: skip
    means: dict[tuple[str, float, float, str], float] = {}
    for label, seeds in (("development", ACROSS_DEVELOPMENT), ("held out", ACROSS_HELD_OUT)):
        runs = [(market, seed) for market in trace_models.MARKETS for seed in seeds]
        replayed = list(pool.map(_replay_across_one_market, *zip(*runs, strict=True)))
        for move_usd in MOVES_USD:
            found: Replayed = {}
            for _, by_move in replayed:
                _extend(found, by_move[move_usd])
            for deadline_h in DEADLINES_H:
                # The optimum across regions from each start, as every strategy's runs have it.
                bests = [o.optimum_cost for o in found[deadline_h][across_regions.HOME_ONLY]]
                singles = [c for confined, _ in replayed for c in confined[deadline_h]]
                known = [single / best for single, best in zip(singles, bests, strict=True)
                         if single is not None and best]  # fmt: skip
                cells = []
                for name, outcomes in found[deadline_h].items():
                    mean, worst = simulation.mean_and_worst([o.vs_optimum for o in outcomes])
                    if mean is not None:
                        means[(label, move_usd, deadline_h, name)] = mean
                    missed = sum(not o.deadline_met for o in outcomes)
                    moves = sum(o.moves for o in outcomes) / len(outcomes)
                    cells.append(f"{report.versus(mean, worst)}, {moves:.1f} moves"
                                 + (f", {missed} missed" if missed else ""))  # fmt: skip
                known_mean, known_worst = simulation.mean_and_worst(known)
                if known_mean is not None:
                    means[(label, move_usd, deadline_h, BEST_REGION_KNOWN)] = known_mean
                cells.append(report.versus(known_mean, known_worst))
                lines.append(f"| {label} ({len(runs) * MODEL_STARTS} runs) | ${move_usd:g} | "
                             f"{deadline_h:g} h | " + " | ".join(cells) + " |")  # fmt: skip
    return lines, means


def best_region(job: simulation.Job, sampled: list[traces.Trace],
                prices: list[tuple[float, float]] | None = None) -> list[float | None]:  # fmt: skip
    """From each start the replay takes, the cost of the exact optimum confined to the one
    region that turns out cheapest from it (known in advance, as the optimum is): what no
    schedule that stays in one region can beat. `prices`: each region's (spot, on-demand)."""
    shortest = min(sampled, key=lambda t: len(t.available))
    priced = simulation.region_prices(job, len(sampled), prices)
    found = []
    for start in simulation.start_ticks(job, shortest, MODEL_STARTS):
        costs = [optimum.cheapest_across([t], job, move_usd=0.0, start_tick=start,
                                         region_prices=[price]).cost
                 for t, price in zip(sampled, priced, strict=True)]  # fmt: skip
        usable = [c for c in costs if c is not None]
        found.append(min(usable) if usable else None)
    return found


PRICED_TYPE = "p4d.24xlarge"
"""The instance type whose regions' prices the regional table takes from the price book: spot
differs by up to 45% between the US regions (home the cheapest), and in the scarce market's
second region it is near on-demand."""
REGIONAL = (across_regions.HOME_ONLY, across_regions.OUTAGE_FILL, across_regions.MARKOV)


def book_prices(market: trace_models.Market) -> list[tuple[float, float]]:
    """Each of the market's regions' spot (the mean over its zones) and on-demand price of
    `PRICED_TYPE`, as the price book gives them and `run deadline-plan` plans with them."""
    from spotrain.core import prices

    book = prices.load()
    pools = [book.pool(PRICED_TYPE, region.name) for region in market.regions]
    return [(pool.spot_price, pool.on_demand.usd_per_hour or 0.0) for pool in pools]


def _replay_regional_one_market(
    market: trace_models.Market, seed: int
) -> tuple[Replayed, dict[float, list[float | None]]]:
    """One market's runs at $0 a move, each region at its own price: each deadline's outcomes
    by strategy, and the best single region's cost over the optimum from each start."""
    priced = book_prices(market)
    sampled, history = _market_runs(market, seed)
    found: Replayed = {}
    known: dict[float, list[float | None]] = {}
    for deadline_h in sorted(DEADLINES_H, reverse=True):  # `markov` solves once
        job = replace(deadline_job(deadline_h), spot_price=priced[0][0],
                      on_demand_price=priced[0][1])  # fmt: skip
        replayed = across_regions.replay_across(
            job, sampled, move_usd=0.0, starts=MODEL_STARTS, history=history,
            strategies=REGIONAL, region_prices=priced,
        )  # fmt: skip
        _extend(found, {deadline_h: replayed})
        bests = [o.optimum_cost for o in replayed[across_regions.HOME_ONLY]]
        known[deadline_h] = [single / best if single is not None and best else None
                             for single, best in zip(best_region(job, sampled, priced), bests,
                                                     strict=True)]  # fmt: skip
    return found, known


def regional_table(pool: Executor) -> tuple[list[str], dict[tuple[str, float, str], float]]:
    """The across table's runs at $0 a move, each region at its own price: the rows, and each
    cell's mean by traces, deadline and strategy."""
    lines = [
        "| traces | deadline | " + " | ".join(f"`{s}`" for s in REGIONAL)
        + f" | {BEST_REGION_KNOWN} |",
        "|---|---|" + "---|" * (len(REGIONAL) + 1),
    ]  # fmt: skip
    means: dict[tuple[str, float, str], float] = {}
    for label, seeds in (("development", ACROSS_DEVELOPMENT), ("held out", ACROSS_HELD_OUT)):
        found: Replayed = {}
        known: dict[float, list[float | None]] = {}
        runs = [(market, seed) for market in trace_models.MARKETS for seed in seeds]
        for market_found, market_known in pool.map(_replay_regional_one_market,
                                                   *zip(*runs, strict=True)):  # fmt: skip
            _extend(found, market_found)
            for deadline_h, ratios in market_known.items():
                known.setdefault(deadline_h, []).extend(ratios)
        for deadline_h in DEADLINES_H:
            cells = []
            for name, outcomes in found[deadline_h].items():
                mean, worst = simulation.mean_and_worst([o.vs_optimum for o in outcomes])
                if mean is not None:
                    means[(label, deadline_h, name)] = mean
                missed = sum(not o.deadline_met for o in outcomes)
                moves = sum(o.moves for o in outcomes) / len(outcomes)
                cells.append(f"{report.versus(mean, worst)}, {moves:.1f} moves"
                             + (f", {missed} missed" if missed else ""))  # fmt: skip
            known_mean, known_worst = simulation.mean_and_worst(known[deadline_h])
            if known_mean is not None:
                means[(label, deadline_h, BEST_REGION_KNOWN)] = known_mean
            cells.append(report.versus(known_mean, known_worst))
            runs_n = len(known[deadline_h])
            lines.append(f"| {label} ({runs_n} runs) | {deadline_h:g} h | " + " | ".join(cells)
                         + " |")  # fmt: skip
    return lines, means


def book_prices_said() -> str:
    """Each market's regions' prices of `PRICED_TYPE`, a line each."""
    return "\n".join(
        f"- `{market.name}`: " + ", ".join(
            f"{region.name} ${spot:.2f}/${on_demand:.2f}"
            for region, (spot, on_demand) in zip(market.regions, book_prices(market), strict=True)
        )
        for market in trace_models.MARKETS
    )  # fmt: skip


def replay_speed() -> str:
    """How long a replay takes here, as `cost simulate` and the handler's plan would: one
    region's four deadlines from one trace, and one deadline across a market's three regions
    (each from four starts; measured alone, after the tables)."""
    sampled, history = model_traces(range(1)), model_traces(range(1), history=True)
    began = time.perf_counter()
    _replay_one_region(sampled[0], history[0])
    one = (time.perf_counter() - began) / len(DEADLINES_H)
    market = trace_models.MARKETS[0]
    regions, past = _market_runs(market, 0)
    began = time.perf_counter()
    across_regions.replay_across(deadline_job(56.0), regions, move_usd=0.0, starts=MODEL_STARTS,
                                 history=past)  # fmt: skip
    across = time.perf_counter() - began
    return (
        f"A replay here: {one:.2f} s a trace and deadline in one region ({MODEL_STARTS} starts, "
        f"every strategy and the optimum), {across:.1f} s a deadline across `{market.name}`'s "
        f"{len(regions)} regions ({MODEL_STARTS} starts; nearly all of it the Markov plan's "
        "solve, one a start, as each start's deadline falls at another hour of the day)."
    )


def regional_reading(means: dict[tuple[str, float, str], float]) -> str:
    """What the regional table says of the candidate, counted from it."""
    sentences = []
    for label in ("development", "held out"):
        marks = [means[(label, d, across_regions.MARKOV)] for d in DEADLINES_H]
        fills = [means[(label, d, across_regions.OUTAGE_FILL)] for d in DEADLINES_H]
        known = [means[(label, d, BEST_REGION_KNOWN)] for d in DEADLINES_H]
        sentences.append(
            f"{label}: `markov` is within 1.05x at {sum(m <= 1.05 for m in marks)} of "
            f"{len(marks)} deadlines ({min(marks):.3f}-{max(marks):.3f}x), cheaper than "
            f"`outage-fill` at {sum(m < f for m, f in zip(marks, fills, strict=True))} and "
            f"than the best region known in advance at "
            f"{sum(m < k for m, k in zip(marks, known, strict=True))}"
        )  # fmt: skip
    return "Reading (counted from the table): " + "; ".join(sentences) + "."


def across_reading(means: dict[tuple[str, float, float, str], float]) -> str:
    """What the across-regions table says of the candidate, counted from it."""
    sentences = []
    for label in ("development", "held out"):
        for move_usd in MOVES_USD:
            cells = [(means[(label, move_usd, d, across_regions.MARKOV)],
                      means[(label, move_usd, d, across_regions.OUTAGE_FILL)])
                     for d in DEADLINES_H]  # fmt: skip
            better = sum(markov < fill for markov, fill in cells)
            within = sum(markov <= 1.05 for markov, _ in cells)
            beats_known = sum(means[(label, move_usd, d, across_regions.MARKOV)]
                              < means[(label, move_usd, d, BEST_REGION_KNOWN)]
                              for d in DEADLINES_H)  # fmt: skip
            told = [means[(label, move_usd, d, WINDOW_KNOWN)] for d in DEADLINES_H]
            sentences.append(
                f"{label}, ${move_usd:g}: `markov` is cheaper than `outage-fill` at {better} of "
                f"{len(cells)} deadlines and within 1.05x at {within}"
                f" (at most {max(m for m, _ in cells):.3f}x), and cheaper than the best region "
                f"known in advance at {beats_known}; told its window's means, "
                f"{min(told):.3f}-{max(told):.3f}x"
            )  # fmt: skip
    return "Reading (counted from the table): " + "; ".join(sentences) + "."


def model_description() -> str:
    rows = []
    for market in trace_models.MARKETS:
        regions = "; ".join(
            f"{r.name}: spells of {r.mean_available_h:g} h on average, outages of median "
            f"{r.outage_median_h:g} h (log-normal, spread {r.outage_spread:g}), day swing "
            f"{r.diurnal:.0%}"
            for r in market.regions
        )
        share = sum(
            t.availability(1)
            for t in model_traces(range(0, 20))
            if t.name.startswith(market.name + "/")
        ) / (20 * len(market.regions))
        rows.append(f"- `{market.name}` (spot {share:.0%} of the time): {regions}; "
                    f"{market.shared_per_day:g} shared dry spells a day (median "
                    f"{market.shared_median_h:g} h), each region joining with probability "
                    f"{market.joins:g}.")  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    previous = (HERE / "cost.md").read_text() if (HERE / "cost.md").exists() else ""
    started = time.perf_counter()
    # Every table's runs are independent: a process a core, the first two tables whole, the
    # others run by run; each table is assembled in its runs' order, so the figures do not
    # depend on how many cores ran them.
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        strategies_ran, intervals_ran = pool.submit(strategies_table), pool.submit(interval_table)
        against_optimum = optimum_table(pool)
        across, across_means = across_table(pool)
        regional, regional_means = regional_table(pool)
        strategies, curves, cells = strategies_ran.result()
        intervals = intervals_ran.result()
    report.plot(curves, HERE / "cost.png",
                f"4 machines, spot {MARKETS[1][0]}/h per machine, recovery {MARKETS[1][1]:g} h, "
                f"{WORK_H:g} h of work")  # fmt: skip
    took = time.perf_counter() - started
    speed = replay_speed()
    markets = ", ".join(f"{rate}/h per machine, gone {gone:g} h" for rate, gone in MARKETS)
    text = f"""# Cost: strategies on spot availability traces, and the checkpoint interval

Command: `.venv/bin/python bench/cost.py` ({took:.0f} s on {os.cpu_count()} cores; seeded, so the
figures are the same on every machine, with any number of cores). Machine: {platform.machine()},
Python {sys.version.split()[0]}, {platform.system()} {platform.release()}.

## Cost as a share of on-demand, and deadline misses

{WORK_H:g} h of compute, changeover d = {CHANGEOVER_H * 60:.0f} min per move, spot at
{SPOT_PRICE / ON_DEMAND_PRICE:.0%} of the on-demand price. Traces generated by
`spotrain.cost.traces.generate` ({TRACES} per row, {STARTS} start offsets each: {TRACES * STARTS}
runs per cell) at three markets: {markets}.
"spot available" is the share of time a gang of that size finds every machine it needs; the
deadline is the work x (1 + slack) + one changeover. A cell is the mean cost over its runs as a
share of on-demand only; "(n missed)" counts runs that finished after the deadline.

{chr(10).join(strategies)}

{reading(cells)}

The policies decide as the authors' reference implementation does: every comparison in exact
arithmetic (whole milliseconds), the 2d safety net only for a run that is idle or on
on-demand, a 1d guard that keeps a training spot machine, and the time left counted in whole
ticks. Every start's window (its deadline) lies inside its trace: nothing wraps around.

{changes(previous, strategies)}

![cost against deadline slack](cost.png)

## The deadline policies against the exact optimum

{DEADLINE_WORK_H:g} h of work, changeover {DEADLINE_CHANGEOVER_H * 60:.0f} min, on-demand at
{ON_DEMAND_PRICE / SPOT_PRICE:g}x spot, one machine; traces of the availability models in
`spotrain.cost.trace_models` ({MODEL_TICK_S // 60}-minute ticks, every region of both markets,
{MODEL_STARTS} starts per trace spread over the ticks whose deadline fits):

{model_description()}

A cell is the mean over the runs of each run's cost over the exact optimum from the same start
(`spotrain.cost.optimum`: the cheapest schedule that meets the deadline, the trace known in
advance), the worst run in brackets, and the runs that missed the deadline. The policies see
what the handler sees: no history before the run's start (outage fill's record starts empty,
its prior standing in). `outage-fill` is the one the handler runs without a plan. `markov` is
the one it runs with a plan (`spotrain run deadline-plan`)
(`spotrain.cost.markov_policy`, in one region), its means and the day's swing of its spells'
ending from what the environment saw of the region in the {HISTORY_DAYS} days before (another
draw of the same model, which says when it starts). Target: every
deadline met and at most 1.10x at every deadline.

{chr(10).join(against_optimum)}

## Across regions, against the exact optimum across them

The same runs over every region of a market at once (`us`: three regions, `scarce`: two; one
trace each from one seed, so their shared dry spells line up), a move between regions paying
a changeover and its transfer: $0 where the checkpoints replicate as spotrain's do (a move
then sends nothing), $0.5 and $3 if it had to send its checkpoint
(`spotrain.cost.across_regions`; the optimum is
`optimum.cheapest_across`). `outage-fill@home` is the handler's policy confined to home (a run
that never moves); `spot-anywhere` the plain rule (spot here, else spot wherever there is some
while a changeover more still fits); `outage-fill` the policy across regions
(`outage_fill.across`), the one the handler runs without a plan; `markov`, the one it runs
with a plan, plans against a
model of each region's market (`spotrain.cost.markov_policy`: an exact programme over the ticks
left, each region a two-state Markov chain whose spells end by the hour of the day), its means
and daily swings from what the environment saw of its regions in the {HISTORY_DAYS} days before
(another draw of the same market), which the other
policies do not use. A cell: mean (worst) of cost over the optimum, the mean moves per run,
misses. Target: at most 1.05x. `best region, known` is no policy: the exact optimum confined
to the one region that turned out cheapest from each start, the traces known in advance (what
no run that stays in one region can beat), over the optimum across regions: the share of the
optimum's saving that needs moves timed by foresight. `{WINDOW_KNOWN}` is no policy either:
`markov` told each region's mean spell and outage over the run's own window (start to
deadline), which no run can know: what a model whose means were exactly right would give, the
timing of spells still unforeseen (not a bound: the model is not the traces').

{chr(10).join(across)}

{across_reading(across_means)}

{speed}

## Across regions, each region at its own price

The runs above at $0 a move (spotrain's own), each region at its own spot and on-demand price:
the price book's {PRICED_TYPE} (`spotrain/core/price_book.json`, spot the mean over each
region's zones), in USD an hour (spot/on-demand):

{book_prices_said()}

`markov` plans with each region's
price, as `spotrain run deadline-plan` does; outage fill (`outage_fill.across`) moves out of
an outage to where spot saves the most on-demand, and leaves spot for cheaper spot when a
spell there saves more than twice the move, priced as the handler prices them from the book.
Every cost, and the optimum's, is at each region's price. Target: at most 1.05x.

{chr(10).join(regional)}

{regional_reading(regional_means)}

## The planner's checkpoint interval against a brute-force search

Young/Daly (`spotrain.cost.planner.daly_interval`) with a checkpoint cost of 2 min, against
a grid of intervals from 0.25x to 3x, simulated with explicit checkpoints (`Job.checkpoint_every_h`:
each checkpoint stalls training 2 min, a preemption loses the work since the last one, a restart
costs 5 min), {WORK_H:g} h of work on one spot machine, 40 seeded traces per interval.
Target: Daly's interval within 5% of the best expected cost.

{chr(10).join(intervals)}
"""
    (HERE / "cost.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
