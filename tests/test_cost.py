"""Cost before a run: the deadline policy's rules, the simulator on scripted traces, the
planner's published worked examples, the price book, and the commands' output and errors."""

from __future__ import annotations

import datetime
import json
import math
from pathlib import Path
from typing import Any

import pytest

from spotrain import cli
from spotrain.core import deadline_policy, prices
from spotrain.core.deadline_policy import IDLE, ON_DEMAND, SPOT, Progress
from spotrain.cost import planner, report, simulation, traces

FIXTURES = Path(__file__).parent / "fixtures"
PRICE_BOOK = FIXTURES / "price_book.json"
EXAMPLE_BOOK = Path(__file__).resolve().parents[1] / "examples" / "price-book.json"


# --- published worked examples -----------------------------------------------------------------
@pytest.mark.parametrize(("mtbf_min", "expected_min"), [(24 * 60, 117), (6 * 60, 57), (15, 9.1)])
def test_daly_optimum_intervals_match_the_published_ones(
    mtbf_min: float, expected_min: float
) -> None:
    # Daly (2006): delta = 5 min; MTBF 24 h -> ~117 min, 6 h -> ~57 min, 15 min -> ~9.1 min.
    assert planner.daly_interval(5, mtbf_min) == pytest.approx(
        expected_min, abs=0.5 if expected_min > 10 else 0.05
    )


def test_spot_against_on_demand_worked_example() -> None:
    # $20/h on-demand vs $6/h spot, 24 h of work, 2 h lost and re-run on on-demand.
    bill = planner.spot_savings(work_h=24, lost_h=2, on_demand_price=20, spot_price=6)
    assert (bill.on_demand_cost, bill.spot_cost) == (480, 184)
    assert round(bill.saved * 100) == 62


# --- the policy ----------------------------------------------------------------------------------
def at(
    t: float, done: float, *, work: float = 10, deadline: float = 20, d: float = 0.5,
    left: float = 0.0, interval: float = 0.0,
) -> Progress:  # fmt: skip
    return Progress(elapsed_h=t, deadline_h=deadline, work_h=work, done_h=done, changeover_h=d,
                    changeover_left_h=left, decision_interval_h=interval)  # fmt: skip


@pytest.mark.parametrize(
    ("progress", "current", "spot", "expected"),
    [
        (at(2, 0.5), IDLE, True, SPOT),  # idle takes spot
        (at(2, 0.5), SPOT, True, SPOT),  # spot stays
        (at(2, 1.5), ON_DEMAND, True, ON_DEMAND),  # ahead of ep(t) but not of ep(t + 2d) = 1.5
        (at(2, 1.6), ON_DEMAND, True, SPOT),  # ahead by the hysteresis margin: back to spot
        (at(2, 0.5), ON_DEMAND, False, ON_DEMAND),  # never from on-demand to idle
        (at(2, 0.9), IDLE, False, ON_DEMAND),  # behind ep(2) = 1: on-demand
        (at(2, 1.0), IDLE, False, IDLE),  # on schedule: wait
        (at(2, 1.0), SPOT, False, IDLE),  # preempted, on schedule: wait
        (at(18, 9.5), SPOT, True, SPOT),  # 2 h left >= 0.5 h work + 1 h: spot still
        (at(18.6, 9.5), IDLE, True, ON_DEMAND),  # 1.4 h left < 0.5 + 2 x 0.5: on-demand
        (at(18.6, 9.5), ON_DEMAND, True, ON_DEMAND),  # ... and it stays there
        (at(18.6, 9.5), SPOT, True, SPOT),  # training spot is not thrown off by the 2d net
        (at(19.1, 9.5), SPOT, True, SPOT),  # 0.9 h < 0.5 + 0.5: training spot stays (1d guard)
        (at(19.1, 9.5, left=0.2), SPOT, True, ON_DEMAND),  # spot still restarting: on-demand
        (at(19.1, 9.5), SPOT, False, ON_DEMAND),  # taken: the net
        (at(18.6, 9.5, d=0), IDLE, True, SPOT),  # a move costs nothing: spot to the end
    ],
)
def test_uniform_progress_follows_its_rules(
    progress: Progress, current: str, spot: bool, expected: str
) -> None:
    choice = deadline_policy.uniform_progress(progress, current=current, spot_available=spot)
    assert choice.mode == expected, choice.reason


@pytest.mark.parametrize(("elapsed", "done"), [(16.5, 15.6), (10.0, 9.6)])
def test_a_run_exactly_ahead_by_the_margin_is_decided_as_the_rule_states(
    elapsed: float, done: float
) -> None:
    # 48 h of work in 52 h, d = 0.2 h: ep(t + 2d) = (t + 0.4) * 12/13 equals the progress
    # exactly; the rule leaves on-demand only when strictly ahead, at every such point.
    progress = Progress(elapsed_h=elapsed, deadline_h=52, work_h=48, done_h=done,
                        changeover_h=0.2)  # fmt: skip
    choice = deadline_policy.uniform_progress(progress, current=ON_DEMAND, spot_available=True)
    assert choice.mode == ON_DEMAND and "is not ahead of" in choice.reason, choice.reason
    ahead = Progress(elapsed_h=elapsed, deadline_h=52, work_h=48, done_h=done + 0.001,
                     changeover_h=0.2)  # fmt: skip
    assert (
        deadline_policy.uniform_progress(ahead, current=ON_DEMAND, spot_available=True).mode == SPOT
    )


def test_the_net_counts_the_time_left_in_whole_decisions() -> None:
    # 0.63 h left, 0.117 h of work + 2 x 0.2 h fits continuously, but with a decision every
    # 5 minutes the time left is 7 whole decisions and the work + 2d needs 7 (rounded up).
    progress = at(7 / 6, 53 / 60, work=1, deadline=1.8, d=0.2)
    assert (
        deadline_policy.uniform_progress(progress, current=ON_DEMAND, spot_available=True).mode
        == SPOT
    )
    every_5_min = at(7 / 6, 53 / 60, work=1, deadline=1.8, d=0.2, interval=1 / 12)
    choice = deadline_policy.uniform_progress(every_5_min, current=ON_DEMAND, spot_available=True)
    assert choice.mode == ON_DEMAND and "whole decisions of 5 min" in choice.reason


def test_progress_that_is_not_hours_is_refused() -> None:
    with pytest.raises(ValueError, match="done_h is nan"):
        at(1, math.nan)
    with pytest.raises(ValueError, match="elapsed_h is inf"):
        at(math.inf, 1)


def test_greedy_waits_for_spot_until_the_deadline_forces_on_demand() -> None:
    assert deadline_policy.greedy(at(2, 0.0), current=IDLE, spot_available=False).mode == IDLE
    assert (
        deadline_policy.greedy(at(9.1, 0.0), current=IDLE, spot_available=False).mode == ON_DEMAND
    )
    assert deadline_policy.greedy(at(2, 0.0), current=IDLE, spot_available=True).mode == SPOT


# --- the simulator -----------------------------------------------------------------------------
def trace(values: list[int], gap_s: float = 3600) -> traces.Trace:
    return traces.Trace("scripted", gap_s, tuple(values))


def job(**changes: float | None) -> simulation.Job:
    settings = {
        "work_h": 4.0,
        "deadline_h": 8.0,
        "changeover_h": 0.5,
        "on_demand_price": 3.0,
        "spot_price": 1.0,
        "nodes": 1,
    }
    return simulation.Job(**{**settings, **changes})  # type: ignore[arg-type]


def test_on_demand_only_pays_the_work_and_one_start() -> None:
    outcome = simulation.simulate(job(), trace([0] * 10), simulation.ON_DEMAND_ONLY)
    assert (outcome.cost, outcome.finish_h, outcome.spot_hours) == (4.5 * 3.0, 4.5, 0.0)
    assert outcome.goodput == pytest.approx(4 / 4.5)


def test_a_value_is_availability_zero_means_no_spot() -> None:
    # The study's own simulator reads the values inverted; here 0 is "none available".
    never = simulation.simulate(job(), trace([0] * 60, gap_s=600), simulation.SPOT_GREEDY)
    assert never.spot_hours == 0 and never.deadline_met  # the safety net: on-demand in time
    assert never.finish_h == pytest.approx(3 + 4.5)  # at 3 h, 5 h left for 4 h of work + 2d
    always = simulation.simulate(job(), trace([1] * 10), simulation.SPOT_GREEDY)
    assert (always.spot_hours, always.on_demand_hours, always.cost) == (4.5, 0.0, 4.5)


def test_preemptions_cost_a_changeover_each_and_a_gang_needs_every_machine() -> None:
    # Spot for 2 h, gone 1 h, back: two starts of 0.5 h; a gang of 2 sees the 1s as "none".
    outcome = simulation.simulate(
        job(deadline_h=None), trace([1, 1, 0, 1, 1, 1, 1]), simulation.SPOT_GREEDY
    )
    assert (outcome.preemptions, outcome.spot_hours, outcome.finish_h) == (1, 5.0, 6.0)
    gang = simulation.simulate(
        job(deadline_h=None, nodes=2), trace([1, 2, 2, 2, 2, 2, 2]), simulation.SPOT_GREEDY
    )
    assert (gang.spot_hours, gang.finish_h) == (9.0, 5.5)


def test_the_blueprint_keeps_its_coordinator_on_demand_and_falls_back_after_its_wait() -> None:
    outcome = simulation.simulate(
        job(nodes=2, deadline_h=None), trace([1, 0, 0, 1, 1, 1, 1, 1]), simulation.BLUEPRINT_MIX
    )
    # Worker: spot 1 h, preempted, on-demand after the 10 min wait, spot again when it returns.
    assert outcome.preemptions == 1
    assert outcome.on_demand_hours > outcome.finish_h  # the coordinator's hours and more


def test_on_a_shipped_trace_both_deadline_policies_meet_it_for_less_than_on_demand() -> None:
    sampled = [traces.load(FIXTURES / "traces" / "one-node.json")]
    run = job(work_h=10, deadline_h=16, changeover_h=0.25)
    results = simulation.replay(run, sampled, starts=12)
    summary = {name: simulation.summarise(o) for name, o in results.items()}
    assert summary["uniform-progress"].deadline_met == 1.0
    assert summary["spot-greedy"].deadline_met == 1.0
    assert summary["uniform-progress"].mean_cost < summary["on-demand"].mean_cost
    assert summary["spot-greedy"].mean_cost < summary["on-demand"].mean_cost


def simulate_json(
    capsys: pytest.CaptureFixture[str], trace_file: Path, *flags: str
) -> tuple[int, Any]:
    code = cli.main(["cost", "simulate", "--trace", str(trace_file), "--on-demand-price", "3",
                     "--spot-price", "1", "--json", *flags])  # fmt: skip
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else captured.err


def test_a_productive_spot_run_is_not_thrown_off_spot_near_its_deadline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No spot for 15 minutes, then spot to the end; 1 h of work by 1.8 h, d = 12 min. The
    # authors' rule keeps the spot machine it takes at 0.25 h to the end (1.2 h of spot);
    # Uniform Progress starts on on-demand (behind at once) and stays there: the net counts
    # whole 5-minute ticks, so it does not move to spot with 7 minutes of slack.
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [0] * 3 + [1] * 40}))
    code, found = simulate_json(capsys, path, "--work-hours", "1", "--deadline-hours", "1.8",
                                "--changeover-minutes", "12", "--starts", "1")  # fmt: skip
    assert code == 0, found
    costs = {name: s["summary"]["mean_cost"] for name, s in found["strategies"].items()}
    assert costs["spot-greedy"] == pytest.approx(1.20, abs=1e-9)
    assert costs["uniform-progress"] == pytest.approx(3.60, abs=1e-9)
    assert found["strategies"]["spot-greedy"]["runs"][0]["on_demand_hours"] == 0


def test_windows_stay_inside_their_trace_unless_wrapping_is_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short = tmp_path / "short.json"  # 10 h of spot, then none
    short.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": [1] * 10}))
    run = ["--work-hours", "4", "--deadline-hours", "8", "--changeover-minutes", "30"]
    code, error = simulate_json(capsys, short, *run, "--starts", "4")
    assert code == 2 and "only 3 start(s)" in error and "--starts 3" in error, error
    code, error = simulate_json(capsys, short, "--work-hours", "4", "--deadline-hours", "12")
    assert code == 2 and "no start fits" in error and "--wrap" in error, error
    code, found = simulate_json(capsys, short, *run, "--starts", "3")
    runs = found["strategies"]["spot-greedy"]["runs"]
    assert code == 0 and not any(r["wrapped"] or r["past_trace"] for r in runs)
    code, found = simulate_json(capsys, short, *run, "--starts", "5", "--wrap")
    assert code == 0 and found["wrap"] is True
    assert sum(r["wrapped"] for r in found["strategies"]["spot-greedy"]["runs"]) >= 1
    assert cli.main(["cost", "simulate", "--trace", str(short), *run, "--starts", "5", "--wrap",
                     "--on-demand-price", "3", "--spot-price", "1"]) == 0  # fmt: skip
    assert "--wrap:" in capsys.readouterr().out  # the table says so


def test_a_run_that_outlives_its_trace_sees_no_spot_and_is_flagged() -> None:
    sampled = trace([1, 1, 1, 1, 1, 1, 1, 1], gap_s=3600)
    late = simulation.simulate(job(deadline_h=None, work_h=7.4), sampled, simulation.SPOT_GREEDY,
                               start_tick=4)  # fmt: skip
    assert late.past_trace and not late.finished  # no spot after the end: greedy waits
    again = simulation.simulate(job(deadline_h=None, work_h=7.4), sampled,
                                simulation.SPOT_GREEDY, start_tick=4, wrap=True)  # fmt: skip
    assert again.wrapped and again.finished


def test_time_is_counted_exactly_over_many_ticks() -> None:
    # 0.1 h ticks for 1,000 h: float hours would drift; whole milliseconds do not.
    outcome = simulation.simulate(job(work_h=100, deadline_h=None), trace([1] * 10, 360),
                                  simulation.ON_DEMAND_ONLY)  # fmt: skip
    assert outcome.finish_h == 100.5 and outcome.on_demand_hours == 100.5


# --- traces ------------------------------------------------------------------------------------
def test_a_coarse_tick_has_spot_only_if_every_tick_in_it_had() -> None:
    fine = trace([2, 2, 1, 2, 0, 2, 2, 2, 2, 2, 1], gap_s=30)
    assert traces.coarsen(fine, 60).available == (2, 1, 0, 2, 2)  # the 11th tick is dropped
    assert traces.coarsen(fine, 90).available == (1, 0, 2)
    assert traces.coarsen(fine, 45).available == (2, 1, 0, 0, 2, 2, 1)  # overlaps count
    assert traces.coarsen(fine, 30) == fine
    with pytest.raises(traces.TraceError, match="finer than"):
        traces.coarsen(fine, 10)


def test_simulate_coarsens_traces_with_tick(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fine.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 32}, "data": [1, 1, 0] * 4000}))
    code, found = simulate_json(capsys, path, "--work-hours", "2", "--deadline-hours", "6",
                                "--changeover-minutes", "6", "--tick", "320")  # fmt: skip
    assert code == 0 and found["traces"][0]["tick_seconds"] == 320
    assert found["traces"][0]["availability"] == 0  # every 320 s holds a tick without spot
    code, error = simulate_json(capsys, path, "--work-hours", "2", "--tick", "16")
    assert code == 2 and "finer than" in error


def test_generated_traces_have_the_availability_their_rate_implies() -> None:
    generated = traces.generate(
        hours=2000, interruptions_per_hour=0.1, recovery_h=1, capacity=1, seed=3
    )
    assert generated.availability(1) == pytest.approx(10 / 11, abs=0.02)
    again = traces.generate(
        hours=2000, interruptions_per_hour=0.1, recovery_h=1, capacity=1, seed=3
    )
    assert again == generated


def test_a_trace_may_say_when_it_starts_which_gives_each_tick_its_hour(tmp_path: Path) -> None:
    """`metadata.start` (ISO 8601 with its zone) is read, written back, kept by a coarser tick
    and gives each tick its hour of the day (UTC); one that is not a time is refused with the
    fix, and a trace without it has no hours."""
    path = tmp_path / "started.json"
    metadata = {"gap_seconds": 1800, "start": "2026-11-02T23:00:00+02:00"}
    path.write_text(json.dumps({"metadata": metadata, "data": [1, 0, 1, 1]}))
    trace = traces.load(path)
    assert [trace.utc_hour(tick) for tick in range(4)] == [21.0, 21.5, 22.0, 22.5]
    assert trace.to_json()["metadata"]["start"] == "2026-11-02T21:00:00Z"
    assert traces.parse(trace.to_json(), str(path)) == trace
    assert traces.coarsen(trace, 3600).utc_hour(1) == 22.0
    for start in ("noon", "2026-11-02T05:00:00", 1762059600):
        path.write_text(json.dumps({"metadata": {"gap_seconds": 60, "start": start},
                                    "data": [1]}))  # fmt: skip
        with pytest.raises(traces.TraceError, match=r"metadata.start is .* ISO 8601"):
            traces.load(path)
    assert traces.Trace("unsaid", 60, (1,)).utc_hour(0) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "no metadata object"),
        ('{"metadata": {}, "data": [1]}', "gap_seconds is None"),
        ('{"metadata": {"gap_seconds": 60}, "data": []}', "not a non-empty list"),
        ('{"metadata": {"gap_seconds": 60}, "data": [1, -1]}', "data[1] is -1"),
        ('{"metadata": {"gap_seconds": 60}, "data": [0.5]}', "data[0] is 0.5"),
        ("not json", "is not JSON"),
    ],
)
def test_a_trace_that_is_not_the_format_is_one_clear_message(
    tmp_path: Path, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.json"
    path.write_text(text)
    code = cli.main(
        [
            "cost",
            "simulate",
            "--trace",
            str(path),
            "--work-hours",
            "4",
            "--on-demand-price",
            "3",
            "--spot-price",
            "1",
        ]
    )
    error = capsys.readouterr().err
    assert code == 2 and message in error and "gap_seconds" in error
    assert "Traceback" not in error and len(error.strip().splitlines()) == 1


@pytest.mark.parametrize("across", [False, True])
def test_simulate_names_every_problem_of_its_flags_and_files_at_once(
    tmp_path: Path, across: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad run, a trace missing, another not the format and a history missing: one message
    names them all (the format once), before anything is replayed."""
    (tmp_path / "bad.json").write_text('{"metadata": {"gap_seconds": 60}, "data": [1, "x"]}')
    flags = ["cost", "simulate", "--trace", str(tmp_path / "gone.json"), "--trace",
             str(tmp_path / "bad.json"), "--work-hours", "-1", "--on-demand-price", "3",
             "--spot-price", "1", "--history", str(tmp_path / "past.json")]  # fmt: skip
    assert cli.main([*flags, *(["--across-regions"] if across else [])]) == 2
    error = capsys.readouterr().err
    said = [
        "the work is -1.0 hours",
        "gone.json cannot be read",
        "data[1] is 'x'",
        "past.json cannot be read",
        "give --deadline-hours" if across else "--history is what the Markov policy",
    ]
    assert all(s in error for s in said), error
    assert error.count("write it as") == 1, error
    listed = error.strip().splitlines()  # one problem a line, after what has them
    problems = len(said) + across  # across regions the history's count is a problem too
    assert listed[0].startswith("error: the replay has") and len(listed) == problems + 1, error


# --- the commands ------------------------------------------------------------------------------
def test_simulate_prints_each_strategy_as_json_from_public_format_traces(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = cli.main(
        [
            "cost",
            "simulate",
            "--trace",
            str(FIXTURES / "traces" / "four-nodes.json"),
            "--nodes",
            "4",
            "--work-hours",
            "12",
            "--deadline-hours",
            "20",
            "--changeover-minutes",
            "15",
            "--on-demand-price",
            "3",
            "--spot-price",
            "1",
            "--starts",
            "5",
            "--json",
            "--plot",
            str(tmp_path / "slack.png"),
        ]
    )
    assert code == 0
    document = json.loads(capsys.readouterr().out.split("\nfigure:")[0])
    # With a deadline Markov is replayed beside them (without history, never recommended).
    assert set(document["strategies"]) == {*simulation.STRATEGIES, simulation.MARKOV}
    # It recommends as `cost plan` does: the cheapest that meets the deadline often enough.
    summaries = [simulation.Summary(**found["summary"])
                 for found in document["strategies"].values()]  # fmt: skip
    assert document["recommended"] == dict(
        zip(("strategy", "why"), planner.recommend(summaries, has_deadline=True), strict=True)
    )
    for found in document["strategies"].values():
        assert len(found["runs"]) == 5
        for run in found["runs"]:
            assert set(run) == {
                "cost",
                "finish_hours",
                "deadline_met",
                "spot_hours",
                "on_demand_hours",
                "preemptions",
                "wrapped",
                "past_trace",
                "optimum_cost",
                "vs_optimum",
            }
            assert not run["wrapped"] and not run["past_trace"]  # every window fits its trace
    on_demand = document["strategies"]["on-demand"]["runs"][0]
    assert on_demand["cost"] == pytest.approx(12.25 * 4 * 3)  # work + one start, 4 machines
    assert (tmp_path / "slack.png").read_bytes()[:4] == b"\x89PNG"


def test_plan_recommends_checks_the_interval_and_flags_stale_prices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(
        [
            "cost",
            "plan",
            "--price-book",
            str(PRICE_BOOK),
            "--instance-type",
            "g5.xlarge",
            "--instance-type",
            "g6.xlarge",
            "--region",
            "us-east-1",
            "--steps",
            "36000",
            "--step-seconds",
            "2",
            "--checkpoint-seconds",
            "60",
            "--checkpoint-every",
            "50",
            "--deadline-hours",
            "40",
            "--nodes",
            "2",
            "--samples",
            "30",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "g5.xlarge us-east-1: on-demand $20.0000/h, spot $6.0000/h" in out  # mean of zones
    assert "Spot Instance Advisor >20%" in out
    assert "prices for g6.xlarge in us-east-1 are" in out and "days old" in out
    assert "checkpoint_every 50 (1.7 min) wastes" in out and "set checkpoint_every to" in out
    assert "recommended:" in out and out.count("<- recommended") == 2


def test_plan_reads_step_time_and_checkpoint_cost_from_the_metrics_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    lines = [
        {"step": n, "loss": 1.0, "tokens_per_s": 1e4, "step_s": 2.0 + n % 3 * 0.1}
        for n in range(1, 40)
    ]
    lines += [
        {"event": "published", "at": 1.0, "step": 20, "stall_s": 30.0},
        {"event": "published", "at": 2.0, "step": 40, "stall_s": 34.0},
    ]
    metrics.write_text("\n".join(json.dumps(line) for line in lines) + '\n{"step": 4')
    code = cli.main(
        [
            "cost",
            "plan",
            "--metrics",
            str(metrics),
            "--steps",
            "3600",
            "--on-demand-price",
            "4",
            "--spot-price",
            "1.5",
            "--interruptions-per-hour",
            "0.05",
            "--samples",
            "10",
            "--json",
        ]
    )
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    assert document["measured"]["step_s"] == pytest.approx(2.1)
    assert document["measured"]["checkpoint_s"] == pytest.approx(32.0)
    assert document["work_hours"] == pytest.approx(3600 * 2.1 / 3600)
    pool = document["pools"][0]
    expected = planner.daly_interval(32.0, 3600 / 0.05)
    assert pool["checkpoint_interval_s"] == pytest.approx(expected)
    assert pool["checkpoint_interval_steps"] == round(expected / 2.1)


def test_plan_counts_a_checkpoints_whole_cost_to_training_not_only_its_stall(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint stalls the loop 0.3 s, but the three steps beside its background publish
    take 5 s where a step takes 2, and its commit 0.1 s more: it cost the training 9.4 s, and
    the checkpoint interval is planned with that. A restart's gap (a new start, its steps
    counted again) is no checkpoint's, and an emergency checkpoint after the last step costs
    no step."""
    metrics = tmp_path / "metrics.jsonl"
    lines: list[dict[str, Any]] = [{"event": "started", "at": 0.0, "step": 0}]
    at = 100.0

    def step(n: int, gap: float, publishing: bool) -> None:
        nonlocal at
        at += gap
        lines.append({"step": n, "loss": 1.0, "tokens_per_s": 1e4, "step_s": 2.0,
                      "publishing": publishing, "at": at})  # fmt: skip

    for n in range(1, 11):
        step(n, 2.0, False)
    lines.append({"event": "published", "at": at + 7.0, "step": 10, "stall_s": 0.3})
    step(11, 5.3, True)  # the stall, then a step beside the publish
    step(12, 5.0, True)
    step(13, 5.0, True)
    step(14, 2.1, False)  # the commit
    for n in range(15, 21):
        step(n, 2.0, False)
    lines.append({"event": "started", "at": at + 60.0, "step": 14})  # a restart from step 14
    at += 60.0
    for n in range(15, 21):
        step(n, 2.0, False)
    lines.append({"event": "published", "at": at + 3.0, "step": 20, "stall_s": 0.3})
    metrics.write_text("\n".join(json.dumps(line) for line in lines))

    assert planner.measured(str(metrics)).checkpoint_s == pytest.approx(9.4)
    # Lines no trainer wrote (a step that is no number, an event that is a list) say nothing.
    odd = [{"at": 1.0, "publishing": False}, {"step": "x", "at": 2.0, "publishing": True},
           {"event": "published", "step": [1]}, {"event": ["started"]}]  # fmt: skip
    assert planner.checkpoint_training_cost(odd) is None
    # JSON `true` is no step 1 (Python's bools are ints).
    truthy = [{"step": True, "at": 1.0, "publishing": False},
              {"step": 2, "at": 3.0, "publishing": False},
              {"event": "published", "step": True}]  # fmt: skip
    assert planner.checkpoint_training_cost(truthy) is None
    plan = ["cost", "plan", "--metrics", str(metrics), "--steps", "3600", "--on-demand-price",
            "4", "--spot-price", "1.5", "--interruptions-per-hour", "0.05", "--samples", "10",
            "--json"]  # fmt: skip
    assert cli.main(plan) == 0
    [pool] = json.loads(capsys.readouterr().out)["pools"]
    assert pool["checkpoint_interval_s"] == pytest.approx(planner.daly_interval(9.4, 3600 / 0.05))


def test_plan_prices_what_the_other_regions_add_replication_and_a_move(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each checkpoint's new bytes (the metrics file's median: 2 GB) go to every other region
    of the environment as they are published, at the sending region's rate; a move costs its
    changeover of the gang and sends nothing more; the dataset went once, when prepared."""
    metrics = tmp_path / "metrics.jsonl"
    lines = [{"step": n, "loss": 1.0, "step_s": 2.0} for n in range(1, 40)]
    lines += [{"event": "published", "step": 20 * n, "stall_s": 30.0, "uploaded_bytes": sent}
              for n, sent in enumerate((1.5e9, 2.0e9, 2.5e9), start=1)]  # fmt: skip
    metrics.write_text("\n".join(json.dumps(line) for line in lines))
    plan = ["cost", "plan", "--environment", "local", "--metrics", str(metrics), "--steps",
            "36000", "--on-demand-price", "4", "--spot-price", "1.5", "--nodes", "2",
            "--interruptions-per-hour", "0.05", "--samples", "10"]  # fmt: skip
    assert cli.main([*plan, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    regions, [pool] = document["regions"], document["pools"]
    assert (regions["home"], regions["others"]) == ("us-east-1", ["us-west-2"])
    assert regions["checkpoint_gb"] == pytest.approx(2.0)
    assert regions["usd_per_gb"] == {"us-west-2": 0.02}
    checkpoints = 36000 * 2.0 / pool["checkpoint_interval_s"]
    assert regions["checkpoints"] == pytest.approx(checkpoints)
    assert regions["replication_usd"] == pytest.approx(2.0 * 0.02 * checkpoints)
    assert regions["move_usd"] == pytest.approx(pool["changeover_hours"] * 1.5 * 2)
    assert cli.main([*plan, "--checkpoint-gb", "10", "--transfer-usd-per-gb", "0.09"]) == 0
    text = capsys.readouterr().out
    assert "each checkpoint sends 10.00 GB to every other region (us-west-2 at $0.09/GB): " \
           f"${10 * 0.09 * checkpoints:,.2f} over the run's" in text  # fmt: skip
    assert "nothing more is sent (the checkpoint it resumes from is there already)" in text
    assert "the dataset: sent to every other region once, when prepared" in text
    assert "give --dataset-gb to price it" in text
    # The dataset crossed once, when prepared: its bytes at the same rate, not per move.
    assert cli.main([*plan, "--dataset-gb", "300", "--json"]) == 0
    regions = json.loads(capsys.readouterr().out)["regions"]
    assert (regions["dataset_gb"], regions["dataset_usd"]) == (300, pytest.approx(300 * 0.02))
    assert regions["move_usd"] == pytest.approx(pool["changeover_hours"] * 1.5 * 2)
    assert cli.main([*plan, "--dataset-gb", "300"]) == 0
    assert "the dataset: 300.00 GB sent to every other region once, when prepared: $6.00 " \
           "(shared by the runs that read it;" in capsys.readouterr().out  # fmt: skip


def test_plan_prices_every_region_of_the_environment_and_leaves_out_another_it_cannot_price(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run may move to any region of its environment: without --region the plan prices each
    (the checked-in book has both of local's), and with a book that has home's prices only,
    the other region's pools are left out, said so, and home's still planned; a region asked
    for by name that cannot be priced is refused."""
    plan = ["cost", "plan", "--environment", "local", "--work-hours", "20", "--nodes", "2",
            "--checkpoint-seconds", "30", "--instance-type", "g5.xlarge", "--samples", "10",
            "--interruptions-per-hour", "0.05"]  # fmt: skip
    assert cli.main([*plan, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [p["pool"] for p in document["pools"]] == ["g5.xlarge us-east-1", "g5.xlarge us-west-2"]
    assert document["not_priced"] == []
    home_only = [*plan, "--price-book", str(PRICE_BOOK)]
    assert cli.main(home_only) == 0
    text = capsys.readouterr().out
    assert "g5.xlarge us-east-1:" in text and "g5.xlarge us-west-2:" not in text
    assert "not priced (another region of the environment): the price book" in text
    assert "has no on-demand or spot price for g5.xlarge in us-west-2" in text
    assert cli.main([*home_only, "--region", "us-west-2"]) == 2
    assert "g5.xlarge in us-west-2" in capsys.readouterr().err


def test_the_rate_between_regions_is_the_senders_and_one_that_depends_on_the_pair_is_asked_for(
) -> None:  # fmt: skip
    from spotrain.core import inter_region
    from spotrain.cost import regions_price

    assert inter_region.usd_per_gb("us-east-1", "us-east-2") == 0.01
    assert inter_region.usd_per_gb("us-west-2", "eu-west-1") == 0.02
    assert inter_region.usd_per_gb("eu-west-1", "eu-west-1") == 0.0
    assert inter_region.usd_per_gb("ap-northeast-1", "us-east-1") is None
    price = regions_price.regions_price(
        "ap-northeast-1", ["us-east-1"], work_h=10, interval_s=3600, checkpoint_gb=1.0,
        changeover_h=0.25, gang_usd_per_h=8.0)  # fmt: skip
    assert price.replication_usd is None and price.move_usd == 2.0
    assert price.missing == ["the rate from ap-northeast-1 to us-east-1 depends on the pair: "
                             "give --transfer-usd-per-gb"]  # fmt: skip
    lines = regions_price.describe(price, "the gang")
    assert lines[-1] == f"  to price it: {price.missing[0]}"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--work-hours", "10", "--deadline-hours", "5"], "shorter than the work"),
        (["--work-hours", "0"], "give a positive number of hours"),
        (["--work-hours", "-3"], "give a positive number of hours"),
        (
            ["--work-hours", "10", "--instance-type", "p5.48xlarge"],
            "no on-demand or spot price for p5.48xlarge in us-east-1: run `spotrain prices refresh",
        ),
        (["--work-hours", "10", "--region", "eu-west-1"], "g5.xlarge in eu-west-1"),
        (["--checkpoint-seconds", "60"], "no amount of work"),
    ],
)
def test_plan_bad_input_is_one_message_with_the_fix(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    defaults = ["--checkpoint-seconds", "60"] if "--checkpoint-seconds" not in arguments else []
    defaults += ["--instance-type", "g5.xlarge"]  # the one type the book prices: one problem
    code = cli.main(["cost", "plan", "--price-book", str(PRICE_BOOK), *defaults, *arguments])
    error = capsys.readouterr().err
    assert code == 2 and message in error, error
    assert len(error.strip().splitlines()) == 1


def test_the_checked_in_price_book_holds_only_sourced_dated_figures() -> None:
    book = prices.load()
    for figure in (*book.on_demand, *book.spot, *book.advisor):
        assert figure.source and figure.taken_at
    assert book.note  # says where its figures come from


def test_the_docs_document_a_price_book_the_loader_takes(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[1] / "docs" / "cost.md").read_text()
    example = readme.split("A price book (the snapshot", 1)[1].split("```json\n", 1)[1]
    path = tmp_path / "book.json"
    path.write_text(example.split("```", 1)[0])
    pool = prices.load(path).pool("g5.xlarge", "us-east-1")
    assert pool.advisor is not None
    assert (pool.on_demand.usd_per_hour, pool.spot_price, pool.advisor.band) == (
        1.006, 0.42, "5-10%",
    )  # fmt: skip


def test_a_deadline_needs_valid_times_and_steps() -> None:
    deadline = deadline_policy.RunDeadline(
        started_at="2027-01-01T00:00:00Z", finish_by="2027-01-03T00:00:00+00:00", total_steps=10
    )
    assert deadline.problems() == [] and deadline.deadline_h == 48
    bad = deadline_policy.RunDeadline(
        started_at="2027-01-02T00:00:00", finish_by="soon", total_steps=0
    )
    assert len(bad.problems()) == 3
    assert math.isfinite(deadline.start_s)


def test_prices_refresh_reads_the_apis_of_the_local_cloud(
    local_cloud: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`spotrain prices refresh` over HTTPS: DescribeSpotPriceHistory per zone and the Price
    List API, which the local cloud answers from the book it was given."""
    from spotrain.localcloud import control

    for key, value in control.aws_environment(local_cloud.endpoint, "us-east-1").items():
        monkeypatch.setenv(key, value)
    control.set_price_book(PRICE_BOOK)
    try:
        out = tmp_path / "book.json"
        code = cli.main(
            [
                "prices",
                "refresh",
                "--instance-type",
                "g5.xlarge",
                "--instance-type",
                "g6.xlarge",
                "--instance-type",
                "p5.48xlarge",
                "--region",
                "us-east-1",
                "--price-book",
                str(out),
            ]
        )
    finally:
        control.set_price_book(None)
    printed = capsys.readouterr().out
    assert code == 1  # p5.48xlarge is not in the book the cloud answers from
    assert "no spot price for p5.48xlarge in us-east-1" in printed
    fresh, given = prices.load(out), prices.load(PRICE_BOOK)
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    assert {(f.instance_type, f.availability_zone, f.usd_per_hour) for f in fresh.spot} == {
        (f.instance_type, f.availability_zone, f.usd_per_hour) for f in given.spot
    }
    assert {(f.instance_type, f.usd_per_hour) for f in fresh.on_demand} == {
        (f.instance_type, f.usd_per_hour) for f in given.on_demand
    }
    for figure in (*fresh.on_demand, *fresh.spot):
        assert figure.taken_at == today and (
            "DescribeSpotPriceHistory" in figure.source or "Price List API" in figure.source
        )
    assert fresh.pool("g5.xlarge", "us-east-1").spot_price == 6.0


def test_plan_takes_the_runs_own_interruption_rate_from_its_events(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import boto3
    from moto import mock_aws

    for key, value in {
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }.items():
        monkeypatch.setenv(key, value)
    now = datetime.datetime.now(datetime.UTC)
    with mock_aws():
        table = boto3.resource("dynamodb").create_table(
            TableName="events",
            BillingMode="PAY_PER_REQUEST",
            KeySchema=[
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            AttributeDefinitions=[{"AttributeName": a, "AttributeType": "S"} for a in ("pk", "sk")],
        )
        # 10 hours of history: 4 warnings for g5.xlarge across two zones, 1 rebalance.
        for index, (kind, pool, hours_ago) in enumerate(
            [
                ("interruption-warning", "g5.xlarge#us-east-1a", 10),
                ("interruption-warning", "g5.xlarge#us-east-1b", 6),
                ("interruption-warning", "g5.xlarge#us-east-1a", 3),
                ("interruption-warning", "g5.xlarge#us-east-1b", 1),
                ("rebalance-recommendation", "g6.xlarge#us-east-1a", 2),
            ]
        ):
            at = (now - datetime.timedelta(hours=hours_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
            table.put_item(
                Item={
                    "pk": f"EVENT#{index}",
                    "sk": "EVENT",
                    "kind": kind,
                    "pool": pool,
                    "occurred_at": at,
                }
            )
        code = cli.main(
            [
                "cost",
                "plan",
                "--price-book",
                str(PRICE_BOOK),
                "--work-hours",
                "10",
                "--checkpoint-seconds",
                "60",
                "--instance-type",
                "g5.xlarge",
                "--instance-type",
                "g6.xlarge",
                "--events-table",
                "events",
                "--samples",
                "5",
                "--json",
            ]
        )
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    g5, g6 = document["pools"]
    assert g5["interruptions_per_hour"] == pytest.approx(0.4, rel=0.01)
    assert g5["rate_source"] == "the run's own interruptions (events)"
    assert g6["rate_source"].startswith("Spot Instance Advisor <5%")  # no warnings of its own


def test_the_planners_interval_is_within_5_percent_of_the_simulators_best() -> None:
    """Brute force: explicit checkpoints (a preemption loses the work since the last one)
    over a grid of intervals; Daly's interval costs at most 5% more than the best of them."""
    delta_h, restart_h, rate = 2 / 60, 5 / 60, 0.3
    daly = planner.daly_interval(delta_h, 1 / rate)
    sampled = [
        traces.generate(
            hours=30, interruptions_per_hour=rate, recovery_h=0.05, capacity=1, gap_s=60, seed=seed
        )
        for seed in range(12)
    ]

    def cost(interval: float) -> float:
        run = simulation.Job(
            work_h=10,
            deadline_h=None,
            changeover_h=restart_h,
            on_demand_price=3,
            spot_price=1,
            checkpoint_every_h=interval,
            checkpoint_cost_h=delta_h,
        )
        return sum(simulation.simulate(run, t, simulation.SPOT_GREEDY).cost for t in sampled)

    grid = [cost(daly * factor) for factor in (0.3, 0.5, 0.75, 1.5, 2.0, 3.0)]
    assert cost(daly) <= 1.05 * min(grid)
    assert max(grid) > 1.05 * cost(daly)  # the grid reaches intervals that do cost more


def test_plan_takes_the_runs_pace_and_work_left_from_its_catalog(
    dynamo: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run with history: steps per hour between checkpoints of one trainer start (a
    restart's downtime between generations is not throughput), the work left after its head."""
    import boto3

    from spotrain.core.catalog_schema import HEAD_SORT_KEY, checkpoint_sort_key, run_key

    table = boto3.resource("dynamodb").Table("catalog")
    records = [
        (0, "10:00:00", 1),
        (1800, "10:30:00", 1),
        (3600, "11:00:00", 1),
        (4000, "13:00:00", 2),
        (5800, "13:30:00", 2),
    ]
    for step, at, generation in records:
        table.put_item(
            Item={
                "pk": run_key("demo"),
                "sk": checkpoint_sort_key(step),
                "step": step,
                "created_at": f"2027-01-15T{at}+00:00",
                "generation": generation,
            }
        )
    table.put_item(Item={"pk": run_key("demo"), "sk": HEAD_SORT_KEY, "step": 5800})
    code = cli.main(
        [
            "cost",
            "plan",
            "--catalog-table",
            "catalog",
            "--run",
            "demo",
            "--steps",
            "36000",
            "--checkpoint-seconds",
            "30",
            "--on-demand-price",
            "4",
            "--spot-price",
            "1",
            "--interruptions-per-hour",
            "0.1",
            "--samples",
            "5",
            "--json",
        ]
    )
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    assert document["done_steps"] == 5800
    assert document["work_hours"] == pytest.approx((36000 - 5800) / 3600)  # 3600 steps/h


def test_without_interruptions_a_plan_pays_one_start_and_one_checkpoint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(
        [
            "cost",
            "plan",
            "--work-hours",
            "5",
            "--checkpoint-seconds",
            "36",
            "--restart-minutes",
            "6",
            "--on-demand-price",
            "2",
            "--spot-price",
            "1",
            "--interruptions-per-hour",
            "0",
            "--samples",
            "2",
            "--json",
        ]
    )
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    [pool] = document["pools"]
    assert pool["mtbf_hours"] is None and pool["checkpoint_interval_s"] is None  # never: null
    paid = {s["strategy"]: s["mean_cost"] for s in pool["strategies"]}
    assert paid["on-demand"] == pytest.approx((5 + 0.01 + 0.1) * 2)  # work, a checkpoint, a start
    assert paid["spot-greedy"] == pytest.approx(5.11)


# --- the pull-request estimate -----------------------------------------------------------------
def test_the_estimate_prices_the_planned_run_as_the_planner_does_and_says_what_it_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """dev's planned run on the test book, its rate from the book's Advisor band: the figures
    are the planner's for the fleet (machine-hours shared by its machines); a base branch that
    cannot be read, an environment without a planned run and one the book cannot price each
    say so in the comment instead of failing it."""
    import dataclasses

    from spotrain.cost import estimate
    from spotrain.stacks import environments
    from spotrain.stacks.runs import load_runs

    dev = environments.dev()
    [small] = load_runs("dev")
    assert small.planned is not None
    small = dataclasses.replace(
        small, planned=dataclasses.replace(small.planned, interruptions_per_hour=None)
    )
    book = prices.load(PRICE_BOOK)
    found = estimate.estimate(dev, small, book)
    assert found is not None and found.spot is not None and found.on_demand is not None
    assert found.rate_source == "Spot Instance Advisor >20% (2026-11-20)"
    # dev's run mixes A10G and L4 machines (it says so): its steps run at the L4's pace.
    from spotrain.core.gpu_types import GPU_TFLOPS

    at_the_slowest = GPU_TFLOPS["A10G"] / GPU_TFLOPS["L4"]
    assert (found.mix_slowdown, found.slowest_gpu) == (pytest.approx(at_the_slowest), "L4")
    plan = planner.plan(planner.PlanInputs(
        work_h=small.planned.machine_hours * at_the_slowest / small.desired_size,
        nodes=small.desired_size, deadline_h=None,
        checkpoint_s=small.planned.checkpoint_seconds, restart_h=estimate.RESTART_HOURS,
        interruptions_per_hour=planner.advisor_rate_per_hour(">20%"),
        recovery_h=estimate.RECOVERY_HOURS, on_demand_price=20.0, spot_price=6.0,
        samples=estimate.SAMPLES, seed=estimate.SEED,
    ))  # fmt: skip
    by_name = {s.strategy: s for s in plan.summaries}
    assert found.on_demand.cost_usd == by_name[simulation.ON_DEMAND_ONLY].mean_cost
    assert found.spot.cost_usd == by_name[found.spot.strategy].mean_cost
    assert found.on_demand.per_day_usd == pytest.approx(20.0 * small.desired_size * 24, 0.02)

    text = estimate.markdown(found, None, base_note="the base has no run 'gpt-small' (it is new).")
    assert "Against the base branch: the base has no run 'gpt-small' (it is new)." in text
    assert "Mixed GPUs: every step runs at the slowest, L4, so the work is priced at 1.03x" in text
    assert text.count("| new | new |") == 2
    [demo, _] = load_runs("local")
    no_work = estimate.markdown(estimate.estimate(environments.local(), demo, book), None,
                                run="demo")  # fmt: skip
    assert "`demo`" in no_work and "plans no work" in no_work
    unpriced = estimate.estimate(environments.prod(), load_runs("prod")[0], book)
    assert unpriced is not None and "no on-demand or spot price for p5en.48xlarge" in str(
        unpriced.problem)  # fmt: skip

    (tmp_path / "runs" / "dev").mkdir(parents=True)
    (tmp_path / "runs" / "dev" / "gpt-small.toml").write_text("half = merged = twice\n")
    assert cli.main(["cost", "estimate", "dev", "--base", str(tmp_path), "--price-book",
                     str(PRICE_BOOK)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "cannot be read by this version (gpt-small.toml: it is not TOML" in out
    assert "| spot: " in out


def test_figures_mark_the_deadline_and_name_only_what_they_draw(tmp_path: Path) -> None:
    met = {simulation.ON_DEMAND_ONLY: [(0.1, 1.0, 1.0), (0.5, 1.0, 1.0)],
           simulation.BLUEPRINT_MIX: [(0.1, 1.0, 1.0), (0.5, 1.0, 1.0)]}  # fmt: skip
    drawn = report.plot(met, tmp_path / "met.png", "nothing missed")
    assert drawn == [simulation.ON_DEMAND_ONLY, simulation.BLUEPRINT_MIX]  # no "misses" entry
    missed = {**met, simulation.SPOT_GREEDY: [(0.1, 0.4, 0.5), (0.5, 0.3, 1.0)]}
    drawn = report.plot(missed, tmp_path / "missed.png", "one missed", deadline_slack=0.25,
                        deadline_label="30 h")  # fmt: skip
    assert drawn[-2:] == ["misses the deadline in some runs", "your deadline (30 h)"]
    assert (tmp_path / "missed.png").stat().st_size > 0


def test_plan_takes_the_machines_the_run_starts_with(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`cost plan --environment dev` plans the fleet `cost estimate dev` prices: the run's
    desired_size, its instance types; --nodes overrides; runs that disagree ask which."""

    def planned(*extra: str) -> dict[str, Any]:
        assert cli.main(["cost", "plan", "--work-hours", "10", "--checkpoint-seconds", "30",
                         "--price-book", str(EXAMPLE_BOOK), "--samples", "20", "--json",
                         *extra]) == 0  # fmt: skip
        return dict(json.loads(capsys.readouterr().out))

    from spotrain.stacks.runs import load_runs

    [small] = load_runs("dev")
    document = planned("--environment", "dev")
    assert (document["nodes"], document["nodes_from"]) == (
        small.desired_size, "run gpt-small's desired_size")  # fmt: skip
    assert [p["pool"].split()[0] for p in document["pools"]] == list(small.instance_types)
    assert planned("--environment", "dev", "--nodes", "4")["nodes"] == 4
    assert planned("--environment", "dev", "--run", "gpt-small")["nodes"] == small.desired_size


def test_estimate_without_prices_names_the_price_book_it_takes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"format": 1, "on_demand": [], "spot": [], "advisor": []}))
    assert cli.main(["cost", "estimate", "dev", "--price-book", str(empty)]) == 0
    out = capsys.readouterr().out
    assert "--price-book FILE" in out and "--on-demand-price" not in out
    assert cli.main(["cost", "estimate", "dev", "--price-book", str(EXAMPLE_BOOK)]) == 0
    assert "| spot: " in capsys.readouterr().out  # the documented example prices every run


def test_goodput_counts_the_work_done_not_the_work_asked_for() -> None:
    # Spot for 2 h, then the trace ends: greedy without a deadline never finishes its 4 h.
    stuck = simulation.simulate(job(deadline_h=None), trace([1, 1]), simulation.SPOT_GREEDY)
    assert not stuck.finished and stuck.past_trace
    assert stuck.goodput == pytest.approx(1.5 / 2.0)  # 0.5 h changeover, 1.5 h of work


def test_the_checked_in_book_is_the_public_catalogs_aws_prices_as_its_script_builds_them(
    tmp_path: Path,
) -> None:
    """Priced out of the box: scripts/price_book_from_catalog.py turns catalog rows (a sample
    copied verbatim: five zones of g5.xlarge in us-east-1, a Local Zone, a type with no
    on-demand price, zones with no spot price) into the figures the checked-in book holds,
    each naming its source and its earliest date, zones by AZ ID."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "book.json"
    subprocess.run([sys.executable, str(root / "scripts" / "price_book_from_catalog.py"),
                    str(FIXTURES / "catalog_sample.csv"), "--out", str(out)],
                   check=True, capture_output=True)  # fmt: skip
    built, shipped = prices.load(out), prices.load()
    assert set(built.on_demand) <= set(shipped.on_demand) and set(built.spot) <= set(shipped.spot)
    assert {(f.instance_type, f.region) for f in built.on_demand} == {
        ("g5.xlarge", "us-east-1"), ("p5.48xlarge", "us-east-1"),
        ("p5en.48xlarge", "me-central-1")}  # fmt: skip
    assert sorted(f.availability_zone for f in built.spot) == [
        "use1-az1", "use1-az2", "use1-az4", "use1-az5", "use1-az6", "use2-az1"]  # fmt: skip
    pool = shipped.pool("g5.xlarge", "us-east-1")
    assert pool.on_demand.usd_per_hour == 1.006
    assert pool.spot_price == pytest.approx((0.4328 + 0.4516 + 0.4473 + 0.4353 + 0.4423) / 5)
    assert "skypilot-catalog" in pool.on_demand.source and "Price List" in pool.on_demand.source
    assert {f.taken_at for f in (*shipped.on_demand, *shipped.spot)} == {"2026-01-22"}
    assert "no earlier than 2026-01-22" in shipped.note
    # Every type the example runs declare has a price in its environment's region.
    assert shipped.pool("g6.xlarge", "us-east-1") and shipped.pool("p5en.48xlarge", "us-east-1")


def test_the_local_cloud_answers_a_zone_the_book_names_by_id_by_its_name() -> None:
    from spotrain.localcloud import price_list

    answered = price_list.spot_price_history("us-east-1", ["g5.xlarge"], [], ["us-east-1a"])
    assert [(a["AvailabilityZone"], a["SpotPrice"]) for a in answered] == [
        ("us-east-1a", "0.442300")
    ]  # use1-az6 is us-east-1a in the local cloud's account


def test_the_advisors_public_data_gives_the_bands_a_plan_reads_its_interruptions_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`prices advisor` reads the Spot Instance Advisor's public data (here a saved sample in
    its shape, figures made up) into the book's bands, with no credentials: a plan on the
    checked-in snapshot, which has no band, then needs no --interruptions-per-hour."""
    import shutil

    book = tmp_path / "book.json"
    shutil.copy(prices.SNAPSHOT, book)
    plan = ["cost", "plan", "--price-book", str(book), "--instance-type", "g5.xlarge",
            "--region", "us-east-1", "--work-hours", "10",
            "--checkpoint-seconds", "60"]  # fmt: skip
    assert cli.main(plan) == 2
    assert "give --interruptions-per-hour" in capsys.readouterr().err
    sample = FIXTURES / "spot-advisor-data.sample.json"
    code = cli.main(["prices", "advisor", "--from-file", str(sample), "--price-book", str(book),
                     "--instance-type", "g5.xlarge", "--instance-type", "g6.xlarge",
                     "--region", "us-east-1", "--region", "us-west-2"])  # fmt: skip
    said = capsys.readouterr().out
    assert code == 1 and "no Advisor band for g6.xlarge in us-west-2" in said, said
    loaded = prices.load(book)
    bands = {(f.instance_type, f.region): f.band for f in loaded.advisor}
    assert bands == {("g5.xlarge", "us-east-1"): "10-15%", ("g6.xlarge", "us-east-1"): "5-10%",
                     ("g5.xlarge", "us-west-2"): ">20%"}  # fmt: skip
    assert loaded.on_demand == prices.load().on_demand  # the prices stay as they were
    assert cli.main(plan) == 0
    assert "Spot Instance Advisor 10-15%" in capsys.readouterr().out
    (tmp_path / "other.json").write_text('{"ranges": []}')
    assert cli.main(["prices", "advisor", "--from-file", str(tmp_path / "other.json"),
                     "--price-book", str(book), "--instance-type", "g5.xlarge"]) == 2  # fmt: skip
    assert "has no `ranges` (index, label) and `spot_advisor`" in capsys.readouterr().err
