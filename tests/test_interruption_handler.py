"""The interruption handler records each event once, and rejects what it does not handle.

Unit tests use in-process moto; the last test talks to the local cloud over HTTP.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from spotrain import catalog_schema as schema
from spotrain.constructs.interruption_handler import handler

FIXTURES = Path(__file__).parent / "fixtures" / "events"
TABLE = "spotrain-test-events"
REGION = "us-east-1"


def event(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def create_events_table(dynamodb: Any) -> Any:
    return dynamodb.create_table(
        TableName=TABLE,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[
            {"AttributeName": schema.PARTITION_KEY, "KeyType": "HASH"},
            {"AttributeName": schema.SORT_KEY, "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": name, "AttributeType": "S"}
            for name in (
                schema.PARTITION_KEY,
                schema.SORT_KEY,
                schema.POOL_KEY,
                schema.OCCURRED_AT_KEY,
            )
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": schema.POOL_INDEX,
                "KeySchema": [
                    {"AttributeName": schema.POOL_KEY, "KeyType": "HASH"},
                    {"AttributeName": schema.OCCURRED_AT_KEY, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
    )


def launch_instance(ec2: Any) -> str:
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    reservation = ec2.run_instances(
        ImageId=image,
        MinCount=1,
        MaxCount=1,
        InstanceType="g5.xlarge",
        Placement={"AvailabilityZone": "us-east-1b"},
    )
    return str(reservation["Instances"][0]["InstanceId"])


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("EVENTS_TABLE", TABLE)
    with mock_aws():
        table = create_events_table(boto3.resource("dynamodb"))
        yield table


def for_instance(name: str, instance_id: str) -> dict[str, Any]:
    e = event(name)
    e["detail"]["instance-id"] = instance_id
    return e


def test_records_a_spot_warning_with_its_pool(cloud: Any) -> None:
    instance = launch_instance(boto3.client("ec2"))
    result = handler.handle(for_instance("spot-interruption-warning", instance))
    assert result == {"recorded": True, "event_id": "12345678-1234-1234-1234-123456789012"}
    item = cloud.get_item(Key={"pk": "EVENT#12345678-1234-1234-1234-123456789012", "sk": "EVENT"})[
        "Item"
    ]
    assert item["kind"] == "interruption-warning"
    assert item["instance_id"] == instance
    assert item["pool"] == "g5.xlarge#us-east-1b"
    assert item["occurred_at"] == "2026-11-21T12:00:00Z"


def test_records_a_rebalance_recommendation(cloud: Any) -> None:
    handler.handle(event("rebalance-recommendation"))
    items = cloud.scan()["Items"]
    assert [(i["kind"], i["pool"]) for i in items] == [("rebalance-recommendation", "unknown")]


def test_redelivered_event_is_recorded_once(cloud: Any) -> None:
    first = handler.handle(event("spot-interruption-warning"))
    second = handler.handle(event("spot-interruption-warning"))
    assert (first["recorded"], second["recorded"]) == (True, False)
    assert cloud.scan()["Count"] == 1


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (
            lambda e: e.update({"detail-type": "EC2 Instance State-change Notification"}),
            "not handled",
        ),
        (lambda e: e.pop("id"), "lacks event_id"),
        (lambda e: e.update({"detail": "not-a-dict"}), "lacks instance_id"),
        (lambda e: e["detail"].pop("instance-id"), "lacks instance_id"),
        (lambda e: e.update({"time": "yesterday"}), "Invalid isoformat"),
    ],
)
def test_malformed_events_are_rejected_and_not_recorded(
    cloud: Any, breakage: Any, message: str
) -> None:
    bad = copy.deepcopy(event("spot-interruption-warning"))
    breakage(bad)
    with pytest.raises(handler.UnhandledEvent, match=message):
        handler.handle(bad)
    assert cloud.scan()["Count"] == 0


def test_records_through_the_local_cloud_over_http(
    local_cloud: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spotrain.localcloud import control

    for key, value in control.aws_environment(local_cloud.endpoint, REGION).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("EVENTS_TABLE", TABLE)
    dynamodb = boto3.resource("dynamodb", endpoint_url=local_cloud.endpoint, region_name=REGION)
    table = create_events_table(dynamodb)
    try:
        instance = launch_instance(control.client("ec2", local_cloud.endpoint, REGION))
        warning = for_instance("spot-interruption-warning", instance)
        assert handler.handle(warning)["recorded"] is True
        assert handler.handle(warning)["recorded"] is False
        by_pool = table.query(
            IndexName=schema.POOL_INDEX,
            KeyConditionExpression="#p = :pool",
            ExpressionAttributeNames={"#p": schema.POOL_KEY},
            ExpressionAttributeValues={":pool": "g5.xlarge#us-east-1b"},
        )["Items"]
        assert [i["instance_id"] for i in by_pool] == [instance]
    finally:
        table.delete()
