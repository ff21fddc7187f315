"""The real path: Terraform applies the `local` environment to the local cloud once for the
suite (tests/deployment.py); boto3 checks what exists over HTTP; then the stories on the
environment's own runs, in order. A user's own run: test_integration_local_users_repository.py
(on the other worker, beside these); the second plan, after these stories, ends this module;
destroy: test_integration_local_destroy.py; the cdktf CLI's own round trip: test_cdktf_cli.py.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from deployment import ACCOUNT, TRAINING_MACHINES, Local, after, alone

from spotrain.constructs.budget_alerts import ALERT_THRESHOLDS
from spotrain.constructs.interruption_handler.construct import HANDLER_ENTRY
from spotrain.core import resource_names as names
from spotrain.core.handler_settings import HandlerSettings
from spotrain.localcloud import control, faults
from spotrain.trainer import failpoints

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def test_applies_every_stack_of_the_environment(local: Local) -> None:
    names = [r.name for r in local.results]
    assert names[0] in ("local-budget", "local-storage")
    assert set(names) == {
        f"local-{p}" for p in ("storage", "catalog", "network", "network-us-west-2", "budget",
                               "interruptions", "interruptions-us-west-2", "run-demo",
                               "run-second")
    }  # fmt: skip
    assert sum(len(r.resources) for r in local.results) > 60


def test_checkpoint_buckets_are_private_versioned_and_kms_encrypted(local: Local) -> None:
    for bucket, region in (
        (local.primary_bucket, local.config.primary_region),
        (local.replica_bucket, local.config.replica_regions[0]),
    ):
        s3 = local.client("s3", region)
        rule = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"][
            "Rules"
        ][0]
        assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
        assert rule["BucketKeyEnabled"] is True
        assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
        block = s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]
        assert all(block.values())
        logging = s3.get_bucket_logging(Bucket=bucket)["LoggingEnabled"]
        assert logging["TargetBucket"] == f"{local.config.bucket_prefix}-access-logs-{region}"
        assert '"aws:SecureTransport"' in s3.get_bucket_policy(Bucket=bucket)["Policy"]


def test_replication_copies_a_checkpoint_from_each_region_to_the_other(local: Local) -> None:
    """Each region's bucket replicates to the other's: a run that moved publishes where it
    trains, and a move back must find that history at home."""
    config = local.config
    buckets = {config.primary_region: local.primary_bucket, config.replica_regions[0]:
               local.replica_bucket}  # fmt: skip

    def key_arn(region: str) -> str:
        alias = f"alias/{names.data_key_alias(config.name, region)}"
        return str(local.client("kms", region).describe_key(KeyId=alias)["KeyMetadata"]["Arn"])

    for source, destination in (tuple(buckets), tuple(reversed(buckets))):
        key = f"runs/{local.run.name}/step_000000001/shard-{uuid.uuid4().hex[:6]}"
        body = os.urandom(64 * 1024)
        # The bucket policy refuses puts that do not name the bucket's own key.
        local.client("s3", source).put_object(
            Bucket=buckets[source], Key=key, Body=body, ServerSideEncryption="aws:kms",
            SSEKMSKeyId=key_arn(source), IfNoneMatch="*",  # runs/ is written once
        )  # fmt: skip
        replica = local.client("s3", destination).get_object(Bucket=buckets[destination], Key=key)
        assert replica["Body"].read() == body
        assert replica["ReplicationStatus"] == "REPLICA"
        assert replica["SSEKMSKeyId"] == key_arn(destination)
        # A replica is not sent back: the source keeps its own copy, untouched.
        source_copy = local.client("s3", source).head_object(Bucket=buckets[source], Key=key)
        assert source_copy["ReplicationStatus"] == "COMPLETED"


def test_every_region_has_its_private_network_reaching_only_its_own_copies(local: Local) -> None:
    """A run may train in any region of its environment: each region's VPC is private, in
    the zones and range configured, and its gateway endpoints reach that region's bucket and
    tables only."""
    for region in local.config.regions:
        ec2 = local.client("ec2", region.name)
        [vpc] = [v for v in ec2.describe_vpcs()["Vpcs"] if not v["IsDefault"]]
        assert vpc["CidrBlock"] == region.vpc_cidr
        subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc["VpcId"]]}])
        assert sorted(s["AvailabilityZone"] for s in subnets["Subnets"]) == sorted(
            region.availability_zones
        )
        assert not any(s["MapPublicIpOnLaunch"] for s in subnets["Subnets"])
        attached = [{"Name": "attachment.vpc-id", "Values": [vpc["VpcId"]]}]
        assert ec2.describe_internet_gateways(Filters=attached)["InternetGateways"] == []
        gateways = {
            e["ServiceName"]: json.loads(e["PolicyDocument"])
            for e in ec2.describe_vpc_endpoints()["VpcEndpoints"]
            if e["VpcEndpointType"] == "Gateway"
        }
        reachable = {}
        for service in ("s3", "dynamodb"):
            policy = gateways[f"com.amazonaws.{region.name}.{service}"]
            listed = (r for st in policy["Statement"] for r in _listed(st["Resource"]))
            # (besides, for S3, the registry's own layer bucket: see the network construct)
            reachable[service] = {r for r in listed if service in r and "starport" not in r}
        bucket = names.checkpoint_bucket(local.config.bucket_prefix, region.name)
        assert reachable["s3"] == {f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"}
        assert {r.split(":")[3] for r in reachable["dynamodb"]} == {region.name}
        interfaces = {e["ServiceName"].removeprefix(f"com.amazonaws.{region.name}.")
                      for e in ec2.describe_vpc_endpoints()["VpcEndpoints"]
                      if e["VpcEndpointType"] == "Interface"}  # fmt: skip
        assert {"autoscaling", "logs", "ecr.api", "ecr.dkr"} <= interfaces


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def test_checkpoint_bucket_policy_is_enforced(local: Local) -> None:
    """Only puts encrypted with the bucket's own key: not unencrypted, not with another key,
    and not with `aws:kms` and no key named (S3 would use the AWS-managed key: the object
    would escape the key's access control and not replicate). The last is refused by
    `StringNotEqualsIfExists`: an absent key makes an ...IfExists condition hold."""
    s3, kms = local.client("s3"), local.client("kms")
    alias = f"alias/spotrain-local-data-{local.config.primary_region}"
    key = kms.describe_key(KeyId=alias)["KeyMetadata"]["Arn"]
    other = kms.create_key(Description="not the bucket's")["KeyMetadata"]["Arn"]
    for refused_put in (
        {},
        {"ServerSideEncryption": "aws:kms"},
        {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": other},
    ):
        with pytest.raises(ClientError) as refused:
            s3.put_object(Bucket=local.primary_bucket, Key="policy-probe", Body=b"x",
                          **refused_put)  # fmt: skip
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403, refused_put
    s3.put_object(Bucket=local.primary_bucket, Key="policy-probe", Body=b"x",
                  ServerSideEncryption="aws:kms", SSEKMSKeyId=key)  # fmt: skip
    # Under runs/ every write that creates an object must be conditional, whoever sends it:
    # what a run published is never overwritten. The steps of a multipart upload carry no
    # condition; its completion does.
    sse = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": key}
    published = f"runs/{local.run.name}/policy-probe-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=local.primary_bucket, Key=published, Body=b"x", **sse)
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    upload = s3.create_multipart_upload(Bucket=local.primary_bucket, Key=published, **sse)
    part = s3.upload_part(Bucket=local.primary_bucket, Key=published, PartNumber=1, Body=b"x",
                          UploadId=upload["UploadId"])  # fmt: skip
    parts = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
    with pytest.raises(ClientError) as refused:
        s3.complete_multipart_upload(
            Bucket=local.primary_bucket, Key=published, UploadId=upload["UploadId"],
            MultipartUpload=parts,
        )  # fmt: skip
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    s3.complete_multipart_upload(Bucket=local.primary_bucket, Key=published, IfNoneMatch="*",
                                 UploadId=upload["UploadId"], MultipartUpload=parts)  # fmt: skip
    with pytest.raises(ClientError) as refused:  # and once there, it stays as it is
        s3.put_object(Bucket=local.primary_bucket, Key=published, Body=b"y", IfNoneMatch="*",
                      **sse)  # fmt: skip
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412


def test_the_image_registry_is_encrypted_immutable_and_scans_every_push(local: Local) -> None:
    ecr = local.client("ecr")
    [repository] = ecr.describe_repositories(repositoryNames=["spotrain-local/trainer"])[
        "repositories"]  # fmt: skip
    assert repository["imageTagMutability"] == "IMMUTABLE"
    assert repository["imageScanningConfiguration"] == {"scanOnPush": True}
    key = local.client("kms").describe_key(KeyId=local.primary_key_alias)
    assert repository["encryptionConfiguration"] == {
        "encryptionType": "KMS", "kmsKey": key["KeyMetadata"]["Arn"]}  # fmt: skip
    assert local.outputs["image_repository"] == repository["repositoryUri"]
    policy = json.loads(ecr.get_lifecycle_policy(repositoryName="spotrain-local/trainer")[
        "lifecyclePolicyText"])  # fmt: skip
    assert policy["rules"][0]["selection"]["tagStatus"] == "untagged"


def test_catalog_tables_are_encrypted_global_tables_with_recovery_and_streams(
    local: Local,
) -> None:
    dynamodb = local.client("dynamodb")
    away = local.client("dynamodb", local.config.replica_regions[0])
    replica_key = local.client("kms", local.config.replica_regions[0]).describe_key(
        KeyId=f"alias/spotrain-local-data-{local.config.replica_regions[0]}"
    )["KeyMetadata"]["Arn"]
    for name in ("spotrain-local-checkpoints", "spotrain-local-events"):
        table = dynamodb.describe_table(TableName=name)["Table"]
        assert table["SSEDescription"]["SSEType"] == "KMS"
        assert table["StreamSpecification"]["StreamEnabled"] is True
        replica = {"RegionName": local.config.replica_regions[0], "ReplicaStatus": "ACTIVE",
                   "KMSMasterKeyId": replica_key}  # fmt: skip
        assert table["Replicas"] == [replica]
        there = away.describe_table(TableName=name)["Table"]
        assert there["SSEDescription"]["KMSMasterKeyArn"] == replica_key
        recovery = away.describe_continuous_backups(TableName=name)["ContinuousBackupsDescription"]
        assert recovery["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "ENABLED"
        backups = dynamodb.describe_continuous_backups(TableName=name)[
            "ContinuousBackupsDescription"
        ]
        assert backups["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "ENABLED"
    indexes = dynamodb.describe_table(TableName="spotrain-local-checkpoints")["Table"][
        "GlobalSecondaryIndexes"
    ]
    assert [i["IndexName"] for i in indexes] == ["lineage"]


def test_spot_fleet_is_deployed_empty_with_an_on_demand_coordinator(local: Local) -> None:
    group = local.client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=["spotrain-local-demo-fleet"]
    )["AutoScalingGroups"][0]
    assert group["CapacityRebalance"] is True
    policy = group["MixedInstancesPolicy"]
    distribution = policy["InstancesDistribution"]
    assert distribution["OnDemandBaseCapacity"] == 1
    assert distribution["OnDemandPercentageAboveBaseCapacity"] == 0
    assert distribution["SpotAllocationStrategy"] == "price-capacity-optimized"
    overrides = [o["InstanceType"] for o in policy["LaunchTemplate"]["Overrides"]]
    assert overrides == list(local.run.instance_types)
    # A run pays only while it trains: nothing runs until its configuration is stored.
    assert (group["MinSize"], group["DesiredCapacity"], group["Instances"]) == (0, 0, [])


def test_a_run_without_its_configuration_starts_no_machine_and_counts_no_crash(
    local: Local, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deployed handler's capacity check (its code, its deployed configuration) on a run
    whose training configuration is not stored yet: it waits, with the command that starts it,
    and its groups stay empty; `spotrain run list` shows it waiting."""
    from spotrain import cli
    from spotrain.core import fleet_state
    from spotrain.tools.rehearsal import deliver_capacity_check

    for name, value in control.aws_environment(local.cloud.endpoint, "us-east-1").items():
        monkeypatch.setenv(name, value)
    outputs = local.outputs
    runs = deliver_capacity_check(local.cloud, outputs["handler_function"], "us-east-1")["runs"]
    assert sorted(runs) == ["demo", "second"]  # one handler serves every run of its environment
    for result in runs.values():
        assert result["decision"] == "wait", result
        assert "`spotrain config put" in result["reason"], result
    fleets = [o["fleet_group"] for o in outputs["runs"].values()]
    groups = local.client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[*fleets, *(f"{f}-on-demand" for f in fleets)]
    )["AutoScalingGroups"]
    assert [(g["DesiredCapacity"], len(g["Instances"])) for g in groups] == [(0, 0)] * 4
    table = control.resource("dynamodb", local.cloud.endpoint, "us-east-1").Table(
        outputs["events_table"]
    )
    assert fleet_state.run_state(table, local.run.name).crashes == 0
    capsys.readouterr()
    assert cli.main(["run", "list", "local"]) == 0
    listed = capsys.readouterr().out
    assert re.search(r"^demo\s+waiting\s+step -", listed, re.M), listed
    assert re.search(r"^second\s+waiting\s+step -", listed, re.M), listed


def test_launch_template_requires_imdsv2_and_encrypts_volumes(local: Local) -> None:
    versions = local.client("ec2").describe_launch_template_versions(
        LaunchTemplateName="spotrain-local-demo-fleet", Versions=["$Latest"]
    )["LaunchTemplateVersions"]
    data = versions[0]["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    assert data["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] is True


def test_deployed_user_data_runs_and_writes_the_deployed_names(
    local: Local, tmp_path: Path
) -> None:
    """What a machine boots with is what Terraform deployed: the launch template's user data
    as the local cloud holds it, decoded and run (into a scratch root instead of /). The run
    has a fleet in every region of its environment: each machine writes to its own region's
    bucket with its own region's key, and reads the tables' copies there."""
    outputs, config = local.outputs, local.config
    for region in config.region_names:
        home = region == config.primary_region
        fleet = names.fleet_group(config.name, local.run.name, None if home else region)
        versions = local.client("ec2", region).describe_launch_template_versions(
            LaunchTemplateName=fleet, Versions=["$Latest"]
        )["LaunchTemplateVersions"]
        script = base64.b64decode(versions[0]["LaunchTemplateData"]["UserData"]).decode()
        root = tmp_path / region
        subprocess.run(["bash", "-c", script], env={**os.environ, "SPOTRAIN_ROOT": str(root)},
                       check=True, timeout=60)  # fmt: skip
        written = (root / "etc" / "spotrain" / "run.env").read_text().splitlines()
        settings = dict(line.split("=", 1) for line in written)
        alias = f"alias/{names.data_key_alias(config.name, region)}"
        key = local.client("kms", region).describe_key(KeyId=alias)["KeyMetadata"]
        assert settings == {
            "SPOTRAIN_RUN": local.run.name,
            "SPOTRAIN_REGION": region,
            "SPOTRAIN_BUCKET": outputs["checkpoint_buckets"][region],
            "SPOTRAIN_CATALOG_TABLE": outputs["checkpoint_catalog_table"],
            "SPOTRAIN_KMS_KEY_ID": key["Arn"],
            "SPOTRAIN_EVENTS_TABLE": outputs["events_table"],
            "SPOTRAIN_NNODES": f"{local.run.min_size}:{local.run.max_size}",
            "SPOTRAIN_RDZV_PORT": "29400",
            "SPOTRAIN_LOG_GROUP": names.machine_log_group(fleet),
            "SPOTRAIN_IMAGE": "",  # the run pins none: the image baked into the machine image
        }, region
        if not home:  # empty where the run does not train: a run pays only where it trains
            autoscaling = local.client("autoscaling", region)
            both = [fleet, names.on_demand_group(fleet)]
            groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=both)[
                "AutoScalingGroups"]  # fmt: skip
            assert [(g["MinSize"], g["DesiredCapacity"]) for g in groups] == [(0, 0), (0, 0)]


def _says_preempted(state: Any, *, by: str, place: int) -> None:
    """A preempted run's waiting reason names its place and the run that preempted it, in
    either of its two forms: the preempting check's own words, or, once a later check (another
    story's, delivered on the shared deployment meanwhile) has said the room it waits for,
    that room followed by who preempted it and when."""
    said = state.waiting_reason or ""
    preempting = f"#{place} in the queue: preempted by run {by} (priority 5 over its 0)"
    waiting = re.fullmatch(
        rf"#{place} in the queue: .+ \(preempted by run {re.escape(by)} at [^)]+\)", said
    )  # fmt: skip
    assert said.startswith(preempting) or waiting, said


def _declare_own_run(
    local: Local, declaration: Any, regions: tuple[str, ...],
    markets: dict[str, int] | None = None,
) -> None:  # fmt: skip
    """A story's own run, as a run's stack makes it: each group with its own launch template
    (of the run's first instance type, tagged with the environment and the run, so its
    machines are its and no other run's) and the declaration in every region of `regions`, to
    that region's handler. `markets`: the groups' `InstancesDistribution`, as a run's spot
    group has (its on-demand base the coordinator); None: a plain group."""
    from spotrain.core import catalog_schema as schema
    from spotrain.core.handler_settings import run_parameter_name

    config, run = local.config, declaration.run
    owner = ((schema.ENVIRONMENT_TAG, config.name), (schema.RUN_TAG, run))
    tags = [{"Key": key, "Value": value} for key, value in owner]
    for group in declaration.groups:
        image = local.client("ssm", group.region).get_parameter(
            Name=names.image_parameter(config.name))["Parameter"]["Value"]  # fmt: skip
        local.client("ec2", group.region).create_launch_template(
            LaunchTemplateName=group.name, LaunchTemplateData={
                "ImageId": image, "InstanceType": declaration.instance_types[0],
                "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}]})  # fmt: skip
        template = {"LaunchTemplateName": group.name, "Version": "$Latest"}
        launch: dict[str, Any] = (
            {"LaunchTemplate": template}
            if markets is None
            else {
                "MixedInstancesPolicy": {
                    "InstancesDistribution": markets,
                    "LaunchTemplate": {
                        "LaunchTemplateSpecification": template,
                        "Overrides": [{"InstanceType": t} for t in declaration.instance_types],
                    },
                }
            }
        )
        local.client("autoscaling", group.region).create_auto_scaling_group(
            AutoScalingGroupName=group.name, MinSize=0, MaxSize=2, DesiredCapacity=0,
            AvailabilityZones=[f"{group.region}a"], **launch,
            Tags=[{**tag, "PropagateAtLaunch": True} for tag in tags],
        )  # fmt: skip
    for region in regions:
        local.client("ssm", region).put_parameter(
            Name=run_parameter_name(config.name, run), Type="SecureString",
            Value=declaration.to_json(),
            KeyId=f"alias/{names.data_key_alias(config.name, region)}",
        )  # fmt: skip


def _redeclare(local: Local, run: str, change: Callable[[Any], Any]) -> dict[str, str]:
    """The run's declaration (a `RunDeclaration`) changed by `change` in each region whose
    handler it is declared to: the values its stack wrote, by region, for
    `_restore_declarations`."""
    from spotrain.core.capacity import RunDeclaration
    from spotrain.core.handler_settings import run_parameter_name

    name, before = run_parameter_name(local.config.name, run), {}
    for region in local.config.region_names:
        ssm = local.client("ssm", region)
        with contextlib.suppress(ssm.exceptions.ParameterNotFound):
            before[region] = ssm.get_parameter(Name=name, WithDecryption=True)["Parameter"][
                "Value"]  # fmt: skip
            changed = change(RunDeclaration.from_json(before[region], run=run))
            ssm.put_parameter(Name=name, Value=changed.to_json(), Overwrite=True)
    return before


def _restore_declarations(local: Local, run: str, before: dict[str, str]) -> None:
    from spotrain.core.handler_settings import run_parameter_name

    name = run_parameter_name(local.config.name, run)
    for region, value in before.items():
        local.client("ssm", region).put_parameter(Name=name, Value=value, Overwrite=True)


def _publish_final(local: Local, run: str, folder: Path, *, step: int) -> None:
    """The run's final checkpoint of `step`, published as its trainer publishes it at its last
    step (a story's run that trains nothing)."""
    from spotrain.trainer import checkpoint_store
    from spotrain.trainer.catalog import DynamoCatalog
    from spotrain.trainer.storage import open_storage

    outputs = local.outputs
    key = local.client("kms").describe_key(KeyId=local.primary_key_alias)["KeyMetadata"]["Arn"]
    storage = open_storage(f"s3://{outputs['checkpoint_bucket']}", kms_key_id=key)
    catalog = DynamoCatalog(outputs["checkpoint_catalog_table"], run, storage,
                            client=local.client("dynamodb"))  # fmt: skip
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"weights" * 64)
    checkpoint_store.publish(folder, storage=storage, run=run, catalog=catalog,
                             generation=catalog.acquire_lease("trainer"), step=step,
                             world_size=1, zero_stage=2, config_hash="c", code_version="v",
                             final=True)  # fmt: skip


def _remove_own_run(local: Local, declaration: Any, regions: tuple[str, ...]) -> None:
    """What `_declare_own_run` made, gone (the destroy test finds nothing left)."""
    from spotrain.core.handler_settings import run_parameter_name

    for group in declaration.groups:
        with contextlib.suppress(ClientError):
            local.client("autoscaling", group.region).delete_auto_scaling_group(
                AutoScalingGroupName=group.name, ForceDelete=True)  # fmt: skip
        with contextlib.suppress(ClientError):
            local.client("ec2", group.region).delete_launch_template(
                LaunchTemplateName=group.name)  # fmt: skip
    for region in regions:
        with contextlib.suppress(ClientError):
            local.client("ssm", region).delete_parameter(
                Name=run_parameter_name(local.config.name, declaration.run))  # fmt: skip


def test_a_run_that_moves_region_has_its_machines_follow_it_and_none_left_behind(
    local: Local, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Each region's deployed handler checks the run for its own region's groups: a run
    declared with groups in both regions (as every run's stack declares them, to each
    region's handler) starts at home; once its move to us-west-2 is claimed in the catalog,
    home's check empties home's groups and us-west-2's starts its own at their declared sizes
    (the run has just moved in); moved back, the other way. Neither handler ever scales the
    other region's groups, and a spot warning for a machine left behind is recorded by its
    region's handler, not requeued. The run is this test's own (its groups made here from the
    deployed templates), so the environment's runs are not moved."""
    from spotrain.core import catalog_schema as schema
    from spotrain.core import fleet_state, run_epochs
    from spotrain.core.capacity import CapacityGroup, RunDeclaration
    from spotrain.tools.rehearsal import deliver_capacity_check, deliver_interruption

    # The check of the environment's runs below sees this run too: after the test that
    # checks exactly which runs the handler serves.
    after(
        local, request, "test_a_run_without_its_configuration_starts_no_machine_and_counts_no_crash"
    )
    config, outputs, run = local.config, local.outputs, "roamer"
    home, away = config.region_names[:2]
    # The same function name in every region (Lambda names are regional), each its own.
    assert outputs["regions"][away]["handler_function"] == outputs["handler_function"]
    functions = {region: local.client("lambda", region).get_function_configuration(
        FunctionName=outputs["handler_function"]) for region in (home, away)}  # fmt: skip
    assert functions[home]["Role"] != functions[away]["Role"]
    assert functions[away]["KMSKeyArn"] == local.client("kms", away).describe_key(
        KeyId=f"alias/{names.data_key_alias(config.name, away)}")["KeyMetadata"]["Arn"]  # fmt: skip
    groups = {
        region: names.fleet_group(config.name, run, None if region == home else region)
        for region in (home, away)
    }
    declared = [
        group
        for region, spot in groups.items()
        for group in (
            CapacityGroup(name=spot, region=region, lifecycle="spot", holds_data=region == home,
                          min_size=1, desired=1),
            CapacityGroup(name=names.on_demand_group(spot), region=region,
                          lifecycle="on-demand", holds_data=region == home),
        )
    ]  # fmt: skip
    declaration = RunDeclaration(run=run, groups=tuple(declared), team="research",
                                 instance_types=("g5.xlarge",))  # fmt: skip
    try:
        _declare_own_run(local, declaration, (home, away))
        local.client("s3").put_object(
            Bucket=local.primary_bucket, Key=f"{schema.configs_prefix(run)}0001.json", Body=b"{}",
            ServerSideEncryption="aws:kms", SSEKMSKeyId=local.client("kms").describe_key(
                KeyId=local.primary_key_alias)["KeyMetadata"]["Arn"], IfNoneMatch="*",
        )  # fmt: skip

        def claim(number: int, region: str) -> None:
            """Claimed in `region`'s copy (as `spotrain checkpoints move` there does), and
            waited for in every other's."""
            epoch = run_epochs.Epoch(
                id=run_epochs.EpochId(number, region),
                base=run_epochs.EpochId(number - 1, home if number % 2 else away) if number
                else None, base_step=0 if number else None, claimed_by="test")  # fmt: skip
            keys = {schema.PARTITION_KEY: {"S": schema.run_key(run)},
                    schema.SORT_KEY: {"S": run_epochs.epoch_sort_key(number)}}  # fmt: skip
            local.client("dynamodb", region).put_item(
                TableName=outputs["checkpoint_catalog_table"], Item={**keys, **epoch.to_item()}
            )
            for other in (home, away):
                replicated(lambda other=other: "Item" in local.client("dynamodb", other).get_item(
                    TableName=outputs["checkpoint_catalog_table"], Key=keys))  # fmt: skip

        def sizes() -> dict[str, tuple[int, int]]:
            found = {}
            for group in declared:
                [g] = local.client("autoscaling", group.region).describe_auto_scaling_groups(
                    AutoScalingGroupNames=[group.name])["AutoScalingGroups"]  # fmt: skip
                found[group.name] = (g["MinSize"], g["DesiredCapacity"])
            return found

        def check(region: str) -> dict[str, Any]:
            return deliver_capacity_check(local.cloud, outputs["handler_function"], region, run)

        spot = {region: groups[region] for region in (home, away)}
        on_demand = {region: names.on_demand_group(spot[region]) for region in spot}
        claim(0, home)
        started = check(home)
        assert started["decision"] == "start", started
        assert check(away)["decision"] == "none"  # nothing of the run's in us-west-2
        assert sizes()[spot[home]] == (1, 1) and sizes()[spot[away]] == (0, 0)
        claim(1, away)  # `spotrain checkpoints move` in us-west-2
        left = check(home)
        assert left["decision"] == "follow-the-run" and f"trains in {away}" in left["reason"]
        assert sizes() == {spot[home]: (0, 0), on_demand[home]: (0, 0),
                           spot[away]: (0, 0), on_demand[away]: (0, 0)}  # fmt: skip
        arrived = check(away)
        assert arrived["decision"] == "follow-the-run", arrived
        assert "just moved in" in arrived["reason"], arrived
        assert sizes() == {spot[home]: (0, 0), on_demand[home]: (0, 0),
                           spot[away]: (1, 1), on_demand[away]: (0, 0)}  # fmt: skip
        for region in (home, away):  # nothing left behind: nothing to do
            assert check(region)["decision"] != "follow-the-run"
        # A machine of the run at home, as a stale group would have left it: its warning is
        # home's handler's (EventBridge delivers it there), recorded and not requeued.
        [instance] = local.client("ec2", home).run_instances(
            LaunchTemplate={"LaunchTemplateName": spot[home]}, MinCount=1, MaxCount=1,
            Placement={"AvailabilityZone": f"{home}a"})["Instances"]  # fmt: skip
        warned = deliver_interruption(local.cloud, outputs["handler_function"],
                                      instance["InstanceId"], home, lambda _: None)  # fmt: skip
        assert warned["decision"] == "none" and f"trains in {away}" in warned["reason"], warned
        local.client("ec2", home).terminate_instances(InstanceIds=[instance["InstanceId"]])
        claim(2, home)  # and back
        assert check(away)["decision"] == "follow-the-run"
        assert check(home)["decision"] == "follow-the-run"
        assert sizes()[spot[home]] == (1, 1) and sizes()[spot[away]] == (0, 0)
        # Home stops answering: us-west-2's handler, the run's next region, orders the move
        # there after three checks in a row and starts the run's groups (their machines claim
        # the run as they boot: test_checkpoint_store.py); home answers again before any did:
        # the order is withdrawn and the groups empty again.
        state = control.resource("dynamodb", local.cloud.endpoint, away).Table(
            outputs["events_table"])  # fmt: skip

        def away_sizes() -> tuple[int, int]:
            [g] = local.client("autoscaling", away).describe_auto_scaling_groups(
                AutoScalingGroupNames=[spot[away]])["AutoScalingGroups"]  # fmt: skip
            return g["MinSize"], g["DesiredCapacity"]

        control.set_faults(regions_down=[home])
        try:
            for count in (1, 2):
                waiting = check(away)
                assert waiting["decision"] == "none", waiting
                assert (
                    f"{home} has not answered {count} check(s) in a row: the run moves "
                    "here after 3" in waiting["reason"]
                ), waiting
            assert away_sizes() == (0, 0)
            moved = check(away)
            assert moved["decision"] == "fail-over", moved
            assert f"{home} has not answered for 3 checks" in moved["reason"], moved
            assert away_sizes() == (1, 1)
            # On-call's view meanwhile: `run status` answers from the region that does.
            from spotrain import cli

            for name, value in control.aws_environment(local.cloud.endpoint, home).items():
                monkeypatch.setenv(name, value)
            capsys.readouterr()
            assert cli.main(["run", "status", "local", run]) == 0
            said = capsys.readouterr()
            assert f"{home} does not answer" in said.err and run in said.out, said
            order = fleet_state.failover_state(state, run, away).move_order
            assert order is not None
            assert (order.from_epoch, order.from_region, order.to_region) == (2, home, away)
        finally:
            control.set_faults(regions_down=[])
        withdrawn = check(away)
        assert withdrawn["decision"] == "follow-the-run", withdrawn
        assert away_sizes() == (0, 0)
        assert fleet_state.failover_state(state, run, away).move_order is None
    finally:
        _remove_own_run(local, declaration, (home, away))


def test_the_deployed_queue_holds_runs_to_the_ceiling_and_budgets_and_preempts_by_priority(
    local: Local, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:  # fmt: skip
    """The environment's queue as deployed: the local environment holds P machines to two at
    once (`vcpu_ceilings`) and gives team speech a budget its first run's machine-seconds
    reach. Runs of one p4d.24xlarge each (their groups made here from their own templates,
    declared as a run's stack declares them), submitted with `spotrain config put`:

    - vision-a, speech-a, vision-b: the deployed handler's check starts the first two and
      keeps vision-b waiting with its place and reason, which `run list` shows; vision-a
      publishes its final checkpoint and the catalog's stream alone (no check) starts vision-b;
    - speech-a spends past its team's budget, then speech-b and vision-c are submitted and
      speech-a finishes: vision-c starts on its machines, speech-b waits for next month;
    - an urgent vision run (priority 5) preempts vision-c, the later of the two it could
      take from (its groups to 0, its sizes kept); when the urgent run finishes, vision-c gets
      them back.

    Other stories' runs are on G machines, which have no ceiling, and of other teams: a check
    they deliver meanwhile reaches the same decisions. A preempted run whose machine trains
    publishes before it goes and resumes with an uninterrupted run's losses: the two-runs
    story."""
    from spotrain import cli
    from spotrain.core import fleet_state, run_lifecycle, spend_ledger
    from spotrain.core.capacity import CapacityGroup, RunDeclaration
    from spotrain.core.resource_names import METRIC_NAMESPACE
    from spotrain.tools.rehearsal import deliver_capacity_check

    after(
        local, request, "test_a_run_without_its_configuration_starts_no_machine_and_counts_no_crash"
    )
    for name, value in control.aws_environment(local.cloud.endpoint, "us-east-1").items():
        monkeypatch.setenv(name, value)
    config, outputs = local.config, local.outputs
    store = f"s3://{outputs['checkpoint_bucket']}"
    events = control.resource("dynamodb", local.cloud.endpoint, "us-east-1").Table(
        outputs["events_table"])  # fmt: skip
    spot_group: dict[str, str] = {}
    declared: dict[str, Any] = {}
    teams = {"vision-a": "vision", "speech-a": "speech", "vision-b": "vision",
             "speech-b": "speech", "vision-c": "vision", "urgent": "vision"}  # fmt: skip
    runs = {name: f"queue-{name}" for name in teams}

    def declare(name: str, priority: int = 0) -> None:
        """Its own groups and template (tagged as its stack tags them) and its declaration."""
        run = runs[name]
        spot_group[name] = names.fleet_group(config.name, run)
        groups = (CapacityGroup(name=spot_group[name], region="us-east-1", lifecycle="spot",
                                holds_data=True, min_size=1, desired=1),
                  CapacityGroup(name=names.on_demand_group(spot_group[name]), region="us-east-1",
                                lifecycle="on-demand", holds_data=True))  # fmt: skip
        declared[name] = RunDeclaration(
            run=run, groups=groups, team=teams[name], priority=priority, gpus=8,
            vcpus={"spot/P": 96}, instance_types=("p4d.24xlarge",))  # fmt: skip
        _declare_own_run(local, declared[name], ("us-east-1",))

    def submit(*names_: str) -> None:
        for name in names_:
            document = tmp_path / f"{name}.json"
            document.write_text(json.dumps({
                **TWO_RUNS_TRAINING, "run": runs[name], "store": store, "steps": 20,
                "data": "/set/by/each/machine/tokens.bin", "work_dir": "/set/by/each/machine",
            }))  # fmt: skip
            assert cli.main(["config", "put", str(document), "--store", store]) == 0

    def desired(name: str) -> int:
        [group] = local.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[spot_group[name]])["AutoScalingGroups"]  # fmt: skip
        return int(group["DesiredCapacity"])

    def finish(name: str) -> None:
        """Its machine publishes its final checkpoint, as the trainer does at its last step."""
        _publish_final(local, runs[name], tmp_path / f"{name}-final", step=20)

    def waits_for(condition: Callable[[], bool], what: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                print(json.dumps(state(), default=str, indent=1))
                print(json.dumps(checks_seen, default=str, indent=1))
                pytest.fail(what)
            time.sleep(0.5)

    def state() -> dict[str, Any]:
        """Each run's lifecycle, queue place and groups' desired size, should a wait fail."""
        return {name: (run_lifecycle.read(events, run), queued(name),
                       desired(name) if name in spot_group else None)
                for name, run in runs.items()}  # fmt: skip

    checks_seen: list[dict[str, Any]] = []

    def check() -> dict[str, Any]:
        checked = deliver_capacity_check(local.cloud, outputs["handler_function"], "us-east-1")
        checks_seen.append({n: checked["runs"].get(r) for n, r in runs.items()})
        return {name: checked["runs"][run] for name, run in runs.items() if run in checked["runs"]}

    def listed(name: str) -> str:
        capsys.readouterr()
        assert cli.main(["run", "list", "local"]) == 0
        said = capsys.readouterr().out
        [line] = [line for line in said.splitlines() if line.startswith(f"{runs[name]} ")]
        return line

    def queued(name: str) -> str | None:
        return fleet_state.run_state(events, runs[name]).queued

    try:
        for name in ("vision-a", "speech-a", "vision-b"):
            declare(name)
        submit("vision-a", "speech-a", "vision-b")  # in this order
        decided = check()
        assert [desired(name) for name in ("vision-a", "speech-a", "vision-b")] == [1, 1, 0], (
            decided
        )
        waiting = ("#1 in the queue: needs 96 vCPUs of spot/P in us-east-1, 0 of its ceiling "
                   "192 free")  # fmt: skip
        assert decided["vision-b"]["decision"] == "wait", decided
        assert (queued("vision-b") or "").startswith(waiting), queued("vision-b")
        assert re.search(rf"\bmachines 0 .*: {re.escape(waiting)}", listed("vision-b")), (
            listed("vision-b"))  # fmt: skip

        # vision-a finishes: the stream brings its final checkpoint to the handler, which
        # empties its groups and starts vision-b at once.
        finish("vision-a")
        waits_for(lambda: desired("vision-b") == 1, "the stream did not start vision-b")
        assert desired("vision-a") == 0 and queued("vision-b") is None
        assert run_lifecycle.read(events, runs["vision-a"]).finished_step == 20

        # speech-a's machine-seconds take its team past its budget (counted at each check).
        def over_budget() -> bool:
            check()
            return spend_ledger.read(events, runs["speech-a"]).spend_usd >= 0.02

        waits_for(over_budget, "speech-a's ledger did not reach its team's budget")
        # Each count went out as the run's spend metric, put by the handler as its role (the
        # cloud judges it by the namespace its grant names).
        assert local.client("cloudwatch").list_metrics(
            Namespace=METRIC_NAMESPACE, MetricName="RunSpendUSD",
            Dimensions=[{"Name": "Run", "Value": runs["speech-a"]}])["Metrics"]  # fmt: skip
        for name in ("speech-b", "vision-c"):
            declare(name)
        submit("speech-b", "vision-c")
        finish("speech-a")
        waits_for(lambda: desired("vision-c") == 1, "vision-c did not start when speech-a finished")
        assert desired("speech-b") == 0 and desired("speech-a") == 0
        budget = queued("speech-b") or ""
        assert "team speech spent $" in budget and "of its $0.02" in budget, budget
        assert budget in listed("speech-b")

        # The urgent run takes the later-started of vision-b and vision-c; it gets its
        # machines back when the urgent run finishes.
        declare("urgent", priority=5)
        submit("urgent")
        check()  # or another story's check, delivered since: it decides the same
        assert (desired("urgent"), desired("vision-c"), desired("vision-b")) == (1, 0, 1)
        preempted = fleet_state.run_state(events, runs["vision-c"])
        # Behind speech-b, which waits for its team's budget and was submitted before it.
        _says_preempted(preempted, by=runs["urgent"], place=2)
        assert preempted.held_sizes == {spot_group["vision-c"]: {"min_size": 1, "desired": 1}}
        finish("urgent")
        waits_for(lambda: desired("vision-c") == 1, "vision-c was not released")
        assert queued("vision-c") is None and desired("urgent") == 0
    finally:
        for declaration in declared.values():
            _remove_own_run(local, declaration, ("us-east-1",))


def test_a_deployed_gang_that_does_not_come_whole_in_time_holds_no_machine_until_it_asks_again(
    local: Local, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:  # fmt: skip
    """Whole-gang starts on the deployed handler, its clock real: a run of two machines (its
    coordinator on-demand, its peer spot) whose spot pool has no capacity (`spot-gone
    us-east-1/g6e.xlarge`, a type no other run uses) and a gang timeout of 15 s (its run
    file's `gang_timeout_minutes`). The check starts it and only the coordinator comes; past
    the timeout a check releases it: no machine is left, on-call hears what the wait cost, and
    `run list` says when it asks again. Checks within that wait keep it at none, whoever
    delivers them; past it, with spot back, a check asks again and the gang comes whole."""
    from spotrain import cli
    from spotrain.core import fleet_state
    from spotrain.core.capacity import CapacityGroup, RunDeclaration
    from spotrain.tools.rehearsal import deliver_capacity_check

    for name, value in control.aws_environment(local.cloud.endpoint, "us-east-1").items():
        monkeypatch.setenv(name, value)
    config, outputs = local.config, local.outputs
    store = f"s3://{outputs['checkpoint_bucket']}"
    events = control.resource("dynamodb", local.cloud.endpoint, "us-east-1").Table(
        outputs["events_table"])  # fmt: skip
    run = f"gang-{uuid.uuid4().hex[:6]}"
    group = names.fleet_group(config.name, run)
    declaration = RunDeclaration(
        run=run, team="platform", gpus=2, gang_timeout_minutes=0.25,
        groups=(CapacityGroup(name=group, region="us-east-1", lifecycle="spot",
                              holds_data=True, min_size=2, desired=2),),
        vcpus={"spot/G and VT": 4, "on-demand/G and VT": 4}, instance_types=("g6e.xlarge",),
    )  # fmt: skip
    notices = _subscribe_a_queue(local, outputs["notice_topic"])

    def machines() -> tuple[int, int]:
        """The group's desired size and its machines in service."""
        [found] = local.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[group])["AutoScalingGroups"]  # fmt: skip
        return int(found["DesiredCapacity"]), sum(
            i["LifecycleState"] == "InService" for i in found.get("Instances", [])
        )

    def checked_until(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: {machines()} {fleet_state.run_state(events, run)}")
            deliver_capacity_check(local.cloud, outputs["handler_function"], "us-east-1")
            time.sleep(1)

    control.set_faults(spot_capacity_gone=["us-east-1/g6e.xlarge"])
    try:
        _declare_own_run(local, declaration, ("us-east-1",), markets={
            "OnDemandBaseCapacity": 1, "OnDemandPercentageAboveBaseCapacity": 0})  # fmt: skip
        document = tmp_path / "gang.json"
        document.write_text(json.dumps({
            **TWO_RUNS_TRAINING, "run": run, "store": store, "steps": 20,
            "data": "/set/by/each/machine/tokens.bin", "work_dir": "/set/by/each/machine",
        }))  # fmt: skip
        assert cli.main(["config", "put", str(document), "--store", store]) == 0
        checked_until(lambda: machines()[0] == 2, "the check did not start the run")
        assert machines() == (2, 1)  # the coordinator came, its spot peer did not
        asked = fleet_state.run_state(events, run).gang_asked
        assert asked is not None

        checked_until(lambda: machines() == (0, 0), "the part that came was not released")
        state = fleet_state.run_state(events, run)
        assert state.gang_releases == 1 and state.gang_released_at is not None
        assert state.gang_released_at - asked.since >= 15  # not before its timeout
        said = state.queued or ""
        assert said.startswith("its gang did not come whole in time (once): it asks again at ")
        capsys.readouterr()
        assert cli.main(["run", "list", "local"]) == 0
        [line] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(f"{run} ")]
        assert "its gang did not come whole in time (once)" in line, line
        [released] = [
            n
            for n in _drain_queue(local, notices)
            if n.get("action") == "gang-released" and group in n.get("desired", {})
        ]
        assert re.search(r"1 of the 2 machines its rendezvous needs came in \d+ s \(limit 15 "
                         r"s\): released rather than kept idle \(the wait cost \$[\d.]+\)",
                         released["reason"]), released  # fmt: skip

        # Within its wait (15 s after the release) a check keeps it at none.
        deliver_capacity_check(local.cloud, outputs["handler_function"], "us-east-1")
        held, at = machines(), time.time()
        if at < state.gang_released_at + 15:  # (on a slow machine the wait may be over)
            assert held == (0, 0)
        control.set_faults(spot_capacity_gone=[])
        checked_until(lambda: machines() == (2, 2), "the run did not ask for its gang again")
        assert time.time() >= state.gang_released_at + 15
        checked_until(lambda: fleet_state.run_state(events, run).gang_releases == 0,
                      "the gang came whole and its releases were not forgotten")  # fmt: skip
        assert fleet_state.run_state(events, run).queued is None
    finally:
        control.set_faults(spot_capacity_gone=[])
        _remove_own_run(local, declaration, ("us-east-1",))


def replicated(arrived: Callable[[], bool], timeout_s: float = 30) -> None:
    """Wait until `arrived` (a global table's copy caught up)."""
    deadline = time.monotonic() + timeout_s
    while not arrived():
        assert time.monotonic() < deadline, "the write did not replicate"
        time.sleep(0.2)


def _subscribe_a_queue(local: Local, topic: str) -> str:
    """A queue subscribed to the notice topic, as on-call's email is: its URL."""
    sqs, sns = local.client("sqs"), local.client("sns")
    queue = sqs.create_queue(QueueName=f"on-call-{uuid.uuid4().hex[:6]}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
    return str(queue)


def _drain_queue(local: Local, queue: str) -> list[dict[str, Any]]:
    """Every notice the queue got (each message's JSON body)."""
    sqs, found = local.client("sqs"), []
    while batch := sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages"):
        for message in batch:
            found.append(json.loads(json.loads(message["Body"])["Message"]))
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
    return found


FLEET_POLICY = "run-scoped-checkpoint-access"


def _deployed_access(local: Local) -> dict[str, Any]:
    """What decides a training machine's access, read back from the deployment: its role's
    trust and policy, the checkpoint buckets' policies and encryption, the tables' keys, the
    data keys and the gateway endpoints its requests come through."""
    iam, ec2 = local.client("iam"), local.client("ec2")
    fleet_roles = {
        r["RoleName"]: r
        for r in iam.list_roles()["Roles"]
        if FLEET_POLICY in iam.list_role_policies(RoleName=r["RoleName"])["PolicyNames"]
    }
    # Each run's fleet in each region has its own role (roles are global: named by region).
    assert sorted(fleet_roles) == ["spotrain-local-demo-fleet",
                                   "spotrain-local-demo-fleet-us-west-2",
                                   "spotrain-local-second-fleet",
                                   "spotrain-local-second-fleet-us-west-2"]  # fmt: skip
    role = fleet_roles["spotrain-local-demo-fleet"]  # the demo run's machines
    buckets = {}
    for bucket, region in (
        (local.primary_bucket, local.config.primary_region),
        (local.replica_bucket, local.config.replica_regions[0]),
    ):
        s3 = local.client("s3", region)
        buckets[bucket] = {
            "region": region,
            "policy": s3.get_bucket_policy(Bucket=bucket)["Policy"],
            "encryption": s3.get_bucket_encryption(Bucket=bucket)[
                "ServerSideEncryptionConfiguration"
            ],
        }
    tables = {
        name: local.client("dynamodb").describe_table(TableName=name)["Table"]
        for name in ("spotrain-local-checkpoints", "spotrain-local-events")
    }
    endpoints = {
        e["ServiceName"].rsplit(".", 1)[-1]: e["VpcEndpointId"]
        for e in ec2.describe_vpc_endpoints()["VpcEndpoints"]
        if e["VpcEndpointType"] == "Gateway"
    }
    [interface] = [
        e["VpcEndpointId"] for e in ec2.describe_vpc_endpoints()["VpcEndpoints"]
        if e["ServiceName"].endswith(".autoscaling")
    ]  # fmt: skip
    key = local.client("kms").describe_key(
        KeyId=f"alias/spotrain-local-data-{local.config.primary_region}"
    )["KeyMetadata"]["Arn"]
    return {
        "role": role,
        "buckets": buckets,
        "tables": tables,
        "endpoints": endpoints,
        "interface": interface,
        "key": key,
        "policy": iam.get_role_policy(RoleName=role["RoleName"], PolicyName=FLEET_POLICY)[
            "PolicyDocument"
        ],
    }


def _recreate(access: dict[str, Any], endpoint: str, region: str) -> dict[str, dict[str, str]]:
    """The deployed access on a fresh cloud; returns the machine's and an operator's
    credentials."""
    import json

    def client(service: str, where: str = region) -> Any:
        return control.client(service, endpoint, where)

    for bucket, found in access["buckets"].items():
        s3 = client("s3", found["region"])
        where = found["region"]
        s3.create_bucket(
            Bucket=bucket,
            **(
                {}
                if where == "us-east-1"
                else {"CreateBucketConfiguration": {"LocationConstraint": where}}
            ),
        )
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        s3.put_bucket_encryption(
            Bucket=bucket, ServerSideEncryptionConfiguration=found["encryption"]
        )
        s3.put_bucket_policy(Bucket=bucket, Policy=found["policy"])
    for name, table in access["tables"].items():
        indexes = [
            {k: i[k] for k in ("IndexName", "KeySchema", "Projection")}
            for i in table.get("GlobalSecondaryIndexes", [])
        ]
        client("dynamodb").create_table(
            TableName=name,
            KeySchema=table["KeySchema"],
            AttributeDefinitions=table["AttributeDefinitions"],
            BillingMode="PAY_PER_REQUEST",
            **({"GlobalSecondaryIndexes": indexes} if indexes else {}),
        )
    iam = client("iam")
    role = access["role"]
    iam.create_role(
        RoleName=role["RoleName"],
        AssumeRolePolicyDocument=json.dumps(role["AssumeRolePolicyDocument"]),
    )
    iam.put_role_policy(
        RoleName=role["RoleName"],
        PolicyName=FLEET_POLICY,
        PolicyDocument=json.dumps(access["policy"]),
    )
    iam.create_user(UserName="on-call")
    iam.put_user_policy(
        UserName="on-call",
        PolicyName="administrator",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
            }
        ),
    )
    operator = iam.create_access_key(UserName="on-call")["AccessKey"]
    # What the instance profile hands a machine: the role's temporary credentials.
    machine = client("sts").assume_role(RoleArn=role["Arn"], RoleSessionName="i-0machine")[
        "Credentials"
    ]
    return {
        "machine": {
            "aws_access_key_id": machine["AccessKeyId"],
            "aws_secret_access_key": machine["SecretAccessKey"],
            "aws_session_token": machine["SessionToken"],
        },
        "operator": {
            "aws_access_key_id": operator["AccessKeyId"],
            "aws_secret_access_key": operator["SecretAccessKey"],
        },
    }


def test_a_machine_cannot_rewrite_history_reach_other_runs_or_use_its_keys_outside(
    local: Local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deployed role and bucket policies, on a cloud of their own that judges every
    request by its caller's policies (conditions included). With a machine's credentials the
    trainer publishes and restores a checkpoint and records a crash; it cannot delete or
    overwrite what it published, touch another run's keys, write datasets, release its run
    from a crash hold, touch its run's deadline plan, rewrite what the handler keeps of its run,
    or use its credentials from outside the VPC. On-call can."""
    from spotrain.core import fleet_state
    from spotrain.core.catalog_schema import (
        DEADLINE_PLAN_HEADER_SORT_KEY,
        deadline_plan_key,
        run_prefix,
    )
    from spotrain.trainer import checkpoint_store, restore_policy
    from spotrain.trainer.catalog import CatalogError, DynamoCatalog
    from spotrain.trainer.storage import AlreadyExists, S3Storage

    access = _deployed_access(local)
    run, region = local.run.name, local.config.primary_region
    monkeypatch.setenv("SPOTRAIN_HOME", str(tmp_path / "enforcing-cloud"))
    cloud = control.up(port=0, schedule_speedup=0)
    try:
        credentials = _recreate(access, cloud.endpoint, region)
        control.set_faults(through_vpc_endpoints=access["endpoints"])
        control.enforce_identity_policies(cloud.endpoint, True)

        def as_(who: str, service: str) -> Any:
            return control.client(service, cloud.endpoint, region, **credentials[who])

        s3, dynamodb = as_("machine", "s3"), as_("machine", "dynamodb")
        bucket = local.primary_bucket

        def refused(call: Any, status: int = 403, code: str | None = None) -> None:
            with pytest.raises(ClientError) as error:
                call()
            response = error.value.response
            assert response["ResponseMetadata"]["HTTPStatusCode"] == status, response["Error"]
            if code:
                assert response["Error"]["Code"] == code

        # The trainer's own calls, as the machine: a checkpoint large enough for a multipart
        # upload is published, then restored.
        storage = S3Storage(
            bucket, "", kms_key_id=access["key"], client=s3, part_size=5 * 1024 * 1024
        )
        catalog = DynamoCatalog("spotrain-local-checkpoints", run, storage, client=dynamodb)
        folder = tmp_path / "step1"
        folder.mkdir()
        (folder / "model.pt").write_bytes(os.urandom(6 * 1024 * 1024))
        (folder / "optim.pt").write_bytes(os.urandom(1024))
        report = checkpoint_store.publish(
            folder,
            storage=storage,
            run=run,
            catalog=catalog,
            generation=catalog.acquire_lease("i-0machine"),
            step=1,
            world_size=1,
            zero_stage=2,
            config_hash="c",
            code_version="v",
        )
        restored = restore_policy.restore(
            tmp_path / "restored", storage=storage, catalog=catalog, run=run
        )
        assert restored.manifest.step == 1 and not restored.fell_back
        assert (tmp_path / "restored" / "model.pt").read_bytes() == (
            folder / "model.pt"
        ).read_bytes()
        manifest = checkpoint_store.key_of(report.manifest)
        shard = next(k for s in report.manifest.shards for k in s.keys)

        def put(key: str, **condition: str) -> Any:  # encrypted as the bucket requires
            return s3.put_object(Bucket=bucket, Key=key, Body=b"forged",
                                 ServerSideEncryption="aws:kms", SSEKMSKeyId=access["key"],
                                 **condition)  # fmt: skip

        # Published history stays as it is: no delete, no overwrite (the bucket policy refuses
        # an unconditional write; a conditional one finds the key taken).
        for key in (manifest, shard):
            refused(lambda key=key: s3.delete_object(Bucket=bucket, Key=key))
            refused(lambda key=key: put(key))
            refused(lambda key=key: put(key, IfNoneMatch="*"), status=412)
        with pytest.raises(AlreadyExists):
            storage.put_bytes(manifest, b"forged")
        with contextlib.suppress(ClientError):  # refused whole, or key by key
            s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": manifest}]})
        assert storage.exists(manifest) and storage.exists(shard)

        # The environment's other run (deployed beside it): its keys, its catalog items and
        # its groups are out of reach, as are the shared datasets (read only).
        other = run_prefix("second")
        refused(lambda: put(f"{other}/x", IfNoneMatch="*"))
        refused(lambda: s3.list_objects_v2(Bucket=bucket, Prefix=f"{other}/"))
        refused(lambda: put("datasets/x", IfNoneMatch="*"))
        with pytest.raises(CatalogError, match="AccessDenied"):
            DynamoCatalog(
                "spotrain-local-checkpoints", "second", storage, client=dynamodb
            ).acquire_lease("i-0machine")
        from spotrain.localcloud.authorization import PERMITTED, verdict

        groups = (
            "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:x:autoScalingGroupName"
        )
        policy = access["policy"]
        assert (
            verdict(
                policy,
                "autoscaling:SetInstanceHealth",
                f"{groups}/spotrain-local-demo-fleet",
                {"aws:SourceVpce": access["interface"]},
            )
            == PERMITTED
        )
        assert (
            verdict(
                policy,
                "autoscaling:SetInstanceHealth",
                f"{groups}/spotrain-local-second-fleet",
                {"aws:SourceVpce": access["interface"]},
            )
            != PERMITTED
        )
        head = {"TableName": "spotrain-local-checkpoints",
                "Key": {"pk": {"S": f"RUN#{run}"}, "sk": {"S": "HEAD"}}}  # fmt: skip
        refused(lambda: dynamodb.delete_item(**head), 400, "AccessDeniedException")

        # A crash is recorded; the machine cannot release its own run, on-call can.
        def events_table(who: str) -> Any:
            return control.resource("dynamodb", cloud.endpoint, region, **credentials[who]).Table(
                "spotrain-local-events"
            )

        machine_events = events_table("machine")
        for _ in range(fleet_state.DEFAULT_MAX_CRASHES):
            verdict = fleet_state.record_exit(machine_events, run, "i-0machine", 1)
        assert verdict.failed
        with pytest.raises(ClientError, match="AccessDenied"):
            fleet_state.reset_crashes(machine_events, run)
        # Nor rewrite what the handler keeps of the run, which may-start reads (below): the
        # sizes it gets back, its place in the queue, a move order.
        order = fleet_state.FailoverState(move_order=None)
        for rewrite in (
            lambda: fleet_state.set_held_sizes(machine_events, run, {"g": {"min_size": 9}}),
            lambda: fleet_state.set_queued(machine_events, run, None),
            lambda: fleet_state.set_failover_state(machine_events, run, "us-east-1", order),
        ):
            with pytest.raises(ClientError, match="AccessDenied"):
                rewrite()
        plan = {"pk": deadline_plan_key(run), "sk": DEADLINE_PLAN_HEADER_SORT_KEY}
        for steer in (lambda: machine_events.put_item(Item={**plan, "header": "{}"}),
                      lambda: machine_events.get_item(Key=plan)):  # fmt: skip
            with pytest.raises(ClientError, match="AccessDenied"):  # nor its deadline plan
                steer()
        on_call_events = events_table("operator")
        assert fleet_state.reset_crashes(on_call_events, run) == fleet_state.DEFAULT_MAX_CRASHES
        assert not fleet_state.run_state(machine_events, run).failed

        # On-call collects garbage with its own credentials.
        as_("operator", "s3").delete_object(Bucket=bucket, Key=shard)

        # The same credentials from outside the VPC: nothing.
        control.set_faults(through_vpc_endpoints={})
        refused(lambda: s3.get_object(Bucket=bucket, Key=manifest))
        refused(lambda: dynamodb.get_item(**head), 400, "AccessDeniedException")
    finally:
        control.down()


def test_the_deployed_handler_reads_the_runs_deadline_plans_and_can_write_none(
    local: Local,
) -> None:
    """The handler's role as deployed, judged as IAM judges it (the local cloud's evaluator):
    it reads a run's deadline plan, which operators store, and cannot write one; its own items
    it writes. (A machine's role reaches no plan: the test above, on a cloud enforcing it.)"""
    from spotrain.core.catalog_schema import deadline_plan_key, handler_state_key, run_key
    from spotrain.localcloud.authorization import PERMITTED, verdict

    role = local.client("lambda").get_function_configuration(
        FunctionName=local.outputs["handler_function"])["Role"]  # fmt: skip
    policy = local.client("iam").get_role_policy(
        RoleName=role.rsplit("/", 1)[-1], PolicyName="record-interruptions"
    )["PolicyDocument"]
    table = local.client("dynamodb").describe_table(
        TableName=local.outputs["events_table"])["Table"]["TableArn"]  # fmt: skip

    def allowed(action: str, partition: str) -> bool:
        return verdict(policy, action, table, {"dynamodb:LeadingKeys": [partition]}) == PERMITTED

    plan = deadline_plan_key("demo")
    assert allowed("dynamodb:GetItem", plan)
    writes = ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem")
    assert not any(allowed(write, plan) for write in writes)
    assert allowed("dynamodb:UpdateItem", run_key("demo"))  # the run's machines' marks
    assert allowed("dynamodb:UpdateItem", handler_state_key("demo"))  # its state of the run


def test_an_event_the_deployed_handler_cannot_take_reaches_its_dead_letter_queue(
    local: Local,
) -> None:
    """The deployed handler sends an event it cannot take to its dead-letter queue as its
    role, judged as IAM judges it (its grant names that queue alone): the event's id and what
    is wrong with it arrive there, for on-call to read and redrive."""
    event_id = f"malformed-{uuid.uuid4().hex[:8]}"
    event = {"id": event_id, "source": "aws.ec2", "detail": {},
             "detail-type": "EC2 Spot Instance Interruption Warning"}  # fmt: skip
    answered = local.client("lambda").invoke(
        FunctionName=local.outputs["handler_function"], Payload=json.dumps(event).encode()
    )
    assert "rejected" in json.loads(answered["Payload"].read()), "the handler took the event"
    sqs, queue = local.client("sqs"), local.outputs["dead_letter_queue"]
    deadline, found = time.monotonic() + 30, []
    while not found and time.monotonic() < deadline:
        batch = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1, MaxNumberOfMessages=10,
                                    MessageAttributeNames=["All"]).get("Messages", [])  # fmt: skip
        found = [m for m in batch if json.loads(m["Body"])["id"] == event_id]
    assert found, "no dead letter for the rejected event (see the local cloud's log)"
    [letter] = found
    reason = letter["MessageAttributes"]["reason"]["StringValue"]
    assert reason and json.loads(letter["Body"])["reason"] == reason
    assert json.loads(letter["Body"])["event"] == event
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=letter["ReceiptHandle"])


def test_budget_alerts_at_every_threshold_to_topic_and_email(local: Local) -> None:
    budgets = local.client("budgets")
    budget = budgets.describe_budget(AccountId=ACCOUNT, BudgetName="spotrain-local-budget-monthly")
    assert budget["Budget"]["BudgetLimit"] == {"Amount": "100.00", "Unit": "USD"}
    notifications = budgets.describe_notifications_for_budget(
        AccountId=ACCOUNT, BudgetName="spotrain-local-budget-monthly"
    )["Notifications"]
    found = sorted((n["NotificationType"], int(n["Threshold"])) for n in notifications)
    assert found == sorted(ALERT_THRESHOLDS)
    subscribers = budgets.describe_subscribers_for_notification(
        AccountId=ACCOUNT, BudgetName="spotrain-local-budget-monthly", Notification=notifications[0]
    )["Subscribers"]
    assert {s["SubscriptionType"] for s in subscribers} == {"EMAIL", "SNS"}


def test_interruption_rules_target_the_handler(local: Local) -> None:
    """Each region's rules (its machines' warnings, its capacity check) target its own
    handler; home's alone is fed by the catalog's stream."""
    for region in local.config.region_names:
        events = local.client("events", region)
        function = local.client("lambda", region).get_function(
            FunctionName="spotrain-local-interruption-handler"
        )["Configuration"]
        # The emulator does not report DeadLetterConfig (hence ignore_changes in the local
        # profile); the synthesized configuration carries it (test_constructs).
        assert function["Handler"] == HANDLER_ENTRY  # the runtime's entry, in the zip
        assert (
            function["Environment"]["Variables"][HandlerSettings.variable("events_table")]
            == "spotrain-local-events"
        )
        patterns, schedules = {}, []
        for rule in events.list_rules(NamePrefix="spotrain-local-interruption-handler")["Rules"]:
            targets = events.list_targets_by_rule(Rule=rule["Name"])["Targets"]
            assert [t["Arn"] for t in targets] == [function["FunctionArn"]]
            assert targets[0]["RetryPolicy"]["MaximumRetryAttempts"] == 8
            if "EventPattern" in rule:
                patterns[rule["Name"]] = rule["EventPattern"]
            else:
                schedules.append(rule["ScheduleExpression"])
        assert len(patterns) == 2, region
        assert schedules == ["rate(5 minutes)"]  # the capacity check
        joined = " ".join(patterns.values())
        assert "EC2 Spot Instance Interruption Warning" in joined
        assert "EC2 Instance Rebalance Recommendation" in joined
        mappings = [
            m for m in local.client("lambda", region).list_event_source_mappings()[
                "EventSourceMappings"] if m["FunctionArn"] == function["FunctionArn"]
        ]  # fmt: skip
        assert len(mappings) == (region == local.config.primary_region), (region, mappings)


def test_the_catalog_stream_runs_the_deployed_handler_which_alarms_on_rewritten_history(
    local: Local,
) -> None:
    """The deployed mapping from the catalog table's stream to the handler, run by the local
    cloud from the deployed zip: a head moved back without a roll back (what a machine's
    credentials could do) reaches the deployed notice topic as an alarm."""
    import json
    import time

    lam, dynamodb, sqs, sns = (local.client(s) for s in ("lambda", "dynamodb", "sqs", "sns"))
    function = lam.get_function(FunctionName="spotrain-local-interruption-handler")
    [mapping] = lam.list_event_source_mappings(
        FunctionName=function["Configuration"]["FunctionArn"]
    )["EventSourceMappings"]
    catalog = "spotrain-local-checkpoints"
    stream = dynamodb.describe_table(TableName=catalog)["Table"]["LatestStreamArn"]
    assert mapping["EventSourceArn"] == stream
    outputs = local.outputs
    queue = sqs.create_queue(QueueName=f"on-call-{uuid.uuid4().hex[:6]}")["QueueUrl"]
    attributes = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])
    queue_arn = attributes["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=outputs["notice_topic"], Protocol="sqs", Endpoint=queue_arn)
    run = f"forged-{uuid.uuid4().hex[:6]}"
    head = {"pk": {"S": f"RUN#{run}"}, "sk": {"S": "HEAD"}}
    dynamodb.put_item(TableName=catalog, Item={**head, "step": {"N": "7"}})
    dynamodb.update_item(TableName=catalog, Key=head, UpdateExpression="SET #s = :two",
                         ExpressionAttributeNames={"#s": "step"},
                         ExpressionAttributeValues={":two": {"N": "2"}})  # fmt: skip
    deadline, alarms = time.monotonic() + 60, []
    while not alarms and time.monotonic() < deadline:
        for message in sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1,
                                           MaxNumberOfMessages=10).get("Messages", []):  # fmt: skip
            body = json.loads(message["Body"])
            if run in body["Subject"]:
                alarms.append((body["Subject"], json.loads(body["Message"])))
    assert alarms, "no alarm reached the notice topic within 60 s (see the local cloud's log)"
    [(subject, alarm)] = alarms
    assert subject.startswith("spotrain ALARM: head-moved-back")
    assert (alarm["from_step"], alarm["to_step"]) == (7, 2)


def test_two_runs_train_at_once_and_a_preempted_one_resumes_with_the_same_losses(
    local: Local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    """A third run is declared beside the repository's two (listed as declared) and submitted by its
    file: its stack applies and its configuration is stored; `second` gets a configuration of
    the same training. One capacity check of the deployed handler starts both and leaves the
    finished demo run's groups as they are. Each trains on a machine booted from its own
    deployed launch template, at the same time: `second`'s booted by the test, `third`'s by
    `run play` (tools/local_fleet.py) as a user plays a local run. A run of higher priority
    that does not fit beside `second` is submitted: the queue preempts `second` (its groups to
    0, their sizes kept, its place and reason in its state); its machine is stopped as EC2
    stops one (SIGTERM), publishes its emergency checkpoint and leaves, accounted as stopped,
    its coordinator role given up. When the urgent run finishes, the catalog's stream gives
    `second` its sizes back; a new machine resumes from that checkpoint, and every step's loss
    equals the third run's, which nothing interrupted. `run logs` shows the stopped machine's
    last words; `run list` and `status` each state; both runs finish and their groups go to 0;
    `run retire` destroys the third's stack (its groups and declaration go), its spend counted
    to its end, and it is listed as retired with that spend. (`run cancel` and `resume` stop
    and start a training run the same way in the user's-repository story.)"""
    import shutil as shell_tools
    import signal
    import threading
    import time
    from dataclasses import replace

    from spotrain import cli
    from spotrain.core import fleet_state, run_lifecycle
    from spotrain.core.capacity import CapacityGroup, RunDeclaration
    from spotrain.localcloud.machines import process_tree, signal_all
    from spotrain.tools import local_fleet
    from spotrain.tools.rehearsal import Phase, deliver_capacity_check

    alone(local, request, TRAINING_MACHINES)
    for name, value in control.aws_environment(local.cloud.endpoint, "us-east-1").items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    outputs = local.outputs
    store = f"s3://{outputs['checkpoint_bucket']}"
    table = control.resource("dynamodb", local.cloud.endpoint, "us-east-1").Table(
        outputs["events_table"])  # fmt: skip
    catalog = control.resource("dynamodb", local.cloud.endpoint, "us-east-1").Table(
        outputs["checkpoint_catalog_table"])  # fmt: skip

    def head(run: str) -> int:
        found = run_lifecycle.published_head(catalog, run)
        return found.step if found else 0

    def sizes(group: str) -> tuple[int, int]:
        [found] = local.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[group])["AutoScalingGroups"]  # fmt: skip
        return int(found["MinSize"]), int(found["DesiredCapacity"])

    def listed() -> str:
        capsys.readouterr()
        assert cli.main(["run", "list", "local"]) == 0
        return capsys.readouterr().out

    # Declared as a user declares a run: a file beside the environment's others.
    runs = tmp_path / "runs" / "local"
    shell_tools.copytree(ROOT / "runs" / "local", runs)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("two runs of one environment read the same prepared words\n" * 400)
    key = local.client("kms").describe_key(KeyId=local.primary_key_alias)["KeyMetadata"]["Arn"]
    assert cli.main(["data", "prepare", str(corpus), "--store", store, "--name", "two-runs",
                     "--kms-key-id", key]) == 0  # fmt: skip
    metrics = {run: Phase(run, tmp_path / f"{run}.jsonl") for run in ("second", "third")}
    training = {**TWO_RUNS_TRAINING, "data": "dataset:two-runs"}
    (runs / "third.toml").write_text("\n".join([
        'owner = "research@example.com"', 'team = "research"',
        'instance_types = ["g6.xlarge", "g5.xlarge"]',
        "mixed_gpus = true", "min_size = 1", "desired_size = 1", "max_size = 1", "[training]",
        *(f"{k} = {json.dumps(v)}" for k, v in training.items() if k != "model"),
        f'metrics_file = "{metrics["third"].metrics}"',
        "model = { context = 32, layers = 2, heads = 2, width = 64 }", "",
    ]))  # fmt: skip
    monkeypatch.setenv("SPOTRAIN_RUNS_DIR", str(tmp_path / "runs"))
    # `third`'s machine honours this hold (it inherits the setting); `second`'s is paused instead.
    hold = tmp_path / "hold"
    monkeypatch.setenv(failpoints.HOLD_VARIABLE, str(hold))
    fleet = _PlayedFleet(local, tmp_path / "machines")
    as_deployed: dict[str, str] = {}
    urgent: RunDeclaration | None = None
    try:
        assert re.search(r"^third\s+declared\s.*`spotrain run submit local third`", listed(),
                         re.M)  # fmt: skip
        assert cli.main(["run", "submit", "local", str(runs / "third.toml")]) == 0
        said = capsys.readouterr().out
        assert "run third submitted to local: its fleet spotrain-local-third-fleet" in said, said
        second_config = tmp_path / "second.json"
        second_config.write_text(json.dumps({
            **training, "run": "second", "store": store, "work_dir": "/set/by/each/machine",
            "metrics_file": str(metrics["second"].metrics)}))  # fmt: skip
        assert cli.main(["config", "put", str(second_config), "--store", store]) == 0
        groups = {run: f"spotrain-local-{run}-fleet" for run in ("second", "third")}
        demo_before = sizes("spotrain-local-demo-fleet")
        asked_at = time.time()
        checked = deliver_capacity_check(local.cloud, outputs["handler_function"], "us-east-1")
        # This check starts both, unless the user's story on the other worker delivered one
        # since they were submitted (the handler checks every run of the environment at each):
        # then that check did, before this one.
        for run in groups:
            started = run_lifecycle.read(table, run).started_at
            assert checked["runs"][run]["decision"] == "start" or (
                started is not None and started <= asked_at), checked  # fmt: skip
        assert [sizes(group) for group in groups.values()] == [(1, 1), (1, 1)]  # as declared
        assert sizes("spotrain-local-demo-fleet") == demo_before
        first = {"second": fleet.boot(groups["second"], settings={
            failpoints.HOLD_VARIABLE: str(tmp_path / "second-is-never-held")})}  # fmt: skip
        # `third` is played as a user plays a local run (`spotrain run play`): another check,
        # then its machine boots here and trains it to the end, its lines said as they come.
        first_checkpoint = TWO_RUNS_TRAINING["checkpoint_every"]
        third_said: list[str] = []
        third_codes: dict[str, int] = {}

        def third_says(line: str) -> None:
            third_said.append(line)
            if f"published step {first_checkpoint}:" in line:  # held from then on, wherever
                hold.touch()  # `second` is: a slow boot of `second` cannot let it finish

        player = threading.Thread(target=lambda: third_codes.update(local_fleet.play(
            "third", work=tmp_path / "played", say=third_says)), daemon=True)  # fmt: skip
        player.start()
        # Both train at the same time, each from its own deployed template, into its own
        # checkpoints. `second` boots first: once it has published a checkpoint its machine is
        # paused (as a slow machine is) until the cancel, so that its lead cannot let it
        # finish all its steps while `third` catches up; `third` is held after the step in
        # which it says its first checkpoint is published, until the runs are listed.
        deadline = time.monotonic() + 300
        machine: list[int] = []
        # Both conditions are checked in the loop's body, so that `second` is paused even when
        # its checkpoint comes after `third`'s hold (a slow boot): unpaused, it would train on
        # to its end while the runs are listed.
        while not (machine and hold.exists()):
            assert first["second"].running() and player.is_alive(), (
                first["second"].output[-3000:], "\n".join(third_said[-40:]))  # fmt: skip
            assert time.monotonic() < deadline, (
                first["second"].output[-3000:], "\n".join(third_said[-40:]))  # fmt: skip
            if not machine and head("second") >= first_checkpoint:
                machine = process_tree(first["second"].process.pid)  # type: ignore[union-attr]
                signal_all(machine, signal.SIGSTOP)
            time.sleep(0.2)
        assert first["second"].running() and player.is_alive()
        assert head("second") < TWO_RUNS_TRAINING["steps"] > head("third")
        now_listed = listed()
        hold.unlink()
        # `third` waited after a step past its first checkpoint (said once the hold ended),
        # and so was listed training.
        deadline = time.monotonic() + 60
        while not (held := metrics["third"].events("held")):
            assert time.monotonic() < deadline, metrics["third"].records()[-5:]
            time.sleep(0.2)
        assert first_checkpoint <= held[0]["step"] < TWO_RUNS_TRAINING["steps"], held
        for run in groups:
            assert re.search(rf"^{run}\s+training\s", now_listed, re.M), now_listed

        # A run of higher priority that does not fit takes `second`'s place: the queue holds
        # `second` (its groups to 0, their sizes kept), its machine is stopped as EC2 stops
        # one (SIGTERM), publishes its emergency checkpoint and leaves; when the urgent run
        # finishes, `second` gets its sizes back and a new machine resumes it. For this story
        # `second` is declared as also holding 96 vCPUs of spot P, the one class the local
        # environment has a ceiling for (192): room for it, not for the urgent run's 192
        # beside it. Its machines are still played from its own deployed template.
        as_deployed = _redeclare(local, "second", lambda declared: replace(
            declared, vcpus={**declared.vcpus, "spot/P": 96}))  # fmt: skip
        urgent_run = f"urgent-{uuid.uuid4().hex[:6]}"
        urgent = RunDeclaration(
            run=urgent_run, team="platform", priority=5, gpus=16,
            groups=(CapacityGroup(name=names.fleet_group("local", urgent_run),
                                  region="us-east-1", lifecycle="spot", holds_data=True,
                                  min_size=2, desired=2),),
            vcpus={"spot/P": 192}, instance_types=("p4d.24xlarge",),
        )  # fmt: skip
        _declare_own_run(local, urgent, ("us-east-1",))
        urgent_config = tmp_path / "urgent.json"
        urgent_config.write_text(json.dumps({**training, "run": urgent.run, "store": store,
                                             "work_dir": "/set/by/each/machine"}))  # fmt: skip
        assert cli.main(["config", "put", str(urgent_config), "--store", store]) == 0
        preempting = deliver_capacity_check(local.cloud, outputs["handler_function"], "us-east-1")
        assert sizes(groups["second"]) == (0, 0), preempting["runs"].get("second")
        assert sizes(urgent.groups[0].name) == (2, 2), preempting["runs"].get(urgent.run)
        _says_preempted(fleet_state.run_state(table, "second"), by=urgent.run, place=1)
        signal_all(machine, signal.SIGCONT)
        codes = fleet.shut_down_the_terminated(groups["second"])
        preempted = first["second"]
        assert list(codes) == [preempted.instance_id], codes
        stops = metrics["second"].events("stopped")  # the machine's last words, should it fail
        assert len(stops) == 1, (codes, stops, preempted.output[-4000:])
        stopped_at = int(stops[0]["step"])
        assert stopped_at < TWO_RUNS_TRAINING["steps"]
        assert head("second") == stopped_at  # its emergency checkpoint is published
        said = preempted.output
        assert f"{preempted.instance_id} is asked to stop (SIGTERM)" in said, said[-3000:]
        assert "spotrain train: stopped by SIGTERM" in said and "Traceback" not in said, said
        assert ": stopped; run second has 0 crash(es)" in said, said[-3000:]
        assert f"{preempted.instance_id} no longer coordinates it" in said, said[-3000:]
        assert fleet_state.run_state(table, "second").crashes == 0
        capsys.readouterr()
        assert cli.main(["run", "status", "local", "second", "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        # Waiting in the queue for room (its reason now the room it needs; its place first).
        assert (status["phase"], status["step"], sum(status["machines"].values())) == (
            "waiting", stopped_at, 0), status  # fmt: skip
        assert str(status["why"]).startswith("#1 in the queue: "), status
        # On-call reads the stopped machine's last words after it is gone.
        assert cli.main(["run", "logs", "local", "second", "--machine",
                         preempted.instance_id]) == 0  # fmt: skip
        shipped = capsys.readouterr().out
        assert "is asked to stop (SIGTERM)" in shipped and f"stopped after step {stopped_at}" in (
            shipped), shipped[-3000:]  # fmt: skip

        # The urgent run finishes: the catalog's stream gives `second` its machines back.
        _publish_final(local, urgent.run, tmp_path / "urgent-final", step=training["steps"])
        deadline = time.monotonic() + 90
        while sizes(groups["second"]) != (1, 1):
            assert time.monotonic() < deadline, "the urgent run's finish did not release second"
            time.sleep(0.5)
        assert fleet_state.run_state(table, "second").queued is None
        resumed = fleet.boot(groups["second"])  # the group's new instance: it coordinates
        assert resumed.wait(timeout=300) == 0, resumed.output[-3000:]
        player.join(timeout=300)
        assert list(third_codes.values()) == [0], "\n".join(third_said[-40:])
        assert any("(on-demand)" in line for line in third_said), third_said[:5]
        assert f"resumed second at step {stopped_at}" in resumed.output, resumed.output[-3000:]
        losses = {run: phase.losses() for run, phase in metrics.items()}
        assert sorted(losses["third"]) == list(range(1, TWO_RUNS_TRAINING["steps"] + 1))
        assert losses["second"] == pytest.approx(losses["third"], rel=1e-6)

        # Finished: the catalog's stream took both runs' groups to 0.
        deadline = time.monotonic() + 60
        while any(run_lifecycle.read(table, run).finished_step is None for run in groups):
            assert time.monotonic() < deadline, "a finish did not reach the handler"
            time.sleep(0.5)
        finished = listed()
        for run in groups:
            steps = TWO_RUNS_TRAINING["steps"]
            assert re.search(rf"^{run}\s+finished\s+step {steps}/{steps} \(final\)\s+loss "
                             rf"{losses[run][steps]:.4f}\s+machines 0 ", finished,
                             re.M), finished  # fmt: skip
        assert cli.main(["run", "retire", "local", "third"]) == 0
        assert local.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[groups["third"]])["AutoScalingGroups"] == []  # fmt: skip
        declared = local.client("ssm").get_parameters_by_path(Path="/spotrain/local/runs")
        kept = {p["Name"].removeprefix("/spotrain/local/runs/") for p in declared["Parameters"]}
        assert "third" not in kept and {"demo", "second"} <= kept, kept  # and the user's
        # Retired, its file kept: listed as retired with what it cost, not as never deployed.
        assert re.search(r"^third\s+retired\s.*\$\d+\.\d\d", listed(), re.M)
    finally:
        hold.unlink(missing_ok=True)  # a run held when an assertion failed goes on
        fleet.stop_all()
        _restore_declarations(local, "second", as_deployed)  # the second plan finds no drift
        if urgent is not None:
            _remove_own_run(local, urgent, ("us-east-1",))


def test_rehearsal_loses_no_work_and_ends_on_the_uninterrupted_loss(
    local: Local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`spotrain rehearse`'s story on this deployment: train, spot notice (IMDS and the
    EventBridge event to the deployed handler's code), resume, primary region down, restore
    from the replica bucket, finish there. Its own run, so the fleet rehearsal below has the
    environment's. While its region is down nothing else may use this cloud: the user's own
    run on the other worker waits for it."""
    import re

    from spotrain.tools.rehearsal import Rehearsal

    for name, value in control.aws_environment(local.cloud.endpoint, "us-east-1").items():
        monkeypatch.setenv(name, value)
    said: list[str] = []
    outputs = local.outputs
    report = Rehearsal(tmp_path, say=said.append, price_book=None).story(
        local.cloud, {**outputs, "config": local.config}, run="solo"
    )
    told = "\n".join(said) + "\n" + report.render()
    assert report.passed, told
    for stage in range(2, 7):
        assert f"[{stage}/6]" in told
    assert re.search(r"steps lost to preemption\s+0 ", told), told
    assert re.search(r"committed work lost\s+0 steps", told), told
    assert "identical at every step" in told
    assert "handler: recorded=True (redelivery recorded=False)" in told
    assert re.search(r"moved to us-west-2 \(epoch 1\); restored step 20 from s3://\S+-us-west-2",
                     told), told  # fmt: skip
    # The move's check was the restore: the training start's restore fetched none of it again.
    once = re.search(r"shards verified, ([\d,]+) bytes taken from the move's check, 0 fetched "
                     r"again\)", told)  # fmt: skip
    assert once and int(once[1].replace(",", "")) > 0, told
    # What the move took and sent: its checkpoints were replicated as they were published.
    moved = re.search(r"move\s+restored in us-west-2 ([\d.]+) s after us-east-1 went down .*; "
                      r"([\d,]+) bytes of checkpoints replicated to us-west-2 before it "
                      r"\(\$[\d.]+ at \$0.02/GB\), nothing sent by the move", told)  # fmt: skip
    assert moved and 0 < float(moved[1]) < 300 and int(moved[2].replace(",", "")) > 0, told
    assert faults.read(control.faults_file()).regions_down == []  # the region is back
    # The catalog outlived its region: the global table's replica holds the run's every item,
    # published while the primary was up (once replication caught up after its return).
    from boto3.dynamodb.conditions import Key

    from spotrain.core.catalog_schema import PARTITION_KEY, STATUS_COMPLETE, STATUS_FENCED, run_key

    def catalog(region: str) -> list[dict[str, Any]]:
        table = control.resource("dynamodb", local.cloud.endpoint, region).Table(
            "spotrain-local-checkpoints")  # fmt: skip
        return list(table.query(KeyConditionExpression=Key(PARTITION_KEY).eq(run_key("solo")),
                                ConsistentRead=True)["Items"])  # fmt: skip

    deadline = time.monotonic() + 30
    while catalog(local.config.replica_regions[0]) != catalog(local.config.primary_region):
        assert time.monotonic() < deadline, "the catalog's copies never agreed"
        time.sleep(0.2)
    assert any(item.get("status") == STATUS_COMPLETE for item in catalog("us-east-1"))
    # The primary is back and reads the replica region's head: the run moved (epoch 1) and
    # finished there; what it published at home before the move is still its history.
    from spotrain.core.run_epochs import EpochId
    from spotrain.trainer.catalog import DynamoCatalog
    from spotrain.trainer.storage import LocalStorage

    home = DynamoCatalog("spotrain-local-checkpoints", "solo", LocalStorage(tmp_path / "none"),
                         client=local.client("dynamodb"))  # fmt: skip
    head = home.head()
    assert head is not None and head.epoch == EpochId(1, "us-west-2"), head
    assert [e for e in home.entries() if e.status == STATUS_FENCED] == []
    # `run status` says where the run trains now.
    from spotrain.cli import run_status

    tables = control.resource("dynamodb", local.cloud.endpoint, "us-east-1")
    where = run_status.Where(
        events=tables.Table("spotrain-local-events"),
        catalog=tables.Table("spotrain-local-checkpoints"), autoscaling=local.client("autoscaling"),
        ssm=local.client("ssm"), bucket=local.primary_bucket, environment="local",
        region="us-east-1", buckets={"us-east-1": local.primary_bucket,
                                     "us-west-2": local.replica_bucket},
    )  # fmt: skip
    status = run_status.status_of(where, "solo", [])
    assert (status.trains_in, status.epoch, status.moved_from_step) == ("us-west-2", 1, 20)
    # Its head is named where it trains: the bucket its writer published to.
    assert status.head_manifest is not None
    assert status.head_manifest.startswith(f"s3://{local.replica_bucket}/runs/solo/")
    # Priced out of the box, as on a fresh clone: the checked-in book's AWS prices, spot
    # cheaper.
    spend = re.search(r"spend\s+\$([\d.]+) for ([\d.]+) machine-hours of run demo's fleet; "
                      r"\$([\d.]+) on on-demand prices", told)  # fmt: skip
    assert spend and 0 < float(spend[1]) <= float(spend[3]), told
    assert "unpriced" not in told


EXAMPLE_PRICE_BOOK = ROOT / "examples" / "price-book.json"
"""The example book (made-up figures for every instance type the example runs declare:
g5.xlarge $20/h on-demand, $5/h spot): the fleet rehearsal prices its spend with it, so the
documented format is the one that works."""


def test_fleet_rehearsal_three_machines_from_the_deployed_template_lose_nothing(
    local: Local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The fleet rehearsal on this deployment: three instances of the deployed group, played
    on this host from the deployed user data and bootstrap.sh, fetch the dataset and the run's
    configuration from the deployed bucket, meet at the on-demand one and train one run; a
    spot one is reclaimed and the others go on without it; the group's replacement joins the
    running group. Losses are those of one uninterrupted process with the same global batch."""
    from spotrain.tools.fleet_rehearsal import MACHINES, STEPS, FleetRehearsal

    for name, value in control.aws_environment(local.cloud.endpoint, "us-east-1").items():
        monkeypatch.setenv(name, value)
    said: list[str] = []
    outputs = local.outputs
    notices = _subscribe_a_queue(local, outputs["notice_topic"])
    book = EXAMPLE_PRICE_BOOK
    report = FleetRehearsal(tmp_path, say=said.append, price_book=book).story(
        local.cloud, {**outputs, "config": local.config}
    )
    rendered = report.render()
    assert report.passed, rendered + "\n" + "\n".join(said)
    assert [n for _, n in report.worlds] == [MACHINES, MACHINES - 1, MACHINES]
    # A run pays only while it trains: its final publish reached the deployed handler over
    # the catalog's stream, its groups went to 0 and stayed, the ledger stopped, and on-call
    # heard it finished, with what it cost.
    assert report.finish.by_stream and report.finish.in_service == 0, rendered
    assert report.finish.ledger_usd[0] == report.finish.ledger_usd[1] > 0, rendered
    [finished] = [m for m in _drain_queue(local, notices)
                  if m.get("kind") == "finished" and m.get("run") == report.run]  # fmt: skip
    assert finished["step"] == STEPS
    assert finished["spend_usd"] > 0 and "spotrain cost report" in finished["report"]
    assert report.reclaimed_stop == report.reclaimed_resume  # nothing lost to the reclaim
    assert report.join_stop == report.join_resume  # nor to the join
    assert report.head_step == STEPS and report.crashes == 0
    assert report.handler["recorded"] is True
    assert "counted as preempted" in rendered
    logs = "\n".join(p.read_text() for p in (tmp_path / "machines").glob("*/boot.log"))
    assert logs.count(" coordinates run ") == 1  # the on-demand machine; the others found it
    assert logs.count(" meets at 127.0.0.1:") == MACHINES
    # The dataset came from the deployed bucket, and a restart on the same disk reuses it.
    assert "4 shard(s), 4 fetched" in logs and "0 fetched, 4 already on this disk" in logs
    # Every machine's output, the reclaimed one's included, is in the deployed log group, one
    # stream each, as its journal has it: on-call can read a machine that is gone.
    cloudwatch = local.client("logs")
    group = outputs["machine_log_group"]
    for boot_log in (tmp_path / "machines").glob("*/boot.log"):
        stream = {"logGroupName": group, "logStreamName": boot_log.parent.name}
        page = cloudwatch.get_log_events(**stream, startFromHead=True)
        messages = [e["message"] for e in page["events"]]
        while page["events"]:  # pages until the token stops moving
            page = cloudwatch.get_log_events(**stream, nextToken=page["nextForwardToken"])
            messages += [e["message"] for e in page["events"]]

        # Progress bars redraw with carriage returns: compare what each side says, piece by
        # piece, whichever line breaks each kept.
        def pieces(text: str) -> list[str]:
            return [piece for piece in re.split(r"[\r\n]", text) if piece.strip()]

        assert pieces("\n".join(messages)) == pieces(boot_log.read_text()), boot_log.parent.name

    # After the rehearsal an operator asks the local cloud what the run cost and what its
    # preemption cost: the handler's three checks, the catalog's checkpoints, the warning.
    from spotrain import cli

    capsys.readouterr()
    tables = ["--run", report.run, "--events-table", outputs["events_table"]]
    assert cli.main(["cost", "status", *tables]) == 0
    assert re.search(rf"run {report.run}: \$[\d.]+ spent", capsys.readouterr().out)
    figure = tmp_path / "spend.png"
    catalog = ["--catalog-table", outputs["checkpoint_catalog_table"]]
    assert cli.main(["cost", "report", *tables, *catalog, "--environment", "local", "--json",
                     "--plot", str(figure)]) == 0  # fmt: skip
    found = json.loads(capsys.readouterr().out)
    assert 0 < found["ledger"]["spend_usd"] < found["ledger"]["on_demand_usd"], found
    # Each checkpoint's new bytes, as its machines recorded them, went to the other region.
    assert found["replicated_bytes"] > 0, found
    assert found["replication_usd"] == pytest.approx(found["replicated_bytes"] / 1e9 * 0.02)
    # Three checks here (the rehearsal above counted the same fleet's machines twice before).
    spent = [p["spend_usd"] for p in found["points"]]
    assert len(spent) >= 3 and spent == sorted(spent) and figure.stat().st_size > 0, found
    reclaimed = [i for i, fate in report.machines.items() if "reclaimed" in fate]
    # The rehearsal above warned one of the same run's machines too (its handler serves the
    # environment's run): this story's warning is the one of the reclaimed machine.
    mine = [p for p in found["preemptions"] if reclaimed[0] in p["instances"]]
    assert len(mine) == 1, (reclaimed, found["preemptions"])
    (preemption,) = mine
    assert (preemption["reached_step"], preemption["resumed_from"], preemption["steps_lost"]) == (
        report.reclaimed_stop, report.reclaimed_resume, 0), mine  # fmt: skip
    assert 0 <= preemption["time_to_resume_s"] < 300 and preemption["cost_usd"] >= 0, found
    assert found["head_step"] == STEPS and 0 < found["goodput"] < 1, found
    assert found["checkpoints"] > 0 and found["mean_stall_s"] > 0, found
    # On-call reads why the reclaimed machine left, after it is gone, as a user would.
    capsys.readouterr()
    assert cli.main(["run", "logs", "local", report.run, "--machine", reclaimed[0]]) == 0
    said = capsys.readouterr().out
    assert f"joins run {report.run}" in said, said[-3000:]
    assert f"{reclaimed[0]} was reclaimed (terminate at " in said, said[-3000:]
    assert f"on {reclaimed[0]}: preempted; run {report.run} has 0 crash(es)" in said, said


TWO_RUNS_TRAINING = {
    "steps": 240, "checkpoint_every": 80, "micro_batch": 4, "seed": 5, "log_every": 100,
    "model": {"context": 32, "layers": 2, "heads": 2, "width": 64},
}  # fmt: skip
"""Both runs of the story below train this: the same losses at every step, unless a cancel
and resume lost or changed anything. Each is held past its first checkpoint (the one started
first paused, the other held after a step: `failpoints.hold`) while both are listed as
training: the hold comes some steps after that checkpoint (its publish, then the player's look
every half second), and 160 steps leave room for a host several times as fast; three
checkpoints a run."""


class _PlayedFleet:
    """The instances of deployed groups, each played on this host from its group's launch
    template (as the fleet rehearsal plays them), and shut down as EC2 stops an instance."""

    def __init__(self, local: Local, work: Path) -> None:
        self.local, self.work = local, work
        self.autoscaling, self.ec2 = local.client("autoscaling"), local.client("ec2")
        self.machines: dict[str, tuple[str, Any]] = {}
        """By instance id: its group and the machine played."""
        self.rdzv_ports: dict[str, int] = {}
        """One host plays every machine: each run's coordinator hosts its rendezvous on a free
        port of its own."""

    def boot(self, group: str, lifecycle: str = "on-demand",
             settings: dict[str, str] | None = None) -> Any:  # fmt: skip
        """The group's next instance in service on the `lifecycle` market (as EC2 launched
        it) that is not played yet, booted (by default its run's coordinator: on-demand), with
        `settings` added to its environment."""
        from spotrain.localcloud.machines import (
            LocalMachine,
            deployed_user_data,
            in_service,
            on_demand_first,
        )

        members, template = in_service(self.autoscaling, group)
        member = next(m for m, market in on_demand_first(self.ec2, members)
                      if m["InstanceId"] not in self.machines and market == lifecycle)  # fmt: skip
        machine = LocalMachine.of_member(
            member, lifecycle=lifecycle, root=self.work,
            user_data=deployed_user_data(self.ec2, template),
            aws_env=control.aws_environment(self.local.cloud.endpoint, "us-east-1"),
            rdzv_port=self.rdzv_ports.setdefault(group, control.free_port()),
            default_type="g6.xlarge", launch_template=template,
            settings={"SPOTRAIN_RDZV_LAST_CALL": "1", **(settings or {})},
        )  # fmt: skip
        self.machines[member["InstanceId"]] = (group, machine)
        return machine.start()

    def shut_down_the_terminated(self, group: str) -> dict[str, int | None]:
        """Every played machine of `group` that its group no longer has, stopped as its OS
        stops it (SIGTERM, then SIGKILL after the unit's stop timeout): their exit codes."""
        from spotrain.localcloud.machines import in_service

        kept = {m["InstanceId"] for m in in_service(self.autoscaling, group)[0]}
        return {instance: machine.shut_down()
                for instance, (its_group, machine) in self.machines.items()
                if its_group == group and machine.running() and instance not in kept}  # fmt: skip

    def stop_all(self) -> None:
        for _, machine in self.machines.values():
            machine.stop()


def test_second_plan_shows_no_changes(local: Local) -> None:
    """Nothing the stories on the environment's runs did (runs submitted and retired, machines
    started and stopped, holds and releases, a region taken down) is drift. It runs after
    them, beside the user's-repository story on the other worker: that story changes only its
    own run's stack, which it deploys and retires itself, and which this plan does not read
    (destroy, after it, finds nothing of it left)."""
    assert local.deployment.plan_has_changes() == {name: False for name in local.deployment.stacks}
