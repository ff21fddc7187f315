"""The local cloud closes the emulator gaps the blueprint hits, over HTTP with boto3."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from spotrain.localcloud import control

REGION = "us-east-1"
ACCOUNT = "123456789012"


def client(cloud: control.RunningCloud, service: str, region: str = REGION) -> Any:
    return control.client(service, cloud.endpoint, region)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def as_session(cloud: control.RunningCloud, service: str, keys: dict[str, str]) -> Any:
    """A client of `service` signed with an assumed role's session (STS's `Credentials`)."""
    return control.client(
        service, cloud.endpoint, REGION, aws_access_key_id=keys["AccessKeyId"],
        aws_secret_access_key=keys["SecretAccessKey"], aws_session_token=keys["SessionToken"],
    )  # fmt: skip


def answer(call: Callable[[], Any]) -> str:
    """ "done", or the error code the cloud answered `call` with."""
    try:
        call()
    except ClientError as error:
        return str(error.response["Error"]["Code"])
    return "done"


def new_role(cloud: control.RunningCloud, statements: list[dict[str, Any]]) -> dict[str, str]:
    """A new role whose one policy is `statements`, which the account and EC2 (for an
    instance profile) may assume: its RoleName and Arn."""
    iam = client(cloud, "iam")
    trust = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": "sts:AssumeRole",
        "Principal": {"Service": "ec2.amazonaws.com", "AWS": f"arn:aws:iam::{ACCOUNT}:root"},
    }]}  # fmt: skip
    name = unique("role")
    role = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]
    policy = {"Version": "2012-10-17", "Statement": statements}
    iam.put_role_policy(RoleName=name, PolicyName="grants", PolicyDocument=json.dumps(policy))
    return {"RoleName": name, "Arn": role["Arn"]}


def session_of(cloud: control.RunningCloud, statements: list[dict[str, Any]], *,
               session: str = "handler") -> dict[str, str]:  # fmt: skip
    """The keys (STS's `Credentials`) of a session named `session` of a `new_role`."""
    role = new_role(cloud, statements)
    keys = client(cloud, "sts").assume_role(RoleArn=role["Arn"], RoleSessionName=session)
    return dict(keys["Credentials"])


# --- Budgets --------------------------------------------------------------------------------
NOTIFICATION = {
    "NotificationType": "ACTUAL",
    "ComparisonOperator": "GREATER_THAN",
    "Threshold": 80.0,
    "ThresholdType": "PERCENTAGE",
}


@pytest.fixture
def budget(local_cloud: control.RunningCloud) -> Any:
    budgets = client(local_cloud, "budgets")
    name = unique("budget")
    budgets.create_budget(
        AccountId=ACCOUNT,
        Budget={
            "BudgetName": name,
            "BudgetLimit": {"Amount": "100", "Unit": "USD"},
            "TimeUnit": "MONTHLY",
            "BudgetType": "COST",
        },
        NotificationsWithSubscribers=[
            {
                "Notification": NOTIFICATION,
                "Subscribers": [{"SubscriptionType": "EMAIL", "Address": "oncall@example.com"}],
            }
        ],
        ResourceTags=[{"Key": "team", "Value": "ml-platform"}],
    )
    yield budgets, name
    budgets.delete_budget(AccountId=ACCOUNT, BudgetName=name)


def test_describes_the_subscribers_of_a_notification(budget: Any) -> None:
    budgets, name = budget
    found = budgets.describe_subscribers_for_notification(
        AccountId=ACCOUNT, BudgetName=name, Notification={**NOTIFICATION, "Threshold": 80}
    )["Subscribers"]
    assert found == [{"SubscriptionType": "EMAIL", "Address": "oncall@example.com"}]


def test_adds_and_removes_subscribers(budget: Any) -> None:
    budgets, name = budget
    sns = {"SubscriptionType": "SNS", "Address": f"arn:aws:sns:{REGION}:{ACCOUNT}:alerts"}
    budgets.create_subscriber(
        AccountId=ACCOUNT, BudgetName=name, Notification=NOTIFICATION, Subscriber=sns
    )
    budgets.delete_subscriber(
        AccountId=ACCOUNT,
        BudgetName=name,
        Notification=NOTIFICATION,
        Subscriber={"SubscriptionType": "EMAIL", "Address": "oncall@example.com"},
    )
    found = budgets.describe_subscribers_for_notification(
        AccountId=ACCOUNT, BudgetName=name, Notification=NOTIFICATION
    )["Subscribers"]
    assert found == [sns]


def test_unknown_notification_is_not_found(budget: Any) -> None:
    budgets, name = budget
    with pytest.raises(ClientError) as caught:
        budgets.describe_subscribers_for_notification(
            AccountId=ACCOUNT, BudgetName=name, Notification={**NOTIFICATION, "Threshold": 42.0}
        )
    assert caught.value.response["Error"]["Code"] == "NotFoundException"


def test_budget_tags_round_trip(budget: Any) -> None:
    budgets, name = budget
    arn = f"arn:aws:budgets::{ACCOUNT}:budget/{name}"
    assert budgets.list_tags_for_resource(ResourceARN=arn)["ResourceTags"] == [
        {"Key": "team", "Value": "ml-platform"}
    ]
    budgets.tag_resource(ResourceARN=arn, ResourceTags=[{"Key": "env", "Value": "local"}])
    budgets.untag_resource(ResourceARN=arn, ResourceTagKeys=["team"])
    assert budgets.list_tags_for_resource(ResourceARN=arn)["ResourceTags"] == [
        {"Key": "env", "Value": "local"}
    ]


# --- S3 replication -------------------------------------------------------------------------
@pytest.fixture
def replicated_pair(local_cloud: control.RunningCloud) -> Any:
    s3_primary = client(local_cloud, "s3")
    s3_replica = client(local_cloud, "s3", "us-west-2")
    kms = client(local_cloud, "kms", "us-west-2")
    replica_key = kms.create_key()["KeyMetadata"]["Arn"]
    source, target = unique("source"), unique("target")
    s3_primary.create_bucket(Bucket=source)
    s3_replica.create_bucket(
        Bucket=target, CreateBucketConfiguration={"LocationConstraint": "us-west-2"}
    )
    for s3, bucket in ((s3_primary, source), (s3_replica, target)):
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3_primary.put_bucket_replication(
        Bucket=source,
        ReplicationConfiguration={
            "Role": f"arn:aws:iam::{ACCOUNT}:role/replication",
            "Rules": [
                {
                    "ID": "checkpoints",
                    "Status": "Enabled",
                    "Priority": 1,
                    "Filter": {"Prefix": "runs/"},
                    "DeleteMarkerReplication": {"Status": "Enabled"},
                    "SourceSelectionCriteria": {"SseKmsEncryptedObjects": {"Status": "Enabled"}},
                    "Destination": {
                        "Bucket": f"arn:aws:s3:::{target}",
                        "EncryptionConfiguration": {"ReplicaKmsKeyID": replica_key},
                    },
                }
            ],
        },
    )
    return s3_primary, s3_replica, source, target, replica_key


def test_new_object_is_copied_to_the_replica_bucket(replicated_pair: Any) -> None:
    s3_primary, s3_replica, source, target, replica_key = replicated_pair
    body = uuid.uuid4().bytes * 1000
    s3_primary.put_object(Bucket=source, Key="runs/demo/step_000000010/shard-0", Body=body)
    replica = s3_replica.get_object(Bucket=target, Key="runs/demo/step_000000010/shard-0")
    assert replica["Body"].read() == body
    assert replica["ReplicationStatus"] == "REPLICA"
    assert replica["ServerSideEncryption"] == "aws:kms"
    assert replica["SSEKMSKeyId"] == replica_key
    original = s3_primary.head_object(Bucket=source, Key="runs/demo/step_000000010/shard-0")
    assert original["ReplicationStatus"] == "COMPLETED"


def test_multipart_upload_is_replicated(replicated_pair: Any) -> None:
    s3_primary, s3_replica, source, target, _ = replicated_pair
    key = "runs/demo/step_000000020/shard-big"
    upload = s3_primary.create_multipart_upload(Bucket=source, Key=key)["UploadId"]
    parts = []
    for number in (1, 2):
        data = bytes([number]) * (5 * 1024 * 1024)
        etag = s3_primary.upload_part(
            Bucket=source, Key=key, UploadId=upload, PartNumber=number, Body=data
        )["ETag"]
        parts.append({"ETag": etag, "PartNumber": number})
    s3_primary.complete_multipart_upload(
        Bucket=source, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
    )
    replica = s3_replica.get_object(Bucket=target, Key=key)["Body"].read()
    assert replica == bytes([1]) * (5 * 1024 * 1024) + bytes([2]) * (5 * 1024 * 1024)


def test_objects_outside_the_rule_filter_stay_put(replicated_pair: Any) -> None:
    s3_primary, s3_replica, source, target, _ = replicated_pair
    s3_primary.put_object(Bucket=source, Key="scratch/notes.txt", Body=b"not a checkpoint")
    with pytest.raises(ClientError) as caught:
        s3_replica.head_object(Bucket=target, Key="scratch/notes.txt")
    assert caught.value.response["Error"]["Code"] == "404"
    head = s3_primary.head_object(Bucket=source, Key="scratch/notes.txt")
    assert "ReplicationStatus" not in head


def test_disabled_rule_replicates_nothing(replicated_pair: Any) -> None:
    s3_primary, s3_replica, source, target, _ = replicated_pair
    config = s3_primary.get_bucket_replication(Bucket=source)["ReplicationConfiguration"]
    config["Rules"][0]["Status"] = "Disabled"
    s3_primary.put_bucket_replication(Bucket=source, ReplicationConfiguration=config)
    s3_primary.put_object(Bucket=source, Key="runs/demo/late", Body=b"x")
    with pytest.raises(ClientError):
        s3_replica.head_object(Bucket=target, Key="runs/demo/late")


# --- faults ---------------------------------------------------------------------------------
@pytest.fixture
def faults_cleared(local_cloud: control.RunningCloud) -> Any:
    yield
    control.set_faults(regions_down=[], regions_partitioned=[], table_replication_lag_seconds=0.0,
                       replication_pending=[])  # fmt: skip


def test_held_replication_leaves_the_replica_missing_until_resumed(
    replicated_pair: Any, faults_cleared: None
) -> None:
    s3_primary, s3_replica, source, target, _ = replicated_pair
    control.set_faults(replication_pending=[f"{source}/runs/demo/step_000000030/*"])
    s3_primary.put_object(Bucket=source, Key="runs/demo/step_000000030/shard-0", Body=b"late")
    s3_primary.put_object(Bucket=source, Key="runs/demo/step_000000020/shard-0", Body=b"on time")
    with pytest.raises(ClientError):
        s3_replica.head_object(Bucket=target, Key="runs/demo/step_000000030/shard-0")
    held = s3_primary.head_object(Bucket=source, Key="runs/demo/step_000000030/shard-0")
    assert held["ReplicationStatus"] == "PENDING"
    assert (
        s3_replica.get_object(Bucket=target, Key="runs/demo/step_000000020/shard-0")["Body"].read()
        == b"on time"
    )
    control.set_faults(replication_pending=[])
    s3_primary.put_object(Bucket=source, Key="runs/demo/step_000000030/shard-1", Body=b"now")
    assert s3_replica.head_object(Bucket=target, Key="runs/demo/step_000000030/shard-1")


def test_a_region_that_is_down_answers_503_and_the_others_serve(
    local_cloud: control.RunningCloud, faults_cleared: None
) -> None:
    control.set_faults(regions_down=["us-east-1"])
    primary = client(local_cloud, "dynamodb", "us-east-1")
    with pytest.raises(ClientError) as refused:
        primary.list_tables()
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert "TableNames" in client(local_cloud, "dynamodb", "us-west-2").list_tables()
    control.set_faults(regions_down=[])
    assert "TableNames" in primary.list_tables()


# --- DynamoDB global tables -----------------------------------------------------------------
def _wait_for(read: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while (value := read()) is None or value is False:
        assert time.monotonic() < deadline, "the change never arrived"
        time.sleep(0.05)
    return value


def test_a_global_table_replicates_after_its_lag_and_the_last_writer_wins_after_a_partition(
    local_cloud: control.RunningCloud, faults_cleared: None
) -> None:
    home, away = "us-east-1", "us-west-2"
    table = unique("global")
    near, far = client(local_cloud, "dynamodb", home), client(local_cloud, "dynamodb", away)
    far_key = client(local_cloud, "kms", away).create_key()["KeyMetadata"]["Arn"]
    near.create_table(
        TableName=table, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                   {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                              {"AttributeName": "sk", "AttributeType": "S"}],
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )  # fmt: skip

    def key(name: str) -> dict[str, Any]:
        return {"pk": {"S": "run"}, "sk": {"S": name}}

    def read(region_client: Any, name: str) -> str | None:
        item = region_client.get_item(TableName=table, Key=key(name), ConsistentRead=True)
        return item.get("Item", {}).get("v", {}).get("S")

    def write(region_client: Any, name: str, value: str, **condition: Any) -> None:
        region_client.put_item(TableName=table, Item={**key(name), "v": {"S": value}}, **condition)

    write(near, "before", "1")
    near.update_table(TableName=table, ReplicaUpdates=[
        {"Create": {"RegionName": away, "KMSMasterKeyId": far_key}}])  # fmt: skip
    replicas = near.describe_table(TableName=table)["Table"]["Replicas"]
    assert replicas == [{"RegionName": away, "ReplicaStatus": "ACTIVE", "KMSMasterKeyId": far_key}]
    described = far.describe_table(TableName=table)["Table"]
    assert described["SSEDescription"]["KMSMasterKeyArn"] == far_key
    assert [r["RegionName"] for r in described["Replicas"]] == [home]
    assert read(far, "before") == "1"  # a new replica holds the table's items

    control.set_faults(table_replication_lag_seconds=1.0)
    written = time.monotonic()
    write(near, "lagged", "2")
    assert read(far, "lagged") is None  # answered at home, not yet away
    _wait_for(lambda: read(far, "lagged"))
    assert time.monotonic() - written >= 0.9
    control.set_faults(table_replication_lag_seconds=0.0)
    far.delete_item(TableName=table, Key=key("lagged"))
    _wait_for(lambda: read(near, "lagged") is None)

    # Cut off, both sides accept writes, even a conditional create of the same item.
    control.set_faults(regions_partitioned=[away])
    new_only = {"ConditionExpression": "attribute_not_exists(pk)"}
    write(near, "head", "home's", **new_only)
    write(far, "head", "away's", **new_only)
    far.update_item(TableName=table, Key=key("count"), UpdateExpression="SET v = :v",
                    ExpressionAttributeValues={":v": {"S": "away's"}})  # fmt: skip
    write(near, "count", "home's, later")
    time.sleep(0.3)
    assert (read(near, "head"), read(far, "head")) == ("home's", "away's")
    control.set_faults(regions_partitioned=[])
    # Rejoined: every copy ends on the later write of each item, whichever side made it.
    _wait_for(lambda: read(near, "head") == "away's")
    _wait_for(lambda: read(far, "count") == "home's, later")
    time.sleep(0.3)
    assert (read(far, "head"), read(near, "count")) == ("away's", "home's, later")

    near.update_table(TableName=table, ReplicaUpdates=[{"Delete": {"RegionName": away}}])
    assert "Replicas" not in near.describe_table(TableName=table)["Table"]
    assert table not in far.list_tables()["TableNames"]


def test_a_read_beside_an_update_sees_the_item_as_one_write_left_it(
    local_cloud: control.RunningCloud,
) -> None:
    """DynamoDB reads an item as one write left it: an UpdateItem that creates an item is seen
    with every attribute it sets or not at all, and an update of an item before or after,
    never half made. moto creates the item from its key and then sets the attributes one by
    one (and changes an existing item in place): a read served meanwhile on another thread of
    the server saw the key alone (a machine claiming its run's coordinator then failed on the
    item its peer's claim had half made)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    dynamodb = client(local_cloud, "dynamodb")
    table = unique("items")
    dynamodb.create_table(
        TableName=table, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
    )  # fmt: skip
    names = [f"a{i}" for i in range(40)]
    update = "SET " + ", ".join(f"#{n} = :{n}" for n in names)
    attribute_names = {f"#{n}": n for n in names}
    values = {f":{n}": {"S": n} for n in names}
    keys = [f"item-{i}" for i in range(60)]

    def create(key: str) -> None:
        dynamodb.update_item(TableName=table, Key={"pk": {"S": key}}, UpdateExpression=update,
                             ExpressionAttributeNames=attribute_names,
                             ExpressionAttributeValues=values)  # fmt: skip

    def watch(key: str) -> set[str]:
        """The attributes of the first copy of `key` a read returns."""
        while True:
            item = dynamodb.get_item(TableName=table, Key={"pk": {"S": key}},
                                     ConsistentRead=True).get("Item")  # fmt: skip
            if item:
                return set(item) - {"pk"}

    with ThreadPoolExecutor(3) as pool:
        for key in keys:
            readers = [pool.submit(watch, key) for _ in range(2)]
            time.sleep(0.01)  # the readers are asking before the item exists
            create(key)
            for seen in readers:
                assert seen.result(timeout=30) == set(names), key

    # An update of an existing item is seen before or after, never half made: each round sets
    # every attribute to the round's number.
    rounds = 60
    done = threading.Event()

    def versions() -> set[frozenset[str]]:
        """The sets of values each read found on the item, over every round."""
        found = set()
        while not done.is_set():
            item = dynamodb.get_item(TableName=table, Key={"pk": {"S": keys[0]}},
                                     ConsistentRead=True)["Item"]  # fmt: skip
            found.add(frozenset(item[n]["S"] for n in names))
        return found

    def round_of(number: int) -> None:
        dynamodb.update_item(TableName=table, Key={"pk": {"S": keys[0]}},
                             UpdateExpression=update, ExpressionAttributeNames=attribute_names,
                             ExpressionAttributeValues={f":{n}": {"S": str(number)}
                                                        for n in names})  # fmt: skip

    round_of(0)
    with ThreadPoolExecutor(2) as pool:
        readers = [pool.submit(versions) for _ in range(2)]
        for number in range(1, rounds):
            round_of(number)
        done.set()
        seen = set().union(*(r.result(timeout=30) for r in readers))
    assert all(len(values) == 1 for values in seen), sorted(map(sorted, seen))[:3]


def test_an_update_changes_a_copy_so_an_item_a_read_found_stays_as_it_was() -> None:
    """The reply to a read is written from the item the read found, after the lock is let go:
    a later update must not change that item in place (moto's does), or the reply mixes two
    writes. In a process of its own: the local cloud's patches stay out of this one's moto."""
    import subprocess
    import sys

    script = """
import boto3
from moto import mock_aws
from moto.dynamodb.models import dynamodb_backends
from spotrain.localcloud import global_tables

global_tables.install()
with mock_aws():
    dynamodb = boto3.client("dynamodb", region_name="us-east-1")
    dynamodb.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                          KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                          AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}])
    key = {"pk": {"S": "k"}}
    dynamodb.put_item(TableName="t", Item={**key, "v": {"S": "before"}})
    backend = dynamodb_backends["123456789012"]["us-east-1"]
    found = backend.get_item("t", key)
    dynamodb.update_item(TableName="t", Key=key, UpdateExpression="SET v = :v",
                         ExpressionAttributeValues={":v": {"S": "after"}})
    print(found.attrs["v"].value, backend.get_item("t", key).attrs["v"].value)
"""
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "AWS_ACCESS_KEY_ID": "testing",
                              "AWS_SECRET_ACCESS_KEY": "testing"}, timeout=120)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["before", "after"]


# --- lifecycle ------------------------------------------------------------------------------
def test_status_reports_the_running_cloud(local_cloud: control.RunningCloud) -> None:
    assert control.status() == local_cloud
    assert control.up() == local_cloud  # idempotent: no second server


def test_second_cloud_on_a_taken_port_gets_a_clear_error(
    local_cloud: control.RunningCloud, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPOTRAIN_HOME", str(tmp_path))
    with pytest.raises(control.LocalCloudError, match="--port 0"):
        control.up(port=local_cloud.port)


# --- bucket policies ------------------------------------------------------------------------
TLS_AND_KMS_ONLY = {
    "Version": "2012-10-17",
    "Statement": [
        {"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": {"AWS": "*"},
         "Action": "s3:*", "Resource": ["arn:aws:s3:::b", "arn:aws:s3:::b/*"],
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
        {"Sid": "DenyPutWithoutSseKms", "Effect": "Deny", "Principal": {"AWS": "*"},
         "Action": "s3:PutObject", "Resource": "arn:aws:s3:::b/*",
         "Condition": {"StringNotEquals": {"s3:x-amz-server-side-encryption": "aws:kms"}}},
        {"Sid": "DenyPutWithOtherKey", "Effect": "Deny", "Principal": {"AWS": "*"},
         "Action": "s3:PutObject", "Resource": "arn:aws:s3:::b/*",
         "Condition": {"StringNotEqualsIfExists": {
             "s3:x-amz-server-side-encryption-aws-kms-key-id": "arn:aws:kms:us-east-1:1:key/k"}}},
    ],
}  # fmt: skip


@pytest.mark.parametrize(
    ("context", "verdict"),
    [
        ({"aws:SecureTransport": "false", "s3:x-amz-server-side-encryption": "aws:kms"}, "DENIED"),
        ({"aws:SecureTransport": "true"}, "DENIED"),  # no SSE header: StringNotEquals holds
        ({"aws:SecureTransport": "true", "s3:x-amz-server-side-encryption": "AES256"}, "DENIED"),
        # aws:kms without a key id would get the aws/s3 managed key: ...IfExists holds, denied.
        ({"aws:SecureTransport": "true", "s3:x-amz-server-side-encryption": "aws:kms"}, "DENIED"),
        (
            {
                "aws:SecureTransport": "true",
                "s3:x-amz-server-side-encryption": "aws:kms",
                "s3:x-amz-server-side-encryption-aws-kms-key-id": "arn:aws:kms:us-east-1:1:key/k",
            },
            "NEUTRAL",
        ),
        (
            {
                "aws:SecureTransport": "true",
                "s3:x-amz-server-side-encryption": "aws:kms",
                "s3:x-amz-server-side-encryption-aws-kms-key-id": "arn:aws:kms:us-east-1:1:key/x",
            },
            "DENIED",
        ),
    ],
)
def test_bucket_policy_conditions_are_evaluated_like_iam(
    context: dict[str, str], verdict: str
) -> None:
    from spotrain.localcloud.extensions import evaluate_bucket_policy

    assert (
        evaluate_bucket_policy(TLS_AND_KMS_ONLY, "s3:PutObject", "arn:aws:s3:::b/k", context)
        == verdict
    )


def test_policy_reads_are_allowed_over_tls_and_refused_without() -> None:
    from spotrain.localcloud.extensions import evaluate_bucket_policy

    read = ("s3:GetObject", "arn:aws:s3:::b/k")
    assert (
        evaluate_bucket_policy(TLS_AND_KMS_ONLY, *read, {"aws:SecureTransport": "true"})
        == "NEUTRAL"
    )
    assert (
        evaluate_bucket_policy(TLS_AND_KMS_ONLY, *read, {"aws:SecureTransport": "false"})
        == "DENIED"
    )


def test_local_cloud_enforces_a_kms_only_bucket_policy_over_https(
    local_cloud: control.RunningCloud,
) -> None:
    s3 = client(local_cloud, "s3")
    kms = client(local_cloud, "kms")
    key = kms.create_key()["KeyMetadata"]["Arn"]
    other_key = kms.create_key()["KeyMetadata"]["Arn"]
    bucket = unique("kms-only")
    s3.create_bucket(Bucket=bucket)
    policy = json.loads(
        json.dumps(TLS_AND_KMS_ONLY)
        .replace("arn:aws:s3:::b", f"arn:aws:s3:::{bucket}")
        .replace("arn:aws:kms:us-east-1:1:key/k", key)
    )
    s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=bucket, Key="plain", Body=b"x")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    for wrong_key in ({"SSEKMSKeyId": other_key}, {}):
        with pytest.raises(ClientError):
            s3.put_object(
                Bucket=bucket, Key="k", Body=b"x", ServerSideEncryption="aws:kms", **wrong_key
            )
    s3.put_object(
        Bucket=bucket, Key="ok", Body=b"x", ServerSideEncryption="aws:kms", SSEKMSKeyId=key
    )
    assert s3.get_object(Bucket=bucket, Key="ok")["Body"].read() == b"x"
    assert local_cloud.endpoint.startswith("https://")


def test_state_and_ca_bundle_paths_are_absolute(monkeypatch: pytest.MonkeyPatch) -> None:
    # Terraform runs inside each stack's folder: a relative CA path would not resolve there.
    monkeypatch.setenv("SPOTRAIN_HOME", ".spotrain")
    assert control.state_dir().is_absolute()
    env = control.aws_environment("https://127.0.0.1:4566", REGION)
    assert Path(env["AWS_CA_BUNDLE"]).is_absolute()


# --- identity-policy conditions: compliant / non-compliant pairs -------------------------
RUN_SCOPED = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::b",
         "Condition": {"StringLike": {"s3:prefix": ["runs/a/*", "runs/a"]}}},
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
         "Resource": "arn:aws:s3:::b/runs/a/*",
         "Condition": {"StringEquals": {"aws:SourceVpce": ["vpce-s3"]}}},
        {"Effect": "Allow", "Action": ["dynamodb:GetItem", "dynamodb:PutItem"],
         "Resource": "arn:aws:dynamodb:us-east-1:1:table/t",
         "Condition": {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["RUN#a"]}}},
    ],
}  # fmt: skip
WRITE_ONCE = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "s3:PutObject",
         "Resource": "arn:aws:s3:::b/runs/*",
         "Condition": {"Null": {"s3:if-none-match": "true"},
                       "Bool": {"s3:ObjectCreationOperation": "true"}}},
    ],
}  # fmt: skip
TABLE = "arn:aws:dynamodb:us-east-1:1:table/t"


@pytest.mark.parametrize(
    ("request_", "compliant", "non_compliant"),
    [
        (("s3:ListBucket", "arn:aws:s3:::b"), {"s3:prefix": "runs/a/"}, {"s3:prefix": "runs/b/"}),
        (("s3:ListBucket", "arn:aws:s3:::b"), {"s3:prefix": "runs/a"}, {}),
        (("s3:GetObject", "arn:aws:s3:::b/runs/a/k"), {"aws:SourceVpce": "vpce-s3"},
         {"aws:SourceVpce": "vpce-other"}),
        (("s3:GetObject", "arn:aws:s3:::b/runs/a/k"), {"aws:SourceVpce": "vpce-s3"}, {}),
        (("dynamodb:PutItem", TABLE), {"dynamodb:LeadingKeys": ["RUN#a"]},
         {"dynamodb:LeadingKeys": ["RUN#a", "RUN#b"]}),
        (("dynamodb:GetItem", TABLE), {"dynamodb:LeadingKeys": ["RUN#a"]},
         {"dynamodb:LeadingKeys": ["RELEASES#a"]}),
    ],
)  # fmt: skip
def test_identity_policy_conditions_allow_the_compliant_request_only(
    request_: tuple[str, str], compliant: dict[str, Any], non_compliant: dict[str, Any]
) -> None:
    from spotrain.localcloud.authorization import verdict

    assert verdict(RUN_SCOPED, *request_, compliant) == "PERMITTED"
    assert verdict(RUN_SCOPED, *request_, non_compliant) == "NEUTRAL"  # no grant: refused


def test_for_all_values_holds_for_an_empty_set_as_in_iam() -> None:
    """IAM's documented pitfall, modelled faithfully: a request with no leading keys (a Scan)
    satisfies ForAllValues; the policy above is safe because it grants no Scan."""
    from spotrain.localcloud.authorization import verdict

    assert verdict(RUN_SCOPED, "dynamodb:GetItem", TABLE, {}) == "PERMITTED"
    assert verdict(RUN_SCOPED, "dynamodb:Scan", TABLE, {}) == "NEUTRAL"


@pytest.mark.parametrize(
    ("method", "url", "headers", "verdict_"),
    [
        ("PUT", "https://h/b/runs/a/k", {"If-None-Match": "*"}, "NEUTRAL"),  # conditional put
        ("PUT", "https://h/b/runs/a/k", {}, "DENIED"),  # could overwrite
        ("POST", "https://h/b/runs/a/k?uploads", {}, "NEUTRAL"),  # starts an upload
        ("PUT", "https://h/b/runs/a/k?partNumber=1&uploadId=u", {}, "NEUTRAL"),  # a part
        ("POST", "https://h/b/runs/a/k?uploadId=u", {"if-none-match": "*"}, "NEUTRAL"),
        ("POST", "https://h/b/runs/a/k?uploadId=u", {}, "DENIED"),  # completes: could overwrite
        ("PUT", "https://h/b/datasets/k", {}, "NEUTRAL"),  # outside the write-once prefix
    ],
)
def test_write_once_prefix_refuses_writes_that_could_overwrite(
    method: str, url: str, headers: dict[str, str], verdict_: str
) -> None:
    from spotrain.localcloud.authorization import s3_context, verdict

    key = "arn:aws:s3:::" + url.split("https://h/", 1)[1].split("?")[0]
    context = s3_context(method, url, headers)
    assert verdict(WRITE_ONCE, "s3:PutObject", key, context, resource_policy=True) == verdict_


def test_dynamodb_transactions_are_authorized_item_by_item() -> None:
    from spotrain.localcloud.authorization import dynamodb_requests

    body = {"TransactItems": [
        {"Put": {"TableName": "t", "Item": {"pk": {"S": "RUN#a"}, "sk": {"S": "1"}}}},
        {"Update": {"TableName": "t", "Key": {"pk": {"S": "RUN#b"}, "sk": {"S": "HEAD"}}}},
    ]}  # fmt: skip
    query = {"TableName": "t", "IndexName": "lineage", "KeyConditionExpression": "#p = :v",
             "ExpressionAttributeNames": {"#p": "pk"},
             "ExpressionAttributeValues": {":v": {"S": "RUN#a"}}}  # fmt: skip

    def arn(name: str) -> str:
        return f"arn:aws:dynamodb:us-east-1:1:table/{name}"

    def hash_key(_: str) -> str:
        return "pk"

    assert dynamodb_requests("TransactWriteItems", body, arn, hash_key) == [
        ("dynamodb:PutItem", TABLE, {"dynamodb:LeadingKeys": ["RUN#a"]}),
        ("dynamodb:UpdateItem", TABLE, {"dynamodb:LeadingKeys": ["RUN#b"]}),
    ]
    assert dynamodb_requests("Query", query, arn, hash_key) == [
        ("dynamodb:Query", f"{TABLE}/index/lineage", {"dynamodb:LeadingKeys": ["RUN#a"]}),
    ]


# --- a machine's output to CloudWatch Logs ---------------------------------------------------
def test_a_machines_output_reaches_its_log_stream_including_what_follows_sigterm(
    local_cloud: control.RunningCloud,
) -> None:
    """`spotrain logs ship` as the boot script runs it: each line to the journal and to the
    machine's stream; a spot reclaim's SIGTERM does not stop it, so the emergency
    checkpoint's lines, printed after it, arrive too."""
    import os
    import signal
    import subprocess
    import sys

    logs = client(local_cloud, "logs")
    group = f"/spotrain/{unique('machines')}"
    logs.create_log_group(logGroupName=group)
    shipper = subprocess.Popen(
        [str(Path(sys.executable).parent / "spotrain"), "logs", "ship", "--group", group,
         "--stream", "i-0reclaimed", "--echo"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, **control.aws_environment(local_cloud.endpoint, REGION)},
    )  # fmt: skip
    assert shipper.stdin is not None and shipper.stdout is not None
    expected = [
        "spotrain bootstrap: i-0reclaimed joins run r", "step 41 loss 2.1",
        "emergency checkpoint of step 42 published",
    ]  # fmt: skip
    shipper.stdin.write("\n".join(expected[:2]) + "\n")
    shipper.stdin.flush()
    echoed = [shipper.stdout.readline().rstrip("\n") for _ in range(2)]  # the journal's copy
    shipper.send_signal(signal.SIGTERM)  # the service stops: every process in it gets this
    shipper.stdin.write(expected[2] + "\n")
    from helpers import rest_of

    out = rest_of(shipper, timeout=60)
    assert shipper.returncode == 0
    assert echoed + out.splitlines() == expected
    events = logs.get_log_events(logGroupName=group, logStreamName="i-0reclaimed",
                                 startFromHead=True)["events"]  # fmt: skip
    assert [e["message"] for e in events] == expected


def test_a_log_group_that_does_not_exist_ends_the_shipper_before_it_reads_a_line(
    local_cloud: control.RunningCloud,
) -> None:
    """Shipping to a missing group (or with an empty name) says which and exits non-zero at
    once, so the boot script's `|| cat` carries the whole output to the journal."""
    import os
    import subprocess
    import sys

    logs = client(local_cloud, "logs")
    group = f"/spotrain/{unique('machines')}"
    logs.create_log_group(logGroupName=group)
    environment = {**os.environ, **control.aws_environment(local_cloud.endpoint, REGION)}
    spotrain = str(Path(sys.executable).parent / "spotrain")
    for where, fragment in (
        (["--group", f"{group}-gone", "--stream", "i-0"], f"log group {group}-gone does not exist"),
        (["--group", "", "--stream", "i-0"], "--group '' is not a log group name"),
        (["--group", group, "--stream", ""], "--stream '' is not a log stream name"),
        (["--group", group, "--stream", "i:0"], "--stream 'i:0' is not a log stream name"),
    ):  # fmt: skip
        # The journal's fallback, as the boot script writes it: `ship ... || cat`.
        shell = f"{spotrain} logs ship {' '.join(map(repr, where))} --echo || cat"
        done = subprocess.run(["bash", "-c", shell], input="step 1\nstep 2\n", text=True,
                              capture_output=True, env=environment, timeout=60)  # fmt: skip
        assert fragment in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert done.stdout == "step 1\nstep 2\n"  # every line reached the journal, through cat
    assert logs.describe_log_streams(logGroupName=group)["logStreams"] == []


# --- Auto Scaling's bounds ---------------------------------------------------------------------
def test_group_sizes_outside_their_bounds_are_refused_as_aws_refuses_them(
    local_cloud: control.RunningCloud,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The local cloud refuses a desired capacity outside a group's bounds as AWS does; `fleet
    scale` says the fix before asking, and stops a group within the rules (--min-size)."""
    from helpers import launch_template

    from spotrain import cli

    autoscaling, ec2 = client(local_cloud, "autoscaling"), client(local_cloud, "ec2")
    name = unique("bounded")
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=1, MaxSize=2, DesiredCapacity=1,
        AvailabilityZones=["us-east-1a"],
        LaunchTemplate={"LaunchTemplateId": launch_template(ec2, name)},
    )  # fmt: skip

    def refused(call: Any, **arguments: Any) -> str:
        with pytest.raises(ClientError) as error:
            call(AutoScalingGroupName=name, **arguments)
        assert error.value.response["Error"]["Code"] == "ValidationError"
        return str(error.value.response["Error"]["Message"])

    assert "is above max value 2" in refused(autoscaling.set_desired_capacity, DesiredCapacity=10)
    assert "is below min value 1" in refused(autoscaling.set_desired_capacity, DesiredCapacity=0)
    assert "must be between the specified min size:1 and max size:2" in refused(
        autoscaling.update_auto_scaling_group, DesiredCapacity=3
    )
    assert "Max bound, 1, must be greater than or equal to min bound, 2" in refused(
        autoscaling.update_auto_scaling_group, MinSize=2, MaxSize=1
    )

    for key, value in control.aws_environment(local_cloud.endpoint, REGION).items():
        monkeypatch.setenv(key, value)

    def scale(*flags: str) -> tuple[int, str]:
        code = cli.main(["fleet", "scale", "--group", name, *flags])
        captured = capsys.readouterr()
        return code, captured.err + captured.out

    code, said = scale("--desired", "10")
    assert code == 2 and "above the group's maximum 2: give --desired 2 or less" in said
    code, said = scale("--desired", "0")
    assert code == 2 and "below the group's minimum 1: add --min-size 0" in said
    assert scale("--desired", "0", "--min-size", "0") == (
        0, f"{name}: desired capacity set to 0, minimum 0\n"
    )  # fmt: skip
    sizes = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])
    group = sizes["AutoScalingGroups"][0]
    assert (group["MinSize"], group["DesiredCapacity"]) == (0, 0)


def test_spot_pools_without_capacity_leave_a_group_short_until_capacity_returns(
    local_cloud: control.RunningCloud, capsys: pytest.CaptureFixture[str]
) -> None:
    """`spotrain local fault spot-gone REGION TYPES`: a mixed-instances group launches its
    on-demand base but none of its spot machines of those types (its desired capacity unmet,
    as AWS leaves it without capacity), tries again at each look, and fills once `spot-back`
    returns the capacity; spot placement scores say the same of the region meanwhile."""
    from helpers import launch_template

    from spotrain import cli

    autoscaling, ec2 = client(local_cloud, "autoscaling"), client(local_cloud, "ec2")
    name = unique("short-of-spot")
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=0, MaxSize=3, DesiredCapacity=0,
        AvailabilityZones=["us-east-1a"],
        MixedInstancesPolicy={
            "LaunchTemplate": {
                "LaunchTemplateSpecification": {"LaunchTemplateId": launch_template(ec2, name)},
                "Overrides": [{"InstanceType": "g6.xlarge"}],
            },
            "InstancesDistribution": {"OnDemandBaseCapacity": 1,
                                      "OnDemandPercentageAboveBaseCapacity": 0},
        },
    )  # fmt: skip

    def in_service() -> list[str]:
        [group] = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])[
            "AutoScalingGroups"]  # fmt: skip
        ids = [i["InstanceId"] for i in group["Instances"]]
        found = ec2.describe_instances(InstanceIds=ids)["Reservations"] if ids else []
        return sorted(i.get("InstanceLifecycle", "on-demand")
                      for r in found for i in r["Instances"])  # fmt: skip

    def scores(*types: str) -> dict[str, int]:
        answer = ec2.get_spot_placement_scores(
            InstanceTypes=list(types), TargetCapacity=2, SingleAvailabilityZone=False,
            RegionNames=[REGION, "us-west-2"])["SpotPlacementScores"]  # fmt: skip
        return {s["Region"]: s["Score"] for s in answer}

    try:
        assert cli.main(["local", "fault", "spot-gone", REGION, "g6.*"]) == 0
        assert "spot capacity gone: us-east-1/g6.*" in capsys.readouterr().out
        autoscaling.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=3)
        assert in_service() == ["on-demand"]
        assert in_service() == ["on-demand"]  # it tries again, and fails again
        # Spot placement scores say so: unlikely where every type asked is gone.
        assert scores("g6.xlarge") == {REGION: 1, "us-west-2": 9}
        assert scores("g6.xlarge", "g5.xlarge") == {REGION: 9, "us-west-2": 9}
        assert cli.main(["local", "fault", "spot-back", REGION, "g6.*"]) == 0
        assert in_service() == ["on-demand", "spot", "spot"]
        assert scores("g6.xlarge") == {REGION: 9, "us-west-2": 9}
    finally:
        control.set_faults(spot_capacity_gone=[])
    assert cli.main(["local", "fault", "spot-gone", "mars-east-1"]) == 2
    assert "is not an AWS region spotrain knows" in capsys.readouterr().err


def test_the_accounts_gpu_quotas_and_their_usage_answer_as_aws_does(
    local_cloud: control.RunningCloud, capsys: pytest.CaptureFixture[str]
) -> None:
    """Service Quotas answers for EC2's GPU quotas (the value `spotrain local fault quota`
    set, else the default) naming its AWS/Usage metric, whose value is the vCPUs of the
    region's running machines of that class and market."""
    from datetime import UTC, datetime, timedelta

    from spotrain import cli
    from spotrain.localcloud import account_quotas

    quotas, ec2 = client(local_cloud, "service-quotas"), client(local_cloud, "ec2")
    cloudwatch = client(local_cloud, "cloudwatch")
    try:
        assert cli.main(["local", "fault", "quota", REGION, "on-demand/P", "192"]) == 0
        assert "GPU quotas set: us-east-1/on-demand/P 192 vCPUs" in capsys.readouterr().out
        quota = quotas.get_service_quota(ServiceCode="ec2", QuotaCode="L-417A185B")["Quota"]
        assert (quota["QuotaName"], quota["Value"]) == ("Running On-Demand P instances", 192)
        other = quotas.get_service_quota(ServiceCode="ec2", QuotaCode="L-C4BD4855")["Quota"]
        assert other["Value"] == account_quotas.DEFAULT_VCPUS  # not set: the default
        metric = quota["UsageMetric"]
        assert metric["MetricDimensions"]["Class"] == "P/OnDemand"

        def used() -> float:
            now = datetime.now(UTC)
            [point] = cloudwatch.get_metric_statistics(
                Namespace=metric["MetricNamespace"], MetricName=metric["MetricName"],
                Dimensions=[{"Name": k, "Value": v} for k, v in metric["MetricDimensions"].items()],
                StartTime=now - timedelta(minutes=15), EndTime=now, Period=60,
                Statistics=["Maximum"])["Datapoints"]  # fmt: skip
            return float(point["Maximum"])

        before = used()  # other tests' machines on this cloud count too
        [machine] = ec2.run_instances(ImageId=control.stock_image(ec2), MinCount=1, MaxCount=1,
                                      InstanceType="p4d.24xlarge")["Instances"]  # fmt: skip
        assert used() == before + 96
        ec2.terminate_instances(InstanceIds=[machine["InstanceId"]])
        assert used() == before
        # `clear` leaves a clean slate: the quotas are the defaults again, with the faults.
        assert cli.main(["local", "fault", "clear"]) == 0
        assert "GPU quotas set: none" in capsys.readouterr().out
        quota = quotas.get_service_quota(ServiceCode="ec2", QuotaCode="L-417A185B")["Quota"]
        assert quota["Value"] == account_quotas.DEFAULT_VCPUS
    finally:
        control.set_faults(vcpu_quotas={})
    assert cli.main(["local", "fault", "quota", REGION, "spot/Q", "8"]) == 2
    assert "'spot/Q' is not a GPU quota: use one of" in capsys.readouterr().err
    assert cli.main(["local", "fault", "quota", REGION, "spot/P5", "lots"]) == 2
    assert "give a whole number of vCPUs, 0 or more" in capsys.readouterr().err
    assert cli.main(["local", "fault", "quota", "mars-1", "spot/Q", "-5"]) == 2  # all at once
    error = capsys.readouterr().err
    assert all(said in error for said in ("'mars-1' is not an AWS region", "'spot/Q' is not",
                                          "VCPUS is '-5'")), error  # fmt: skip
    assert "has 3 problem(s):\n  - " in error  # one a line


def test_schedule_periods_and_the_clock_file(tmp_path: Path) -> None:
    """EventBridge's `rate(...)` periods, and the speed-up a running cloud reads: unreadable
    or absent, the clock is stopped."""
    from spotrain.localcloud import schedules

    assert schedules.rate_seconds("rate(5 minutes)") == 300
    assert schedules.rate_seconds("rate(1 hour)") == 3600
    assert schedules.rate_seconds("cron(0 12 * * ? *)") is None
    assert schedules.rate_seconds(None) is None
    clock = tmp_path / schedules.CLOCK_NAME
    assert schedules.read_speedup(clock) == 0
    schedules.write_speedup(clock, 60)
    assert schedules.read_speedup(clock) == 60
    clock.write_text("{not json")
    assert schedules.read_speedup(clock) == 0


def python_function(local_cloud: control.RunningCloud, files: dict[str, str], handler: str,
                    variables: dict[str, str] | None = None) -> str:  # fmt: skip
    """A Python function of `files` (path: source), deployed with a role of its own: its name."""
    import io
    import zipfile

    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as archive:
        for path, source in files.items():
            archive.writestr(path, source)
    name, iam = unique("function"), client(local_cloud, "iam")
    role = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "lambda.amazonaws.com"}}],
    }))["Role"]["Arn"]  # fmt: skip
    client(local_cloud, "lambda").create_function(
        FunctionName=name, Runtime="python3.12", Role=role, Handler=handler,
        Code={"ZipFile": code.getvalue()}, Environment={"Variables": variables or {}}, Timeout=60,
    )  # fmt: skip
    return name


def test_a_python_function_is_invoked_from_its_zip_as_lambda_runs_it(
    local_cloud: control.RunningCloud,
) -> None:
    """Invoke runs the function's zip with its handler and environment (moto alone needs
    Docker): the handler's return is the payload; one that raises is a function error whose
    log tail says why."""
    name = python_function(local_cloud, {"app/__init__.py": "", "app/entry.py": (
        "import os\n"
        "def handle(event, context):\n"
        "    if event.get('fail'):\n"
        "        raise RuntimeError('asked to fail')\n"
        "    return {'got': event, 'colour': os.environ['COLOUR']}\n"
    )}, "app.entry.handle", {"COLOUR": "teal"})  # fmt: skip
    functions = client(local_cloud, "lambda")
    answer = functions.invoke(FunctionName=name, Payload=json.dumps({"n": 7}).encode())
    assert "FunctionError" not in answer
    assert json.loads(answer["Payload"].read()) == {"got": {"n": 7}, "colour": "teal"}
    failed = functions.invoke(FunctionName=name, Payload=b'{"fail": true}', LogType="Tail")
    assert failed["FunctionError"] == "Unhandled"
    assert "asked to fail" in json.loads(failed["Payload"].read())["errorMessage"]


def test_a_function_runs_as_its_role_and_is_judged_by_its_policies(
    local_cloud: control.RunningCloud,
) -> None:
    """A function's calls are made with a session of its execution role, as Lambda's are, and
    its S3 and DynamoDB calls judged by the role's policies (conditions included), while the
    cloud serves the tests' own keys as before."""
    table = unique("table")
    dynamodb = client(local_cloud, "dynamodb")
    dynamodb.create_table(
        TableName=table,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
    )
    for pk in ("RUN#a", "RUN#b"):  # the tests' keys: not judged
        dynamodb.put_item(TableName=table, Item={"pk": {"S": pk}})
    name = python_function(local_cloud, {"entry.py": (
        "import boto3\n"
        "def handle(event, context):\n"
        "    dynamodb, said = boto3.client('dynamodb'), {}\n"
        "    for pk in ('RUN#a', 'RUN#b'):\n"
        "        for action in ('get_item', 'delete_item'):\n"
        "            try:\n"
        "                getattr(dynamodb, action)(TableName=event['table'],\n"
        "                                          Key={'pk': {'S': pk}})\n"
        "                said[f'{action} {pk}'] = 'done'\n"
        "            except Exception as error:\n"
        "                said[f'{action} {pk}'] = error.response['Error']['Code']\n"
        "    return said\n"
    )}, "entry.handle")  # fmt: skip
    arn = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table}"
    only_a = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["RUN#a"]}}
    grant = {"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": arn, "Condition": only_a}
    reads = {"Version": "2012-10-17", "Statement": [grant]}
    client(local_cloud, "iam").put_role_policy(RoleName=name, PolicyName="reads",
                                               PolicyDocument=json.dumps(reads))  # fmt: skip
    answer = client(local_cloud, "lambda").invoke(
        FunctionName=name, Payload=json.dumps({"table": table}).encode())  # fmt: skip
    assert json.loads(answer["Payload"].read()) == {
        "get_item RUN#a": "done", "get_item RUN#b": "AccessDeniedException",
        "delete_item RUN#a": "AccessDeniedException", "delete_item RUN#b": "AccessDeniedException",
    }  # fmt: skip


def test_a_machine_is_judged_by_its_instance_role_through_its_vpcs_endpoint(
    local_cloud: control.RunningCloud, tmp_path: Path
) -> None:
    """A played machine gets what EC2 gives an instance: a session of its launch template's
    instance role, named for the instance. Its S3 calls are judged by the role's policies, and
    come through its VPC's endpoint (aws:SourceVpce); the same role's session
    named for no instance of the region (a credential used elsewhere) comes through none."""
    from spotrain.localcloud.machines import instance_role_keys

    ec2, iam, s3 = (client(local_cloud, s) for s in ("ec2", "iam", "s3"))
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.1.0/24")["Subnet"]["SubnetId"]
    endpoint = ec2.create_vpc_endpoint(
        VpcId=vpc, ServiceName=f"com.amazonaws.{REGION}.s3", VpcEndpointType="Gateway"
    )["VpcEndpoint"]["VpcEndpointId"]
    bucket = unique("machine-bucket")
    s3.create_bucket(Bucket=bucket)
    name = unique("machine-role")
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "sts:AssumeRole",
                "Principal": {"Service": "ec2.amazonaws.com"},
            }
        ],
    }
    role = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]
    mine = f"arn:aws:s3:::{bucket}/mine/*"
    grant = {
        "Effect": "Allow",
        "Action": "s3:PutObject",
        "Resource": mine,
        "Condition": {"StringEquals": {"aws:SourceVpce": endpoint}},
    }
    policy = json.dumps({"Version": "2012-10-17", "Statement": [grant]})
    iam.put_role_policy(RoleName=name, PolicyName="writes", PolicyDocument=policy)
    iam.create_instance_profile(InstanceProfileName=name)
    iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    template = unique("machine-template")
    ec2.create_launch_template(
        LaunchTemplateName=template,
        LaunchTemplateData={
            "ImageId": "ami-12c6146b",
            "IamInstanceProfile": {"Arn": f"arn:aws:iam::{ACCOUNT}:instance-profile/{name}"},
        },
    )
    [instance] = ec2.run_instances(
        LaunchTemplate={"LaunchTemplateName": template}, SubnetId=subnet, MinCount=1, MaxCount=1
    )["Instances"]
    aws_env = control.aws_environment(local_cloud.endpoint, REGION)
    keys = instance_role_keys(aws_env, template, instance["InstanceId"])

    def as_machine(keys: dict[str, str]) -> Any:
        return control.client(
            "s3",
            local_cloud.endpoint,
            REGION,
            aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
            aws_session_token=keys["AWS_SESSION_TOKEN"],
        )

    def answer(machine: Any, key: str) -> str:
        try:
            machine.put_object(Bucket=bucket, Key=key, Body=b"x")
        except ClientError as error:
            return str(error.response["Error"]["Code"])
        return "done"

    machine = as_machine(keys)
    assert (answer(machine, "mine/a"), answer(machine, "theirs/a")) == ("done", "AccessDenied")
    sts = client(local_cloud, "sts")
    elsewhere = sts.assume_role(RoleArn=role["Arn"], RoleSessionName="i-0elsewhere")["Credentials"]
    stolen = {
        "AWS_ACCESS_KEY_ID": elsewhere["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": elsewhere["SecretAccessKey"],
        "AWS_SESSION_TOKEN": elsewhere["SessionToken"],
    }
    assert answer(as_machine(stolen), "mine/b") == "AccessDenied"
    assert answer(client(local_cloud, "s3"), "theirs/b") == "done"  # the tests' keys: not judged


def test_a_roles_auto_scaling_calls_are_judged_by_group_and_tag_and_a_machines_by_endpoint(
    local_cloud: control.RunningCloud,
) -> None:
    """An assumed role's Auto Scaling calls are judged by its policies against the group they
    act on (its ARN, its tags), as the handler's scaling is: its own environment's group is
    scaled, another environment's is refused, and so is one it names by a grant's prefix but
    whose tag is another's. A machine reports its own health through its VPC's Auto Scaling
    endpoint (aws:SourceVpce), the group found from the instance it names."""
    from spotrain.localcloud.machines import instance_role_keys

    ec2, iam, autoscaling = (client(local_cloud, s) for s in ("ec2", "iam", "autoscaling"))
    vpc = ec2.create_vpc(CidrBlock="10.8.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.8.1.0/24")["Subnet"]["SubnetId"]
    endpoint = ec2.create_vpc_endpoint(
        VpcId=vpc, ServiceName=f"com.amazonaws.{REGION}.autoscaling",
        VpcEndpointType="Interface", SubnetIds=[subnet],
    )["VpcEndpoint"]["VpcEndpointId"]  # fmt: skip
    prefix = unique("fleet")
    group_arns = (
        f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:*:autoScalingGroupName/{prefix}*"
    )
    role = new_role(local_cloud, [
        {"Effect": "Allow", "Action": ["autoscaling:SetDesiredCapacity"], "Resource": group_arns,
         "Condition": {"StringEquals": {"aws:ResourceTag/env": "mine"}}},
        {"Effect": "Allow", "Action": "autoscaling:SetInstanceHealth", "Resource": group_arns,
         "Condition": {"StringEquals": {"aws:SourceVpce": endpoint}}},
        {"Effect": "Allow", "Action": "autoscaling:DescribeAutoScalingGroups", "Resource": "*"},
    ])  # fmt: skip
    name = role["RoleName"]
    iam.create_instance_profile(InstanceProfileName=name)
    iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    template = unique("scaled-template")
    ec2.create_launch_template(LaunchTemplateName=template, LaunchTemplateData={
        "ImageId": "ami-12c6146b",
        "IamInstanceProfile": {"Arn": f"arn:aws:iam::{ACCOUNT}:instance-profile/{name}"},
    })  # fmt: skip
    groups = {"mine": f"{prefix}-mine", "theirs": f"{prefix}-theirs", "other": unique("other")}
    for env, group in (("mine", groups["mine"]), ("theirs", groups["theirs"]),
                       ("mine", groups["other"])):  # fmt: skip
        autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=group, MinSize=0, MaxSize=2, DesiredCapacity=1,
            LaunchTemplate={"LaunchTemplateName": template}, VPCZoneIdentifier=subnet,
            Tags=[{"Key": "env", "Value": env, "PropagateAtLaunch": True}],
        )  # fmt: skip
    sts = client(local_cloud, "sts")
    session = sts.assume_role(RoleArn=role["Arn"], RoleSessionName="handler")["Credentials"]
    handler = as_session(local_cloud, "autoscaling", session)
    assert [answer(lambda g=group: handler.set_desired_capacity(AutoScalingGroupName=g,
                                                                DesiredCapacity=0))
            for group in groups.values()] == ["done", "AccessDenied", "AccessDenied"]  # fmt: skip
    mine = [groups["mine"]]
    assert (
        answer(lambda: handler.describe_auto_scaling_groups(AutoScalingGroupNames=mine)) == "done"
    )
    [member] = autoscaling.describe_auto_scaling_groups(
        AutoScalingGroupNames=[groups["theirs"]])["AutoScalingGroups"][0]["Instances"]  # fmt: skip
    keys = instance_role_keys(control.aws_environment(local_cloud.endpoint, REGION), template,
                              member["InstanceId"])  # fmt: skip
    machine = as_session(local_cloud, "autoscaling", {
        "AccessKeyId": keys["AWS_ACCESS_KEY_ID"], "SecretAccessKey": keys["AWS_SECRET_ACCESS_KEY"],
        "SessionToken": keys["AWS_SESSION_TOKEN"]})  # fmt: skip

    def unhealthy(reporter: Any) -> str:
        return answer(lambda: reporter.set_instance_health(
            InstanceId=member["InstanceId"], HealthStatus="Unhealthy"))  # fmt: skip

    # The handler's session comes from no instance: through no endpoint.
    assert (unhealthy(machine), unhealthy(handler)) == ("done", "AccessDenied")


def test_a_roles_ssm_reads_are_judged_by_the_parameters_they_name(
    local_cloud: control.RunningCloud,
) -> None:
    """An assumed role's SSM calls are judged against the parameters (or the path) they name,
    by ARN, as the handler's read of its environment's run declarations is: its own path is
    read, another environment's is refused, and so is a parameter it was not granted."""
    ssm = client(local_cloud, "ssm")
    mine, theirs = f"/{unique('mine')}/runs", f"/{unique('theirs')}/runs"
    for path in (mine, theirs):
        ssm.put_parameter(Name=f"{path}/demo", Value="{}", Type="String")
    keys = session_of(local_cloud, [{
        "Effect": "Allow", "Action": "ssm:GetParametersByPath",
        "Resource": f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{mine}",
    }])  # fmt: skip
    reader = as_session(local_cloud, "ssm", keys)
    assert [
        answer(lambda: reader.get_parameters_by_path(Path=mine)),
        answer(lambda: reader.get_parameters_by_path(Path=theirs)),
        answer(lambda: reader.get_parameter(Name=f"{mine}/demo")),
    ] == ["done", "AccessDeniedException", "AccessDeniedException"]


def test_a_roles_log_writes_are_judged_by_the_stream_they_write(
    local_cloud: control.RunningCloud,
) -> None:
    """An assumed role's CloudWatch Logs calls are judged against the stream (or group) they
    name, as a machine's shipped output is: its fleet's group takes its streams and events,
    another group refuses them."""
    logs = client(local_cloud, "logs")
    mine, theirs = f"/{unique('mine')}/machines", f"/{unique('theirs')}/machines"
    for group in (mine, theirs):
        logs.create_log_group(logGroupName=group)
    keys = session_of(local_cloud, [{
        "Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
        "Resource": f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{mine}:log-stream:*",
    }], session="i-0shipper")  # fmt: skip
    shipper = as_session(local_cloud, "logs", keys)
    event = [{"timestamp": int(time.time() * 1000), "message": "step 1"}]
    stream = {"logGroupName": mine, "logStreamName": "i-0a"}
    assert [
        answer(lambda: shipper.create_log_stream(logGroupName=mine, logStreamName="i-0a")),
        answer(lambda: shipper.put_log_events(**stream, logEvents=event)),
        answer(lambda: shipper.create_log_stream(logGroupName=theirs, logStreamName="i-0a")),
        answer(lambda: shipper.describe_log_streams(logGroupName=mine)),
    ] == ["done", "done", "AccessDeniedException", "AccessDeniedException"]


def test_a_roles_instance_tags_and_notices_are_judged_by_resource_tags_and_topic(
    local_cloud: control.RunningCloud,
) -> None:
    """An assumed role's EC2 tagging is judged against each instance it tags, by ARN, with the
    instance's tags and the keys it sets, as the handler's interruption mark is: its own mark
    on its environment's instance is set; on another environment's instance, or any other key,
    it is refused. Its SNS publish is judged against the topic."""
    ec2, sns = client(local_cloud, "ec2"), client(local_cloud, "sns")

    def instance(env: str) -> str:
        [started] = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1,
                                      TagSpecifications=[{"ResourceType": "instance",
                                                          "Tags": [{"Key": "env", "Value": env}]}],
                                      )["Instances"]  # fmt: skip
        return str(started["InstanceId"])

    mine, theirs = instance("mine"), instance("theirs")
    topic, other = (sns.create_topic(Name=unique(n))["TopicArn"] for n in ("notices", "other"))
    keys = session_of(local_cloud, [
        {"Effect": "Allow", "Action": "ec2:CreateTags",
         "Resource": f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/*",
         "Condition": {"StringEquals": {"aws:ResourceTag/env": "mine"},
                       "ForAllValues:StringEquals": {"aws:TagKeys": ["mark"]}}},
        {"Effect": "Allow", "Action": "sns:Publish", "Resource": topic},
    ])  # fmt: skip
    handler_ec2, handler_sns = (as_session(local_cloud, s, keys) for s in ("ec2", "sns"))

    def tag(instance_id: str, key: str) -> str:
        tags = [{"Key": key, "Value": "x"}]
        return answer(lambda: handler_ec2.create_tags(Resources=[instance_id], Tags=tags))

    assert [tag(mine, "mark"), tag(theirs, "mark"), tag(mine, "env")] == [
        "done", "AccessDenied", "AccessDenied"]  # fmt: skip
    published = [answer(lambda arn=arn: handler_sns.publish(TopicArn=arn, Message="m"))
                 for arn in (topic, other)]  # fmt: skip
    assert published == ["done", "AccessDenied"], published


def test_a_roles_dead_letters_are_judged_by_the_queue_they_go_to(
    local_cloud: control.RunningCloud,
) -> None:
    """An assumed role's SQS sends are judged against the queue they name, by ARN, as the
    handler's dead letters are: its own queue takes them, another queue refuses them, and so
    does an action it was not granted."""
    sqs = client(local_cloud, "sqs")
    mine, theirs = (sqs.create_queue(QueueName=unique(n))["QueueUrl"] for n in ("dlq", "other"))
    keys = session_of(local_cloud, [{
        "Effect": "Allow", "Action": "sqs:SendMessage",
        "Resource": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{mine.rsplit('/', 1)[-1]}",
    }])  # fmt: skip
    handler = as_session(local_cloud, "sqs", keys)
    assert [
        answer(lambda: handler.send_message(QueueUrl=mine, MessageBody="rejected")),
        answer(lambda: handler.send_message(QueueUrl=theirs, MessageBody="rejected")),
        answer(lambda: handler.receive_message(QueueUrl=mine)),
    ] == ["done", "AccessDenied", "AccessDenied"]
    [sent] = sqs.receive_message(QueueUrl=mine)["Messages"]
    assert sent["Body"] == "rejected"


def test_a_roles_metric_writes_are_judged_by_the_namespace_they_name(
    local_cloud: control.RunningCloud,
) -> None:
    """An assumed role's CloudWatch metric calls are judged as `cloudwatch:` actions with the
    namespace they name (`cloudwatch:namespace`), as the handler's spend metrics are: its own
    namespace takes them, another refuses them, and so does a call it was not granted."""
    mine, theirs = unique("spend"), unique("other")
    keys = session_of(local_cloud, [{
        "Effect": "Allow", "Action": "cloudwatch:PutMetricData", "Resource": "*",
        "Condition": {"StringEquals": {"cloudwatch:namespace": mine}},
    }])  # fmt: skip
    handler = as_session(local_cloud, "cloudwatch", keys)

    def put(namespace: str) -> str:
        metric = [{"MetricName": "RunSpendUSD", "Value": 1.0}]
        return answer(lambda: handler.put_metric_data(Namespace=namespace, MetricData=metric))

    assert [put(mine), put(theirs), answer(lambda: handler.list_metrics(Namespace=mine))] == [
        "done", "AccessDenied", "AccessDenied"]  # fmt: skip
    found = client(local_cloud, "cloudwatch").list_metrics()["Metrics"]
    assert {m["Namespace"] for m in found} & {mine, theirs} == {mine}


def test_a_function_keeps_a_warm_environment_between_invocations_as_lambda_does(
    local_cloud: control.RunningCloud,
) -> None:
    """A function's execution environment serves the next invocation (what its module keeps
    outlives an invocation, as on AWS); invocations at once each get one of their own; one
    whose invocation failed is not used again."""
    from concurrent.futures import ThreadPoolExecutor

    name = python_function(local_cloud, {"counter.py": (
        "import os, time\n"
        "calls = 0\n"
        "def handle(event, context):\n"
        "    global calls\n"
        "    calls += 1\n"
        "    time.sleep(event.get('hold', 0))\n"
        "    if event.get('fail'):\n"
        "        raise RuntimeError(f'asked to fail in process {os.getpid()}.')\n"
        "    return {'calls': calls, 'process': os.getpid()}\n"
    )}, "counter.handle")  # fmt: skip
    functions = client(local_cloud, "lambda")

    def invoke(event: dict[str, Any]) -> dict[str, Any]:
        answer = functions.invoke(FunctionName=name, Payload=json.dumps(event).encode())
        return dict(json.loads(answer["Payload"].read()))

    first, second = invoke({}), invoke({})
    assert (first["calls"], second["calls"]) == (1, 2)  # warm: the same module
    assert first["process"] == second["process"]
    with ThreadPoolExecutor(2) as pool:  # at once: the warm one, and a cold one beside it
        together = list(pool.map(invoke, [{"hold": 1}, {"hold": 1}]))
    assert sorted(r["calls"] for r in together) == [1, 3]
    failed = invoke({"fail": True})["errorMessage"]
    gone = int(failed.split("asked to fail in process ")[-1].split(".")[0])
    assert gone in {r["process"] for r in together}  # a warm one failed
    after = [invoke({}) for _ in range(3)]
    assert gone not in {r["process"] for r in after}  # and is not used again
    assert [r["calls"] for r in after][1:] == [after[0]["calls"] + 1, after[0]["calls"] + 2]


def test_a_client_that_stalls_its_handshake_holds_up_no_other(
    local_cloud: control.RunningCloud,
) -> None:
    """TLS is negotiated in each connection's own thread: a client that connects and says
    nothing (one starved of CPU mid-handshake) does not stop the cloud answering others."""
    import socket
    import time
    from urllib.parse import urlsplit

    import boto3
    from botocore.config import Config

    where = urlsplit(local_cloud.endpoint)
    with socket.create_connection((where.hostname, where.port)):
        started = time.monotonic()
        quick = Config(connect_timeout=5, read_timeout=5, retries={"total_max_attempts": 1})
        sts = boto3.client("sts", endpoint_url=local_cloud.endpoint, region_name=REGION,
                           verify=str(control.ca_bundle()), config=quick,
                           **{k.lower(): v for k, v in control.CREDENTIALS.items()})  # fmt: skip
        assert sts.get_caller_identity()["Account"] == ACCOUNT
        assert time.monotonic() - started < 5


def test_a_retried_call_gets_its_first_reply_and_a_call_that_failed_is_done_again(
    local_cloud: control.RunningCloud,
) -> None:
    """A client that lost the reply to a call the cloud did and sends it again (the SDKs mark
    every attempt of a call with one invocation id) gets the first reply, not a second go at
    it; a retry of an attempt that failed is done; a new call that repeats another is refused
    as AWS refuses it."""
    iam = control.client("iam", local_cloud.endpoint, "us-east-1")
    ec2 = control.client("ec2", local_cloud.endpoint, "us-east-1")
    sent = {"invocation": "", "attempt": 1}

    def as_attempt_of_one_call(request: Any, **_: Any) -> None:
        if sent["invocation"]:
            request.headers["amz-sdk-invocation-id"] = sent["invocation"]
            request.headers["amz-sdk-request"] = f"attempt={sent['attempt']}; max=5"

    for client in (iam, ec2):
        client.meta.events.register("before-send", as_attempt_of_one_call)

    def twice(invocation: str, call: Callable[[], Any]) -> tuple[Any, Any]:
        sent.update(invocation=invocation, attempt=1)
        first = call()
        sent["attempt"] = 2
        try:
            return first, call()
        finally:
            sent.update(invocation="", attempt=1)

    name = f"retried-{uuid.uuid4().hex[:8]}"
    trust = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow",
        "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]})  # fmt: skip
    remove = lambda: iam.remove_role_from_instance_profile(  # noqa: E731
        InstanceProfileName=name, RoleName=name)  # fmt: skip
    sent.update(invocation=f"{name}-failed")
    with pytest.raises(ClientError, match="NoSuchEntity"):
        remove()
    sent.update(invocation="")
    iam.create_role(RoleName=name, AssumeRolePolicyDocument=trust)
    iam.create_instance_profile(InstanceProfileName=name)
    iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    sent.update(invocation=f"{name}-failed", attempt=2)
    remove()  # the retry of the attempt that failed is done
    sent.update(invocation="", attempt=1)
    assert iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Roles"] == []
    iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    twice(f"{name}-removed", remove)
    assert iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Roles"] == []
    iam.delete_instance_profile(InstanceProfileName=name)
    iam.delete_role(RoleName=name)

    logs = control.client("logs", local_cloud.endpoint, "us-east-1")
    logs.create_log_group(logGroupName=name)
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    create = {"ResourceIds": [vpc], "ResourceType": "VPC", "TrafficType": "ALL",
              "LogGroupName": name,
              "DeliverLogsPermissionArn": "arn:aws:iam::123456789012:role/flow-logs"}  # fmt: skip
    try:
        first, retried = twice(f"{name}-flow-log", lambda: ec2.create_flow_logs(**create))
        assert retried["FlowLogIds"] == first["FlowLogIds"]
        with pytest.raises(ClientError, match="FlowLogAlreadyExists"):
            ec2.create_flow_logs(**create)
        on_vpc = ec2.describe_flow_logs(Filters=[{"Name": "resource-id", "Values": [vpc]}])
        assert [f["FlowLogId"] for f in on_vpc["FlowLogs"]] == first["FlowLogIds"]
    finally:
        for flow_log in ec2.describe_flow_logs(
                Filters=[{"Name": "resource-id", "Values": [vpc]}])["FlowLogs"]:  # fmt: skip
            ec2.delete_flow_logs(FlowLogIds=[flow_log["FlowLogId"]])
        ec2.delete_vpc(VpcId=vpc)
        logs.delete_log_group(logGroupName=name)


def test_a_connection_stays_open_for_the_next_request(local_cloud: control.RunningCloud) -> None:
    """The cloud keeps connections alive (a request on an open connection skips the TLS
    handshake, half its CPU): two requests, one connection, both answered."""
    import http.client
    import ssl
    from urllib.parse import urlsplit

    where = urlsplit(local_cloud.endpoint)
    context = ssl.create_default_context(cafile=str(control.ca_bundle()))
    connection = http.client.HTTPSConnection(where.hostname, where.port, context=context,
                                             timeout=30)  # fmt: skip
    try:
        for _ in range(2):
            connection.request("GET", "/moto-api/")  # moto's dashboard: a static page
            answer = connection.getresponse()
            answer.read()
            assert answer.status == 200 and answer.getheader("Connection") != "close"
        assert connection.sock is not None  # the same connection served both
    finally:
        connection.close()


def test_kms_keys_encrypt_and_sign_as_their_kind_allows(local_cloud: control.RunningCloud) -> None:
    """A symmetric key encrypts and decrypts; an asymmetric one signs, verifies and gives its
    public key (its key pair made when first needed)."""
    kms = control.client("kms", local_cloud.endpoint, "us-east-1")
    symmetric = kms.create_key(Description="data")["KeyMetadata"]["KeyId"]
    sealed = kms.encrypt(KeyId=symmetric, Plaintext=b"checkpoint")["CiphertextBlob"]
    assert kms.decrypt(CiphertextBlob=sealed)["Plaintext"] == b"checkpoint"
    signing = kms.create_key(KeySpec="RSA_2048", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["KeyId"]
    algorithm = "RSASSA_PSS_SHA_256"
    signature = kms.sign(KeyId=signing, Message=b"m", SigningAlgorithm=algorithm)["Signature"]
    assert kms.verify(KeyId=signing, Message=b"m", Signature=signature,
                      SigningAlgorithm=algorithm)["SignatureValid"]  # fmt: skip
    assert kms.get_public_key(KeyId=signing)["PublicKey"].startswith(b"0\x82")  # DER


def test_attempts_of_one_call_at_once_do_it_once_and_after_a_failure_once_more() -> None:
    """The retry middleware alone: an attempt that arrives while the first is being answered
    waits for it and gets its reply; after a first attempt that failed, two retries at once do
    the call once between them."""
    import threading
    import time

    from spotrain.localcloud import retries

    done: list[str] = []
    release = threading.Event()

    def cloud(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        done.append(environ["HTTP_AMZ_SDK_INVOCATION_ID"])
        if environ["HTTP_AMZ_SDK_REQUEST"] == "attempt=1; max=5" and "failing" in done[-1]:
            start_response("500 Internal Server Error", [])
            return [b"failed"]
        release.wait(timeout=20)
        start_response("200 OK", [("Content-Type", "text/xml")])
        return [f"made for {done[-1]} #{len(done)}".encode()]

    served = retries.answered_once(cloud)

    def attempts(invocation: str, numbers: list[int]) -> list[bytes]:
        replies: dict[int, bytes] = {}

        def send(number: int) -> None:
            environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/",
                       "HTTP_AMZ_SDK_INVOCATION_ID": invocation,
                       "HTTP_AMZ_SDK_REQUEST": f"attempt={number}; max=5"}  # fmt: skip
            replies[number] = b"".join(served(environ, lambda *_: None))

        threads = [threading.Thread(target=send, args=(n,)) for n in numbers]
        for thread in threads:
            thread.start()
            time.sleep(0.2)  # the later attempts arrive while the first is being answered
        release.set()
        for thread in threads:
            thread.join(timeout=20)
        release.clear()
        return [replies[n] for n in numbers]

    first, retried = attempts("lost-reply", [1, 2])
    assert done == ["lost-reply"] and first == retried == b"made for lost-reply #1"
    assert attempts("failing", [1]) == [b"failed"]
    second, third = attempts("failing", [2, 3])
    assert done.count("failing") == 2 and second == third == b"made for failing #3"
