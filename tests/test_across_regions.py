"""A run over several regions: the exact optimum across them equals a brute force over every
(region, mode) schedule, no strategy beats it, and the policy moves only when a move pays."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from spotrain import cli
from spotrain.core import prices
from spotrain.core.deadline_policy import IDLE, ON_DEMAND, SPOT, Progress
from spotrain.core.errors import CostInputError
from spotrain.core.outage_fill import RegionRecords, SpotRecord, across
from spotrain.cost import across_regions, optimum, simulation, trace_models, traces

HOUR = 3600.0


def brute_force(
    job: simulation.Job, sampled: list[traces.Trace], move_usd: float,
    region_prices: list[tuple[float, float]] | None = None,
) -> float | None:  # fmt: skip
    """The cheapest schedule of (region, mode) per tick that meets the deadline, each replayed
    through the simulator across regions itself."""
    ticks = math.ceil(job.deadline_h * 3600 / sampled[0].gap_s)  # type: ignore[operator]
    choices = [(r, m) for r in range(len(sampled)) for m in (SPOT, ON_DEMAND)] + [(0, IDLE)]
    best = None
    for schedule in itertools.product(choices, repeat=ticks):
        if any(mode == SPOT and (i >= len(sampled[r].available) or sampled[r].available[i] < 1)
               for i, (r, mode) in enumerate(schedule)):  # fmt: skip
            continue
        # Idle keeps the region the run was in: the script says idle as "stay where it is".
        outcome = across_regions.simulate_across(job, sampled, _idle_in_place(schedule),
                                                 move_usd=move_usd,
                                                 region_prices=region_prices)  # fmt: skip
        if outcome.deadline_met and (best is None or outcome.cost < best):
            best = outcome.cost
    return best


def _idle_in_place(schedule: Sequence[tuple[int, str]]) -> across_regions.DecideWhere:
    steps = iter(schedule)

    def scripted(
        progress: Progress, where: tuple[int, str], available: Sequence[bool]
    ) -> tuple[int, str]:
        region, mode = next(steps, (where[0], IDLE))
        return (where[0], IDLE) if mode == IDLE else (region, mode)

    return scripted


def test_the_optimum_across_regions_is_the_cheapest_of_every_schedule() -> None:
    rng = random.Random(11)
    compared = 0
    while compared < 12:
        work_h = rng.choice([0.5, 1.0, 1.5])
        deadline_h = work_h + rng.choice([0.5, 1.0])
        if math.ceil(deadline_h * 2) > 5:
            continue
        job = simulation.Job(work_h=work_h, deadline_h=deadline_h,
                             changeover_h=rng.choice([0, 10, 15]) / 60,
                             on_demand_price=3.0, spot_price=rng.choice([0.5, 1.0]))  # fmt: skip
        sampled = [traces.Trace(f"r{r}", 1800, tuple(rng.choice([0, 1]) for _ in range(5)))
                   for r in range(2)]  # fmt: skip
        move_usd = rng.choice([0.0, 0.3, 2.0])
        # Half the cases price each region on its own (spot by up to half, as the price book's
        # regions differ), the other region's on-demand cheaper than home's spot at times.
        other = (rng.choice([0.4, 1.2]), rng.choice([0.9, 2.5]))
        prices = None if compared % 2 else [(job.spot_price, 3.0), other]
        expected = brute_force(job, sampled, move_usd, prices)
        found = optimum.cheapest_across(sampled, job, move_usd=move_usd,
                                        region_prices=prices).cost  # fmt: skip
        assert (found is None) == (expected is None)
        if expected is not None:
            assert found == pytest.approx(expected, rel=1e-12), (job, sampled, move_usd, prices)
        compared += 1


def test_no_strategy_beats_the_optimum_and_regions_only_help() -> None:
    sampled = trace_models.sample(trace_models.US, hours=40, gap_s=600, seed=4)
    job = simulation.Job(work_h=12, deadline_h=15, changeover_h=0.2, on_demand_price=3.0,
                         spot_price=1.0)  # fmt: skip
    results = across_regions.replay_across(job, sampled, move_usd=0.5, starts=3)
    for name, outcomes in results.items():
        for outcome in outcomes:
            assert outcome.deadline_met, name
            assert outcome.cost >= outcome.optimum_cost * (1 - 1e-12), name  # type: ignore[operator]
    for start, outcome in zip(simulation.start_ticks(job, sampled[0], 3),
                              results[across_regions.OUTAGE_FILL], strict=True):  # fmt: skip
        home = optimum.cheapest(job, sampled[0], start_tick=start).cost
        assert outcome.optimum_cost <= home  # type: ignore[operator]


def _progress(elapsed_h: float = 4.0, done_h: float = 3.0) -> Progress:
    return Progress(elapsed_h=elapsed_h, deadline_h=20.0, work_h=10.0, done_h=done_h,
                    changeover_h=0.25, decision_interval_h=0.1)  # fmt: skip


SCARCE_HOME = RegionRecords(
    (SpotRecord(observed_s=24 * HOUR, available_s=4 * HOUR, spells=6),
     SpotRecord(observed_s=24 * HOUR, available_s=20 * HOUR, spells=2)),
    SpotRecord(observed_s=24 * HOUR, available_s=22 * HOUR, spells=3),
)  # fmt: skip
"""Home saw spot 4 h a day in short spells; the other region 20 h in long ones."""


def test_a_run_moves_for_spot_that_saves_more_than_the_move_and_stays_for_spot_here() -> None:
    def where(**changes: object) -> tuple[int, str]:
        arguments: dict[str, object] = {
            "region": 0, "current": ON_DEMAND, "spot_available": [False, True],
            "records": SCARCE_HOME, "move_usd": 1.0, "prices": [(1.0, 3.0)] * 2,
        }  # fmt: skip
        placement = across(_progress(), **{**arguments, **changes})  # type: ignore[arg-type]
        return placement.region, placement.mode

    assert where() == (1, SPOT)
    assert where(move_usd=1_000.0) == (0, ON_DEMAND)  # a move dearer than what it saves
    assert where(spot_available=[True, True]) == (0, SPOT)  # never leaves spot for spot
    assert where(spot_available=[False, False]) == (0, ON_DEMAND)  # stays until spot returns
    # Idle, with years of time left: spot at home will carry the run, a move would buy
    # nothing it needs.
    ample = across(_progress(done_h=9.0), region=0, current=IDLE, spot_available=[False, True],
                   records=RegionRecords((SpotRecord(observed_s=24 * HOUR,
                                                     available_s=23 * HOUR, spells=2),
                                          SCARCE_HOME.regions[1]),
                                         SCARCE_HOME.anywhere),
                   move_usd=1.0, prices=[(1.0, 3.0)] * 2)  # fmt: skip
    assert (ample.region, ample.mode) == (0, IDLE), ample.reason


def test_regions_priced_apart_no_strategy_beats_the_optimum_and_markov_finds_cheaper() -> None:
    """Two regions with spot alike, the second's at 0.6x home's: every strategy pays each
    region's price and none beats the optimum across them, which is the cheaper region's;
    Markov, which plans with the prices, pays less than the best schedule at home."""
    sampled = trace_models.sample(trace_models.US, hours=40, gap_s=600, seed=4)[:2]
    sampled = [sampled[0], traces.Trace("cheaper", 600, sampled[0].available)]
    job = simulation.Job(work_h=12, deadline_h=15, changeover_h=0.2, on_demand_price=3.0,
                         spot_price=1.0)  # fmt: skip
    prices = [(1.0, 3.0), (0.6, 3.0)]
    results = across_regions.replay_across(job, sampled, move_usd=0.5, starts=3,
                                           history=sampled, region_prices=prices)  # fmt: skip
    for name, outcomes in results.items():
        for outcome in outcomes:
            assert outcome.deadline_met, name
            assert outcome.cost >= outcome.optimum_cost * (1 - 1e-12), name  # type: ignore[operator]
    markov = results[across_regions.MARKOV]

    # The same spot in both, one cheaper in every mode: the optimum is the cheaper region's.
    def confined(region: int, start: int) -> float | None:
        return optimum.cheapest_across([sampled[region]], job, move_usd=0.5, start_tick=start,
                                       region_prices=[prices[region]]).cost  # fmt: skip

    starts = simulation.start_ticks(job, sampled[0], 3)
    homes = [confined(0, start) for start in starts]
    for outcome, start, home in zip(markov, starts, homes, strict=True):
        assert outcome.optimum_cost == pytest.approx(confined(1, start), rel=1e-12)
        assert outcome.optimum_cost <= home  # type: ignore[operator]
    assert sum(o.optimum_cost for o in markov) < sum(homes)  # type: ignore[misc,arg-type]
    # Markov trains where it is cheaper: below what the best schedule at home costs, which a
    # run blind to the prices (home first of two alike) pays at least.
    assert sum(o.cost for o in markov) < sum(homes)  # type: ignore[arg-type]
    with pytest.raises(CostInputError, match="1 regions' prices for 2 regions"):
        optimum.cheapest_across(sampled, job, move_usd=0.5, region_prices=prices[:1])


def test_regions_priced_apart_a_run_leaves_spot_for_spot_only_where_a_spell_pays_the_move() -> None:
    """Spot in both regions, the other's spot cheaper: the run moves when a spell there saves
    more than twice the move's changeover and transfer, and stays otherwise; out of spot here,
    it goes where the on-demand it saves is largest, not where spells are longest; and with no
    prices known it makes no move on a guess."""
    both = {"spot_available": [True, True], "records": SCARCE_HOME, "region": 0,
            "current": SPOT}  # fmt: skip

    def where(**changes: object) -> tuple[int, str]:
        arguments: dict[str, object] = {**both, "move_usd": 0.0,
                                        "prices": [(1.0, 3.0), (0.5, 3.0)]}  # fmt: skip
        placement = across(_progress(), **{**arguments, **changes})  # type: ignore[arg-type]
        return placement.region, placement.mode

    # A spell there is 10 h (20 of 24 h in 2 spells): it saves (10 - 0.25) x 0.5 = $4.9.
    assert where() == (1, SPOT)
    assert where(move_usd=2.5) == (0, SPOT)  # twice (0.125 + 2.5) is more than it saves
    assert where(prices=[(1.0, 3.0), (0.98, 3.0)]) == (0, SPOT)  # cheaper by too little
    assert where(prices=[]) == (0, SPOT)
    # No spot at home, spot in two others: the longer spells are dearer there.
    three = RegionRecords((*SCARCE_HOME.regions, SpotRecord(observed_s=24 * HOUR,
                                                            available_s=12 * HOUR, spells=4)),
                          SCARCE_HOME.anywhere)  # fmt: skip
    gone = {"spot_available": [False, True, True], "records": three, "current": ON_DEMAND}
    assert where(**gone, prices=[(1.0, 3.0), (2.9, 3.0), (1.0, 3.0)]) == (2, SPOT)
    assert where(**gone, prices=[(1.0, 3.0)] * 3) == (1, SPOT)  # alike: the longest spells
    assert where(**gone, prices=[]) == (0, ON_DEMAND)


def test_across_regions_meets_every_deadline_and_beats_staying_home() -> None:
    sampled = trace_models.sample(trace_models.SCARCE, hours=40, gap_s=600, seed=7)
    job = simulation.Job(work_h=12, deadline_h=16, changeover_h=0.2, on_demand_price=3.0,
                         spot_price=1.0)  # fmt: skip
    results = across_regions.replay_across(job, sampled, move_usd=0.5, starts=4)
    ours = results[across_regions.OUTAGE_FILL]
    home = results[across_regions.HOME_ONLY]
    assert all(o.deadline_met for o in ours)
    assert sum(o.cost for o in ours) < sum(o.cost for o in home)


def test_cost_simulate_across_regions_reports_moves_and_the_optimum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths, history = [], []
    for index, (trace, past) in enumerate(zip(
        trace_models.sample(trace_models.US, hours=30, gap_s=600, seed=2),
        trace_models.sample(trace_models.US, hours=24 * 7, gap_s=600, seed=3), strict=True,
    )):  # fmt: skip
        paths += ["--trace", str(tmp_path / f"{index}.json")]
        (tmp_path / f"{index}.json").write_text(json.dumps(trace.to_json()))
        history += ["--history", str(tmp_path / f"past-{index}.json")]  # the week before
        (tmp_path / f"past-{index}.json").write_text(json.dumps(past.to_json()))
    flags = ["cost", "simulate", "--across-regions", *paths, "--work-hours", "8",
             "--deadline-hours", "11", "--on-demand-price", "3", "--spot-price", "1",
             "--starts", "3", "--move-usd", "0.5", "--json"]  # fmt: skip
    for given in ([], history):  # the candidate learns its means, or knows them
        assert cli.main(flags + given) == 0
        found = json.loads(capsys.readouterr().out)
        assert len(found["regions"]) == 3 and found["move_usd"] == 0.5
        assert set(found["strategies"]) == set(across_regions.STRATEGIES)
        for name, strategy in found["strategies"].items():
            assert strategy["summary"]["deadline_met"] == 1.0, name
            assert all(run["vs_optimum"] >= 1 - 1e-12 for run in strategy["runs"]), name
        assert found["strategies"]["outage-fill@home"]["summary"]["mean_moves"] == 0
        # It recommends among what the handler runs across regions: outage fill, and Markov
        # only when planned on history (the others are references no run gets).
        runnable = ["outage-fill", *(["markov"] if given else [])]
        cheapest = min(runnable, key=lambda n: found["strategies"][n]["summary"]["mean_cost"])
        assert found["recommended"]["strategy"] == cheapest, found["recommended"]
        assert ("spotrain run deadline-plan" in found["recommended"]["why"]) == (
            cheapest == "markov")  # fmt: skip
    assert cli.main([f for f in flags if f != "--json"] + history) == 0
    assert "\nrecommended over these traces: " in capsys.readouterr().out
    # Each region at its own price (home's the flags'): every run and its optimum pay them.
    priced = ["--region-price", "0.6,2.5", "--region-price", "1.4,3.5"]
    assert cli.main(flags + history + priced) == 0
    found = json.loads(capsys.readouterr().out)
    assert [(r["spot_price"], r["on_demand_price"]) for r in found["regions"]] == [
        (1.0, 3.0), (0.6, 2.5), (1.4, 3.5)]  # fmt: skip
    sampled = traces.load_all(paths[1::2])
    job = simulation.Job(work_h=8, deadline_h=11, changeover_h=0.25, on_demand_price=3.0,
                         spot_price=1.0)  # fmt: skip
    first = simulation.start_ticks(job, sampled[0], 3)[0]
    each = [(1.0, 3.0), (0.6, 2.5), (1.4, 3.5)]
    expected = optimum.cheapest_across(sampled, job, move_usd=0.5, start_tick=first,
                                       region_prices=each)  # fmt: skip
    assert found["strategies"]["markov"]["runs"][0]["optimum_cost"] == pytest.approx(
        expected.cost, rel=1e-12)  # fmt: skip
    assert cli.main(flags + priced[:2]) == 2
    assert "give one --region-price per region after home" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([*flags, "--region-price", "1,free"])
    assert "give SPOT,ON_DEMAND, two USD/h above 0" in capsys.readouterr().err
    assert cli.main(["cost", "simulate", "--across-regions", *paths[:2], "--work-hours", "8",
                     "--on-demand-price", "3", "--spot-price", "1", "--wrap",
                     *history[:4]]) == 2  # fmt: skip
    error = capsys.readouterr().err
    assert "--trace per region" in error and "--deadline-hours" in error and "--wrap" in error
    assert "give one --history per --trace, in the same order (2 for 1)" in error


def test_cost_simulate_takes_each_regions_prices_from_the_price_book(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = []
    for index, trace in enumerate(trace_models.sample(trace_models.US, hours=30, gap_s=600,
                                                      seed=2)):  # fmt: skip
        paths += ["--trace", str(tmp_path / f"{index}.json")]
        (tmp_path / f"{index}.json").write_text(json.dumps(trace.to_json()))
    regions = ["us-east-1", "us-east-2", "us-west-2"]
    flags = ["cost", "simulate", "--across-regions", *paths, "--work-hours", "8",
             "--deadline-hours", "11", "--starts", "2", "--json"]  # fmt: skip
    by_book = ["--instance-type", "p4d.24xlarge", *(f for r in regions for f in ("--region", r))]
    assert cli.main(flags + by_book) == 0
    found = json.loads(capsys.readouterr().out)
    book = prices.load()
    pools = [book.pool("p4d.24xlarge", region) for region in regions]
    each = [(pool.spot_price, pool.on_demand.usd_per_hour) for pool in pools]
    assert [(r["spot_price"], r["on_demand_price"]) for r in found["regions"]] == each
    assert [r["region"] for r in found["regions"]] == regions
    assert len(set(each)) == 3  # the regions' prices differ, so each went where it belongs
    # The same replay as the book's prices given by hand.
    by_hand = ["--spot-price", str(each[0][0]), "--on-demand-price", str(each[0][1]),
               *(f for spot, on_demand in each[1:] for f in ("--region-price",
                                                           f"{spot!r},{on_demand!r}"))]  # fmt: skip
    assert cli.main(flags + by_hand) == 0
    assert json.loads(capsys.readouterr().out)["strategies"] == found["strategies"]
    assert cli.main([f for f in flags if f != "--json"] + by_book) == 0
    assert "(p4d.24xlarge in us-west-2, the price book's)" in capsys.readouterr().out
    # One region, its trace generated.
    assert cli.main(["cost", "simulate", "--interruptions-per-hour", "0.2", "--traces", "2",
                     "--work-hours", "4", "--starts", "2", "--instance-type", "p4d.24xlarge",
                     "--region", "us-east-2", "--json"]) == 0  # fmt: skip
    spot, on_demand = each[1]
    assert json.loads(capsys.readouterr().out)["prices"] == {"spot": spot, "on_demand": on_demand}
    # Every problem at once, before anything is replayed.
    two_regions = ["--region", "us-east-1", "--region", "nowhere-1"]
    assert cli.main([*flags[:-1], "--work-hours", "0", "--spot-price", "1", "--instance-type",
                     "p4d.24xlarge", *two_regions]) == 2  # fmt: skip
    error = capsys.readouterr().err
    assert "not both" in error
    assert "give one --region per --trace, in the same order (2 for 3)" in error
    assert "the work is 0.0 hours" in error
    assert cli.main([*flags, "--instance-type", "p4d.24xlarge", "--region", "us-east-1",
                     "--region", "nowhere-1", "--region", "us-west-2"]) == 2  # fmt: skip
    error = capsys.readouterr().err
    assert "spotrain prices refresh --instance-type p4d.24xlarge --region nowhere-1" in error
    assert "instead of --instance-type and --region" in error
    assert cli.main([*flags, "--price-book", str(tmp_path / "book.json")]) == 2
    error = capsys.readouterr().err
    assert "give --on-demand-price and --spot-price, or --instance-type and --region" in error
    assert "--price-book is read for --instance-type and --region" in error


def test_traces_of_different_ticks_are_refused_with_the_fix() -> None:
    job = simulation.Job(work_h=1, deadline_h=2, changeover_h=0.1, on_demand_price=3.0,
                         spot_price=1.0)  # fmt: skip
    with pytest.raises(CostInputError, match="--tick"):
        optimum.cheapest_across([traces.Trace("a", 600, (1,) * 20),
                                 traces.Trace("b", 300, (1,) * 40)], job, move_usd=0)  # fmt: skip


def test_the_records_of_every_region_are_kept_as_an_item_and_read_back() -> None:
    """What the handler keeps in a run's state between checks (`spot_records`): the same
    records back; none kept, or kept for another number of regions, reads as empty ones."""
    records = RegionRecords.empty(2).seen(1_000.0, [False, True], longest_gap_s=600.0)
    records = records.seen(1_300.0, [True, True], longest_gap_s=600.0)
    assert RegionRecords.from_item(records.to_item(), 2) == records
    assert RegionRecords.from_item(None, 3) == RegionRecords.empty(3)
    assert RegionRecords.from_item(records.to_item(), 3) == RegionRecords.empty(3)
