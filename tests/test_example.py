"""The bring-your-own-model example (examples/train_llama.py): a Hugging Face Llama on DeepSpeed
ZeRO-2 with the Checkpointer, 2 ranks under plain torchrun, checkpoints in the local cloud (S3
with a KMS-only bucket policy, DynamoDB catalog). SIGTERM mid-run: it publishes and exits; a new
start resumes and its losses are those of a run that never stopped."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import create_catalog_table, kms_only_bucket, rest_of
from training import LLAMA_LOSSES, printed_losses

from spotrain.localcloud import control

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
REGION = "us-east-1"
STEPS = 8
UNINTERRUPTED = LLAMA_LOSSES[:STEPS]


def test_sigterm_mid_run_publishes_and_the_restart_resumes_with_the_same_losses(
    local_cloud: Any, tmp_path: Path
) -> None:
    s3 = control.client("s3", local_cloud.endpoint, REGION)
    dynamodb = control.client("dynamodb", local_cloud.endpoint, REGION)
    bucket, table = "example-checkpoints", "example-catalog"
    key = kms_only_bucket(s3, control.client("kms", local_cloud.endpoint, REGION), bucket)
    create_catalog_table(dynamodb, table)
    env = {**os.environ, **control.aws_environment(local_cloud.endpoint, REGION)}
    # docs/training.md's command: torchrun, as spotrain repairs it.
    command = [str(Path(sys.executable).parent / "spotrain-torchrun"),
               "--nproc-per-node", "2", str(ROOT / "examples" / "train_llama.py"),
               "--run-name", "llama", "--store", f"s3://{bucket}", "--catalog-table", table,
               "--kms-key-id", key, "--work-dir", str(tmp_path / "work"),
               "--steps", str(STEPS), "--checkpoint-every", "3", "--keep-last", "2"]  # fmt: skip

    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env, start_new_session=True)  # fmt: skip
    seen, deadline = [], time.monotonic() + 180
    assert first.stdout is not None
    for line in first.stdout:  # stop it once it has trained past its first checkpoint
        seen.append(line)
        if '"step": 4,' in line:
            first.send_signal(signal.SIGTERM)  # torchrun forwards it to both ranks
            break
        assert time.monotonic() < deadline, "".join(seen)[-3000:]
    rest = rest_of(first, timeout=180)
    output = "".join(seen) + rest
    stopped = re.search(r"stopped after step (\d+) \(SIGTERM\); it is published", output)
    assert stopped, output[-3000:]
    # A clean stop ends in one line, with the status a signal's stop gives, no traceback.
    assert first.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "spotrain-torchrun: stopped by SIGTERM" in output
    assert "Traceback" not in output, output[-3000:]
    stop = int(stopped[1])
    assert 4 <= stop < STEPS

    second = subprocess.run(command, capture_output=True, text=True, env=env, timeout=180)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert f"resumed llama at step {stop}" in second.stdout
    trained = {**printed_losses(output), **printed_losses(second.stdout)}
    assert sorted(trained) == list(range(1, STEPS + 1))
    assert [trained[step] for step in range(1, STEPS + 1)] == pytest.approx(UNINTERRUPTED,
                                                                            rel=1e-5)  # fmt: skip
    assert f"published step {STEPS}" in second.stdout  # the run's end, in the store
    # Retention: after each publish the two newest complete checkpoints are kept, older ones
    # collected (objects deleted, the catalog says so).
    items = dynamodb.scan(TableName=table)["Items"]
    statuses = {int(i["step"]["N"]): i["status"]["S"] for i in items if "status" in i}
    assert statuses == {3: "COLLECTED", stop: "COLLECTED", 6: "COMPLETE", STEPS: "COMPLETE"}
