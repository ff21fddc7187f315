"""Training on DeepSpeed ZeRO with 2 ranks (torchrun, gloo): a run stopped after a checkpoint
and started again continues with exactly the losses of a run that never stopped, through a
folder and through the local cloud (S3 with a KMS-only bucket policy, DynamoDB catalog)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import training
from helpers import create_catalog_table, kms_only_bucket
from training import (
    GOLDEN_REL,
    TINY_BF16_LOSSES,
    TINY_CPU_ADAM_LOSSES,
    TINY_LOSSES,
    TINY_MODEL,
    TINY_WARMUP_COSINE_LOSSES,
    losses_of,
    prepare,
)

from spotrain.localcloud import control

pytestmark = pytest.mark.integration


def torchrun(
    config: dict[str, Any], tmp_path: Path, name: str, env: dict[str, str] | None = None
) -> list[float]:
    return training.train(config, tmp_path, name, env=env).losses


def roll_back(store: str, run: str, step: int, *extra: str, env: dict[str, str] | None = None
              ) -> None:  # fmt: skip
    """`spotrain checkpoints rollback`: the run's head goes back to `step`, as an operator
    would move it; the next start resumes from there."""
    subprocess.run(
        [sys.executable, "-m", "spotrain.cli", "checkpoints", "rollback", "--store", store,
         "--run", run, "--step", str(step), "--reason", "replay the steps after it", *extra],
        capture_output=True, text=True, env={**os.environ, **(env or {})}, check=True,
    )  # fmt: skip


FITTED = {"activation_checkpointing": True, "offload_params": "cpu"}
"""Memory options that recompute or move the same numbers (DeepSpeed's activation
checkpointing, ZeRO-3's parameter offload): a run may switch them at a resume."""


@pytest.mark.parametrize(
    ("zero_stage", "bf16", "schedule", "golden", "first_part"),
    [(1, False, {}, TINY_LOSSES[:6], {}), (3, False, {}, TINY_LOSSES[:6], FITTED),
     (2, True, {}, TINY_BF16_LOSSES, {}),
     (2, False, {"warmup_steps": 2, "decay_steps": 3, "learning_rate": 1e-3},
      TINY_WARMUP_COSINE_LOSSES, {})],
    ids=["zero1", "zero3-first-part-fitted", "zero2-bf16", "zero2-warmup-cosine"],
)  # fmt: skip
def test_resumed_run_has_the_losses_of_an_uninterrupted_one(
    zero_stage: int, bf16: bool, schedule: dict[str, Any], golden: list[float],
    first_part: dict[str, Any], corpus: str, tmp_path: Path,
) -> None:  # fmt: skip
    """A run trains 6 steps uninterrupted, checkpointing at 3; its head is rolled back to step
    3 and it trains steps 4-6 again from that checkpoint, in a new process: the same losses,
    bit for bit (on the same machine), and no checkpoint had to allocate host buffers. At
    ZeRO-3 the first run recomputes activations and keeps parameters in host memory, the
    resumed one does neither. (ZeRO-2 in fp32 with a constant rate, the default, resumes
    through the local cloud below.)"""
    base = {"run": "demo", "data": corpus, "checkpoint_every": 3, "micro_batch": 4,
            "zero_stage": zero_stage, "bf16": bf16, "model": TINY_MODEL, "steps": 6,
            "store": f"file://{tmp_path / 'b'}", **schedule}  # fmt: skip
    started = training.train({**base, **first_part}, tmp_path, "uninterrupted")
    said = "memory: activations recomputed in the backward pass, parameters in host memory"
    assert (said in started.output) == bool(first_part)
    # Buffers for the state the first step creates were ready: no checkpoint allocated any.
    assert "published step 3" in started.output and "host buffers" not in started.output
    uninterrupted = started.losses
    assert uninterrupted == pytest.approx(golden, rel=GOLDEN_REL)
    roll_back(base["store"], "demo", 3)
    resumed = training.train(base, tmp_path, "resumed")
    assert "resumed demo at step 3" in resumed.output
    assert resumed.losses == uninterrupted[3:]  # bit for bit: floats compared exactly


@pytest.mark.cpu_adam
def test_optimizer_offload_trains_and_resumes_exactly(corpus: str, tmp_path: Path) -> None:
    """Optimizer offload steps with DeepSpeed's CPU Adam: a run of its own, resumed exactly
    (from step 3, with activations recomputed the second time), and on another number of
    ranks (switching it is a definition change: test_memory_options.py; switching the other
    options: the zero3 scenario above)."""
    on_host = {"run": "fit", "data": corpus, "checkpoint_every": 3, "micro_batch": 4,
               "model": TINY_MODEL, "zero_stage": 2, "offload_optimizer": "cpu",
               "store": f"file://{tmp_path / 'store'}"}  # fmt: skip
    first = training.train({**on_host, "steps": 6}, tmp_path, "host-first")
    assert "optimizer state in host memory (CPU Adam)" in first.output
    assert first.losses == pytest.approx(TINY_CPU_ADAM_LOSSES[:6], rel=GOLDEN_REL)
    roll_back(on_host["store"], "fit", 3)
    second = training.train({**on_host, "steps": 6, "activation_checkpointing": True}, tmp_path,
                            "host-second")  # fmt: skip
    assert "resumed fit at step 3" in second.output
    restored = [r for r in second.records if r.get("event") == "restored"]
    assert [r["step"] for r in restored] == [3] and restored[0]["fetch_s"] > 0
    assert second.losses == first.losses[3:]  # bit for bit
    # The fleet shrank to one rank: the host-held state converts like any other.
    one_rank = training.train({**on_host, "steps": 8}, tmp_path, "host-one-rank", nproc=1,
                              overrides=("micro_batch=8",), via_cli=True)  # fmt: skip
    assert "converted step 6 from 2 to 1 ranks" in one_rank.output
    assert one_rank.losses == pytest.approx(TINY_CPU_ADAM_LOSSES[6:8], rel=GOLDEN_REL)


def test_training_publishes_to_the_local_cloud_and_resumes_from_it(
    corpus: str, tmp_path: Path, local_cloud: control.RunningCloud
) -> None:
    """Through S3 (a KMS-only bucket) and the DynamoDB catalog: published, listed, rolled
    back by the operator's command, and resumed from the cloud bit for bit; the final
    checkpoint announced before it is published. The resume finds the checkpoint already
    restored into its restore folder, as a machine that moved the run leaves it (beside what
    a crashed start left): it fetches none of it again."""
    region = "us-east-1"
    s3 = control.client("s3", local_cloud.endpoint, region)
    bucket, table = "trainer-resume-test", "trainer-resume-test-catalog"
    key = kms_only_bucket(s3, control.client("kms", local_cloud.endpoint, region), bucket)
    create_catalog_table(control.client("dynamodb", local_cloud.endpoint, region), table)
    env = control.aws_environment(local_cloud.endpoint, region)
    base = {"run": "cloud", "data": corpus, "checkpoint_every": 2, "micro_batch": 4,
            "store": f"s3://{bucket}", "catalog_table": table, "kms_key_id": key,
            "model": TINY_MODEL, "steps": 4}  # fmt: skip
    uninterrupted = torchrun(base, tmp_path, "first", env)
    assert uninterrupted == pytest.approx(TINY_LOSSES[:4], rel=GOLDEN_REL)
    listing = subprocess.run(
        [sys.executable, "-m", "spotrain.cli", "checkpoints", "list", "--store", f"s3://{bucket}",
         "--run", "cloud", "--catalog-table", table],
        capture_output=True, text=True, env={**os.environ, **env}, check=True,
    ).stdout  # fmt: skip
    assert listing.splitlines()[-1].split()[0] == "4" and "<- head" in listing.splitlines()[-1]
    roll_back(f"s3://{bucket}", "cloud", 2, "--catalog-table", table, "--kms-key-id", key, env=env)
    from spotrain.trainer.run_checkpoints import RESTORE_FOLDER

    restored = tmp_path / "work-second" / RESTORE_FOLDER
    subprocess.run(
        [sys.executable, "-m", "spotrain.cli", "checkpoints", "restore", "--store",
         f"s3://{bucket}", "--run", "cloud", "--catalog-table", table, "--to", str(restored)],
        capture_output=True, text=True, env={**os.environ, **env}, check=True,
    )  # fmt: skip
    (restored / "universal").mkdir()  # a crashed start's conversion
    (restored / "universal" / "left").write_text("over")
    second = training.train(base, tmp_path, "second", env=env)
    assert second.losses == uninterrupted[2:]
    resumed = second.losses
    took = re.search(r"step 2: ([\d,]+) bytes taken from \S+'s earlier restore \(a move's "
                     r"check\), 0 fetched", second.output)  # fmt: skip
    assert took and int(took[1].replace(",", "")) > 0, second.output[-3000:]
    # Each step's loss is on the checkpoint records, for `run status --plot`.
    from spotrain.cost import run_report

    records = control.resource("dynamodb", local_cloud.endpoint, region).Table(table)
    checkpoints, head = run_report.read_checkpoints(records, "cloud")
    each_step = {step: loss for c in sorted(checkpoints, key=lambda c: (c.generation, c.step))
                 for step, loss in c.step_losses}  # fmt: skip
    assert head == 4 and each_step == dict(enumerate(uninterrupted[:2] + resumed, start=1))
    # Before its final checkpoint the run said it was publishing it (the handler's queue then
    # starts the next run on its machines: a warm start).
    from spotrain.core.catalog_schema import FINISHING_SORT_KEY, PARTITION_KEY, SORT_KEY, run_key

    announced = records.get_item(Key={PARTITION_KEY: run_key("cloud"),
                                      SORT_KEY: FINISHING_SORT_KEY})["Item"]  # fmt: skip
    assert (announced["step"], announced["epoch"], announced["region"]) == (4, 0, region)


def test_sigterm_stops_every_rank_after_one_step_publishes_it_and_resume_is_exact(
    corpus: str, tmp_path: Path
) -> None:
    import signal
    import time

    from spotrain.trainer.catalog import StoreCatalog
    from spotrain.trainer.storage import LocalStorage

    base = {"run": "demo", "data": corpus, "micro_batch": 4, "model": TINY_MODEL,
            "checkpoint_every": 1000, "store": f"file://{tmp_path / 'store'}"}  # fmt: skip
    started = prepare({**base, "steps": 100_000}, tmp_path, "preempted")
    command, metrics = started.command, started.metrics
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert process.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)  # torchrun forwards it to every rank
    output, _ = process.communicate(timeout=120)
    first = losses_of(metrics)
    stopped = len(first)
    assert f"stopped after step {stopped} (SIGTERM); it is published" in output
    head = StoreCatalog(LocalStorage(tmp_path / "store"), "demo").head()
    assert head is not None and head.step == stopped  # the emergency checkpoint, not an older one

    resumed = torchrun({**base, "steps": stopped + 3}, tmp_path, "resumed")
    # Where the signal lands depends on the machine's speed: the reference runs as far.
    reference = torchrun({**base, "steps": stopped + 3, "store": f"file://{tmp_path / 'ref'}"},
                         tmp_path, "reference")  # fmt: skip
    assert first + resumed == reference
    # The run's definition changed behind its back: the start is refused and names the change,
    # once, though an elastic launch (as on the fleet) would restart failed ranks: retrying
    # cannot help, and the machine is billed meanwhile. The reason is left for the boot script.
    changed = training.prepare({**base, "steps": stopped + 5, "learning_rate": 1e-3}, tmp_path,
                               "changed", via_cli=True)  # fmt: skip
    changed.command += ["--nnodes", "1:2", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
                        "--rdzv-id", "changed", "--rdzv-last-call", "1"]  # fmt: skip
    refused = subprocess.run(changed.command, capture_output=True, text=True, timeout=300)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0 and losses_of(changed.metrics) == [], output[-3000:]
    # Rank 0 chooses the checkpoint and refuses it, once: its group was not restarted.
    assert output.count("learning_rate: 0.0003 -> 0.001") == 1, output[-3000:]
    assert "set allow_config_change=true" in output
    note = tmp_path / "work-changed" / ".spotrain-failure"
    assert "learning_rate: 0.0003 -> 0.001" in note.read_text()
    head = StoreCatalog(LocalStorage(tmp_path / "store"), "demo").head()
    assert head is not None and head.step == stopped + 3  # nothing published was touched


def test_a_run_keeps_its_global_batch_as_its_machine_count_changes(
    corpus: str, tmp_path: Path
) -> None:
    """One rank, then two, then one again, its global batch left to the run: it keeps the one
    it started with (micro_batch 8 x 1 rank, TINY_LOSSES' batch), each rank taking its share
    in passes of at most micro_batch (gradient accumulation), the checkpoint converted to
    DeepSpeed's universal format at each change. Its losses are the uninterrupted run's up to
    float rounding."""
    base = {"run": "elastic", "data": corpus, "checkpoint_every": 4, "micro_batch": 4,
            "zero_stage": 2, "model": TINY_MODEL,
            "store": f"file://{tmp_path / 'store'}"}  # fmt: skip
    one = training.train({**base, "steps": 4, "micro_batch": 8}, tmp_path, "one", nproc=1,
                         via_cli=True)  # fmt: skip
    two = training.train({**base, "steps": 8}, tmp_path, "two", nproc=2)
    back = training.train({**base, "steps": 12}, tmp_path, "back", nproc=1, via_cli=True)
    assert "converted step 4 from 1 to 2 ranks" in two.output
    assert "resumed elastic at step 4" in two.output
    assert "converted step 8 from 2 to 1 ranks" in back.output
    assert "global batch 8 on 1 rank(s): 2 passes of 4 sequences a step" in back.output
    assert one.losses + two.losses + back.losses == pytest.approx(TINY_LOSSES[:12], rel=1e-5)
    assert back.losses != pytest.approx(one.losses, rel=1e-3)  # it did not start over


def test_two_machines_each_upload_their_shards_and_each_fetch_on_restore(
    corpus: str, tmp_path: Path
) -> None:
    """Two torchrun agents on one host play two machines (c10d rendezvous, separate work
    disks): each machine's leader uploads only its own shards, rank 0 publishes their union,
    and on restart each machine fetches the checkpoint for itself."""
    import socket

    base = {"run": "nodes", "data": corpus, "checkpoint_every": 2, "micro_batch": 4,
            "model": TINY_MODEL, "store": f"file://{tmp_path / 'store'}"}  # fmt: skip

    def two_machines(steps: int, name: str) -> list[training.Finished]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        launches = []
        for node in (0, 1):
            launch = training.prepare(
                {**base, "steps": steps}, tmp_path, f"{name}-{node}", nproc=1, via_cli=True,
                overrides=(f"work_dir={tmp_path / f'disk-{node}'}",),
            )  # fmt: skip
            launch.command += ["--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}",
                               "--rdzv-id", name]  # fmt: skip
            launches.append(launch)
        processes = [
            subprocess.Popen(
                launch.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            for launch in launches
        ]
        finished = []
        for process, launch in zip(processes, launches, strict=True):
            output, _ = process.communicate(timeout=300)
            assert process.returncode == 0, output[-3000:]
            records = training.records_of(launch.metrics)
            losses = [r["loss"] for r in records if "loss" in r]
            finished.append(training.Finished(losses, output, 0, records))
        return finished

    reference = training.train({**base, "steps": 4, "store": f"file://{tmp_path / 'ref'}"},
                               tmp_path, "reference")  # fmt: skip
    first = two_machines(2, "first")
    second = two_machines(4, "second")
    from spotrain.core.manifest import Manifest
    from spotrain.trainer.catalog import StoreCatalog
    from spotrain.trainer.storage import LocalStorage

    storage = LocalStorage(tmp_path / "store")
    head = StoreCatalog(storage, "nodes").head()
    assert head is not None and head.step == 4
    names = {s.name for s in Manifest.from_json(storage.get_bytes(head.manifest_key)).shards}
    assert {"step_000000004/rng_rank0.pt", "step_000000004/rng_rank1.pt"} <= names
    # each machine wrote only its own rank's files to its own disk; the manifest has both
    leader_output = first[0].output + second[0].output
    assert "resumed nodes at step 2" in leader_output
    losses = [r.losses for r in first + second if r.losses]
    assert losses[0] + losses[1] == reference.losses


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
