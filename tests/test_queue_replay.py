"""`spotrain cost queue`: a queue of runs replayed on a capacity trace with the queue's own
decision (`admission.admit`): waits, preemptions, reclaims and cost, per team and priority."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spotrain import cli
from spotrain.core import prices
from spotrain.core.errors import CostInputError
from spotrain.cost import queue_replay
from spotrain.cost.traces import Trace

ROOT = Path(__file__).resolve().parents[1]
P5 = "p5.48xlarge"  # 8 GPUs, 192 vCPUs: spot/P5
PRICE = prices.load().pool(P5, "us-east-1").spot_price


def _setup(*runs: dict[str, Any], ceiling: int = 384, **settings: Any) -> queue_replay.QueueSetup:
    return queue_replay.parse({
        "region": "us-east-1", "changeover_minutes": 6, "vcpu_ceilings": {"spot/P5": ceiling},
        "teams": [{"name": "vision", "gpus": 16}, {"name": "speech", "gpus": 16}],
        "runs": [{"instance_type": P5, "machines": 1, "team": "vision", **r} for r in runs],
        **settings,
    })  # fmt: skip


def _by_name(outcome: queue_replay.QueueOutcome) -> dict[str, queue_replay.RunOutcome]:
    return {run.name: run for run in outcome.runs}


def test_a_third_run_waits_for_the_first_to_finish_and_every_hour_is_paid_at_spot() -> None:
    outcome = queue_replay.replay(_setup(
        {"name": "a", "work_h": 2}, {"name": "b", "team": "speech", "work_h": 4},
        {"name": "c", "work_h": 1, "submitted_h": 0.5}), gap_s=360)  # fmt: skip
    runs = _by_name(outcome)
    assert runs["a"].started_h == runs["b"].started_h == 0
    assert runs["a"].finished_h == pytest.approx(2.1)  # 6 minutes' changeover, then 2 h
    # The ceiling fits two: c waits from its submission until the tick in which a finishes,
    # when it starts on a's machines while a publishes its last checkpoint (a warm start).
    assert runs["c"].started_h == pytest.approx(2.0)
    assert runs["c"].waited_h == pytest.approx(1.5)
    for run in runs.values():
        assert run.cost_usd == pytest.approx(run.held_machine_h * PRICE)
        assert run.held_machine_h == pytest.approx(run.trained_h + 0.1)  # one changeover
    assert outcome.by("team")["vision"]["longest_wait_h"] == pytest.approx(1.5)
    assert outcome.hours == pytest.approx(4.1)  # until every run finished
    # Without a market machine to spare in that tick, c waits for the next one.
    market = Trace("two machines", 360, (2,) * 60)
    short = _by_name(queue_replay.replay(_setup(
        {"name": "a", "work_h": 2}, {"name": "b", "team": "speech", "work_h": 4},
        {"name": "c", "work_h": 1, "submitted_h": 0.5}), market))  # fmt: skip
    assert short["c"].started_h == pytest.approx(2.1)


def test_a_higher_priority_run_preempts_the_latest_lower_one_which_resumes_where_it_was() -> None:
    outcome = queue_replay.replay(_setup(
        {"name": "old", "work_h": 5}, {"name": "new", "work_h": 5, "submitted_h": 0.1},
        {"name": "promised", "work_h": 5, "deadline": True, "submitted_h": 0.2},
        {"name": "urgent", "team": "speech", "priority": 9, "work_h": 1, "submitted_h": 1},
        ceiling=576), gap_s=360)  # fmt: skip
    runs = _by_name(outcome)
    # `promised` has a deadline and was submitted last: `new` is preempted instead.
    assert [r.preemptions for r in (runs["old"], runs["new"], runs["promised"])] == [0, 1, 0]
    assert runs["urgent"].started_h == pytest.approx(1.0)
    assert runs["new"].trained_h == pytest.approx(5.0)  # its progress kept
    # urgent's changeover and hour, but for the tick in which it finishes (a warm start)
    assert runs["new"].waited_h == pytest.approx(1.0)
    assert runs["new"].held_machine_h == pytest.approx(5.2)  # two starts: two changeovers
    assert outcome.by("priority")[9]["mean_wait_h"] == 0


def test_a_team_at_its_budget_waits_and_the_other_teams_run_goes_on() -> None:
    budget = 1.5 * PRICE  # an hour and a half of one machine
    setup = _setup({"name": "first", "work_h": 1}, {"name": "second", "work_h": 1},
                   {"name": "third", "work_h": 1},
                   {"name": "theirs", "team": "speech", "work_h": 1, "submitted_h": 2},
                   ceiling=192)  # fmt: skip
    setup = queue_replay.QueueSetup(**{**vars(setup), "teams": (
        queue_replay.Team(name="vision", gpus=16, monthly_budget_usd=budget),
        queue_replay.Team(name="speech", gpus=16))})  # fmt: skip
    outcome = queue_replay.replay(setup, hours=10, gap_s=360)
    runs = _by_name(outcome)
    # One machine at a time: `second` starts within the budget (a started run keeps its
    # machines); once it is spent, `third` waits and the other team's run goes first.
    assert runs["second"].started_h == pytest.approx(1.0)  # a warm start on the first's
    assert runs["theirs"].started_h == pytest.approx(2.0)  # at its submission, on second's
    assert runs["third"].started_h is None and runs["third"].waited_h == pytest.approx(10)
    assert outcome.by("team")["vision"]["finished"] == 2


def test_the_market_reclaims_the_last_started_gang_and_a_partial_gang_never_starts() -> None:
    # Three machines, then one for two hours, then three again.
    market = Trace("market", 360.0, (3,) * 10 + (1,) * 20 + (3,) * 30)
    outcome = queue_replay.replay(_setup(
        {"name": "pair", "machines": 2, "work_h": 3},
        {"name": "single", "work_h": 3, "submitted_h": 0.1}, ceiling=1000), market)  # fmt: skip
    runs = _by_name(outcome)
    # One machine left: both gangs are reclaimed, and the single run starts again on it while
    # the pair, whose gang is not there, waits holding nothing (never half a gang, billed).
    assert (runs["pair"].reclaims, runs["single"].reclaims) == (1, 1)
    assert (runs["pair"].waited_h, runs["single"].waited_h) == (pytest.approx(2.0), 0)
    assert runs["pair"].held_machine_h == pytest.approx(2 * (1.0 + 0.1 + 2.1))
    assert runs["pair"].finished_h == pytest.approx(5.2)
    assert outcome.machine_h_available == pytest.approx(3 * 1 + 1 * 2 + 3 * 2.2)  # to 5.2 h


def test_bad_queue_files_list_every_problem_and_the_command_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(CostInputError) as error:
        queue_replay.parse({"region": "", "vcpu_ceilings": {"spot/Q": -1}, "colour": 1,
                            "runs": [{"name": "x", "instance_type": "p9", "machines": 0,
                                      "work_h": 1, "team": "nlp", "priority": "high",
                                      "deadline": "yes"}],
                            "teams": [{"name": "vision", "gpus": -2},
                                      {"name": "audio", "gpus": "many"}]})  # fmt: skip
    said = str(error.value)
    for problem in ("'colour' is not a setting", "region is ''", "names 'spot/Q'",
                    "'spot/Q' is -1", "gpus = -2", "'p9' is not a GPU type",
                    "machines is 0", "team 'nlp' is not one of vision",
                    "priority is 'high'", "deadline is 'yes'", "gpus = 'many'"):  # fmt: skip
        assert problem in said, said
    queue = tmp_path / "queue.toml"
    queue.write_text(
        'region = "us-east-1"\n[vcpu_ceilings]\n"spot/P5" = 192\n'
        f'[[runs]]\nname = "a"\ninstance_type = "{P5}"\nmachines = 1\nwork_h = 1\n'
        f'[[runs]]\nname = "b"\ninstance_type = "{P5}"\nmachines = 1\nwork_h = 1\n'
    )
    assert cli.main(["cost", "queue", str(queue)]) == 0
    out = capsys.readouterr().out
    assert "priority 0: 2 of 2 finished" in out and "machine-hours paid for" in out
    assert cli.main(["cost", "queue", str(queue), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in document["runs"]] == ["a", "b"]
    # a's 1 h 15 in 10-minute ticks, less the tick it finishes in (b's warm start)
    assert document["runs"][1]["waited_h"] == pytest.approx(7 / 6)
    assert cli.main(["cost", "queue", str(ROOT / "examples" / "queue.toml")]) == 0
    assert "urgent" in capsys.readouterr().out  # the documented example runs
    queue.write_text("region = [")
    assert cli.main(["cost", "queue", str(queue)]) == 2
    assert "is not TOML" in capsys.readouterr().err
