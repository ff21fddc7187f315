"""The exact optimum the simulator measures strategies against: equal to a brute force over
every schedule on small traces, never above a strategy that met its deadline."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest

from spotrain import cli
from spotrain.core.deadline_policy import IDLE, ON_DEMAND, SPOT, Progress
from spotrain.core.errors import CostInputError
from spotrain.cost import optimum, simulation, traces


def _scripted(schedule: tuple[str, ...]) -> simulation.Decide:
    """A strategy that plays `schedule`, a mode per tick, then idles."""
    modes = iter(schedule)

    def scripted(progress: Progress, current: str, available: bool) -> str:
        return next(modes, IDLE)

    return scripted


def brute_force(job: simulation.Job, trace: traces.Trace) -> float | None:
    """The cheapest schedule that meets the deadline, by replaying every sequence of modes
    through the simulator itself (so the programme is held to the simulator's model)."""
    ticks = math.ceil(job.deadline_h * 3600 / trace.gap_s)  # type: ignore[operator]
    spot_in = [i < len(trace.available) and trace.available[i] >= job.nodes
               for i in range(ticks)]  # fmt: skip
    best = None
    for schedule in itertools.product((SPOT, ON_DEMAND, IDLE), repeat=ticks):
        if any(mode == SPOT and not spot_in[i] for i, mode in enumerate(schedule)):
            continue
        outcome = simulation.simulate(job, trace, _scripted(schedule))
        if outcome.deadline_met and (best is None or outcome.cost < best):
            best = outcome.cost
    return best


def test_the_optimum_is_the_cheapest_of_every_schedule_on_small_traces() -> None:
    rng = random.Random(7)
    compared = reachable = 0
    while compared < 40:
        gap_s = rng.choice([600, 900, 1800, 3600])
        work_h = rng.choice([0.25, 0.5, 1.0, 1.5, 2.2])
        ticks = rng.randint(2, 6)
        deadline_h = rng.choice([work_h + 0.5, work_h + 1, ticks * gap_s / 3600])
        if math.ceil(deadline_h * 3600 / gap_s) > 6:
            continue
        try:
            job = simulation.Job(
                work_h=work_h, deadline_h=deadline_h,
                changeover_h=rng.choice([0, 5, 10, 15, 20, 45]) / 60,
                first_start_h=rng.choice([None, 0.0, 5 / 60, 10 / 60]),
                on_demand_price=3.0, spot_price=rng.choice([0.5, 1.0, 2.9]),
                nodes=rng.choice([1, 2]),
            )  # fmt: skip
        except CostInputError:
            continue  # a deadline no schedule can meet
        trace = traces.Trace("random", gap_s, tuple(rng.choice([0, 1, 2]) for _ in range(ticks)))
        expected = brute_force(job, trace)
        found = optimum.cheapest(job, trace).cost
        assert (found is None) == (expected is None), (job, trace)
        if expected is not None:
            assert found == pytest.approx(expected, rel=1e-12), (job, trace)
            reachable += 1
        compared += 1
    assert reachable >= 30  # most cases have a schedule: the comparison is not vacuous


def test_no_strategy_that_meets_its_deadline_is_cheaper_than_the_optimum() -> None:
    sampled = traces.generate_many(4, seed=3, hours=40, capacity=2, interruptions_per_hour=0.3,
                                   recovery_h=1.5, gap_s=600)  # fmt: skip
    for deadline_h, nodes in ((13, 1), (16, 2), (24, 2)):
        run = simulation.Job(work_h=12, deadline_h=deadline_h, changeover_h=0.2, nodes=nodes,
                             on_demand_price=3.0, spot_price=1.0)  # fmt: skip
        results = simulation.replay(run, sampled, starts=4, optimum=True)
        for name, outcomes in results.items():
            if name == simulation.BLUEPRINT_MIX and nodes > 1:  # not a gang: not measured
                assert all(o.optimum_cost is None for o in outcomes)
                continue
            for outcome in outcomes:
                assert outcome.optimum_cost is not None
                assert outcome.cost >= outcome.optimum_cost * (1 - 1e-12), (name, deadline_h)
                assert outcome.vs_optimum is None or outcome.vs_optimum >= 1 - 1e-12
        summary = simulation.summarise(results[simulation.UNIFORM_PROGRESS])
        assert summary.mean_vs_optimum is not None and summary.mean_vs_optimum >= 1
        # On-demand from the start is optimal only where spot never helps: here it does.
        on_demand = simulation.summarise(results[simulation.ON_DEMAND_ONLY])
        assert on_demand.mean_vs_optimum > summary.mean_vs_optimum  # type: ignore[operator]


def test_the_optimum_waits_for_spot_it_knows_is_coming() -> None:
    # Spot only from the third hour: 2 h of work, a 4.5 h deadline, 30-minute changeovers.
    # Waiting 2 h and taking spot costs 2.5 spot hours; any start before pays on-demand.
    run = simulation.Job(work_h=2, deadline_h=4.5, changeover_h=0.5, on_demand_price=3.0,
                         spot_price=1.0)  # fmt: skip
    known = optimum.cheapest(run, traces.Trace("later", 3600, (0, 0, 1, 1, 1)))
    assert known.cost == pytest.approx(2.5)
    # With a 4 h deadline the wait no longer fits: an hour of on-demand first (half of it its
    # changeover), then spot from the third hour with its own: 1 h x 3 + 2 h x 1.
    tight = optimum.cheapest(simulation.Job(work_h=2, deadline_h=4.0, changeover_h=0.5,
                                            on_demand_price=3.0, spot_price=1.0),
                             traces.Trace("later", 3600, (0, 0, 1, 1, 1)))  # fmt: skip
    assert tight.cost == pytest.approx(5.0)


def test_jobs_the_optimum_does_not_model_are_refused_with_the_fix() -> None:
    explicit = simulation.Job(work_h=2, deadline_h=4, changeover_h=0.25, on_demand_price=3.0,
                              spot_price=1.0, checkpoint_every_h=0.5)  # fmt: skip
    with pytest.raises(CostInputError, match="leave checkpoint_every_h unset"):
        optimum.cheapest(explicit, traces.Trace("any", 3600, (1, 1, 1, 1)))


def test_cost_simulate_reports_each_run_and_strategy_against_the_optimum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600},
                                "data": ([1] * 20 + [0] * 10) * 6}))  # fmt: skip
    flags = ["cost", "simulate", "--trace", str(path), "--on-demand-price", "3", "--spot-price",
             "1", "--work-hours", "8", "--deadline-hours", "12", "--starts", "3"]  # fmt: skip
    assert cli.main([*flags, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    for name, strategy in found["strategies"].items():
        ratios = [run["vs_optimum"] for run in strategy["runs"]]
        assert all(r is None or r >= 1 - 1e-12 for r in ratios), name
        met = [r for r in ratios if r is not None]
        assert strategy["summary"]["mean_vs_optimum"] == pytest.approx(sum(met) / len(met))
        assert strategy["summary"]["worst_vs_optimum"] == pytest.approx(max(met))
    assert cli.main(flags) == 0
    table = capsys.readouterr().out
    assert "vs optimum" in table and "x (" in table
