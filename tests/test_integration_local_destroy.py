"""The shared deployment's end (tests/deployment.py), after every story on it: the local
cloud's clock runs the deployed schedule, destroy leaves nothing behind. (The second plan
ends test_integration_local_apply.py.)"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from deployment import ACCOUNT, MODULES, Local, after

from spotrain.core import handler_settings, spend_ledger
from spotrain.localcloud import control

pytestmark = pytest.mark.integration

EVERY_STORY = MODULES[:-1]  # every module before this one
TWO_RUNS = "test_two_runs_train_at_once_and_a_preempted_one_resumes_with_the_same_losses"


def test_the_deployed_schedule_takes_a_machine_started_by_hand_on_a_finished_run_back_to_0(
    local: Local, request: pytest.FixtureRequest
) -> None:
    """The local cloud keeps time: with its clock on, the deployed schedule's capacity check
    (nobody delivers it) takes a machine started by hand on a finished run (`second`, which
    the two-runs story trained to its end) back to 0 and counts its time. Its clock runs the
    check of every run of the environment: no story is running then."""
    if not any(item.name == TWO_RUNS for item in request.session.items):
        pytest.skip("needs the two-runs story, which trains `second` to its end")
    after(local, request, modules=EVERY_STORY)
    events = control.resource("dynamodb", local.cloud.endpoint, "us-east-1").Table(
        local.outputs["events_table"])  # fmt: skip
    group = local.outputs["runs"]["second"]["fleet_group"]
    counted = spend_ledger.read(events, "second")
    autoscaling = local.client("autoscaling")
    autoscaling.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=1)
    control.set_schedule_speedup(300)  # the 5-minute check every second
    handler = f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:spotrain-local-interruption-handler"
    ran = re.compile(rf"local cloud: schedule \S+ ran {handler}: exit 0")
    try:
        deadline = time.monotonic() + 120
        while True:
            [spot_group] = autoscaling.describe_auto_scaling_groups(
                AutoScalingGroupNames=[group])["AutoScalingGroups"]  # fmt: skip
            now_counted = spend_ledger.read(events, "second")
            if (spot_group["DesiredCapacity"] == 0
                    and (now_counted.as_of or 0) > (counted.as_of or 0)
                    and ran.search(Path(local.cloud.log).read_text())):  # fmt: skip
                break
            assert time.monotonic() < deadline, (spot_group, now_counted)
            time.sleep(0.5)
    finally:
        control.set_schedule_speedup(0)


def test_destroy_leaves_nothing_behind(local: Local, request: pytest.FixtureRequest) -> None:
    after(local, request, modules=EVERY_STORY)
    # What the stacks made, by name: the cloud's own (its state bucket) stays.
    regions = local.config.region_names
    aliases = [f"alias/spotrain-local-data-{r}" for r in regions] + ["alias/spotrain-local-alerts"]
    keys = {}
    for region in regions:
        kms = local.client("kms", region)
        for alias in aliases:
            try:
                keys[alias] = (region, kms.describe_key(KeyId=alias)["KeyMetadata"]["KeyId"])
            except ClientError:
                continue
    assert len(keys) == 3
    # Destroy does not read every resource back first (`-refresh=false`, a walk of each stack
    # fewer): what someone deleted by hand is deleted again, which AWS answers "not found"
    # and the provider takes as done.
    local.client("logs").delete_log_group(logGroupName=local.outputs["machine_log_group"])
    declaration = handler_settings.run_parameter_name(local.config.name, "second")
    local.client("ssm").delete_parameter(Name=declaration)

    local.deployment.destroy()

    prefix = local.config.bucket_prefix
    buckets = {b["Name"] for b in local.client("s3").list_buckets()["Buckets"]}
    state_bucket = local.config.state.bucket  # type: ignore[union-attr]  # bootstrap, kept
    assert {b for b in buckets if b.startswith(prefix)} == {state_bucket}
    for region in regions:  # every region's tables, fleets and repositories
        tables = local.client("dynamodb", region).list_tables()["TableNames"]
        assert [t for t in tables if t.startswith("spotrain-local-")] == [], region
        groups = local.client("autoscaling", region).describe_auto_scaling_groups()[
            "AutoScalingGroups"]  # fmt: skip
        assert [g for g in groups if g["AutoScalingGroupName"].startswith("spotrain-local-")
                ] == [], region  # fmt: skip
        repositories = local.client("ecr", region).describe_repositories()["repositories"]
        assert [r for r in repositories if r["repositoryName"].startswith("spotrain-local/")
                ] == [], region  # fmt: skip
    budgets = local.client("budgets").describe_budgets(AccountId=ACCOUNT).get("Budgets", [])
    assert [b for b in budgets if b["BudgetName"].startswith("spotrain-local-")] == []
    for region in regions:  # every region's handler, network and declarations
        functions = local.client("lambda", region).list_functions()["Functions"]
        assert [f for f in functions if f["FunctionName"].startswith("spotrain-local-")] == []
        events = local.client("events", region)
        assert events.list_rules(NamePrefix="spotrain-local-")["Rules"] == [], region
        queues = local.client("sqs", region).list_queues(QueueNamePrefix="spotrain-local-")
        assert queues.get("QueueUrls", []) == [], region
        vpcs = local.client("ec2", region).describe_vpcs()["Vpcs"]
        assert [v for v in vpcs if not v["IsDefault"]] == [], region
        declared = local.client("ssm", region).get_parameters_by_path(
            Path="/spotrain/local/runs")["Parameters"]  # fmt: skip
        assert declared == [], region
    for region, key_id in keys.values():
        state = local.client("kms", region).describe_key(KeyId=key_id)["KeyMetadata"]["KeyState"]
        assert state == "PendingDeletion"
    for role in ("spotrain-local-replication", "spotrain-local-replication-us-west-2",
                 "spotrain-local-interruption-handler",
                 "spotrain-local-interruption-handler-us-west-2"):  # fmt: skip
        with pytest.raises(ClientError):
            local.client("iam").get_role(RoleName=role)
