"""Preemption conformance: a run is interrupted at every dangerous point (SIGTERM and SIGKILL,
mid-save, mid-upload, between manifest and catalog, at a random moment; a spot notice from the
metadata service) and started again. Each time the resumed step is the run's published head,
nothing torn is restored, and the losses continue bit for bit those of a run never interrupted.

Failpoints (spotrain.trainer.failpoints) put the signal at an exact point; `sigkill` takes
torchrun and both ranks at once, like a lost machine.
"""

from __future__ import annotations

import random
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import create_catalog_table, kms_only_bucket
from training import TINY_MODEL, losses_of, prepare, train

from spotrain.core.catalog_schema import checkpoint_tag
from spotrain.core.manifest import Manifest, checkpoints_prefix
from spotrain.cost import planner
from spotrain.localcloud import control
from spotrain.localcloud.imds import LocalMetadataService
from spotrain.trainer.catalog import DynamoCatalog, StoreCatalog
from spotrain.trainer.failpoints import kill_launcher_and_workers
from spotrain.trainer.storage import LocalStorage, open_storage

pytestmark = pytest.mark.integration

STEPS, EVERY = 12, 3
LONG_STEPS = 48
"""How far the uninterrupted run goes: a run stopped by a spot notice may get past STEPS first
(steps take milliseconds here, the notice is polled), and its resume is compared up to here."""


def base(corpus: str) -> dict[str, Any]:
    return {"run": "conformance", "data": corpus, "micro_batch": 4, "model": TINY_MODEL,
            "steps": STEPS, "checkpoint_every": EVERY}  # fmt: skip


@pytest.fixture(scope="module")
def reference(corpus: str, tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """Losses of the run that nobody interrupts (LONG_STEPS of them; the learning rate does not
    depend on the run's length, so a run of STEPS has the first STEPS)."""
    folder = tmp_path_factory.mktemp("reference")
    run = train({**base(corpus), "steps": LONG_STEPS, "store": f"file://{folder / 'store'}"},
                folder, "reference")  # fmt: skip
    assert len(run.losses) == LONG_STEPS
    return run.losses


@pytest.fixture(scope="module")
def cloud_store(local_cloud: control.RunningCloud) -> dict[str, Any]:
    """A KMS-only bucket and a catalog table on the local cloud, and the environment to reach
    them."""
    region = "us-east-1"
    bucket, table = "conformance-checkpoints", "conformance-catalog"
    s3 = control.client("s3", local_cloud.endpoint, region)
    key = kms_only_bucket(s3, control.client("kms", local_cloud.endpoint, region), bucket)
    create_catalog_table(control.client("dynamodb", local_cloud.endpoint, region), table)
    return {
        "config": {"store": f"s3://{bucket}", "catalog_table": table, "kms_key_id": key},
        "env": control.aws_environment(local_cloud.endpoint, region),
    }


def head_step(config: dict[str, Any], env: dict[str, str]) -> int | None:
    if config.get("catalog_table"):
        client = control.client("dynamodb", env["AWS_ENDPOINT_URL"], env["AWS_REGION"])
        s3 = control.client("s3", env["AWS_ENDPOINT_URL"], env["AWS_REGION"])
        storage = open_storage(config["store"], client=s3)
        head = DynamoCatalog(config["catalog_table"], config["run"], storage, client=client).head()
    else:
        storage = LocalStorage(Path(config["store"].removeprefix("file://")))
        head = StoreCatalog(storage, config["run"]).head()
    return None if head is None else head.step


def resume_and_compare(
    config: dict[str, Any], interrupted: list[float], reference: list[float], tmp_path: Path,
    env: dict[str, str] | None = None,
) -> int:  # fmt: skip
    """Start the run again: it must resume at the published head and continue exactly.
    Returns the step it resumed at."""
    head = head_step(config, env or {})
    resumed = train(config, tmp_path, "resumed", env=env)
    if head is None:
        assert "resumed" not in resumed.output
    else:
        assert f"resumed {config['run']} at step {head}" in resumed.output, resumed.output[-3000:]
    kept = head or 0
    assert interrupted[:kept] + resumed.losses == reference[: config["steps"]]  # bit for bit
    return kept


# The dangerous points, in the order one run meets them: each start resumes from the head the
# previous one left and is interrupted at its own point, at the first checkpoint at least two
# periods later (so one checkpoint of its own is published before). A SIGTERM finishes the
# checkpoint in flight and publishes the step the run stopped after; a SIGKILL leaves the
# checkpoint before the one in flight as the head. The first is killed during its first upload:
# nothing was ever published, and the next start begins the run again.
FAILPOINTS_IN_TURN = ["after-shard-upload=sigkill", "after-snapshot=sigterm",
                      "after-shard-upload=sigterm", "before-catalog-publish=sigterm",
                      "after-snapshot=sigkill", "after-shard-upload=sigkill",
                      "before-catalog-publish=sigkill"]  # fmt: skip


def test_a_run_interrupted_at_each_failpoint_in_turn_resumes_each_time_from_its_published_head(
    corpus: str, reference: list[float], cloud_store: dict[str, Any], tmp_path: Path
) -> None:
    """Through the real path: S3 (KMS-only bucket) and the DynamoDB catalog on the local
    cloud. One run, started again after each interruption (several scenarios a start: each
    start is the previous scenario's resume)."""
    config = {**base(corpus), **cloud_store["config"], "run": "in-turn", "steps": LONG_STEPS}
    env = cloud_store["env"]
    s3 = control.client("s3", env["AWS_ENDPOINT_URL"], env["AWS_REGION"])
    storage = open_storage(config["store"], kms_key_id=config["kms_key_id"], client=s3)
    trained: dict[int, float] = {}  # step -> loss, as published: what the next start kept
    head: int | None = None
    for turn, failpoint in enumerate([*FAILPOINTS_IN_TURN, None]):
        at = EVERY if turn == 0 else ((head or 0) // EVERY + 2) * EVERY
        planned = {} if failpoint is None else {"SPOTRAIN_FAILPOINTS": f"{failpoint}@{at}"}
        started = train(config, tmp_path, f"turn-{turn}", env={**env, **planned},
                        check=failpoint is None)  # fmt: skip
        said = f"{failpoint}@{at}: " + started.output[-3000:]
        if head is None:
            assert "resumed" not in started.output, said
        else:
            assert re.search(rf"resumed in-turn at step {head}\b", started.output), said
        losses = {r["step"]: r["loss"] for r in started.records if "loss" in r}
        assert min(losses) == (head or 0) + 1, said
        if failpoint is None:
            kept = LONG_STEPS
        elif failpoint.endswith("sigkill"):
            assert started.returncode == -signal.SIGKILL, said
            kept = at - EVERY  # the save in flight was never published (0: none before)
            assert head_step(config, env) == (kept or None), said
        else:
            stopped = re.search(r"stopped after step (\d+) \(SIGTERM\); it is", started.output)
            assert stopped, said
            # The signal came during a checkpoint; that one and the emergency one publish.
            kept = int(stopped.group(1))
            assert kept >= at and head_step(config, env) == kept, said
        if failpoint == "before-catalog-publish=sigkill":
            # The unfinished publish left its manifest, but the catalog never named it.
            assert storage.list(f"{checkpoints_prefix('in-turn')}{checkpoint_tag(at)}/"), said
        trained.update({step: loss for step, loss in losses.items() if step <= kept})
        head = kept or None
    # Bit for bit: every step's loss, each from the start that published it.
    assert [trained[step] for step in sorted(trained)] == reference
    assert sorted(trained) == list(range(1, LONG_STEPS + 1))


def test_sigkill_at_a_random_moment_loses_only_unpublished_steps(
    corpus: str, reference: list[float], tmp_path: Path
) -> None:
    config = {**base(corpus), "store": f"file://{tmp_path / 'store'}", "checkpoint_every": 2}
    launch = prepare(config, tmp_path, "killed")
    process = subprocess.Popen(launch.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)  # fmt: skip
    kill_after = random.uniform(0.0, 1.5)
    deadline = time.monotonic() + 120
    while len(losses_of(launch.metrics)) < 3:
        assert process.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.05)
    time.sleep(kill_after)
    kill_launcher_and_workers(process.pid)  # the machine is gone
    process.wait(timeout=30)
    resumed_at = resume_and_compare(config, losses_of(launch.metrics), reference, tmp_path)
    print(f"killed {kill_after:.2f} s after step 3; resumed at step {resumed_at}")


def test_spot_interruption_notice_stops_the_run_before_any_signal(
    corpus: str, reference: list[float], tmp_path: Path
) -> None:
    with LocalMetadataService() as imds:
        config = {**base(corpus), "steps": 100_000, "store": f"file://{tmp_path / 'store'}",
                  "spot_notice_endpoint": imds.endpoint,
                  "spot_notice_poll_seconds": 0.2}  # fmt: skip
        launch = prepare(config, tmp_path, "noticed")
        process = subprocess.Popen(
            launch.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + 120
        while len(losses_of(launch.metrics)) < 2:
            assert process.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.02)
        imds.announce_interruption()
        output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output[-3000:]  # no signal: torchrun exits cleanly
    stopped = re.search(r"stopped after step (\d+) \(spot interruption notice: terminate", output)
    assert stopped, output[-3000:]
    assert head_step(config, {}) == int(stopped.group(1))
    assert int(stopped.group(1)) < LONG_STEPS, "the notice took too long to stop the run"
    resume_and_compare({**config, "steps": LONG_STEPS}, losses_of(launch.metrics), reference,
                       tmp_path)  # fmt: skip


def test_rebalance_recommendation_checkpoints_now_and_training_goes_on(
    corpus: str, reference: list[float], tmp_path: Path
) -> None:
    with LocalMetadataService() as imds:
        imds.recommend_rebalance()  # already there when training starts
        config = {**base(corpus), "store": f"file://{tmp_path / 'store'}",
                  "checkpoint_every": 1000, "spot_notice_endpoint": imds.endpoint,
                  "spot_notice_poll_seconds": 0.2}  # fmt: skip
        finished = train(config, tmp_path, "rebalanced")
    assert finished.losses == reference[:STEPS]
    published = [r["step"] for r in finished.records if r.get("event") == "published"]
    assert len(published) == 2 and published[0] < STEPS and published[1] == STEPS
    assert "checkpoint requested after step" in finished.output
    # The metrics file gives the cost planner the run's step time and checkpoint cost.
    seen = planner.measured(str(tmp_path / "rebalanced.jsonl"))
    assert (seen.steps, seen.checkpoints) == (STEPS, 2)
    assert seen.step_s is not None and seen.step_s > 0
    assert seen.checkpoint_s is not None and seen.checkpoint_s >= 0


def test_light_checkpoint_on_the_work_disk_resumes_a_crashed_run_without_the_store(
    corpus: str, reference: list[float], tmp_path: Path
) -> None:
    """Processes die (the machine stays): the restart resumes from the light checkpoint on the
    work disk, newer than anything published, and continues exactly."""
    config = {**base(corpus), "store": f"file://{tmp_path / 'store'}", "checkpoint_every": 1000,
              "light_every": 2, "work_dir": str(tmp_path / "work-disk")}  # fmt: skip
    crashed = train(config, tmp_path, "crashed", check=False,
                    env={"SPOTRAIN_FAILPOINTS": "after-light-seal=sigkill@6"})  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL, crashed.output[-3000:]
    assert head_step(config, {}) is None  # nothing was ever published
    resumed = train(config, tmp_path, "restarted")  # on the same work disk
    assert "restoring step 6 from this machine's light checkpoint" in resumed.output
    assert "resumed conformance at step 6 (light checkpoint)" in resumed.output
    assert crashed.losses[:6] + resumed.losses == reference[:STEPS]
    assert head_step(config, {}) == STEPS  # the run's end is published as a full checkpoint


def test_corrupt_head_is_passed_over_the_head_follows_and_the_run_goes_on(
    corpus: str, reference: list[float], cloud_store: dict[str, Any], tmp_path: Path
) -> None:
    """A shard of the newest checkpoint is damaged in the bucket: the restart says so, resumes
    from the one before, moves the catalog's head back to it (else its own next publish would be
    refused as not newer) and publishes to the end with the uninterrupted run's losses."""
    config = {**base(corpus), **cloud_store["config"], "run": "corrupt-head"}
    env = cloud_store["env"]
    first = train({**config, "steps": 2 * EVERY}, tmp_path, "first", env=env)
    assert head_step(config, env) == 2 * EVERY
    s3 = control.client("s3", env["AWS_ENDPOINT_URL"], env["AWS_REGION"])
    storage = open_storage(config["store"], kms_key_id=config["kms_key_id"], client=s3)
    client = control.client("dynamodb", env["AWS_ENDPOINT_URL"], env["AWS_REGION"])
    head = DynamoCatalog(config["catalog_table"], "corrupt-head", storage, client=client).head()
    manifest = Manifest.from_json(storage.get_bytes(head.manifest_key))  # type: ignore[union-attr]
    victim = next(s for s in manifest.shards if s.name.endswith("model_states.pt"))
    for key in victim.keys:  # bit rot in the bucket, past the store's write-once rule
        s3.put_object(Bucket=config["store"].removeprefix("s3://"), Key=key,
                      Body=b"\0" * victim.size, ServerSideEncryption="aws:kms",
                      SSEKMSKeyId=config["kms_key_id"])  # fmt: skip
    resumed = train(config, tmp_path, "resumed", env=env)
    assert f"skipped checkpoint step {2 * EVERY}: shard" in resumed.output
    assert f"head moved back from step {2 * EVERY} to {EVERY}" in resumed.output
    assert f"resumed corrupt-head at step {EVERY}" in resumed.output
    assert first.losses[:EVERY] + resumed.losses == reference[:STEPS]
    assert head_step(config, env) == STEPS
