"""Lambda: records EC2 spot interruption warnings and rebalance recommendations.

Each event is written once to the events table, keyed by the EventBridge event id, so a
redelivered event (EventBridge delivers at least once) does not create a second record.
Events that are not one of the two handled kinds raise `UnhandledEvent`; after the retries
Lambda moves them to the dead-letter queue.

Runs with only boto3 and the standard library; ships with spotrain/catalog_schema.py.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime
from typing import Any

import boto3
from botocore.exceptions import ClientError

from spotrain.catalog_schema import (
    EVENT_SORT_KEY,
    EXPIRES_AT_KEY,
    OCCURRED_AT_KEY,
    PARTITION_KEY,
    POOL_KEY,
    SORT_KEY,
    event_key,
    pool_key,
)

HANDLED_DETAIL_TYPES = {
    "EC2 Spot Instance Interruption Warning": "interruption-warning",
    "EC2 Instance Rebalance Recommendation": "rebalance-recommendation",
}
UNKNOWN_POOL = "unknown"

log = logging.getLogger()
log.setLevel(logging.INFO)


class UnhandledEvent(ValueError):
    """The event is malformed or of a kind this handler does not take."""


def parse(event: dict[str, Any]) -> dict[str, str]:
    """The fields we record, or UnhandledEvent naming what is missing."""
    kind = HANDLED_DETAIL_TYPES.get(str(event.get("detail-type")))
    if kind is None:
        raise UnhandledEvent(f"detail-type {event.get('detail-type')!r} is not handled")
    detail = event.get("detail")
    fields = {
        "event_id": event.get("id"),
        "time": event.get("time"),
        "region": event.get("region"),
        "instance_id": detail.get("instance-id") if isinstance(detail, dict) else None,
    }
    missing = sorted(
        name for name, value in fields.items() if not isinstance(value, str) or not value
    )
    if missing:
        raise UnhandledEvent(f"event lacks {', '.join(missing)}")
    datetime.fromisoformat(fields["time"].replace("Z", "+00:00"))  # rejects a malformed time
    return {"kind": kind, **fields}  # type: ignore[dict-item]


def instance_pool(ec2: Any, instance_id: str) -> str:
    """instance type x zone of the instance, or 'unknown' if it is already gone."""
    try:
        reservations = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    except ClientError:
        return UNKNOWN_POOL
    for reservation in reservations:
        for instance in reservation["Instances"]:
            return pool_key(instance["InstanceType"], instance["Placement"]["AvailabilityZone"])
    return UNKNOWN_POOL


def record(table: Any, ec2: Any, fields: dict[str, str], retention_days: int) -> bool:
    """Write the event once; False if it was already recorded."""
    item = {
        PARTITION_KEY: event_key(fields["event_id"]),
        SORT_KEY: EVENT_SORT_KEY,
        "kind": fields["kind"],
        "instance_id": fields["instance_id"],
        "region": fields["region"],
        POOL_KEY: instance_pool(ec2, fields["instance_id"]),
        OCCURRED_AT_KEY: fields["time"],
        EXPIRES_AT_KEY: int(time.time()) + retention_days * 86400,
    }
    try:
        table.put_item(Item=item, ConditionExpression=f"attribute_not_exists({PARTITION_KEY})")
    except ClientError as error:
        if error.response["Error"]["Code"] == "ConditionalCheckFailedException":
            return False
        raise
    return True


def handle(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    try:
        fields = parse(event)
    except (UnhandledEvent, ValueError, AttributeError) as error:
        log.error("rejected event %s: %s", json.dumps(event, default=str)[:2000], error)
        raise UnhandledEvent(str(error)) from error
    table = boto3.resource("dynamodb").Table(os.environ["EVENTS_TABLE"])
    recorded = record(
        table, boto3.client("ec2"), fields, int(os.environ.get("EVENT_RETENTION_DAYS", "90"))
    )
    log.info(
        "%s %s for %s",
        "recorded" if recorded else "duplicate",
        fields["kind"],
        fields["instance_id"],
    )
    return {"recorded": recorded, "event_id": fields["event_id"]}
