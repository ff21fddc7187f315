"""A run's cost report: figures hand-computed for a scripted run, written by the parts that
write them in a deployment (the trainer's catalog, the handler's ledger, history and marks)
and read back by `spotrain cost report`. The local cloud's version runs in the spend cap test
(tests/test_spend_ledger.py) and after the fleet rehearsal
(tests/test_integration_local_apply.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest

from spotrain import cli
from spotrain.core import fleet_state, spend_ledger
from spotrain.core.catalog_schema import INSTANCE_STATUS_INTERRUPTING
from spotrain.core.manifest import Manifest
from spotrain.core.spend_ledger import CapNotice, Ledger
from spotrain.cost import run_report
from spotrain.trainer.catalog import DynamoCatalog
from spotrain.trainer.storage import LocalStorage

T0 = 1_800_000_000.0
RUN = "demo"
MACHINES = 2
STALL_S, UPLOAD_S = 1.0, 5.0
# (step, lease generation, published at T0 + s, parent step): 10 s a step throughout.
# Start 1 is warned at 3,500 s with no checkpoint after the warning; start 2 publishes an
# emergency checkpoint (520) after its warning at 6,150 s; start 3's 700 was rolled back.
CHECKPOINTS = [
    (100, 1, 1000, None), (200, 1, 2000, 100), (300, 1, 3000, 200),
    (400, 2, 5000, 300), (500, 2, 6000, 400), (520, 2, 6200, 500),
    (600, 3, 8000, 520), (700, 3, 9000, 600),
]  # fmt: skip
WARNINGS = [(3500, "i-first", "g5.xlarge#us-east-1a"), (6150, "i-second", "g5.xlarge#us-east-1b")]
LEDGER = Ledger(
    as_of=T0 + 9000, spend_usd=15.0, on_demand_usd=30.0,
    per_pool={"g5.xlarge#us-east-1a#spot": {"seconds": 20000, "spend_usd": 5, "on_demand_usd": 20},
              "g5.xlarge#us-east-1a#on-demand": {"seconds": 10000, "spend_usd": 10,
                                                 "on_demand_usd": 10}},
    cap_usd=25.0, notified=(50,),
)  # fmt: skip
PER_MACHINE_S = 15.0 / 30000


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(T0 + seconds, UTC).isoformat(timespec="milliseconds")


def _run_left_behind(client: Any, tmp_path: Path) -> None:
    """What the scripted run leaves in the tables, written as a deployment writes it."""
    catalog = DynamoCatalog("catalog", RUN, LocalStorage(tmp_path), client=client)
    generation = 0
    for step, start, at, parent in CHECKPOINTS:
        while generation < start:
            generation = catalog.acquire_lease(f"start-{start}")
        manifest = Manifest(
            run=RUN, step=step, shards=(), world_size=MACHINES, zero_stage=1, config_hash="c",
            code_version="v", created_at=_iso(at), parent=parent and f"{RUN}/step_{parent:09d}",
            extra={"timings": {"stall_s": STALL_S, "upload_s": UPLOAD_S, "machines": MACHINES}},
        )  # fmt: skip
        key = f"runs/{RUN}/checkpoints/step_{step:09d}/manifest-{step:016x}.json"
        catalog.publish(manifest, key, generation)
    catalog.roll_back(600, generation, "a loss spike after 600")
    table = boto3.resource("dynamodb").Table("catalog")
    # i-second marked itself first, from its metadata service (whose time is the stop, two
    # minutes after the warning); the handler's event, older, arrives after: the warning stands.
    fleet_state.mark_instance(table, RUN, "i-second", status=INSTANCE_STATUS_INTERRUPTING,
                              pool=WARNINGS[1][2], event_id="own", at=_iso(6150 + 120),
                              warned_at=_iso(6150))  # fmt: skip
    for at, instance, pool in WARNINGS:
        fleet_state.mark_instance(table, RUN, instance, status=INSTANCE_STATUS_INTERRUPTING,
                                  pool=pool, event_id=f"e-{instance}", at=_iso(at))  # fmt: skip
    assert spend_ledger.write(table, RUN, LEDGER, Ledger())
    for at, spent in ((3000, 5.0), (6000, 10.0), (9000, 15.0)):
        point = Ledger(as_of=T0 + at, spend_usd=spent, on_demand_usd=2 * spent)
        spend_ledger.record_point(table, RUN, point, retention_days=90)
    spend_ledger.record_notice(table, RUN, CapNotice(T0 + 8000, 50, 13.0, 25.0), 90)


def test_the_report_prices_preemptions_goodput_and_checkpoints_from_what_the_run_left(
    dynamo: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run_left_behind(dynamo, tmp_path)
    report = ["cost", "report", "--run", RUN, "--events-table", "catalog"]
    figure = tmp_path / "spend.png"
    assert cli.main([*report, "--catalog-table", "catalog", "--json", "--plot", str(figure)]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["saved_usd"] == 15.0 and found["saved"] == 0.5
    assert found["head_step"] == 600 and found["checkpoints"] == 7  # 700 was rolled back
    assert found["steps_per_hour"] == pytest.approx(360)
    # The lineage's 600 steps at 10 s on 2 machines, less 7 stalls of 1 s on each.
    assert found["productive_s"] == pytest.approx(600 * 10 * 2 - 7 * 2)
    assert found["goodput"] == pytest.approx((12000 - 14) / 30000)
    assert found["mean_stall_s"] == STALL_S and found["mean_upload_s"] == UPLOAD_S
    first, second = found["preemptions"]
    # Warned 500 s after step 300 was published: 50 more steps, lost; start 2 trained again
    # at 5000 - 5 (upload) - 100 steps x 10 s = 3,995 s.
    assert (first["reached_step"], first["resumed_from"], first["steps_lost"]) == (350, 300, 50)
    assert first["time_to_resume_s"] == pytest.approx(495)
    assert first["cost_usd"] == pytest.approx((50 * 10 + 495) * MACHINES * PER_MACHINE_S)
    # The emergency checkpoint (520) came after the warning: nothing lost.
    assert (second["reached_step"], second["resumed_from"], second["steps_lost"]) == (520, 520, 0)
    assert second["time_to_resume_s"] == pytest.approx(8000 - 5 - 800 - 6150)
    assert second["cost_usd"] == pytest.approx(1045 * MACHINES * PER_MACHINE_S)
    assert second["pools"] == ["g5.xlarge#us-east-1b"]
    assert [p["spend_usd"] for p in found["points"]] == [5.0, 10.0, 15.0]
    assert [(n["percent"], n["at"]) for n in found["notices"]] == [(50, T0 + 8000)]
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert cli.main([*report, "--catalog-table", "catalog"]) == 0
    text = capsys.readouterr().out
    assert "$15.00; $30.00 on on-demand prices: $15.00 saved (50%)" in text
    assert "goodput             40%" in text
    assert "i-first (g5.xlarge#us-east-1a): steps lost 50 (had reached 350), resumed from step " \
           "300 after 8.2 min, cost $0.99" in text  # fmt: skip
    assert "cap                 $25.00: 60% spent; notices: 50% at " in text

    # Without the catalog: the money, and what it cannot say.
    assert cli.main(report) == 0
    assert "no checkpoint catalog given (--catalog-table)" in capsys.readouterr().out


def test_a_run_that_left_nothing_is_one_message_naming_the_fix(
    dynamo: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["cost", "report", "--run", "nobody", "--events-table", "catalog",
            "--catalog-table", "catalog"]  # fmt: skip
    assert cli.main(argv) != 0
    err = capsys.readouterr().err
    assert "run 'nobody' left nothing in catalog or catalog: check the run's name" in err
    assert "Traceback" not in err


def test_a_start_not_yet_followed_by_another_has_no_resume_figures() -> None:
    checkpoints = [run_report.Checkpoint(100, 1, T0 + 1000, None, machines=1),
                   run_report.Checkpoint(200, 1, T0 + 2000, 100, machines=1)]  # fmt: skip
    found = run_report.build(
        RUN, ledger=LEDGER, points=[], notices=[], checkpoints=checkpoints, head_step=200,
        interruptions=[run_report.Interruption(T0 + 2500, "i-1", "p")],
    )  # fmt: skip
    (preemption,) = found.preemptions
    assert preemption.reached_step == 250 and preemption.resumed_from is None
    assert preemption.steps_lost is None and preemption.cost_usd is None
    assert "has not been followed by another one yet" in run_report.render(found)
    assert "not in these figures yet" not in run_report.render(found)  # counted past 200
    # Counted before the run's last checkpoint (its machines went on): the report says so.
    behind = run_report.build(
        RUN, ledger=replace(LEDGER, as_of=T0 + 1500), points=[], notices=[],
        checkpoints=checkpoints, head_step=200, interruptions=[],
    )  # fmt: skip
    assert "spend is counted to 2027-01-15 08:25:00 UTC, before the run's last checkpoint " \
        "(2027-01-15 08:33:20 UTC): the machine time after it is not in these figures yet" in (
        run_report.render(behind))  # fmt: skip


def test_a_start_warned_before_its_first_checkpoint_is_the_one_publishing_in_the_notice() -> None:
    """Warned at step 19 before any checkpoint: the emergency checkpoint (19, 10 s after the
    warning) is the stopped start's; the next start resumes from it and loses nothing."""
    checkpoints = [run_report.Checkpoint(19, 1, T0 + 10, None, upload_s=2, machines=3),
                   run_report.Checkpoint(25, 2, T0 + 40, 19, upload_s=2, machines=2),
                   run_report.Checkpoint(50, 2, T0 + 90, 25, upload_s=2, machines=2)]  # fmt: skip
    found = run_report.build(
        RUN, ledger=LEDGER, points=[], notices=[], checkpoints=checkpoints, head_step=50,
        interruptions=[run_report.Interruption(T0, "i-1", "p")],
    )  # fmt: skip
    (preemption,) = found.preemptions
    assert (preemption.reached_step, preemption.resumed_from, preemption.steps_lost) == (19, 19, 0)
    # Start 2 trains 2 s a step: it trained again at 40 - 2 (upload) - 6 x 2 = 26 s.
    assert preemption.time_to_resume_s == pytest.approx(26)


def test_the_progress_figure_marks_each_restart_and_preemption_over_the_steps(
    tmp_path: Path,
) -> None:
    """`spotrain run status --plot`: the scripted run's three starts (two restarts, at 300
    and 520) and two warnings (reached 350 and 520), its loss at each checkpoint."""
    checkpoints = [
        run_report.Checkpoint(step=step, generation=generation, published_at=T0 + at,
                              parent_step=parent, loss=10.0 / step)
        for step, generation, at, parent in CHECKPOINTS
    ]  # fmt: skip
    warnings = [run_report.Interruption(at=T0 + at, instance_id=instance, pool=pool)
                for at, instance, pool in WARNINGS]  # fmt: skip
    drawn = run_report.plot_progress(RUN, checkpoints, warnings, tmp_path / "progress.png")
    assert drawn == [
        "loss at each checkpoint", "restart (resumed from)", "preemption",
        "steps per hour (between checkpoints of one start)",
    ]  # fmt: skip
    # With each step's loss, as the Checkpointer records it with each checkpoint: drawn too.
    each_step = [replace(c, step_losses=((c.step - 1, 10.5 / c.step), (c.step, 10.0 / c.step)))
                 for c in checkpoints]  # fmt: skip
    assert run_report.plot_progress(RUN, each_step, warnings, tmp_path / "steps.png")[:2] == [
        "loss at each step", "loss at each checkpoint"]  # fmt: skip
    assert (tmp_path / "progress.png").stat().st_size > 0
    no_loss = [run_report.Checkpoint(step=c.step, generation=c.generation,
                                     published_at=c.published_at, parent_step=c.parent_step)
               for c in checkpoints]  # fmt: skip
    assert "loss at each checkpoint" not in run_report.plot_progress(
        RUN, no_loss, [], tmp_path / "no-loss.png")  # fmt: skip


def test_a_stale_writers_checkpoint_is_fenced_in_the_report_and_sets_no_pace(
    dynamo: Any, tmp_path: Path
) -> None:
    """The run moved after step 200 and trained on at 10 s a step; meanwhile the region it
    left published a step 300 of its own 100 s after its 200 (as replication delivers what a
    cut-off region accepted). That checkpoint is no progress: the report lists it FENCED and
    notes it, and neither the report's pace nor the handler's (the deadline policy's input)
    counts it (it would have read 100 steps in 100 s). The new epoch's leases count from 1
    again: its first start is not the old one's (200 -> 300 is the move's downtime, not 100
    steps in 3,000 s)."""
    from spotrain.core import catalog_schema as schema
    from spotrain.core.deadline_policy import read_throughput

    storage = LocalStorage(tmp_path)

    def publish(catalog: DynamoCatalog, generation: int, step: int, at: float,
                parent: int | None) -> None:  # fmt: skip
        manifest = Manifest(
            run=RUN, step=step, shards=(), world_size=1, zero_stage=1, config_hash="c",
            code_version="v", created_at=_iso(at), parent=parent and f"{RUN}/step_{parent:09d}",
        )  # fmt: skip
        key = f"runs/{RUN}/checkpoints/step_{step:09d}/manifest-{step + generation:016x}.json"
        catalog.publish(manifest, key, generation)

    old = DynamoCatalog("catalog", RUN, storage, client=dynamo)
    lease = old.acquire_lease("trainer at home")
    publish(old, lease, 100, 1000, None)
    publish(old, lease, 200, 2000, 100)
    [base] = [e for e in old.entries() if e.step == 200]
    moved = DynamoCatalog("catalog", RUN, storage, client=dynamo)
    moved.claim_move(base, by="test")
    generation = moved.acquire_lease("trainer after the move")
    publish(moved, generation, 300, 5000, 200)
    publish(moved, generation, 400, 6000, 300)
    stale = {**old._key(schema.checkpoint_sort_key(300)),
             "status": {"S": schema.STATUS_COMPLETE}, "step": {"N": "300"},
             "created_at": {"S": _iso(2100)}, "generation": {"N": str(lease)},
             "manifest": {"S": f"runs/{RUN}/checkpoints/step_{300:09d}/manifest-{0:016x}.json"},
             }  # fmt: skip
    dynamo.put_item(TableName="catalog", Item=stale)

    table = boto3.resource("dynamodb").Table("catalog")
    checkpoints, head = run_report.read_checkpoints(table, RUN)
    assert head == 400
    assert sorted((c.step, c.status) for c in checkpoints) == [
        (100, "COMPLETE"), (200, "COMPLETE"), (300, "COMPLETE"), (300, "FENCED"),
        (400, "COMPLETE")]  # fmt: skip
    report = run_report.build(RUN, ledger=Ledger(), points=[], notices=[], head_step=head,
                              checkpoints=checkpoints, interruptions=[])  # fmt: skip
    assert report.steps_per_hour == pytest.approx(360)
    assert report.checkpoints == 4  # 100, 200, 300 and 400: the head's lineage
    assert any("1 checkpoint(s) published after the run moved on" in n and "steps 300" in n
               for n in report.notes), report.notes  # fmt: skip
    assert read_throughput(table, RUN) == pytest.approx(360)


def test_a_move_between_regions_is_reported_with_its_changeover_and_replication_priced() -> None:
    """The run trained at home to step 250 and moved to us-west-2 from step 200 (250 had
    not replicated when the claim was made at 3,000 s); there it published 300 at 5,000 s
    and 400 at 6,000 s (10 s a step, 10 s uploads). The report lists the move: 50 steps lost,
    trained again 990 s after the claim (its first checkpoint less its upload and 100 steps
    at its pace), those seconds and the lost steps' at the run's price per machine-second.
    Every checkpoint's new bytes went from the region that published it to the other, at
    $0.02/GB both ways; without the environment's regions the bytes are shown unpriced."""
    from spotrain.core.run_epochs import Epoch, EpochId

    home, away = EpochId(0, "us-east-1"), EpochId(1, "us-west-2")
    epochs = [Epoch(home, None, None, _iso(0), "trainer"),
              Epoch(away, home, 200, _iso(3000), "handler")]  # fmt: skip
    made = [(100, 0, 1000, None), (200, 0, 2000, 100), (250, 0, 2500, 200),
            (300, 1, 5000, 200), (400, 1, 6000, 300)]  # fmt: skip
    checkpoints = [
        run_report.Checkpoint(step=step, generation=1, published_at=T0 + at, parent_step=parent,
                              upload_s=10.0, machines=2, epoch=epoch, sent_bytes=2_000_000_000)
        for step, epoch, at, parent in made
    ]  # fmt: skip
    found = run_report.build(RUN, ledger=LEDGER, points=[], notices=[], head_step=400,
                             checkpoints=checkpoints, interruptions=[], epochs=epochs,
                             regions=("us-east-1", "us-west-2"))  # fmt: skip
    [move] = found.moves
    assert (move.from_region, move.to_region, move.from_step, move.steps_lost) == (
        "us-east-1", "us-west-2", 200, 50)  # fmt: skip
    assert move.time_to_resume_s == pytest.approx(990)
    assert move.cost_usd == pytest.approx((50 * 10 + 990) * 2 * PER_MACHINE_S)
    assert found.replicated_bytes == 10_000_000_000
    assert found.replication_usd == pytest.approx(10 * 0.02)  # to the one other region
    text = run_report.render(found)
    assert "  moves               1" in text
    assert (f"us-east-1 -> us-west-2 from step 200: steps lost 50, trained again after "
            f"16.5 min, cost ${move.cost_usd:,.2f}; nothing sent (its checkpoint was "
            "replicated)") in text  # fmt: skip
    assert "replication         10.000 GB of new checkpoint bytes, each sent to every other " \
           "region: $0.20" in text  # fmt: skip
    unpriced = run_report.build(RUN, ledger=LEDGER, points=[], notices=[], head_step=400,
                                checkpoints=checkpoints, interruptions=[],
                                epochs=epochs)  # fmt: skip
    assert unpriced.replication_usd is None
    assert unpriced.as_json()["moves"][0]["time_to_resume_s"] == pytest.approx(990)
    assert "replication is not priced: give the run's --environment (its regions)" in (
        unpriced.notes)  # fmt: skip
