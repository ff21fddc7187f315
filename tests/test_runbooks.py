"""Every runbook's `bash` blocks run, in order, in one shell against the local cloud, after the
test arranges the runbook's symptom; then the outcome is checked. A runbook that drifts from
the code fails here."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
from helpers import create_catalog_table, kms_only_bucket

from spotrain.core import catalog_schema as schema
from spotrain.core.manifest import Manifest
from spotrain.localcloud import control
from spotrain.trainer import checkpoint_store
from spotrain.trainer.catalog import DynamoCatalog, StaleWriter
from spotrain.trainer.storage import open_storage

pytestmark = pytest.mark.integration

RUNBOOKS = Path(__file__).resolve().parents[1] / "runbooks"
REGION = "us-east-1"
REPLICA_REGION = "us-west-2"


def bash_blocks(runbook: Path) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", runbook.read_text(), flags=re.DOTALL)


def run_runbook(runbook: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = "set -euo pipefail\n" + "\n".join(bash_blocks(runbook))
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=300,
        env={**os.environ, **env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )  # fmt: skip


class Run:
    """A run with published checkpoints at steps 10, 20, 30 on the local cloud, its fleet's
    groups (spot and on-demand fallback), fleet state table and budget. With `held_replica`,
    the bucket replicates to a replica region whose copy of step 30's new shard never
    arrives."""

    def __init__(
        self, cloud: control.RunningCloud, name: str, tmp_path: Path, *, held_replica: bool
    ) -> None:
        self.name, self.cloud = name, cloud
        s3 = control.client("s3", cloud.endpoint, REGION)
        self.dynamodb = control.client("dynamodb", cloud.endpoint, REGION)
        bucket, table = f"runbook-{name}", f"runbook-{name}-catalog"
        key = kms_only_bucket(s3, control.client("kms", cloud.endpoint, REGION), bucket)
        create_catalog_table(self.dynamodb, table, stream=True)
        if held_replica:  # the catalog is a global table, as deployed
            self.dynamodb.update_table(TableName=table, ReplicaUpdates=[
                {"Create": {"RegionName": REPLICA_REGION}}])  # fmt: skip
        self.events = f"runbook-{name}-events"
        create_catalog_table(self.dynamodb, self.events)  # fleet state uses the same keys
        replica = f"runbook-{name}-replica"
        if held_replica:
            replicate(cloud, bucket, replica)
        self.storage = open_storage(f"s3://{bucket}", kms_key_id=key, client=s3)
        self.catalog = DynamoCatalog(table, name, self.storage, client=self.dynamodb)
        self.folders = tmp_path / "published"
        generation = self.catalog.acquire_lease("trainer")
        for step in (10, 20, 30):
            if held_replica and step == 30:  # step 30's new shard has not replicated yet
                control.set_faults(replication_pending=[f"{bucket}/runs/{name}/shards/*"])
            self.publish(step, generation)
        self.groups = create_fleet_groups(cloud, name)
        self.budget = f"runbook-{name}-monthly"
        create_budget(cloud, self.budget)
        self.env = {**control.aws_environment(cloud.endpoint, REGION), "RUN": name,
                    "STORE": f"s3://{bucket}", "CATALOG": table, "KMS_KEY": key,
                    "EVENTS": self.events, "FLEET_GROUP": self.groups[0],
                    "ON_DEMAND_GROUP": self.groups[1], "BUDGET": self.budget,
                    "REPLICA_STORE": f"s3://{replica}", "REPLICA_REGION": REPLICA_REGION,
                    "SCRATCH": str(tmp_path / "scratch")}  # fmt: skip

    def publish(self, step: int, generation: int) -> None:
        """A checkpoint of `step` (one random file), as a trainer publishes it."""
        folder = self.folders / f"step{step}"
        (folder / f"step_{step:09d}").mkdir(parents=True)
        (folder / f"step_{step:09d}" / "model.pt").write_bytes(os.urandom(40_000))
        (folder / "latest").write_text(f"step_{step:09d}")
        checkpoint_store.publish(
            folder, storage=self.storage, catalog=self.catalog, generation=generation,
            run=self.name, step=step, world_size=2, zero_stage=2, config_hash="c0ffee",
            code_version="test",
        )  # fmt: skip

    def statuses(self) -> dict[int, str]:
        return {e.step: e.status for e in self.catalog.entries()}

    def desired(self, group: str) -> int:
        autoscaling = control.client("autoscaling", self.cloud.endpoint, REGION)
        found = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])
        return int(found["AutoScalingGroups"][0]["DesiredCapacity"])


def replicate(cloud: control.RunningCloud, bucket: str, replica: str) -> None:
    s3 = control.client("s3", cloud.endpoint, REGION)
    replica_s3 = control.client("s3", cloud.endpoint, REPLICA_REGION)
    replica_key = control.client("kms", cloud.endpoint, REPLICA_REGION).create_key()["KeyMetadata"][
        "Arn"
    ]
    replica_s3.create_bucket(
        Bucket=replica, CreateBucketConfiguration={"LocationConstraint": REPLICA_REGION}
    )
    for client, name in ((s3, bucket), (replica_s3, replica)):
        client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    s3.put_bucket_replication(
        Bucket=bucket,
        ReplicationConfiguration={
            "Role": "arn:aws:iam::123456789012:role/replication",
            "Rules": [{"ID": "runs", "Status": "Enabled", "Priority": 1,
                       "Filter": {"Prefix": "runs/"},
                       "DeleteMarkerReplication": {"Status": "Enabled"},
                       "Destination": {"Bucket": f"arn:aws:s3:::{replica}",
                                       "EncryptionConfiguration":
                                           {"ReplicaKmsKeyID": replica_key}}}],
        },
    )  # fmt: skip


def create_fleet_groups(cloud: control.RunningCloud, name: str) -> tuple[str, str]:
    """The fleet's spot group (lost: 0 machines) and its empty on-demand fallback group."""
    ec2 = control.client("ec2", cloud.endpoint, REGION)
    autoscaling = control.client("autoscaling", cloud.endpoint, REGION)
    image = control.stock_image(ec2)
    template = ec2.create_launch_template(
        LaunchTemplateName=f"runbook-{name}",
        LaunchTemplateData={"ImageId": image, "InstanceType": "g5.xlarge"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    groups = (f"runbook-{name}-fleet", f"runbook-{name}-fleet-on-demand")
    for group in groups:
        autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=group, MinSize=0, MaxSize=4, DesiredCapacity=0,
            AvailabilityZones=[f"{REGION}a"],
            LaunchTemplate={"LaunchTemplateId": template, "Version": "$Latest"},
        )  # fmt: skip
    return groups


def create_budget(cloud: control.RunningCloud, name: str) -> None:
    control.client("budgets", cloud.endpoint, REGION).create_budget(
        AccountId="123456789012",
        Budget={"BudgetName": name, "BudgetType": "COST", "TimeUnit": "MONTHLY",
                "BudgetLimit": {"Amount": "100.0", "Unit": "USD"}},
    )  # fmt: skip


def damage_head(run: Run) -> dict[str, str]:
    head = run.catalog.head()
    assert head is not None and head.step == 30
    manifest = Manifest.from_json(run.storage.get_bytes(head.manifest_key))
    shard = manifest.shards[-1]
    run.storage.delete(list(shard.keys))  # a lifecycle rule gone wrong
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


def fleet_lost(run: Run) -> dict[str, str]:
    """The run's machines are gone. Once the runbook gives the group capacity, the machines
    it launches resume and publish step 40 (a start of their own: a new lease)."""
    import threading

    Path(run.env["SCRATCH"]).mkdir(parents=True)

    def new_fleet_trains() -> None:
        deadline = time.monotonic() + 240
        while run.desired(run.groups[0]) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        if run.desired(run.groups[0]) > 0:
            run.publish(40, run.catalog.acquire_lease("a machine of the new fleet"))

    threading.Thread(target=new_fleet_trains, daemon=True).start()
    return {"WORKERS": "2"}


def check_new_fleet(run: Run, result: subprocess.CompletedProcess[str]) -> None:
    assert run.desired(run.groups[0]) == 2
    assert "step 30: all 2 files present and match their SHA-256" in result.stdout
    assert "restored step 30" in result.stdout
    # Verified by training, not by capacity: the wait saw the new fleet's checkpoint.
    assert "step 40 published: run restore-onto-new-fleet trains" in result.stdout


def primary_region_down(run: Run) -> dict[str, str]:
    Path(run.env["SCRATCH"]).mkdir(parents=True)
    there = control.client("dynamodb", run.cloud.endpoint, REPLICA_REGION)
    replica = DynamoCatalog(run.catalog.table_name, run.name, run.storage, client=there)
    deadline = time.monotonic() + 30
    while len(replica.entries()) < 3:  # the catalog replicated before the outage
        assert time.monotonic() < deadline, "the catalog's replica never caught up"
        time.sleep(0.05)
    control.set_faults(regions_down=[REGION])
    return {}


def check_replica_restore(run: Run, result: subprocess.CompletedProcess[str]) -> None:
    control.set_faults(regions_down=[], replication_pending=[])
    assert "newest replica checkpoint is incomplete" in result.stdout
    assert "passed over step 30" in result.stdout  # its shard never arrived
    assert f"run {run.name} moved to {REPLICA_REGION} (epoch 1) from step 20" in result.stdout
    assert "restored step 20" in result.stdout
    # The primary is back: its copy learns of the move, and its machines may not train.
    deadline = time.monotonic() + 30
    while len(run.catalog.chain()) < 2:
        assert time.monotonic() < deadline, "the move never reached the primary's copy"
        time.sleep(0.05)
    assert run.catalog.head().step == 20  # type: ignore[union-attr]  # the moved run's head
    with pytest.raises(StaleWriter, match=f"trains in {REPLICA_REGION} since epoch 1"):
        run.catalog.acquire_lease("a machine of the primary region, back")


def interruptions_in_every_pool(run: Run) -> dict[str, str]:
    from spotrain.core import fleet_state

    table = boto3.resource(
        "dynamodb", endpoint_url=run.cloud.endpoint, region_name=REGION,
        verify=run.cloud.ca_bundle, aws_access_key_id="local", aws_secret_access_key="local",
    ).Table(run.events)  # fmt: skip
    fleet_state.mark_instance(table, run.name, "i-0123456789abcdef0", status="INTERRUPTING",
                              pool="g5.xlarge#us-east-1a", event_id="e-1",
                              at="2026-11-21T12:00:00Z")  # fmt: skip
    fleet_state.set_short_since(table, run.name, time.time() - 900)
    return {"SHORTFALL": "1", "INSTANCE_TYPE": "g5.xlarge"}


def check_on_demand(run: Run, result: subprocess.CompletedProcess[str]) -> None:
    assert "i-0123456789abcdef0" in result.stdout and "INTERRUPTING" in result.stdout
    assert "short of spot capacity for" in result.stdout
    assert run.desired(run.groups[1]) == 1
    # The checked-in price book: g5.xlarge's prices with their date, or how to get them.
    assert "g5.xlarge us-east-1" in result.stdout or "spotrain prices refresh" in result.stdout


def over_budget(run: Run) -> dict[str, str]:
    autoscaling = control.client("autoscaling", run.cloud.endpoint, REGION)
    # The fleet group keeps its coordinator: its minimum is 1, as the stacks deploy it, and
    # the local cloud refuses what AWS refuses below it.
    autoscaling.update_auto_scaling_group(AutoScalingGroupName=run.groups[0], MinSize=1,
                                          DesiredCapacity=3)  # fmt: skip
    autoscaling.set_desired_capacity(AutoScalingGroupName=run.groups[1], DesiredCapacity=2)
    # The handler's checks counted the run's machines: $84 over four hours, $240 on on-demand.
    from spotrain.core import spend_ledger

    events = control.resource("dynamodb", run.cloud.endpoint, REGION).Table(run.env["EVENTS"])
    start, previous = time.time() - 4 * 3600, spend_ledger.Ledger()
    for hour in (1, 2, 3, 4):
        ledger = spend_ledger.Ledger(
            as_of=start + hour * 3600, spend_usd=21.0 * hour, on_demand_usd=60.0 * hour,
            per_pool={"g5.xlarge#us-east-1a#spot": {"seconds": 3 * 3600.0 * hour,
                      "spend_usd": 21.0 * hour, "on_demand_usd": 60.0 * hour}},
        )  # fmt: skip
        assert spend_ledger.write(events, run.name, ledger, previous)
        spend_ledger.record_point(events, run.name, ledger, retention_days=90)
        previous = ledger
    Path(run.env["SCRATCH"]).mkdir(exist_ok=True)  # as `mktemp -d` leaves it
    return {"KEEP": "1"}


def check_shrunk(run: Run, result: subprocess.CompletedProcess[str]) -> None:
    assert f"{run.budget}: limit 100.00 USD per monthly" in result.stdout
    assert f"run {run.name}: $84.00 spent, $240.00 on on-demand prices (65% saved)" in (
        result.stdout)  # fmt: skip
    assert f"run {run.name}: cost report" in result.stdout
    assert "$84.00; $240.00 on on-demand prices: $156.00 saved (65%)" in result.stdout
    assert "preemptions         0" in result.stdout and "goodput" in result.stdout
    assert (Path(run.env["SCRATCH"]) / "spend.png").stat().st_size > 0
    assert (run.desired(run.groups[0]), run.desired(run.groups[1])) == (1, 0)
    # Stopped within AWS's rules (minimum and desired together), then started again.
    assert f"{run.groups[0]}: desired capacity set to 0, minimum 0" in result.stdout
    assert f"{run.groups[0]}: desired capacity set to 1, minimum 1" in result.stdout


SCENARIOS: dict[str, tuple[Callable[[Run], dict[str, str]], Callable[[Run, Any], None]]] = {
    "corrupted-checkpoint": (damage_head, check_corrupted),
    "roll-back": (spike_after_step_10, check_rolled_back),
    "restore-onto-new-fleet": (fleet_lost, check_new_fleet),
    "region-down": (primary_region_down, check_replica_restore),
    "spot-capacity": (interruptions_in_every_pool, check_on_demand),
    "budget-alert": (over_budget, check_shrunk),
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
    try:
        run = Run(local_cloud, name, tmp_path, held_replica=name == "region-down")
        extra = arrange(run)
        result = run_runbook(RUNBOOKS / f"{name}.md", {**run.env, **extra})
    finally:
        control.set_faults(regions_down=[], replication_pending=[])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    check(run, result)


def test_run_env_prints_the_exports_of_the_regions_that_answer_during_an_outage(
    local_cloud: control.RunningCloud,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Where the region-down runbook starts: the primary does not answer, and `run env` still
    prints every name and the replica region's key, leaving the primary's key empty."""
    import shlex

    from spotrain import cli

    keys = {}
    for region in (REGION, REPLICA_REGION):
        kms = control.client("kms", local_cloud.endpoint, region)
        alias = f"alias/spotrain-local-data-{region}"
        with contextlib.suppress(kms.exceptions.AlreadyExistsException):
            kms.create_alias(AliasName=alias, TargetKeyId=kms.create_key()["KeyMetadata"]["KeyId"])
        keys[region] = kms.describe_key(KeyId=alias)["KeyMetadata"]["Arn"]
    for name, value in control.aws_environment(local_cloud.endpoint, REGION).items():
        monkeypatch.setenv(name, value)
    control.set_faults(regions_down=[REGION])
    try:
        assert cli.main(["run", "env", "local", "demo"]) == 0
    finally:
        control.set_faults(regions_down=[])
    said = capsys.readouterr()
    exported = dict(w.split("=", 1) for w in shlex.split(said.out)[1:])
    assert (exported["KMS_KEY"], exported["REPLICA_KMS_KEY"]) == ("", keys[REPLICA_REGION])
    assert exported["REPLICA_REGION"] == REPLICA_REGION and exported["CATALOG"]
    assert f"{REGION} does not answer" in said.err
