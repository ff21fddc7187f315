"""The handler's reads and writes of AWS: the instance and groups an event is about, the
events table's records and counts, whether a run's configuration is stored and its head
final, scaling, tagging and notifying. Decisions are made elsewhere (`capacity_policy`)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from spotrain.constructs.interruption_handler.runtime import clients
from spotrain.constructs.interruption_handler.runtime.settings import Settings
from spotrain.core import fleet_state, run_epochs, run_lifecycle
from spotrain.core.capacity import Group
from spotrain.core.capacity_policy import Decision
from spotrain.core.catalog_schema import (
    ENVIRONMENT_TAG,
    EVENT_SORT_KEY,
    EXPIRES_AT_KEY,
    INTERRUPTION_TAG,
    OCCURRED_AT_KEY,
    PARTITION_KEY,
    POOL_KEY,
    RUN_TAG,
    SORT_KEY,
    UNKNOWN_POOL,
    configs_prefix,
    event_key,
    pool_key,
)

GROUP_TAG = "aws:autoscaling:groupName"

log = logging.getLogger()


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def events_table(settings: Settings) -> Any:
    return clients.dynamodb().Table(settings.handler.events_table)


# --- reads -------------------------------------------------------------------------------------
def describe_instance(ec2: Any, instance_id: str) -> dict[str, str]:
    """pool, run and group of the instance; an instance already gone has an unknown pool."""
    try:
        reservations = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    except ClientError:
        return {"pool": UNKNOWN_POOL}
    for reservation in reservations:
        for instance in reservation["Instances"]:
            tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
            kind, zone = instance.get("InstanceType"), instance["Placement"]["AvailabilityZone"]
            return {
                "pool": pool_key(kind, zone) if kind else UNKNOWN_POOL,
                "run": tags.get(RUN_TAG, ""),
                "group": tags.get(GROUP_TAG, ""),
            }
    return {"pool": UNKNOWN_POOL}


def own_region() -> str:
    """The region this handler runs in (the function's): the groups it scales are there."""
    return clients.own_region()


def capacity_groups(
    settings: Settings, autoscaling: Callable[[str], Any], *, region: str
) -> list[Group]:
    """The run's groups in `region` as they are now (as its stack declares them). A group
    that is not tagged with the handler's environment and this run is not the handler's to
    scale: it is left out."""
    groups: list[Group] = []
    if settings.declaration is None:
        return groups
    environment = settings.handler.environment
    for declared in settings.declaration.groups:
        if declared.region != region:
            continue
        found = autoscaling(declared.region).describe_auto_scaling_groups(
            AutoScalingGroupNames=[declared.name]
        )["AutoScalingGroups"]
        if not found:
            log.warning("capacity group %s in %s does not exist", declared.name, declared.region)
            continue
        group = found[0]
        tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
        owner = (tags.get(ENVIRONMENT_TAG), tags.get(RUN_TAG))
        if owner != (environment, settings.run):
            log.warning("capacity group %s is tagged environment %s, run %s: not scaled for run "
                        "%s of %s", declared.name, *owner, settings.run, environment)  # fmt: skip
            continue
        policy = group.get("MixedInstancesPolicy", {}).get("LaunchTemplate", {})
        types = [o["InstanceType"] for o in policy.get("Overrides", []) if "InstanceType" in o]
        groups.append(Group(
            declared=declared,
            pools=tuple(pool_key(t, zone) for t in types for zone in group["AvailabilityZones"]),
            desired=int(group["DesiredCapacity"]),
            min_size=int(group["MinSize"]),
            max_size=int(group["MaxSize"]),
            in_service=sum(i.get("LifecycleState") == "InService"
                           for i in group.get("Instances", [])),
        ))  # fmt: skip
    return groups


def configuration_stored(settings: Settings) -> bool:
    """Whether the run's training configuration is in its bucket (any stored version: they are
    checked when stored, the dataset they name included). Without a config bucket the handler
    cannot tell, and the run starts at the first check."""
    bucket = settings.handler.config_bucket
    if not bucket:
        return True
    listed = clients.client("s3").list_objects_v2(
        Bucket=bucket, Prefix=configs_prefix(settings.run), MaxKeys=1
    )
    return int(listed.get("KeyCount", 0)) > 0


def submitted_at(settings: Settings) -> float | None:
    """When the run's first training configuration was stored, its submission (the queue's
    order); None: none is stored. Without a config bucket, 0: submitted from the start."""
    bucket = settings.handler.config_bucket
    if not bucket:
        return 0.0
    listed = clients.client("s3").list_objects_v2(Bucket=bucket,
                                                  Prefix=configs_prefix(settings.run))  # fmt: skip
    times = [item["LastModified"].timestamp() for item in listed.get("Contents", [])]
    return min(times) if times else None


def final_step(settings: Settings, chain: list[run_epochs.Epoch] | None = None) -> int | None:
    """The run's published head when it is marked final (the run is done), else None, read
    from this region's copy (the handler of the region the run trains in asks: its writer's
    copy, the first to know). `chain`: the run's epochs, when the check has read them."""
    if not settings.handler.checkpoints_table or not settings.run:
        return None
    catalog = clients.dynamodb().Table(settings.handler.checkpoints_table)
    head = run_lifecycle.published_head(catalog, settings.run, chain)
    return head.step if head is not None and head.final else None


def epoch_chain(settings: Settings, run: str) -> list[run_epochs.Epoch]:
    """Run `run`'s epoch claims in this region's copy of the catalog (none without one)."""
    if not settings.handler.checkpoints_table:
        return []
    catalog = clients.dynamodb().Table(settings.handler.checkpoints_table)
    return run_epochs.read_chain(catalog, run)


def current_epoch(
    settings: Settings, chain: list[run_epochs.Epoch] | None = None
) -> run_epochs.EpochId:
    """The epoch run `settings.run` trains in, as this region's copy of the catalog knows it:
    its region is where the run trains (home, epoch 0, where the run declares it starts, until
    it moves). `chain`: the run's epochs, when the caller has read them."""
    assert settings.declaration is not None
    chain = epoch_chain(settings, settings.run) if chain is None else chain
    latest = run_epochs.current(chain)
    return latest.id if latest is not None else run_epochs.EpochId(
        0, settings.declaration.home_region)  # fmt: skip


# --- writes ------------------------------------------------------------------------------------
def record(table: Any, fields: dict[str, str], pool: str, retention_days: int) -> bool:
    """Write the event once; False if it was already recorded."""
    item = {
        PARTITION_KEY: event_key(fields["event_id"]),
        SORT_KEY: EVENT_SORT_KEY,
        "kind": fields["kind"],
        "instance_id": fields["instance_id"],
        "region": fields["region"],
        POOL_KEY: pool,
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


def apply(
    decision: Decision, groups: list[Group], table: Any, run: str,
    autoscaling: Callable[[str], Any],
) -> None:  # fmt: skip
    regions = {g.name: g.region for g in groups}
    for name, desired in sorted(decision.desired.items()):
        if name in decision.min_sizes:  # below the minimum needs the minimum changed too
            autoscaling(regions[name]).update_auto_scaling_group(
                AutoScalingGroupName=name, MinSize=decision.min_sizes[name],
                DesiredCapacity=desired,
            )  # fmt: skip
            continue
        autoscaling(regions[name]).set_desired_capacity(
            AutoScalingGroupName=name, DesiredCapacity=desired, HonorCooldown=False
        )
    if run:
        fleet_state.set_short_since(table, run, decision.short_since)
        if decision.spot_record is not None:
            fleet_state.set_spot_record(table, run, decision.spot_record)


def tag_newest(ec2: Any, table: Any, run: str, instance_id: str, own: str) -> None:
    """Tag the instance with its newest event, as its mark in the fleet state keeps it
    whatever order events arrive in (`own`, this event's label, when it has no run or mark).
    The mark is read again after tagging: a handler of an older event that tags last sees the
    newer label there and tags again, so the tag ends as the mark. It tags until the mark it
    reads is the one it tagged: the mark only ever moves to a newer event (consistent reads),
    so each further round follows one more of the instance's warnings and the rounds end."""
    current = (fleet_state.latest_label(table, run, instance_id) if run else None) or own
    while True:
        ec2.create_tags(Resources=[instance_id], Tags=[{"Key": INTERRUPTION_TAG, "Value": current}])
        if not run:
            return
        again = fleet_state.latest_label(table, run, instance_id) or own
        if again == current:
            return
        current = again


def notify(topic: str | None, subject: str, message: dict[str, Any]) -> None:
    if topic:
        clients.client("sns").publish(
            TopicArn=topic, Subject=subject[:100], Message=json.dumps(message, default=str)
        )
