"""Every runbook's `bash` blocks run, in order, in one shell against the local cloud, after the
test arranges the runbook's symptom; then the outcome is checked. A runbook that drifts from
the code fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import create_catalog_table, kms_only_bucket

from spotrain import catalog_schema as schema
from spotrain.localcloud import control
from spotrain.trainer import checkpoint
from spotrain.trainer.catalog import DynamoCatalog
from spotrain.trainer.manifest import Manifest, manifest_key, shard_key
from spotrain.trainer.storage import open_storage

pytestmark = pytest.mark.integration

RUNBOOKS = Path(__file__).resolve().parents[1] / "runbooks"
REGION = "us-east-1"


def bash_blocks(runbook: Path) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", runbook.read_text(), flags=re.DOTALL)


def run_runbook(runbook: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = "set -euo pipefail\n" + "\n".join(bash_blocks(runbook))
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=300,
        env={**os.environ, **env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )  # fmt: skip


class Run:
    """A run with published checkpoints at steps 10, 20, 30 on the local cloud."""

    def __init__(self, cloud: control.RunningCloud, name: str, tmp_path: Path) -> None:
        self.name = name
        s3 = control.client("s3", cloud.endpoint, REGION)
        self.dynamodb = control.client("dynamodb", cloud.endpoint, REGION)
        bucket, table = f"runbook-{name}", f"runbook-{name}-catalog"
        key = kms_only_bucket(s3, control.client("kms", cloud.endpoint, REGION), bucket)
        create_catalog_table(self.dynamodb, table)
        self.storage = open_storage(f"s3://{bucket}", kms_key_id=key, client=s3)
        self.catalog = DynamoCatalog(table, name, client=self.dynamodb)
        generation = self.catalog.acquire_lease("trainer")
        for step in (10, 20, 30):
            folder = tmp_path / f"step{step}"
            (folder / f"step_{step:09d}").mkdir(parents=True)
            (folder / f"step_{step:09d}" / "model.pt").write_bytes(os.urandom(40_000))
            (folder / "latest").write_text(f"step_{step:09d}")
            checkpoint.publish(
                folder, storage=self.storage, catalog=self.catalog, generation=generation,
                run=name, step=step, world_size=2, zero_stage=2, config_hash="c0ffee",
                code_version="test",
            )  # fmt: skip
        self.env = {**control.aws_environment(cloud.endpoint, REGION), "RUN": name,
                    "STORE": f"s3://{bucket}", "CATALOG": table, "KMS_KEY": key}  # fmt: skip

    def statuses(self) -> dict[int, str]:
        return {e.step: e.status for e in self.catalog.entries()}


def damage_head(run: Run) -> dict[str, str]:
    manifest = Manifest.from_json(run.storage.get_bytes(manifest_key(run.name, 30)))
    shard = manifest.shards[-1]
    run.storage.delete([shard_key(run.name, shard.sha256)])  # a lifecycle rule gone wrong
    return {}


def check_corrupted(run: Run, result: subprocess.CompletedProcess[str]) -> None:
    assert "head is step 30" in result.stdout and "head intact: no" in result.stdout
    assert "step 30 quarantined" in result.stdout
    assert "restored step 20" in result.stdout
    assert run.statuses()[30] == schema.STATUS_QUARANTINED


def spike_after_step_10(run: Run) -> dict[str, str]:
    return {"GOOD_STEP": "10"}


def check_rolled_back(run: Run, result: subprocess.CompletedProcess[str]) -> None:
    assert "head of roll-back is step 10; rolled back [20, 30]" in result.stdout
    assert run.catalog.head().step == 10  # type: ignore[union-attr]
    assert run.statuses() == {10: schema.STATUS_COMPLETE, 20: schema.STATUS_ROLLED_BACK,
                              30: schema.STATUS_ROLLED_BACK}  # fmt: skip


SCENARIOS: dict[str, tuple[Callable[[Run], dict[str, str]], Callable[[Run, Any], None]]] = {
    "corrupted-checkpoint": (damage_head, check_corrupted),
    "roll-back": (spike_after_step_10, check_rolled_back),
}


def test_every_runbook_is_exercised() -> None:
    written = {p.stem for p in RUNBOOKS.glob("*.md") if p.name != "README.md"}
    assert written == set(SCENARIOS)
    for name in written:
        assert bash_blocks(RUNBOOKS / f"{name}.md"), f"{name} has no commands to run"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_runbook_commands_work_on_the_local_cloud(
    name: str, local_cloud: control.RunningCloud, tmp_path: Path
) -> None:
    arrange, check = SCENARIOS[name]
    run = Run(local_cloud, name, tmp_path)
    extra = arrange(run)
    result = run_runbook(RUNBOOKS / f"{name}.md", {**run.env, **extra})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    check(run, result)
