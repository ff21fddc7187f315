"""The Markov policy (`spotrain.cost.markov_policy`): its programme's expected cost equals an
expectimax written out state by state over the same model, its decisions carry their reasons,
it meets deadlines on generated traces, and it moves only when a move pays."""

from __future__ import annotations

import functools
import itertools
import json
import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import adversarial_availability

from spotrain import cli
from spotrain.core.deadline_plan import GO_ON, IDLE_THERE, ON_DEMAND_HERE, SPOT_IN
from spotrain.core.deadline_policy import IDLE, ON_DEMAND, SPOT, Progress
from spotrain.core.errors import CostInputError
from spotrain.core.outage_fill import SpotRecord
from spotrain.cost import across_regions, markov_policy, planner, simulation, trace_models, traces
from spotrain.cost.markov_policy import MISSED_USD, Plan, Prices, RegionRates


def expectimax(rates: list[RegionRates], prices: Prices, *, tick_h: float, ticks: int,
               work: int, changeover: int,
               deadline_utc_h: float | None = None) -> dict[int, float]:  # fmt: skip
    """The least expected cost of a run not yet started, with `ticks` ticks to its deadline
    and `work` ticks of work, for each set of regions with spot at its start (as bits),
    written out one state at a time. With the deadline's hour, a spell ends over a tick at
    its rate at the tick's middle: 1 + swing times the cosine of the hours from its peak, over
    the mean spell."""
    regions = len(rates)
    returns = [min(1.0, tick_h / r.mean_outage_h) for r in rates]

    def ends(r: int, left: int) -> float:
        rate = 1 / rates[r].mean_spell_h
        if deadline_utc_h is not None:
            middle = deadline_utc_h - (left - 0.5) * tick_h
            hours_from_peak = middle - rates[r].spell_peak_utc_h
            rate *= 1 + rates[r].spell_swing * math.cos(2 * math.pi * hours_from_peak / 24)
        return min(1.0, tick_h * rate)

    def chance(now: tuple[bool, ...], then: tuple[bool, ...], left: int) -> float:
        p = 1.0
        for r in range(regions):
            stays = 1 - ends(r, left) if now[r] else 1 - returns[r]
            p *= stays if then[r] == now[r] else 1 - stays
        return p

    patterns = list(itertools.product((False, True), repeat=regions))

    @functools.cache
    def best(left: int, w: int, spot: tuple[bool, ...], region: int, mode: str, k: int) -> float:
        if w == 0:
            return 0.0
        if left == 0:
            return MISSED_USD
        options = [after(left, w, spot, region, IDLE, 0, 0.0)]  # idle
        if mode != IDLE and (mode != SPOT or spot[region]):  # go on
            options.append(run(left, w, spot, region, mode, k, 0.0))
        options.append(run(left, w, spot, region, ON_DEMAND, changeover, 0.0))
        for to in range(regions):
            if spot[to]:
                move = prices.move_usd if to != region else 0.0
                options.append(run(left, w, spot, to, SPOT, changeover, move))
        return min(options)

    def run(left: int, w: int, spot: tuple[bool, ...], region: int, mode: str, k: int,
            extra: float) -> float:  # fmt: skip
        spot_price, on_demand_price = (
            prices.regional[region]
            if prices.regional
            else (prices.spot_per_hour, prices.on_demand_per_hour)
        )
        price = spot_price if mode == SPOT else on_demand_price
        if k > 0:
            return price * tick_h + after(left, w, spot, region, mode, k - 1, extra)
        return price * tick_h + after(left, w - 1, spot, region, mode, 0, extra)

    def after(left: int, w: int, spot: tuple[bool, ...], region: int, mode: str, k: int,
              extra: float) -> float:  # fmt: skip
        total = extra
        for then in patterns:
            if w == 0:
                continue  # done: nothing more to pay
            lost = mode == SPOT and not then[region]
            total += chance(spot, then, left) * best(
                left - 1, w, then, region, IDLE if lost else mode, 0 if lost else k
            )
        return total

    return {sum(1 << r for r, there in enumerate(spot) if there):
            min(best(ticks, work, spot, r, IDLE, 0) for r in range(regions))
            for spot in patterns}  # fmt: skip


@pytest.mark.parametrize("daily", [False, True], ids=["alike-by-the-hour", "daily-swing"])
@pytest.mark.parametrize("seed", range(6))
def test_the_programme_equals_an_expectimax_over_the_same_model(seed: int, daily: bool) -> None:
    """Also where spells end more often at some hours of the day than at others, each region
    peaking at an hour of its own, the deadline at any hour: the ticks (5 to 7 of half an
    hour) cross several hours, so a plan whose hours were a tick out of line fails."""
    rng = random.Random(seed)
    regions = rng.choice([1, 2])
    rates = [RegionRates(rng.choice([1.0, 3.0] if daily else [0.5, 1.0, 3.0]),
                         rng.choice([0.5, 1.0, 2.0]),
                         spell_swing=rng.choice([0.5, 0.9]) if daily else 0.0,
                         spell_peak_utc_h=rng.uniform(0, 24))
             for _ in range(regions)]  # fmt: skip
    deadline_utc_h = rng.uniform(0, 24) if daily else None
    prices = Prices(spot_per_hour=1.0, on_demand_per_hour=rng.choice([2.0, 3.0]),
                    move_usd=rng.choice([0.0, 0.2, 1.0]))  # fmt: skip
    if seed % 2:  # each region at prices of its own
        own = tuple((rng.choice([0.6, 1.0, 1.4]), rng.choice([2.0, 3.0])) for _ in rates)
        prices = replace(prices, regional=own)
    tick_h, ticks, work, changeover = 0.5, rng.choice([5, 6, 7]), rng.choice([2, 3]), rng.choice(
        [0, 1])  # fmt: skip
    if daily:  # a changeover to pay again after a spell ends: when it ends matters
        changeover = 1
    plan = Plan(rates, prices, tick_h=tick_h, ticks=ticks, work=work, changeover=changeover,
                deadline_utc_h=deadline_utc_h)  # fmt: skip
    expected = expectimax(rates, prices, tick_h=tick_h, ticks=ticks, work=work,
                          changeover=changeover, deadline_utc_h=deadline_utc_h)  # fmt: skip
    if daily:  # the hours count: a deadline a tick later costs another amount
        later = expectimax(rates, prices, tick_h=tick_h, ticks=ticks, work=work,
                           changeover=changeover,
                           deadline_utc_h=deadline_utc_h + tick_h)  # fmt: skip
        assert any(later[s] != pytest.approx(v, rel=1e-6) for s, v in expected.items())
    assert len(expected) == 1 << regions
    for spot, value in expected.items():
        assert plan.idle_value[work, spot] == pytest.approx(value, rel=1e-9), (seed, spot)


def every_action_chosen(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The programme as its definition reads: each tick, the expected cost of every action in
    every state (idle there, go on, on-demand here, spot in each region), the least taken,
    ties to the action listed first; the plan's (action, first region, idle value) so."""
    regions, states, c_full = plan.regions, 1 << plan.regions, plan.changeover
    modes, work = 3 * regions, plan.work
    spot_of = np.array([[(b >> r) & 1 for r in range(regions)] for b in range(states)], dtype=bool)
    price = np.zeros(modes)
    for r in range(regions):
        spot, on_demand = plan.prices.in_region(r)
        price[regions + r], price[2 * regions + r] = on_demand * plan.tick_h, spot * plan.tick_h
    region_of = np.arange(modes) % regions
    value = np.zeros((work + 1, states, modes, c_full + 1))
    value[1:] = MISSED_USD
    action = np.zeros((plan.ticks + 1, work + 1, states, modes, c_full + 1), dtype=np.int8)
    first = np.zeros((plan.ticks + 1, work + 1, states), dtype=np.int8)
    idle_value = value[:, :, np.arange(regions), 0].min(axis=2)
    for left in range(1, plan.ticks + 1):
        expected = np.einsum("ab,wbmk->wamk", plan.transition(left, spot_of), value)
        running = np.empty_like(expected)  # a tick of mode m with c changeover ticks to pay
        running[:, :, :, 1:] = expected[:, :, :, :-1]
        running[1:, :, :, 0] = expected[:-1, :, :, 0]
        running[0] = 0.0
        running += price[None, None, :, None]
        q = np.full((SPOT_IN + regions, *expected.shape), np.inf)
        for s, m in itertools.product(range(states), range(modes)):
            here = region_of[m]
            q[IDLE_THERE, :, s, m] = expected[:, s, here, 0][:, None]
            if m >= regions and (m < 2 * regions or spot_of[s, here]):
                q[GO_ON, :, s, m] = running[:, s, m]
            q[ON_DEMAND_HERE, :, s, m] = running[:, s, regions + here, c_full][:, None]
            for r in np.flatnonzero(spot_of[s]):
                moved = plan.prices.move_usd if r != here else 0.0
                q[SPOT_IN + r, :, s, m] = (running[:, s, 2 * regions + r, c_full] + moved)[:, None]
        q[:, 0] = 0.0  # done
        action[left] = q.argmin(axis=0)
        value = q.min(axis=0)
        idle = value[:, :, np.arange(regions), 0]
        first[left], idle_value = idle.argmin(axis=2), idle.min(axis=2)
    return action, first, idle_value


@pytest.mark.parametrize("seed", range(8))
def test_the_plan_takes_in_every_state_the_least_action_listed_first(seed: int) -> None:
    """The solve chooses the best start once per region and sets it against going on: the
    same actions, bit for bit, as every action's cost taken in every state, ties included
    (moves at $0 and regions at one price make many)."""
    rng = random.Random(seed)
    regions = rng.choice([1, 2, 3])
    rates = [RegionRates(rng.choice([0.5, 1.0, 3.0]), rng.choice([0.5, 1.0]),
                         spell_swing=rng.choice([0.0, 0.5]), spell_peak_utc_h=rng.uniform(0, 24))
             for _ in range(regions)]  # fmt: skip
    prices = Prices(spot_per_hour=1.0, on_demand_per_hour=rng.choice([2.0, 3.0]),
                    move_usd=rng.choice([0.0, 0.5]))  # fmt: skip
    if seed % 2:
        prices = replace(prices, regional=tuple((rng.choice([0.6, 1.0]), 3.0) for _ in rates))
    plan = Plan(rates, prices, tick_h=0.5, ticks=rng.choice([8, 12]), work=rng.choice([3, 6]),
                changeover=rng.choice([0, 1, 2]), deadline_utc_h=rng.uniform(0, 24))  # fmt: skip
    action, first, idle_value = every_action_chosen(plan)
    assert np.array_equal(plan.action, action)
    assert np.array_equal(plan.first_region, first)
    assert np.array_equal(plan.idle_value, idle_value)


def test_the_days_swing_of_spells_ending_is_read_from_a_history_that_says_when_it_starts() -> None:
    """Three months of a region whose spells end 60% more often at 15:00 of its day (UTC-5:
    20:00 UTC) than on average: the swing and its peak hour are read back; the same history
    without its start, or under a week of checks, reads as alike at every hour (its means the
    same)."""
    region = trace_models.RegionModel("us-east-1", mean_available_h=4.0, outage_median_h=1.0,
                                      outage_spread=0.8, diurnal=0.6, utc_offset_h=-5)  # fmt: skip
    history = trace_models.sample(trace_models.Market("one", (region,)), hours=90 * 24,
                                  gap_s=600, seed=4)[0]  # fmt: skip
    (rates,) = markov_policy.known_rates([history], 1)
    assert rates.spell_swing == pytest.approx(0.6, abs=0.12)
    assert abs((rates.spell_peak_utc_h - 20 + 12) % 24 - 12) < 1.5
    (startless,) = markov_policy.known_rates([replace(history, start_s=None)], 1)
    assert (startless.spell_swing, startless.spell_peak_utc_h) == (0.0, 0.0)
    assert (startless.mean_spell_h, startless.mean_outage_h) == (rates.mean_spell_h,
                                                                 rates.mean_outage_h)  # fmt: skip
    week = round(markov_policy.DAILY_EVIDENCE_DAYS * 24 * 6)  # ticks of 10 minutes
    for ticks, read in ((week, True), (week - 1, False)):
        short = replace(history, available=history.available[:ticks])
        (rates,) = markov_policy.known_rates([short], 1)
        assert (rates.spell_swing > 0) is read, ticks


def test_the_handlers_record_of_a_week_of_checks_gives_the_same_daily_swing() -> None:
    """The record the handler's checks keep of a region (a check every tick of a month, at the
    tick's Unix time) counts spot and spells' endings by the hour: `seen_by` reads the swing
    and peak the whole trace's record gives (`known_rates`), from a record kept in two halves
    and added together (two runs) and from one stored and read back; with under a week of
    checks, or a record kept before the hours were counted, the hours are alike."""
    from spotrain.core.outage_fill import SpotRecord

    region = trace_models.RegionModel("us-east-1", mean_available_h=4.0, outage_median_h=1.0,
                                      outage_spread=0.8, diurnal=0.6, utc_offset_h=-5)  # fmt: skip
    trace = trace_models.sample(trace_models.Market("one", (region,)), hours=30 * 24,
                                gap_s=300, seed=5)[0]  # fmt: skip
    assert trace.start_s is not None
    halves = []
    for part in (range(len(trace.available) // 2),
                 range(len(trace.available) // 2, len(trace.available))):  # fmt: skip
        record = SpotRecord()
        for tick in part:
            record = record.seen(trace.start_s + tick * 300, trace.available[tick] >= 1,
                                 longest_gap_s=600)  # fmt: skip
        halves.append(record)
    together = halves[0].and_seen(halves[1])
    assert sum(together.ends_by_hour) == together.spells - 2  # each half's last spell goes on
    read = RegionRates.seen_by(together)
    (whole,) = markov_policy.known_rates([trace], 1)
    swing, peak = whole.spell_swing, whole.spell_peak_utc_h
    assert read.spell_swing == pytest.approx(swing, abs=0.02) and swing > 0.3
    assert read.spell_peak_utc_h == pytest.approx(peak, abs=0.3)
    stored = SpotRecord.from_item(json.loads(json.dumps(together.to_item())))
    assert RegionRates.seen_by(stored) == read
    assert RegionRates.seen_by(halves[0]).spell_swing > 0  # fifteen days: over a week
    week_less = replace(together, observed_s=markov_policy.DAILY_EVIDENCE_DAYS * 86400 - 1)
    assert RegionRates.seen_by(week_less) == RegionRates.of(week_less)
    before = {k: v for k, v in together.to_item().items() if not k.endswith("_by_hour")}
    assert RegionRates.seen_by(SpotRecord.from_item(before)) == RegionRates.of(together)


def test_a_plan_blind_to_the_hour_serves_a_deadline_at_any_hour() -> None:
    """Two runs alike but for their deadline's hour share one solve when no region's spells end
    by the hour; where one does, each run's plan is lined up with its own deadline."""
    progress = Progress(elapsed_h=0.0, deadline_h=6.0, work_h=4.0, done_h=0.0,
                        changeover_h=0.2, decision_interval_h=0.5)  # fmt: skip
    for swing, solves in ((0.0, 0), (0.8, 1)):
        known = [RegionRates(3.0, 1.0, spell_swing=swing, spell_peak_utc_h=15.0)]
        policies = [markov_policy.MarkovPolicy(1, Prices(1.0, 3.0, 0.0), known=known,
                                               deadline_utc_h=hour)
                    for hour in (2.0, 9.0)]  # fmt: skip
        for policy in policies:
            policy.decide(progress, region=None, current=IDLE, spot_available=[True])
        assert policies[1].solves == solves, swing
        assert (policies[0].plan is policies[1].plan) == (solves == 0)


def _progress(**changes: float) -> Progress:
    fields = {"elapsed_h": 0.0, "deadline_h": 20.0, "work_h": 10.0, "done_h": 0.0,
              "changeover_h": 0.2, "decision_interval_h": 0.1, **changes}  # fmt: skip
    return Progress(**fields)  # type: ignore[arg-type]


def test_each_decision_says_why_and_a_dear_move_is_not_taken() -> None:
    known = [RegionRates(1.0, 6.0), RegionRates(12.0, 0.5)]  # home scarce, the other plentiful
    cheap = markov_policy.MarkovPolicy(2, Prices(1.0, 3.0, move_usd=0.0), known=known,
                                       names=("eu-west-1", "us-east-2"))  # fmt: skip
    moved = cheap.decide(_progress(), region=0, current=ON_DEMAND, spot_available=[False, True])
    assert (moved.region, moved.mode) == (1, SPOT), moved.reason
    assert "move to spot in us-east-2" in moved.reason, moved.reason
    assert "eu-west-1 lacks spot (spells of 1.0 h, outages of 6.0 h)" in moved.reason
    dear = markov_policy.MarkovPolicy(2, Prices(1.0, 3.0, move_usd=1_000.0), known=known)
    stays = dear.decide(_progress(), region=0, current=ON_DEMAND, spot_available=[False, True])
    assert stays.region == 0 and stays.mode in (ON_DEMAND, IDLE), stays.reason
    # Spot in both, the run idle: a start pays a changeover wherever it is, and a free move
    # buys spells twelve times as long; a dear one does not.
    start = cheap.decide(_progress(), region=0, current=IDLE, spot_available=[True, True])
    assert (start.region, start.mode) == (1, SPOT), start.reason
    here = dear.decide(_progress(), region=0, current=IDLE, spot_available=[True, True])
    assert (here.region, here.mode) == (0, SPOT), here.reason


def test_between_regions_alike_but_for_their_prices_it_trains_where_spot_is_cheaper() -> None:
    """Each region at its own prices (`run deadline-plan` takes them from the price book): of
    two regions whose spot comes and goes alike, both with spot now, a run starts where it
    costs less, home or not; at one price it stays home."""
    known = [RegionRates(4.0, 1.0), RegionRates(4.0, 1.0)]
    for regional, where in ((((1.0, 3.0), (0.6, 3.0)), 1), (((0.6, 3.0), (1.0, 3.0)), 0),
                            ((), 0)):  # fmt: skip
        policy = markov_policy.MarkovPolicy(2, Prices(1.0, 3.0, 0.0, regional=regional),
                                            known=known)  # fmt: skip
        start = policy.decide(_progress(), region=None, current=IDLE, spot_available=[True, True])
        assert (start.region, start.mode) == (where, SPOT), (regional, start.reason)
        assert policy.header is not None and policy.header.regional_prices == regional


def test_a_plan_stored_before_regions_had_prices_of_their_own_reads_back_at_homes() -> None:
    """A header as the events table holds it: one written before `regional_prices` reads back
    with none (each region at home's prices, as it was solved), one written now with its own."""
    from spotrain.core import deadline_plan

    plan = Plan([RegionRates(4.0, 1.0)] * 2, Prices(1.0, 3.0, 0.0, regional=((1.0, 3.0),
                (0.7, 2.5))), tick_h=0.5, ticks=4, work=2, changeover=1)  # fmt: skip
    header = plan.header(("us-east-1", "us-west-2"))
    assert deadline_plan.Header.from_json(header.to_json()) == header
    older = json.loads(header.to_json())
    del older["regional_prices"]
    assert deadline_plan.Header.from_json(json.dumps(older)).regional_prices == ()


def test_out_of_slack_it_takes_on_demand_to_the_end() -> None:
    policy = markov_policy.MarkovPolicy(1, Prices(1.0, 3.0, 0.0), known=[RegionRates(4.0, 1.0)])
    decision = policy.decide(_progress(done_h=0.0, deadline_h=10.15), region=0, current=IDLE,
                             spot_available=[False])  # fmt: skip
    assert decision.mode == ON_DEMAND, decision.reason


def test_it_learns_the_means_from_its_checks_and_solves_again_when_they_move() -> None:
    policy = markov_policy.MarkovPolicy(1, Prices(1.0, 3.0, 0.0))
    for tick in range(200):  # 20 h of checks that always find spot: the prior's 4 h spell goes
        policy.decide(_progress(elapsed_h=tick * 0.1, deadline_h=60.0, work_h=48.0,
                                done_h=tick * 0.1), region=0, current=SPOT,
                      spot_available=[True])  # fmt: skip
    assert policy.solves >= 2
    assert policy.plan is not None and policy.plan.rates[0].mean_spell_h > 4.0 * 1.5
    assert markov_policy.RegionRates.of(SpotRecord()).mean_spell_h == pytest.approx(4.0)


def test_it_meets_every_deadline_and_costs_no_less_than_the_optimum() -> None:
    sampled = trace_models.sample(trace_models.SCARCE, hours=40, gap_s=600, seed=11)
    history = trace_models.sample(trace_models.SCARCE, hours=24 * 10, gap_s=600, seed=12)
    job = simulation.Job(work_h=12, deadline_h=16, changeover_h=0.2, on_demand_price=3.0,
                         spot_price=1.0)  # fmt: skip
    for move_usd in (0.0, 3.0):
        results = across_regions.replay_across(
            job, sampled, move_usd=move_usd, starts=4, history=history,
            strategies=(across_regions.MARKOV, across_regions.HOME_ONLY))  # fmt: skip
        ours, home = results[across_regions.MARKOV], results[across_regions.HOME_ONLY]
        for outcome in ours:
            assert outcome.deadline_met
            assert outcome.cost >= outcome.optimum_cost * (1 - 1e-12)  # type: ignore[operator]
        assert sum(o.cost for o in ours) < sum(o.cost for o in home)


def test_in_one_region_it_meets_every_deadline_and_needs_one() -> None:
    sampled = trace_models.sample(trace_models.US, hours=40, gap_s=600, seed=3)
    history = trace_models.sample(trace_models.US, hours=24 * 10, gap_s=600, seed=4)
    job = simulation.Job(work_h=12, deadline_h=15, changeover_h=0.2, on_demand_price=3.0,
                         spot_price=1.0)  # fmt: skip
    compared = (simulation.MARKOV, simulation.ON_DEMAND_ONLY)
    found = simulation.replay(job, sampled, starts=3, optimum=True, history=history,
                              strategies=compared)  # fmt: skip
    for ours, on_demand in zip(found[simulation.MARKOV], found[simulation.ON_DEMAND_ONLY],
                               strict=True):  # fmt: skip
        assert ours.deadline_met and ours.cost < on_demand.cost
        assert ours.cost >= ours.optimum_cost * (1 - 1e-12)  # type: ignore[operator]
    with pytest.raises(CostInputError, match="plans to a deadline: give one"):
        simulation.simulate(replace(job, deadline_h=None), sampled[0], simulation.MARKOV)


@pytest.mark.parametrize("deadline_h", [6.5, 8.0, 12.0])
@pytest.mark.parametrize("knows", [False, True], ids=["learning", "known"])
def test_every_deadline_is_met_on_traces_built_to_break_it(deadline_h: float, knows: bool) -> None:
    # outage fill's adversarial traces (test_outage_fill.py): 6 h of work, 15-minute
    # changeovers, 10-minute ticks: a burst of one tick never trains. Two things keep these
    # deadlines, each alone (checked by taking the other out): the programme's price of a miss
    # and the 1d guard.
    job = simulation.Job(work_h=6, deadline_h=deadline_h, changeover_h=0.25,
                         on_demand_price=3.0, spot_price=1.0)  # fmt: skip
    ticks = int(deadline_h * 6) + 6
    history = trace_models.sample(trace_models.US, hours=24 * 10, gap_s=600, seed=5)[:1]
    known = markov_policy.known_rates(history, 1)[0] if knows else None
    for name, values in adversarial_availability(ticks):
        outcome = simulation.simulate(job, traces.Trace(name, 600, values), simulation.MARKOV,
                                      known=known)  # fmt: skip
        assert outcome.deadline_met, (name, outcome)


def test_cost_simulate_replays_markov_with_a_deadline_and_recommends_it_only_on_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the environment's history Markov is what a planned run gets, and the replay may
    recommend it, saying how to plan; learning from scratch, as the handler never decides, it
    is shown only."""
    trace, past = tmp_path / "trace.json", tmp_path / "past.json"
    trace.write_text(json.dumps(trace_models.sample(trace_models.SCARCE, hours=30, gap_s=600,
                                                    seed=14)[0].to_json()))  # fmt: skip
    past.write_text(json.dumps(trace_models.sample(trace_models.SCARCE, hours=24 * 7, gap_s=600,
                                                   seed=15)[0].to_json()))  # fmt: skip
    flags = ["cost", "simulate", "--trace", str(trace), "--work-hours", "8", "--deadline-hours",
             "11", "--changeover-minutes", "12", "--on-demand-price", "3", "--spot-price", "1",
             "--starts", "3", "--json", "--history", str(past)]  # fmt: skip
    assert cli.main(flags) == 0
    found = json.loads(capsys.readouterr().out)
    markov = found["strategies"][simulation.MARKOV]
    assert markov["summary"]["deadline_met"] == 1.0
    assert all(run["vs_optimum"] >= 1 - 1e-12 for run in markov["runs"])
    cheapest_safe = min((s["summary"] for s in found["strategies"].values()
                         if s["summary"]["deadline_met"] >= planner.DEADLINE_CONFIDENCE),
                        key=lambda summary: summary["mean_cost"])  # fmt: skip
    assert found["recommended"]["strategy"] == cheapest_safe["strategy"] == simulation.MARKOV
    assert "spotrain run deadline-plan ENV RUN --spot-history" in found["recommended"]["why"]
    learning = [f for f in flags if f not in ("--history", str(past))]
    assert cli.main(learning) == 0
    learnt = json.loads(capsys.readouterr().out)
    assert simulation.MARKOV in learnt["strategies"]
    assert learnt["recommended"]["strategy"] in simulation.STRATEGIES
    # Without a deadline there is nothing for it to plan to: not replayed.
    no_deadline = [f for f in flags if f not in ("--deadline-hours", "11", "--history", str(past))]
    assert cli.main(no_deadline) == 0
    assert simulation.MARKOV not in json.loads(capsys.readouterr().out)["strategies"]
    assert cli.main([*flags, "--history", str(past)]) == 2
    assert "--history is given 2 times: give one trace" in capsys.readouterr().err
    # Nothing to plan with it without a deadline: said, with both fixes, not ignored.
    without = [f for f in flags if f not in ("--deadline-hours", "11")]
    assert cli.main([*without, "--history", str(past)]) == 2
    error = capsys.readouterr().err
    assert "given 2 times" in error and "give --deadline-hours, or leave out --history" in error


def test_markov_is_recommended_only_where_it_was_replayed_on_history() -> None:
    def summary(strategy: str, cost: float) -> simulation.Summary:
        return simulation.Summary(strategy=strategy, runs=10, mean_cost=cost, mean_finish_h=10.0,
                                  deadline_met=1.0, mean_goodput=1.0, mean_spot_hours=5.0,
                                  mean_on_demand_hours=5.0, mean_preemptions=0.0)  # fmt: skip

    cheapest = [summary(simulation.MARKOV, 1.0), summary(simulation.OUTAGE_FILL, 2.0)]
    assert planner.recommend(cheapest, has_deadline=True)[0] == simulation.OUTAGE_FILL
    strategy, why = planner.recommend(cheapest, has_deadline=True, plannable=True)
    assert strategy == simulation.MARKOV
    assert why.endswith("the handler runs it once the run is planned with that history: "
                        "`spotrain run deadline-plan ENV RUN --spot-history FILE...`")  # fmt: skip
    # Dearer than another that meets the deadline, or missing it more often: not recommended.
    dear = [summary(simulation.MARKOV, 3.0), summary(simulation.OUTAGE_FILL, 2.0)]
    assert planner.recommend(dear, has_deadline=True, plannable=True)[0] == simulation.OUTAGE_FILL


def _events_table() -> Any:
    """An events table (its keys as the stack makes them), in moto."""
    import boto3

    return boto3.resource("dynamodb").create_table(
        TableName="events", BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                   {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                              {"AttributeName": "sk", "AttributeType": "S"}],
    )  # fmt: skip


def test_a_stored_plan_decides_as_the_solved_one_and_a_new_plan_replaces_it_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plan `spotrain run deadline-plan` stores in the events table (a header and parts
    of compressed slices), read back part by part as the handler reads it, decides as the
    solved plan in every state asked; a plan stored again under a new id leaves none of the
    old one's parts."""
    from moto import mock_aws

    from spotrain.core import deadline_plan
    from spotrain.core.catalog_schema import DEADLINE_PLAN_HEADER_SORT_KEY

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr(deadline_plan, "PART_BYTES", 1024)  # several parts
    rates = [RegionRates(3.0, 1.5), RegionRates(5.0, 2.5)]
    plan = Plan(rates, Prices(1.0, 3.0, 0.5), tick_h=0.25, ticks=60, work=40, changeover=1)
    header = replace(plan.header(("us-east-1", "us-west-2")), plan_id="1")
    rng = random.Random(3)
    with mock_aws():
        table = _events_table()
        stored = deadline_plan.store(table, "demo", header, plan.slices())
        assert len(stored.parts) > 2
        read = deadline_plan.read_header(table, "demo")
        assert read == stored
        for _ in range(300):
            progress = Progress(
                elapsed_h=rng.uniform(0, 14), deadline_h=15.0, work_h=10.0,
                done_h=rng.uniform(0, 10), changeover_h=0.25, decision_interval_h=0.25,
                changeover_left_h=rng.choice([0.0, 0.25]),
            )  # fmt: skip
            ask = {"region": rng.choice([None, 0, 1]),
                   "current": rng.choice([IDLE, ON_DEMAND, SPOT]),
                   "spot_available": [rng.random() < 0.5, rng.random() < 0.5]}  # fmt: skip
            part = deadline_plan.read_part(table, "demo", read,
                                           deadline_plan.part_holding(read, progress))  # fmt: skip
            assert part is not None
            assert deadline_plan.decide(read, part, progress, **ask) == deadline_plan.decide(
                header, plan, progress, **ask)  # fmt: skip
        other = Plan(rates[::-1], Prices(1.0, 3.0, 0.5), tick_h=0.5, ticks=30, work=20,
                     changeover=1)  # fmt: skip
        again = deadline_plan.store(table, "demo", replace(other.header(), plan_id="2"),
                                    other.slices())  # fmt: skip
        # Under a key of its own, not the run's: the run's machines cannot reach it.
        keys = sorted((i["pk"], i["sk"]) for i in table.scan()["Items"])
        parts = [f"PART#2#{first:07d}" for first in again.parts]
        assert keys == sorted(("DEADLINE_PLAN#demo", sk)
                              for sk in [DEADLINE_PLAN_HEADER_SORT_KEY, *parts])  # fmt: skip
        assert deadline_plan.read_header(table, "demo") == again
        assert deadline_plan.read_part(table, "demo", read, read.parts[-1]) is None  # old: gone


def test_of_two_plans_stored_at_once_one_is_the_runs_whole_and_a_stopped_stores_parts_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Never two writers of a run's plan: a store whose header would replace a plan that is no
    longer the run's (another was stored while it wrote its parts) writes no header, removes
    its parts and says so; the other plan stays whole. Parts a stopped store left behind go
    with the next store once they are an hour old."""
    from moto import mock_aws

    from spotrain.core import deadline_plan
    from spotrain.core.catalog_schema import deadline_plan_key

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr(deadline_plan, "PART_BYTES", 1024)  # several parts
    plan = Plan([RegionRates(3.0, 1.5)], Prices(1.0, 3.0, 0.0), tick_h=0.25, ticks=40, work=30,
                changeover=1)  # fmt: skip

    def as_id(plan_id: str) -> deadline_plan.Header:
        return replace(plan.header(("us-east-1",)), plan_id=plan_id)

    class Interleaved:
        """The table, with plan "4" stored whole just before plan "3"'s header is written."""

        def __init__(self, table: Any) -> None:
            self.table = table

        def put_item(self, **request: Any) -> Any:
            if request["Item"].get("plan_id") == "3":
                deadline_plan.store(table, "demo", as_id("4"), plan.slices(), now=1000.0)
            return self.table.put_item(**request)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.table, name)

    def stored() -> list[str]:
        return sorted(i["sk"] for i in table.scan()["Items"]
                      if i["pk"] == deadline_plan_key("demo"))  # fmt: skip

    with mock_aws():
        table = _events_table()
        deadline_plan.store(table, "demo", as_id("1"), plan.slices(), now=1000.0)
        with pytest.raises(deadline_plan.PlanReplaced, match=r"while this one was \(plan 4\)"):
            deadline_plan.store(Interleaved(table), "demo", as_id("3"), plan.slices(), now=1000.0)
        header = deadline_plan.read_header(table, "demo")
        assert header is not None and header.plan_id == "4"
        assert stored() == sorted(["HEADER", *(f"PART#4#{f:07d}" for f in header.parts)])
        # A store stopped after its parts: they go with a later store, once an hour old.
        for written_at, plan_id in ((1000.0, "old"), (4500.0, "new")):
            table.put_item(
                Item={
                    "pk": deadline_plan_key("demo"),
                    "sk": f"PART#{plan_id}#0000000",
                    "written_at": int(written_at),
                }
            )
        again = deadline_plan.store(table, "demo", as_id("5"), plan.slices(), now=5000.0)
        assert stored() == sorted(["HEADER", "PART#new#0000000",
                                   *(f"PART#5#{f:07d}" for f in again.parts)])  # fmt: skip


def test_run_deadline_plan_solves_from_the_history_given_and_stores_what_the_handler_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`spotrain run deadline-plan`'s solve: one history trace per region of the environment
    gives each region's means, the gang's prices come from the price book, the tick is the
    handler's check (coarser for a far deadline), and the plan stored is the one the handler
    reads; or from the records earlier runs' checks kept of each region, together (a day of
    them at least). A run without a deadline and a wrong count of traces are refused together, with
    their fixes, before anything is stored."""
    import types

    from moto import mock_aws

    from spotrain.cli import run_plan
    from spotrain.core import deadline_plan, fleet_state, prices
    from spotrain.core.deadline_policy import RunDeadline
    from spotrain.core.errors import SpotrainError
    from spotrain.core.outage_fill import RegionRecords
    from spotrain.stacks.runs import read_run, run_file

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    prod = read_run(run_file("prod", "gpt-large"), "prod")
    run = replace(prod, deadline=RunDeadline(started_at="2027-01-04T09:00:00Z",
                                             finish_by="2027-01-05T01:00:00Z",
                                             total_steps=1000, changeover_minutes=15))  # fmt: skip
    regions = ("us-east-1", "us-west-2")
    history = []
    for r, model in enumerate((trace_models.SCARCE, trace_models.US)):
        path = tmp_path / f"{regions[r]}.json"
        path.write_text(json.dumps(trace_models.sample(model, hours=24 * 7, gap_s=600,
                                                       seed=20 + r)[0].to_json()))  # fmt: skip
        history.append(str(path))
    with mock_aws():
        table = _events_table()
        where = types.SimpleNamespace(events=table, regions=regions, region=regions[0])
        said = run_plan.solve_and_store(where, run, run_plan.means(where, run, history, []))
        assert "192 ticks of 5 minutes" in said and "us-west-2: spells of" in said, said
        header = deadline_plan.read_header(table, run.name)
        assert header is not None and header.regions == regions and header.tick_h == 5 / 60
        expected = markov_policy.known_rates([traces.load(p) for p in history], run.desired_size)
        assert header.means == tuple((r.mean_spell_h, r.mean_outage_h) for r in expected)
        # The traces say when they start: each region's spells end by the hour, as the plan
        # and its reasons say.
        assert header.daily == tuple((r.spell_swing, r.spell_peak_utc_h) for r in expected)
        assert all(swing > 0 for swing, _ in header.daily) and "more often near" in said
        pool = prices.load().pool(run.instance_types[0], regions[0])
        assert header.spot_per_hour == pytest.approx(pool.spot_price * run.desired_size)
        assert header.on_demand_per_hour == pytest.approx(
            (pool.on_demand.usd_per_hour or 0) * run.desired_size)  # fmt: skip
        # Each region at its own prices (spot differs between these two by a few percent).
        book = [prices.load().pool(run.instance_types[0], r) for r in regions]
        stored = [price for region in header.regional_prices for price in region]
        listed = [price for p in book for price in (p.spot_price, p.on_demand.usd_per_hour)]
        assert stored == pytest.approx([price * run.desired_size for price in listed])
        assert book[0].spot_price != book[1].spot_price
        progress = Progress(elapsed_h=1.0, deadline_h=16.0, work_h=10.0, done_h=0.5,
                            changeover_h=0.25, decision_interval_h=5 / 60)  # fmt: skip
        part = deadline_plan.read_part(table, run.name, header,
                                       deadline_plan.part_holding(header, progress))  # fmt: skip
        assert part is not None
        decided = deadline_plan.decide(header, part, progress, region=0, current=ON_DEMAND,
                                       spot_available=[False, True])  # fmt: skip
        assert decided.reason.startswith("plan: 9.5 h of work in 15.0 h; us-east-1 lacks")
        assert ":00 UTC, outages of" in decided.reason
        listed = r"(?s)no deadline.*one trace per region"  # one problem a line
        with pytest.raises(SpotrainError, match=listed) as refused:
            run_plan.means(where, replace(run, deadline=None), [str(tmp_path / "gone.json")], [])
        # Every problem at once: the file that cannot be read too.
        assert "--spot-history is given 1 time(s)" in str(refused.value)
        assert "gone.json cannot be read" in str(refused.value)
        with pytest.raises(SpotrainError, match=r"--spot-history FILE\.\.\. .* or --spot-seen-by"):
            run_plan.means(where, run, history, ["earlier"])

        # Or the means the checks of earlier runs kept of each region (their fleet state),
        # together.
        day = 24 * 3600.0
        kept = RegionRecords((SpotRecord(observed_s=2 * day, available_s=day, spells=6),
                              SpotRecord(observed_s=2 * day, available_s=1.5 * day,
                                         spells=3)))  # fmt: skip
        fleet_state.set_spot_records(table, "earlier", kept.to_item())
        given = run_plan.means(where, run, [], ["earlier"])
        assert given.rates == tuple(RegionRates.of(r) for r in kept.regions)
        fleet_state.set_spot_records(table, "brief", RegionRecords(
            (SpotRecord(observed_s=day, available_s=day, spells=1),
             SpotRecord(observed_s=3600.0))).to_item())  # fmt: skip
        both = run_plan.means(where, run, [], ["earlier", "brief"])
        east = SpotRecord(observed_s=3 * day, available_s=2 * day, spells=7)
        assert both.rates[0] == RegionRates.of(east)  # their evidence added
        assert "as the checks of earlier, brief saw them over 49 h" in run_plan.solve_and_store(
            where, run, both)  # fmt: skip
        again = deadline_plan.read_header(table, run.name)
        assert again is not None and again.plan_id != header.plan_id  # a new plan, a new id
        assert again.means == tuple((r.mean_spell_h, r.mean_outage_h) for r in both.rates)
        with pytest.raises(SpotrainError, match="the checks of brief, never kept less than 24 h "
                           "of spot in us-west-2: name runs"):  # fmt: skip
            run_plan.means(where, run, [], ["brief", "never"])
        # A book without a usable price is refused, not planned as a free market.
        unpriced = types.SimpleNamespace(
            spot_price=pool.spot_price, on_demand=types.SimpleNamespace(usd_per_hour=None)
        )
        monkeypatch.setattr(prices.PriceBook, "pool", lambda *_, **__: unpriced)
        with pytest.raises(
            SpotrainError,
            match=r"no usable price of p5en\.48xlarge in "
            r"us-east-1 .*on-demand \$0 an hour\): run `spotrain prices refresh",
        ) as refused:
            run_plan.solve_and_store(where, run, both)  # fmt: skip
        assert "the deadline plan has 2 problem(s)" in str(refused.value)  # every region's
        assert "refresh --instance-type p5en.48xlarge --region us-west-2" in str(refused.value)
    assert cli.main(["run", "list", "local", "--spot-seen-by", "earlier"]) == 2
    assert "--spot-history and --spot-seen-by go with `spotrain run deadline-plan`" in (
        capsys.readouterr().err)  # fmt: skip
    # Three weeks in two regions: a coarser tick keeps the plan to its size.
    assert run_plan.plan_tick_minutes(5, 504, 2, 20) == 20
