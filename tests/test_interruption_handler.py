"""The interruption handler records each event once, marks, tags, requeues and notifies, and
sends what it cannot handle to the dead-letter queue without raising.

Unit tests use in-process moto; the last tests talk to the local cloud over HTTP.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import random
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from spotrain.constructs.interruption_handler.runtime import aws as runtime_aws
from spotrain.constructs.interruption_handler.runtime import clients as runtime_clients
from spotrain.constructs.interruption_handler.runtime import entry as handler
from spotrain.constructs.interruption_handler.runtime import settings as runtime_settings
from spotrain.core import capacity_policy, fleet_state
from spotrain.core import catalog_schema as schema
from spotrain.core.capacity import CapacityGroup, Group, RunDeclaration
from spotrain.core.deadline_policy import Progress, RunDeadline
from spotrain.core.handler_settings import HandlerSettings, run_parameter_name
from spotrain.core.outage_fill import SpotRecord
from spotrain.localcloud import control

ENVIRONMENT_VARIABLE = HandlerSettings.variable("environment")
"""Where the handler reads the environment whose runs it serves."""
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


def launch_instance(ec2: Any, tags: dict[str, str] | None = None) -> str:
    image = control.stock_image(ec2)
    reservation = ec2.run_instances(
        ImageId=image,
        MinCount=1,
        MaxCount=1,
        InstanceType="g5.xlarge",
        Placement={"AvailabilityZone": "us-east-1b"},
        TagSpecifications=[
            {"ResourceType": "instance",
             "Tags": [{"Key": k, "Value": v} for k, v in (tags or {}).items()]}
        ] if tags else [],
    )  # fmt: skip
    return str(reservation["Instances"][0]["InstanceId"])


RUN = "gpt-small"
HOT_POOL = "g5.xlarge#us-east-1b"


@dataclass
class Cloud:
    table: Any
    queue_url: str
    notices_url: str

    def dead_letters(self) -> list[dict[str, Any]]:
        return _drain(self.queue_url)

    def notices(self) -> list[dict[str, Any]]:
        return [json.loads(json.loads(m["Body"])["Message"]) for m in _drain(self.notices_url)]


def aws(service: str, region: str | None = None) -> Any:
    """`service`'s client in `region` (None: the shell's), made once per cloud the test talks
    to: making one (an EC2 client under moto: about 50 ms of CPU) cost the handler's tests
    more than their calls."""
    endpoint, key = os.environ.get("AWS_ENDPOINT_URL", ""), os.environ["AWS_ACCESS_KEY_ID"]
    return _client(service, region or os.environ["AWS_DEFAULT_REGION"], endpoint, key)


@functools.cache
def _client(service: str, region: str, endpoint: str, key: str) -> Any:
    return boto3.client(service, region_name=region)


def _drain(url: str) -> list[dict[str, Any]]:
    sqs, messages = aws("sqs"), []
    while batch := sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
    ).get("Messages", []):
        messages += batch
        for message in batch:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return messages


def create_group(name: str, region: str, zone: str, desired: int, run: str = RUN,
                 distribution: dict[str, int] | None = None) -> None:  # fmt: skip
    """A group as a run's stack deploys it, tagged with its environment and run
    (`distribution`: its markets, as the stack's `InstancesDistribution`; none: on-demand)."""
    ec2 = aws("ec2", region)
    image = control.stock_image(ec2)
    template = ec2.create_launch_template(
        LaunchTemplateName=name, LaunchTemplateData={"ImageId": image}
    )["LaunchTemplate"]["LaunchTemplateId"]
    aws("autoscaling", region).create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=0, MaxSize=4, DesiredCapacity=desired,
        AvailabilityZones=[zone],
        MixedInstancesPolicy={
            "LaunchTemplate": {
                "LaunchTemplateSpecification": {"LaunchTemplateId": template},
                "Overrides": [{"InstanceType": "g5.xlarge"}, {"InstanceType": "g6.xlarge"}],
            },
            **({"InstancesDistribution": distribution} if distribution else {}),
        },
        Tags=[{"Key": k, "Value": v, "PropagateAtLaunch": True}
              for k, v in (("spotrain:environment", os.environ[ENVIRONMENT_VARIABLE]),
                           ("spotrain:run", run))],
    )  # fmt: skip


def desired(name: str, region: str) -> int:
    groups = aws("autoscaling", region).describe_auto_scaling_groups(AutoScalingGroupNames=[name])[
        "AutoScalingGroups"
    ]
    return int(groups[0]["DesiredCapacity"])


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        yield _handler_environment(boto3.resource("dynamodb"), monkeypatch)


def _handler_environment(dynamodb: Any, monkeypatch: pytest.MonkeyPatch) -> Cloud:
    """The events table, dead-letter queue and notice topic (read through a queue), and the
    handler's environment variables as the stack sets them."""
    _client.cache_clear()  # a cloud of its own: moto's afresh, or another endpoint
    table = create_events_table(dynamodb)
    sqs, sns = aws("sqs"), aws("sns")
    queue_url = sqs.create_queue(QueueName=f"dlq-{random.getrandbits(32)}")["QueueUrl"]
    notices_url = sqs.create_queue(QueueName=f"notices-{random.getrandbits(32)}")["QueueUrl"]
    topic = sns.create_topic(Name=f"notices-{random.getrandbits(32)}")["TopicArn"]
    notices_arn = sqs.get_queue_attributes(QueueUrl=notices_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=notices_arn)
    environment = f"unit{random.getrandbits(32):08x}"  # its own runs on a shared local cloud
    for key, value in HandlerSettings(
        events_table=TABLE, alert_topic_arn=topic, dead_letter_queue_url=queue_url,
        hot_pool_threshold=2, on_demand_deadline_minutes=10, environment=environment,
    ).to_environment().items():  # fmt: skip
        monkeypatch.setenv(key, value)
    declare_run([
        CapacityGroup(name="east-spot", region="us-east-1", lifecycle="spot", holds_data=True),
        CapacityGroup(name="west-spot", region="us-west-2", lifecycle="spot", holds_data=False),
        CapacityGroup(name="east-on-demand", region="us-east-1", lifecycle="on-demand",
                      holds_data=True),
        CapacityGroup(name="east-spot-c", region="us-east-1", lifecycle="spot", holds_data=True),
    ])  # fmt: skip
    return Cloud(table, queue_url, notices_url)


def declare_run(
    groups: list[CapacityGroup], run: str = RUN, region: str = REGION, **settings: Any
) -> None:
    """What the run's stack writes: its declaration to `region`'s handler."""
    aws("ssm", region).put_parameter(
        Name=run_parameter_name(os.environ[ENVIRONMENT_VARIABLE], run), Type="SecureString",
        Overwrite=True,
        Value=RunDeclaration(run=run, groups=tuple(groups), **settings).to_json(),
    )  # fmt: skip


def publish_checkpoint(catalog: Any, folder: Path, generation: int, step: int) -> None:
    """A one-file checkpoint of `step` published through `catalog` (its storage) as the
    trainer publishes, staged in `folder`."""
    from spotrain.trainer import checkpoint_store

    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(bytes([step, generation]) * 64)
    checkpoint_store.publish(folder, storage=catalog.records.storage, run=RUN, catalog=catalog,
                             generation=generation, step=step, world_size=1, zero_stage=2,
                             config_hash="c", code_version="v")  # fmt: skip


def check_run(check: dict[str, Any], run: str = RUN) -> dict[str, Any]:
    """The scheduled capacity check (of every run of the environment): `run`'s result."""
    return handler.handle(check)["runs"][run]


def for_instance(name: str, instance_id: str, **changes: str) -> dict[str, Any]:
    e = event(name)
    e["detail"]["instance-id"] = instance_id
    e.update(changes)
    return e


def run_instance(group: str = "east-spot") -> str:
    return launch_instance(aws("ec2"), {"spotrain:run": RUN, "aws:autoscaling:groupName": group})


def test_records_a_spot_warning_with_its_pool_and_marks_tags_and_notifies(cloud: Cloud) -> None:
    instance = run_instance()
    result = handler.handle(for_instance("spot-interruption-warning", instance))
    assert result["recorded"] is True
    assert (result["run"], result["pool"]) == (RUN, HOT_POOL)
    item = cloud.table.get_item(
        Key={"pk": "EVENT#12345678-1234-1234-1234-123456789012", "sk": "EVENT"}
    )["Item"]
    assert (item["kind"], item["instance_id"], item["pool"], item["occurred_at"]) == (
        "interruption-warning", instance, HOT_POOL, "2026-11-21T12:00:00Z",
    )  # fmt: skip
    assert fleet_state.instance_status(cloud.table, RUN, instance) == "INTERRUPTING"
    tags = aws("ec2").describe_tags(Filters=[{"Name": "resource-id", "Values": [instance]}])["Tags"]
    assert {t["Key"]: t["Value"] for t in tags}["spotrain:interruption"] == (
        "interruption-warning@2026-11-21T12:00:00Z"
    )
    [notice] = cloud.notices()
    assert (notice["instance_id"], notice["decision"]) == (instance, "replace-in-place")
    assert cloud.dead_letters() == []


@pytest.mark.parametrize("tags", [{"spotrain:run": "someone-elses"}, {"team": "ml"}])
def test_a_machine_of_another_run_is_counted_and_left_alone(
    cloud: Cloud, tags: dict[str, str]
) -> None:
    """The rules see the whole account's spot warnings: another environment's machine, or
    one of no run, is neither recorded, marked, tagged, requeued, notified nor dead-lettered."""
    create_group("east-spot", "us-east-1", "us-east-1b", 2)
    stranger = launch_instance(aws("ec2"), tags)
    for attempt in range(2):
        result = handler.handle(
            for_instance("spot-interruption-warning", stranger, id=f"stranger-{attempt}")
        )
        assert result["recorded"] is False
        assert "not to a run of environment unit" in result["ignored"]
    assert cloud.table.scan(FilterExpression="sk = :e",
                            ExpressionAttributeValues={":e": "EVENT"})["Count"] == 0  # fmt: skip
    assert fleet_state.instance_status(cloud.table, RUN, stranger) is None
    tags_now = aws("ec2").describe_tags(Filters=[{"Name": "resource-id", "Values": [stranger]}])[
        "Tags"
    ]
    assert "spotrain:interruption" not in {t["Key"] for t in tags_now}
    assert desired("east-spot", "us-east-1") == 2
    assert cloud.notices() == [] and cloud.dead_letters() == []
    counted = cloud.table.get_item(Key={"pk": schema.FOREIGN_EVENTS_KEY, "sk": "STATE"})["Item"]
    assert counted["foreign_events"] == 2


def test_a_rebalance_recommendation_marks_but_never_requeues(cloud: Cloud) -> None:
    create_group("east-spot", "us-east-1", "us-east-1b", 2)
    instance = run_instance()
    result = handler.handle(for_instance("rebalance-recommendation", instance))
    assert (result["decision"], result["desired"]) == ("none", {})
    assert fleet_state.instance_status(cloud.table, RUN, instance) == "REBALANCING"
    handler.handle(for_instance("spot-interruption-warning", instance))
    assert fleet_state.instance_status(cloud.table, RUN, instance) == "INTERRUPTING"
    # a late rebalance notice never downgrades an interruption
    handler.handle(for_instance("rebalance-recommendation", instance, id="late-rebalance"))
    assert fleet_state.instance_status(cloud.table, RUN, instance) == "INTERRUPTING"


def test_redelivered_event_is_recorded_and_acted_on_once(cloud: Cloud) -> None:
    instance = run_instance()
    first = handler.handle(for_instance("spot-interruption-warning", instance))
    second = handler.handle(for_instance("spot-interruption-warning", instance))
    assert (first["recorded"], second["recorded"]) == (True, False)
    assert cloud.table.scan(FilterExpression="sk = :e",
                            ExpressionAttributeValues={":e": "EVENT"})["Count"] == 1  # fmt: skip
    assert len(cloud.notices()) == 1


def test_a_hot_pool_shifts_capacity_to_another_pool_of_the_runs_region_only(
    cloud: Cloud,
) -> None:
    """A gang cannot span regions: the run trains at home (no move claimed), so the hot
    pool's capacity goes to home's other group, never to the other region's."""
    create_group("east-spot", "us-east-1", "us-east-1b", 2)
    create_group("west-spot", "us-west-2", "us-west-2a", 0)
    create_group("east-on-demand", "us-east-1", "us-east-1b", 0)
    first, second = run_instance(), run_instance()
    quiet = handler.handle(for_instance("spot-interruption-warning", first, id="w-1"))
    assert quiet["decision"] == "replace-in-place"
    hot = handler.handle(for_instance("spot-interruption-warning", second, id="w-2",
                                      time="2026-11-21T12:10:00Z"))  # fmt: skip
    assert hot["decision"] == "wait-for-spot", hot["reason"]  # home has no other pool
    assert desired("west-spot", "us-west-2") == 0
    create_group("east-spot-c", "us-east-1", "us-east-1c", 0)
    third = run_instance()
    shifted = handler.handle(for_instance("spot-interruption-warning", third, id="w-3",
                                          time="2026-11-21T12:12:00Z"))  # fmt: skip
    assert shifted["decision"] == "shift", shifted["reason"]
    assert (desired("east-spot", "us-east-1"), desired("east-spot-c", "us-east-1")) == (1, 1)
    assert (desired("west-spot", "us-west-2"), desired("east-on-demand", "us-east-1")) == (0, 0)


def test_interruptions_outside_the_window_do_not_make_a_pool_hot(cloud: Cloud) -> None:
    create_group("east-spot", "us-east-1", "us-east-1b", 2)
    create_group("west-spot", "us-west-2", "us-west-2a", 0)
    instance = run_instance()
    handler.handle(for_instance("spot-interruption-warning", instance, id="old",
                                time="2026-11-21T09:00:00Z"))  # fmt: skip
    later = handler.handle(for_instance("spot-interruption-warning", instance, id="new"))
    assert later["decision"] == "replace-in-place"
    assert desired("west-spot", "us-west-2") == 0


def test_a_run_that_crashed_too_often_is_held(cloud: Cloud) -> None:
    create_group("east-spot", "us-east-1", "us-east-1b", 2)
    create_group("west-spot", "us-west-2", "us-west-2a", 0)
    check_run(event("scheduled-capacity-check"))  # the run starts (no configuration to wait for)
    crashing = run_instance()
    verdicts = [
        fleet_state.record_exit(cloud.table, RUN, crashing, 1, max_crashes=3) for _ in range(3)
    ]
    assert [(v.kind, v.crashes, v.failed) for v in verdicts] == [
        ("crash", 1, False), ("crash", 2, False), ("crash", 3, True),
    ]  # fmt: skip
    for n in range(2):
        result = handler.handle(for_instance("spot-interruption-warning", run_instance(),
                                             id=f"w-{n}"))  # fmt: skip
    assert result["decision"] == "hold"
    assert desired("west-spot", "us-west-2") == 0
    # The scheduled check takes the held run's groups to nothing: no machine idles, billed.
    cloud.notices()
    check = event("scheduled-capacity-check")
    assert check_run(check)["decision"] == "hold"
    assert desired("east-spot", "us-east-1") == 0
    [notice] = cloud.notices()
    assert "scaled to 0" in notice["reason"]
    assert check_run(check)["decision"] == "hold" and cloud.notices() == []  # said once
    fleet_state.reset_crashes(cloud.table, RUN)  # on-call fixed the cause
    assert check_run(check)["decision"] == "release"
    assert desired("east-spot", "us-east-1") == 2
    assert "back to east-spot 0..2" in cloud.notices()[0]["reason"]
    assert fleet_state.run_state(cloud.table, RUN).held_sizes is None
    # The release forgave the three crashes, not the next: the crash records stay as they were.
    again = fleet_state.record_exit(cloud.table, RUN, crashing, 1, max_crashes=3)
    assert (again.crashes, again.failed) == (1, False)


def test_an_exit_of_an_interrupted_machine_is_a_preemption_not_a_crash(cloud: Cloud) -> None:
    instance = run_instance()
    handler.handle(for_instance("spot-interruption-warning", instance))
    verdict = fleet_state.record_exit(cloud.table, RUN, instance, 143, max_crashes=1)
    assert (verdict.kind, verdict.crashes, verdict.failed) == ("preempted", 0, False)
    finished = fleet_state.record_exit(cloud.table, RUN, run_instance(), 0, max_crashes=1)
    assert finished.kind == "finished"
    assert fleet_state.run_state(cloud.table, RUN).failed is False


def test_capacity_check_falls_back_to_on_demand_after_the_deadline(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_group("east-spot", "us-east-1", "us-east-1b", 2)
    create_group("east-on-demand", "us-east-1", "us-east-1b", 0)
    aws("autoscaling").update_auto_scaling_group(
        AutoScalingGroupName="east-spot", DesiredCapacity=3
    )
    # moto fills desired capacity at once: play a group that spot cannot fill
    monkeypatch.setattr(capacity_policy, "reconcile", _with_spot_missing(capacity_policy.reconcile))
    clock = iter([1000.0, 1700.0])
    monkeypatch.setattr(runtime_settings, "now", lambda: next(clock))
    check = event("scheduled-capacity-check")
    assert check_run(check)["decision"] == "wait-for-spot"
    assert fleet_state.run_state(cloud.table, RUN).short_since == 1000.0
    assert check_run(check)["decision"] == "on-demand"
    assert desired("east-on-demand", "us-east-1") == 1


def _with_spot_missing(reconcile: Any) -> Any:
    def short_by_one(*, groups: Any, **kwargs: Any) -> Any:
        played = [
            Group(**{**g.__dict__, "in_service": g.desired - 1})
            if g.lifecycle == "spot" else g
            for g in groups
        ]  # fmt: skip
        return reconcile(groups=played, **kwargs)

    return short_by_one


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (
            lambda e: e.update({"detail-type": "EC2 Instance State-change Notification"}),
            "not handled",
        ),
        (lambda e: e.update({"source": "my.app"}), "not handled"),
        (lambda e: e.pop("id"), "lacks event_id"),
        (lambda e: e.update({"detail": "not-a-dict"}), "lacks instance_id"),
        (lambda e: e["detail"].pop("instance-id"), "lacks instance_id"),
        (lambda e: e.update({"time": "yesterday"}), "not ISO 8601"),
    ],
)
def test_malformed_events_go_to_the_dead_letter_queue_and_are_not_recorded(
    cloud: Cloud, breakage: Any, message: str
) -> None:
    bad = copy.deepcopy(event("spot-interruption-warning"))
    breakage(bad)
    result = handler.handle(bad)
    assert message in result["rejected"]
    [dead] = cloud.dead_letters()
    assert json.loads(dead["Body"])["event"] == bad  # whole, for redrive
    assert message in dead["MessageAttributes"]["reason"]["StringValue"]
    assert cloud.table.scan()["Count"] == 0


def test_an_event_that_is_not_an_object_is_rejected(cloud: Cloud) -> None:
    assert "JSON object" in handler.handle(["not", "an", "event"])["rejected"]
    assert len(cloud.dead_letters()) == 1


def test_a_failure_half_way_goes_to_the_dead_letter_queue(cloud: Cloud) -> None:
    cloud.table.delete()  # DynamoDB answers ResourceNotFound
    result = handler.handle(event("spot-interruption-warning"))
    assert "ResourceNotFoundException" in result["rejected"]
    assert len(cloud.dead_letters()) == 1


def burst(count: int, distinct: int, seed: int) -> list[dict[str, Any]]:
    """`count` events, `distinct` of them different, the rest redeliveries, shuffled."""
    originals = _originals(distinct, seed)
    rng = random.Random(seed)
    events = originals + [rng.choice(originals) for _ in range(count - distinct)]
    rng.shuffle(events)
    return events


def redelivered_together(distinct: int, copies: int, seed: int) -> list[dict[str, Any]]:
    """`distinct` events in a shuffled order, each delivered `copies` times in a row: handed to
    concurrent invocations in this order, the copies of one event race one another."""
    originals = _originals(distinct, seed)
    random.Random(seed).shuffle(originals)
    return [delivery for original in originals for delivery in [original] * copies]


def _originals(distinct: int, seed: int) -> list[dict[str, Any]]:
    return [
        for_instance(
            "spot-interruption-warning" if n % 3 else "rebalance-recommendation",
            f"i-{n:017x}", id=f"burst-{seed}-{n}",
        )
        for n in range(distinct)
    ]  # fmt: skip


def test_a_burst_with_duplicates_is_recorded_exactly(cloud: Cloud) -> None:
    # Concurrent redeliveries run over HTTP below; in-process moto answers pool queries slowly.
    events = burst(60, 40, seed=7)
    results = [handler.handle(e) for e in events]
    assert sum(r["recorded"] for r in results) == 40
    assert cloud.table.scan(FilterExpression="sk = :e",
                            ExpressionAttributeValues={":e": "EVENT"})["Count"] == 40  # fmt: skip
    assert cloud.dead_letters() == []


# --- through the local cloud, over HTTP ----------------------------------------------------
@pytest.fixture
def http_cloud(local_cloud: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    for key, value in control.aws_environment(local_cloud.endpoint, REGION).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    cloud = _handler_environment(boto3.resource("dynamodb"), monkeypatch)
    try:
        yield cloud
    finally:
        cloud.table.delete()


@pytest.mark.integration
def test_records_through_the_local_cloud_over_http(http_cloud: Cloud) -> None:
    instance = run_instance()
    warning = for_instance("spot-interruption-warning", instance)
    assert handler.handle(warning)["recorded"] is True
    assert handler.handle(warning)["recorded"] is False
    by_pool = http_cloud.table.query(
        IndexName=schema.POOL_INDEX,
        KeyConditionExpression="#p = :pool",
        ExpressionAttributeNames={"#p": schema.POOL_KEY},
        ExpressionAttributeValues={":pool": HOT_POOL},
    )["Items"]
    assert [i["instance_id"] for i in by_pool] == [instance]
    assert fleet_state.instance_status(http_cloud.table, RUN, instance) == "INTERRUPTING"
    assert len(http_cloud.notices()) == 1


@pytest.mark.integration
def test_a_concurrent_burst_over_http_is_recorded_exactly(http_cloud: Cloud) -> None:
    # Eight concurrent invocations, and the four copies of each event among them at once: every
    # event is recorded by exactly one of the invocations that race on it.
    events = redelivered_together(30, 4, seed=11)
    with ThreadPoolExecutor(max_workers=8) as pool:  # concurrent Lambda invocations
        results = list(pool.map(handler.handle, events))
    assert [r for r in results if "rejected" in r] == []
    assert sum(r["recorded"] for r in results) == 30
    for first in range(0, len(events), 4):  # one of each event's copies recorded it
        assert sum(r["recorded"] for r in results[first : first + 4]) == 1, first
    assert http_cloud.table.scan(FilterExpression="sk = :e",
                                 ExpressionAttributeValues={":e": "EVENT"},
                                 Select="COUNT")["Count"] == 30  # fmt: skip


def test_a_large_malformed_event_is_dead_lettered_as_a_summary_and_nothing_raises(
    cloud: Cloud,
) -> None:
    sqs = aws("sqs")
    # As Terraform creates the queue (the provider's default maximum message size).
    sqs.set_queue_attributes(QueueUrl=cloud.queue_url, Attributes={"MaximumMessageSize": "262144"})
    bad = event("spot-interruption-warning")
    bad["detail"].pop("instance-id")
    bad["detail"]["note"] = "é" * 75_000  # 150 KB in UTF-8; six times that as escaped JSON
    result = handler.handle(bad)
    assert "lacks instance_id" in result["rejected"]
    [dead] = cloud.dead_letters()
    summary = json.loads(dead["Body"])
    assert (summary["id"], summary["source"], summary["detail-type"]) == (
        bad["id"], "aws.ec2", "EC2 Spot Instance Interruption Warning",
    )  # fmt: skip
    assert "event" not in summary and summary["size"] > 262144 and len(summary["sha256"]) == 64
    assert "lacks instance_id" in summary["reason"]
    sqs.delete_queue(QueueUrl=cloud.queue_url)  # a dead-letter queue that cannot take it
    assert "JSON object" in handler.handle(["not", "an", "event"])["rejected"]


def test_the_mark_keeps_the_newest_event_whatever_order_they_arrive_in(cloud: Cloud) -> None:
    def mark(instance: str) -> dict[str, Any]:
        return dict(
            cloud.table.get_item(Key={"pk": f"RUN#{RUN}", "sk": f"INSTANCE#{instance}"})["Item"]
        )

    early, late = "2026-11-21T12:00:00Z", "2026-11-21T12:05:00Z"
    first = run_instance()
    handler.handle(for_instance("spot-interruption-warning", first, id="late-1", time=late))
    handler.handle(for_instance("rebalance-recommendation", first, id="early-1", time=early))
    assert (mark(first)["status"], mark(first)["event_id"]) == ("INTERRUPTING", "late-1")
    assert mark(first)["updated_at"].startswith("2026-11-21T12:05:00")
    second = run_instance()
    handler.handle(for_instance("rebalance-recommendation", second, id="late-2", time=late))
    handler.handle(for_instance("spot-interruption-warning", second, id="early-2", time=early))
    # The machine is still going away (never downgraded); the newest event is still the mark's.
    assert (mark(second)["status"], mark(second)["event_id"]) == ("INTERRUPTING", "late-2")
    # The instances' tags say the same: the newest event, not the one delivered last.
    assert interruption_tag(first) == f"interruption-warning@{late}"
    assert interruption_tag(second) == f"rebalance-recommendation@{late}"


def test_a_tag_follows_its_mark_however_often_the_mark_moves_while_it_tags() -> None:
    """Newer warnings for one instance land while an older event's handler tags it, one after
    each of its writes, more of them than any fixed number of rounds: the tag ends at the
    newest, and the handler stops once the mark it reads is the label it wrote."""
    labels = [f"interruption-warning@2026-11-21T12:{minute:02d}:00Z" for minute in range(30)]
    moves = iter(labels[1:])
    written: list[str] = []
    mark = {"latest_label": labels[0]}

    class Table:  # the fleet state's instance item, as a consistent read returns it
        def get_item(self, **_: Any) -> dict[str, Any]:
            return {"Item": dict(mark)}

    class Ec2:
        def create_tags(self, Resources: list[str], Tags: list[dict[str, str]]) -> None:
            written.append(Tags[0]["Value"])
            mark["latest_label"] = next(moves, mark["latest_label"])  # a newer warning lands

    runtime_aws.tag_newest(Ec2(), Table(), RUN, "i-0123456789abcdef0", labels[0])
    assert written == labels


def interruption_tag(instance: str) -> str | None:
    tags = aws("ec2").describe_tags(Filters=[{"Name": "resource-id", "Values": [instance]}])["Tags"]
    return {t["Key"]: t["Value"] for t in tags}.get("spotrain:interruption")


@pytest.mark.integration
def test_an_out_of_order_concurrent_burst_leaves_each_tag_at_its_newest_warning(
    http_cloud: Cloud,
) -> None:
    rng = random.Random(5)
    instances = [run_instance() for _ in range(10)]
    events, newest = [], {}
    for index, instance in enumerate(instances):
        minutes = rng.sample(range(60), 6)
        newest[instance] = f"interruption-warning@2026-11-21T10:{max(minutes):02d}:00Z"
        events += [for_instance("spot-interruption-warning", instance, id=f"w-{index}-{m}",
                                time=f"2026-11-21T10:{m:02d}:00Z") for m in minutes]  # fmt: skip
    rng.shuffle(events)
    with ThreadPoolExecutor(max_workers=8) as pool:  # concurrent Lambda invocations
        results = list(pool.map(handler.handle, events))
    assert [r for r in results if "rejected" in r] == []
    assert {i: interruption_tag(i) for i in instances} == newest


# --- the checkpoint catalog's stream ----------------------------------------------------------
def test_catalog_changes_that_rewrite_history_are_alarms_and_a_roll_back_a_notice(
    cloud: Cloud, tmp_path: Path
) -> None:
    """The trainer's own publishes, roll back and status changes, then what only a forger (or
    a bug) does, read from the table's stream as Lambda receives it."""
    from helpers import create_catalog_table, stream_records

    from spotrain.trainer.catalog import DynamoCatalog
    from spotrain.trainer.storage import LocalStorage

    client = aws("dynamodb")
    create_catalog_table(client, "catalog", stream=True)
    storage = LocalStorage(tmp_path / "store")
    catalog = DynamoCatalog("catalog", RUN, storage, client=client)
    generation = catalog.acquire_lease("trainer")
    for step in (1, 2, 3):
        publish_checkpoint(catalog, tmp_path / f"step{step}", generation, step)
    catalog.roll_back(2, generation, "step 3 diverged")
    catalog.quarantine(3, "kept for the post-mortem")
    history = len(stream_records(client, aws("dynamodbstreams"), "catalog"))

    def key(sort_key: str) -> dict[str, Any]:
        return {"pk": {"S": schema.run_key(RUN)}, "sk": {"S": sort_key}}

    client.update_item(TableName="catalog", Key=key(schema.HEAD_SORT_KEY),
                       UpdateExpression="SET #s = :one", ExpressionAttributeNames={"#s": "step"},
                       ExpressionAttributeValues={":one": {"N": "1"}})  # fmt: skip
    client.update_item(TableName="catalog", Key=key(schema.checkpoint_sort_key(1)),
                       UpdateExpression="SET manifest = :forged",
                       ExpressionAttributeValues={":forged": {"S": "forged.json"}})  # fmt: skip
    client.delete_item(TableName="catalog", Key=key(schema.checkpoint_sort_key(2)))

    records = stream_records(client, aws("dynamodbstreams"), "catalog")
    result = handler.handle({"Records": records})
    assert result["catalog_changes"] == history + 3
    found = [
        (f["severity"], f["kind"], f.get("step", f.get("to_step"))) for f in result["findings"]
    ]
    assert found == [
        ("notice", "head-rolled-back", 2),  # the trainer's roll back says why
        ("alarm", "head-moved-back", 1), ("alarm", "record-rewritten", 1),
        ("alarm", "record-removed", 2),
    ]  # fmt: skip
    assert [n["kind"] for n in cloud.notices()] == [kind for _, kind, _ in found]
    assert result["findings"][2]["changed"] == ["manifest"]
    assert cloud.dead_letters() == []


def test_each_regions_handler_scales_its_own_groups_for_the_region_the_run_trains_in(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every region has its handler. The run moved to us-west-2 (its epoch 1, in each region's
    copy of the catalog once replicated): home's check empties home's groups and nothing else,
    and keeps no ledger; us-west-2's starts its own groups (the run has just moved in) and
    never touches home's; a warning for a machine left at home is recorded, not requeued."""
    from helpers import create_catalog_table

    from spotrain.core import run_epochs, run_lifecycle

    west = "us-west-2"
    declared = [
        CapacityGroup(name="east-spot", region=REGION, lifecycle="spot", holds_data=True,
                      min_size=1, desired=2),
        CapacityGroup(name="east-on-demand", region=REGION, lifecycle="on-demand",
                      holds_data=True),
        CapacityGroup(name="west-spot", region=west, lifecycle="spot", holds_data=False,
                      min_size=1, desired=2),
        CapacityGroup(name="west-on-demand", region=west, lifecycle="on-demand",
                      holds_data=False),
    ]  # fmt: skip
    for group in declared:
        create_group(
            group.name, group.region, f"{group.region}a", 2 if group.name == "east-spot" else 0
        )  # the run trained at home
    monkeypatch.setenv(HandlerSettings.variable("checkpoints_table"), "catalog")
    moved = run_epochs.Epoch(id=run_epochs.EpochId(1, west), base=run_epochs.EpochId(0, REGION),
                             base_step=0, claimed_by="test")  # fmt: skip
    for region in (REGION, west):  # each region's copies, as replication leaves them
        dynamodb = aws("dynamodb", region)
        create_catalog_table(dynamodb, "catalog")
        dynamodb.put_item(TableName="catalog", Item={
            schema.PARTITION_KEY: {"S": schema.run_key(RUN)},
            schema.SORT_KEY: {"S": run_epochs.epoch_sort_key(1)}, **moved.to_item()})  # fmt: skip
        table = cloud.table if region == REGION else create_events_table(
            boto3.resource("dynamodb", region_name=region))  # fmt: skip
        run_lifecycle.mark_started(table, RUN, 0.0)
        declare_run(declared, region=region)

    topics = {REGION: os.environ[HandlerSettings.variable("alert_topic_arn")],
              west: aws("sns", west).create_topic(Name="notices")[
                  "TopicArn"]}  # fmt: skip

    def in_region(region: str) -> None:  # each region's function: its own process and topic
        monkeypatch.setenv("AWS_DEFAULT_REGION", region)
        monkeypatch.setenv(HandlerSettings.variable("alert_topic_arn"), topics[region])
        monkeypatch.setattr(runtime_settings, "_declarations", {})
        runtime_clients.forget()

    def sizes() -> dict[str, int]:
        return {g.name: desired(g.name, g.region) for g in declared}

    home = check_run(event("scheduled-capacity-check"))
    assert home["decision"] == "follow-the-run", home
    assert "trains in us-west-2" in home["reason"] and "its handler there" in str(home["ledger"])
    assert sizes() == {"east-spot": 0, "east-on-demand": 0, "west-spot": 0, "west-on-demand": 0}
    in_region(west)
    there = check_run(event("scheduled-capacity-check"))
    assert there["decision"] == "follow-the-run" and "just moved in" in there["reason"], there
    assert sizes() == {"east-spot": 0, "east-on-demand": 0, "west-spot": 2, "west-on-demand": 0}
    assert check_run(event("scheduled-capacity-check"))["decision"] != "follow-the-run"
    in_region(REGION)
    assert check_run(event("scheduled-capacity-check"))["decision"] == "none"
    left = handler.handle(for_instance("spot-interruption-warning", run_instance()))
    assert left["recorded"] is True and left["decision"] == "none", left
    assert "trains in us-west-2" in left["reason"]
    assert sizes()["west-spot"] == 2 and sizes()["east-spot"] == 0


def test_a_checkpoint_published_by_an_epoch_the_run_moved_on_from_is_an_alarm(
    cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run moved (epoch 1, from step 2); then the old epoch's step 3 arrives, as the
    global table delivers what a region cut off from the others accepted. The new epoch's own
    step 3 is history growing; the old one's is a stale writer."""
    from helpers import create_catalog_table, stream_records

    from spotrain.trainer.catalog import DynamoCatalog
    from spotrain.trainer.storage import LocalStorage

    client = aws("dynamodb")
    create_catalog_table(client, "catalog", stream=True)
    monkeypatch.setenv(HandlerSettings.variable("checkpoints_table"), "catalog")
    storage = LocalStorage(tmp_path / "store")
    old = DynamoCatalog("catalog", RUN, storage, client=client)

    def publish(catalog: DynamoCatalog, generation: int, step: int) -> None:
        publish_checkpoint(catalog, tmp_path / f"{generation}-{step}", generation, step)

    lease = old.acquire_lease("trainer in us-east-1")
    for step in (1, 2):
        publish(old, lease, step)
    [before] = [e for e in old.entries() if e.step == 2]
    moved = DynamoCatalog("catalog", RUN, storage, client=client)
    moved.claim_move(before, by="test")
    publish(moved, moved.acquire_lease("trainer of epoch 1"), 3)
    # What the cut-off region accepted, as replication writes it: its own key, unconditionally.
    stale = {**old._key(schema.checkpoint_sort_key(3)), "status": {"S": schema.STATUS_COMPLETE},
             "step": {"N": "3"}, "manifest": {"S": "runs/demo/checkpoints/step_3/m.json"},
             "generation": {"N": str(lease)}, "bytes": {"N": "1"}}  # fmt: skip
    client.put_item(TableName="catalog", Item=stale)

    result = handler.handle({"Records": stream_records(client, aws("dynamodbstreams"),
                                                       "catalog")})  # fmt: skip
    found = [(f["kind"], f.get("step"), f.get("epoch")) for f in result["findings"]]
    assert found == [("stale-writer", 3, 0)]
    assert "moved to us-east-1 (epoch 1)" in result["findings"][0]["detail"]
    assert [n["kind"] for n in cloud.notices()] == ["stale-writer"]
    assert [(e.step, e.status) for e in old.entries() if e.step == 3] == [
        (3, schema.STATUS_FENCED), (3, schema.STATUS_COMPLETE)]  # fmt: skip


def test_a_stale_writer_that_is_refused_leaves_its_attempt_and_the_watcher_alarms(
    cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run moved to us-west-2 after step 1 (its claim, as replication delivers it to the
    old region's copy). The old region's writer then tries to publish step 2, and a machine of
    the old region coming back tries to start: both refused, nothing published, and each
    leaves its attempt, which the catalog's stream brings to the handler as an alarm."""
    from helpers import create_catalog_table, stream_records

    from spotrain.core import run_epochs
    from spotrain.trainer.catalog import DynamoCatalog, StaleWriter
    from spotrain.trainer.storage import LocalStorage

    client = aws("dynamodb")
    create_catalog_table(client, "catalog", stream=True)
    monkeypatch.setenv(HandlerSettings.variable("checkpoints_table"), "catalog")
    storage = LocalStorage(tmp_path / "store")
    old = DynamoCatalog("catalog", RUN, storage, client=client)

    def publish(generation: int, step: int) -> None:
        publish_checkpoint(old, tmp_path / f"{step}", generation, step)

    lease = old.acquire_lease("trainer in us-east-1")
    publish(lease, 1)
    moved = run_epochs.Epoch(run_epochs.EpochId(1, "us-west-2"), run_epochs.EpochId(0, REGION),
                             1, "2026-11-27T00:00:00Z", "test")  # fmt: skip
    client.put_item(TableName="catalog",
                    Item={**old._key(run_epochs.epoch_sort_key(1)), **moved.to_item()})  # fmt: skip
    with pytest.raises(StaleWriter, match="moved on from this writer's epoch"):
        publish(lease, 2)
    back = DynamoCatalog("catalog", RUN, storage, client=client)
    with pytest.raises(StaleWriter, match="trains in us-west-2 since epoch 1"):
        back.acquire_lease("a machine of us-east-1, back")
    assert [e.step for e in old.entries()] == [1]  # nothing published

    result = handler.handle({"Records": stream_records(client, aws("dynamodbstreams"),
                                                       "catalog")})  # fmt: skip
    found = [(f["kind"], f.get("refused"), f["epoch"], f["region"]) for f in result["findings"]]
    assert found == [("stale-writer", "publish of step 2", 0, REGION),
                     ("stale-writer", "take the run's lease (a start)", 0, REGION)]  # fmt: skip
    assert "after the run moved to us-west-2 (epoch 1): refused, nothing published" in result[
        "findings"][0]["detail"]  # fmt: skip
    assert [n["kind"] for n in cloud.notices()] == ["stale-writer", "stale-writer"]


@pytest.mark.parametrize(
    ("where", "strategy"),
    [("in-process", "outage-fill"), ("in-process", "markov"), ("in-process", "markov-daily"),
     pytest.param("local-cloud", "markov", marks=pytest.mark.integration)],
)  # fmt: skip
def test_a_run_with_a_deadline_moves_as_the_simulator_decides(
    where: str, strategy: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scripted spot availability sequence, replayed by the cost simulator and by the
    handler's scheduled check on the run's catalog: each check leaves the run on what the
    simulator chose for that tick (one decision function, used twice). Outage fill: each
    keeps the record of spot its checks saw (the handler's in the run's fleet state). Markov:
    the simulator solves its plan; the same plan, stored as `spotrain run deadline-plan`
    stores it, is what the handler reads. Markov by the hour: spells end most at 10:00 UTC,
    the trace starts when the run does, and the plan stored is lined up with the run's deadline
    as `run deadline-plan` lines it up (the hour its `finish_by` is at): the same decisions,
    which differ from those of a plan blind to the hour."""
    from helpers import create_catalog_table

    from spotrain.cli import run_plan
    from spotrain.core import deadline_plan
    from spotrain.core.catalog_schema import HEAD_SORT_KEY, checkpoint_sort_key, run_key
    from spotrain.cost import markov_policy, simulation, traces

    per_hour, start = 3600, 1_800_000_000.0  # one step a second; the run's time 0
    available = [0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1]
    job = simulation.Job(work_h=8, deadline_h=14, changeover_h=0.25, on_demand_price=3.0,
                         spot_price=1.0)  # fmt: skip
    timeline: list[tuple[float, float, bool, str]] = []
    daily = strategy == "markov-daily"
    strategy = strategy.removesuffix("-daily")
    known = markov_policy.RegionRates(
        mean_spell_h=3.0,
        mean_outage_h=2.0,
        spell_swing=0.9 if daily else 0.0,
        spell_peak_utc_h=10.0,
    )
    scripted = traces.Trace("scripted", 3600, tuple(available), start_s=start if daily else None)
    simulation.simulate(job, scripted, strategy, timeline=timeline, known=known)  # fmt: skip
    modes = [mode for *_, mode in timeline]
    assert {"spot", "on-demand", "idle"} <= set(modes)  # the script exercises every move
    if daily:
        blind: list[tuple[float, float, bool, str]] = []
        simulation.simulate(job, replace(scripted, start_s=None), strategy, timeline=blind,
                            known=known)  # fmt: skip
        assert modes != [mode for *_, mode in blind]

    iso = lambda epoch: datetime.fromtimestamp(epoch, UTC).isoformat()  # noqa: E731
    run_deadline = RunDeadline(started_at=iso(start), finish_by=iso(start + 14 * 3600),
                               total_steps=8 * per_hour, changeover_minutes=15)  # fmt: skip
    cloud = request.getfixturevalue("cloud" if where == "in-process" else "http_cloud")
    if strategy == "markov":
        plan = markov_policy.Plan([known], markov_policy.Prices.of(job), tick_h=1.0, ticks=14,
                                  work=14, changeover=1,
                                  deadline_utc_h=run_plan.deadline_utc_h(run_deadline))  # fmt: skip
        plan_id = f"{random.getrandbits(32):08x}"  # a warm handler keeps parts by plan
        header = replace(
            plan.header((REGION,)), plan_id=plan_id, deadline=deadline_plan.solved_for(run_deadline)
        )
        deadline_plan.store(cloud.table, RUN, header, plan.slices())
    names = {
        kind: f"{kind}-{random.getrandbits(32):08x}" for kind in ("spot", "on-demand", "catalog")
    }
    create_catalog_table(aws("dynamodb"), names["catalog"])
    catalog = boto3.resource("dynamodb").Table(names["catalog"])
    for step, at in ((0, "2027-01-15T08:00:00Z"), (per_hour, "2027-01-15T09:00:00Z")):
        catalog.put_item(Item={"pk": run_key(RUN), "sk": checkpoint_sort_key(step), "step": step,
                               "created_at": at, "generation": 1})  # fmt: skip
    monkeypatch.setenv(HandlerSettings.variable("checkpoints_table"), names["catalog"])
    monkeypatch.setenv("CAPACITY_CHECK_MINUTES", "60")  # a check per tick of the script
    declare_run(
        [CapacityGroup(name=names[kind], region=REGION, lifecycle=kind, holds_data=True)
         for kind in ("spot", "on-demand")],
        run_deadline=run_deadline,
    )  # fmt: skip
    create_group(names["spot"], REGION, "us-east-1b", 1)
    create_group(names["on-demand"], REGION, "us-east-1b", 0)
    spot_now = {"available": False}
    groups_as_they_are = runtime_aws.capacity_groups

    def spot_as_scripted(settings: Any, autoscaling: Any, *, region: str) -> Any:
        return [
            Group(**{**g.__dict__, "in_service": g.desired if
                                     spot_now["available"] else 0})
            if g.lifecycle == "spot" else g
            for g in groups_as_they_are(settings, autoscaling, region=region)
        ]  # fmt: skip

    monkeypatch.setattr(runtime_aws, "capacity_groups", spot_as_scripted)
    for t, done, spot, expected in timeline:
        spot_now["available"] = spot
        catalog.put_item(Item={"pk": run_key(RUN), "sk": HEAD_SORT_KEY,
                               "step": round(done * per_hour)})  # fmt: skip
        monkeypatch.setattr(runtime_settings, "now", lambda t=t: start + t * 3600)
        result = check_run(event("scheduled-capacity-check"))
        on_demand = desired(names["on-demand"], REGION) > 0
        got = "on-demand" if on_demand else "spot" if spot else "idle"
        assert got == expected, (t, done, spot, result)
        assert "deadline policy" in result["reason"]
        assert ("plan:" in result["reason"]) == (strategy == "markov")
    catalog.delete()


DEADLINE_START, STEPS_PER_HOUR = 1_800_000_000.0, 3600
"""The runs with a deadline below start at 2027-01-15T08:00Z and train 3600 steps an hour."""


def _run_of_two_regions(name: str) -> tuple[str, str, list[CapacityGroup]]:
    """A run of home and us-west-2 (named `name` and a random suffix): its name, the other
    region, and its spot group (one machine) and on-demand group in each, home holding data."""
    west, run = "us-west-2", f"{name}-{random.getrandbits(32):08x}"
    return run, west, [
        CapacityGroup(name=f"{run}-{r}-{kind}", region=r, lifecycle=kind,
                      holds_data=r == REGION, min_size=int(kind == "spot"),
                      desired=int(kind == "spot"))
        for r in (REGION, west) for kind in ("spot", "on-demand")
    ]  # fmt: skip


def _deadline_catalog(run: str, regions: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> str:
    """The checkpoint catalog the handler reads, a copy in each of `regions` (the run never
    moved): the run's first two checkpoints an hour apart and its head at the second (an hour
    of work done at its pace). Its name."""
    from helpers import create_catalog_table

    from spotrain.core.catalog_schema import HEAD_SORT_KEY, checkpoint_sort_key, run_key

    name = f"catalog-{run}"
    for region in regions:
        create_catalog_table(aws("dynamodb", region), name)
    catalog = boto3.resource("dynamodb").Table(name)
    for step, at in ((0, "2027-01-15T08:00:00Z"), (STEPS_PER_HOUR, "2027-01-15T09:00:00Z")):
        catalog.put_item(Item={"pk": run_key(run), "sk": checkpoint_sort_key(step), "step": step,
                               "created_at": at, "generation": 1})  # fmt: skip
    catalog.put_item(Item={"pk": run_key(run), "sk": HEAD_SORT_KEY, "step": STEPS_PER_HOUR})
    monkeypatch.setenv(HandlerSettings.variable("checkpoints_table"), name)
    return name


@pytest.mark.integration
@pytest.mark.parametrize("strategy", ["outage-fill", "markov"])
def test_a_run_with_a_deadline_moves_for_spot_to_its_other_region_and_back_if_spot_returns(
    http_cloud: Cloud, monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    """A run with a deadline, on on-demand at home because spot is gone there (the local
    cloud's fault). While spot is gone in us-west-2 too it stays; once spot placement scores
    put spot in us-west-2, home's check wishes the move (outage fill: the policy's saving
    against on-demand here is more than the move's cost; markov: the run's stored plan, in
    each region's copy of the events table, says so) and takes home's groups to 0;
    us-west-2's check reads the wish, orders the move there and starts the run's groups,
    whose machines would claim it. Spot back at home before they do: home withdraws the wish
    and starts its groups again; us-west-2 empties its own."""
    from spotrain.core import deadline_plan, run_lifecycle
    from spotrain.cost import markov_policy

    run, west, declared = _run_of_two_regions("mover")
    start, per_hour = DEADLINE_START, STEPS_PER_HOUR
    iso = lambda epoch: datetime.fromtimestamp(epoch, UTC).isoformat()  # noqa: E731
    catalog_name = _deadline_catalog(run, (REGION, west), monkeypatch)
    monkeypatch.setattr(runtime_settings, "now", lambda: start + 2 * 3600)
    deadline = RunDeadline(started_at=iso(start), finish_by=iso(start + 14 * 3600),
                           total_steps=8 * per_hour, changeover_minutes=15)  # fmt: skip
    tables = {
        REGION: http_cloud.table,
        west: create_events_table(boto3.resource("dynamodb", region_name=west)),
    }
    for region in (REGION, west):  # started, as the stack declared it to each region
        declare_run(declared, run=run, region=region, run_deadline=deadline,
                    instance_types=("g6.xlarge",))  # fmt: skip
        run_lifecycle.mark_started(tables[region], run, start)
    if strategy == "markov":  # stored in both copies, as the table's replication does
        plan = markov_policy.Plan([markov_policy.RegionRates(4.0, 2.0)] * 2,
                                  markov_policy.Prices(1.0, 3.0, 0.0), tick_h=1 / 12,
                                  ticks=14 * 12, work=14 * 12, changeover=3)  # fmt: skip
        header = replace(
            plan.header((REGION, west)),
            plan_id=f"{random.getrandbits(32):08x}",
            deadline=deadline_plan.solved_for(deadline),
        )
        for table in tables.values():
            deadline_plan.store(table, run, header, plan.slices())
    control.set_faults(spot_capacity_gone=["*/*"])  # at first in both regions
    all_spot = {"OnDemandBaseCapacity": 0, "OnDemandPercentageAboveBaseCapacity": 0}
    for group in declared:  # home trains on on-demand: spot is gone there
        create_group(
            group.name,
            group.region,
            f"{group.region}b",
            int(group.region == REGION),
            run=run,
            distribution=all_spot if group.lifecycle == "spot" else None,
        )
    check = event("scheduled-capacity-check")

    topics = {REGION: os.environ[HandlerSettings.variable("alert_topic_arn")],
              west: aws("sns", west).create_topic(Name=f"notices-{run}")[
                  "TopicArn"]}  # fmt: skip

    def in_region(region: str) -> None:  # each region's function: its own copies and topic
        for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
            monkeypatch.setenv(name, region)
        monkeypatch.setenv(HandlerSettings.variable("alert_topic_arn"), topics[region])
        monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
        monkeypatch.setattr(runtime_settings, "_declarations", {})
        runtime_clients.forget()

    def replicate_the_wish() -> None:  # the events table's replication, item by item
        key = {"pk": schema.handler_state_key(run), "sk": schema.failover_sort_key(REGION)}
        item = tables[REGION].get_item(Key=key).get("Item")
        if item is None:
            tables[west].delete_item(Key=key)
        else:
            tables[west].put_item(Item=item)

    def sizes(region: str) -> dict[str, int]:
        return {g.name.removeprefix(f"{run}-"): desired(g.name, g.region)
                for g in declared if g.region == region}  # fmt: skip

    try:
        autoscaling = aws("autoscaling")
        autoscaling.update_auto_scaling_group(
            AutoScalingGroupName=f"{run}-{REGION}-on-demand", MinSize=0, DesiredCapacity=1
        )
        # An order an earlier failover left in home's item (to home, from us-west-2) is
        # history, not a wish of this epoch.
        from spotrain.core.failover import MoveOrder

        old = MoveOrder(from_epoch=0, from_region=west, to_region=REGION, ordered_at=start,
                        reason="us-west-2 did not answer")  # fmt: skip
        fleet_state.set_failover_state(tables[REGION], run, REGION,
                                       fleet_state.FailoverState(move_order=old))  # fmt: skip
        stays = check_run(check, run)  # no spot anywhere: the deadline policy here decides
        assert stays["decision"] != "move-for-spot" and "deadline policy" in stays["reason"]
        assert sizes(REGION)[f"{REGION}-on-demand"] == 1
        control.set_faults(spot_capacity_gone=[f"{REGION}/*"])  # spot back in us-west-2
        home = check_run(check, run)
        assert home["decision"] == "move-for-spot", home
        said = home["reason"]
        moves = ("move to spot in us-west-2" if strategy == "markov"
                 else "spot in us-west-2: training there")  # fmt: skip
        assert moves in said and ("plan:" in said) == (strategy == "markov"), said
        assert "us-west-2's handler starts the run's groups there" in said, said
        assert sizes(REGION) == {f"{REGION}-spot": 0, f"{REGION}-on-demand": 0}
        wish = fleet_state.failover_state(tables[REGION], run, REGION).move_order
        assert (wish.from_epoch, wish.from_region, wish.to_region) == (0, REGION, west)
        assert check_run(check, run)["decision"] == "move-for-spot"  # it stands
        replicate_the_wish()
        in_region(west)
        there = check_run(check, run)
        assert there["decision"] == "fail-over" and "claim the run here" in there["reason"], there
        assert sizes(west) == {f"{west}-spot": 1, f"{west}-on-demand": 0}
        ordered = fleet_state.failover_state(tables[west], run, west).move_order
        assert ordered is not None and ordered.to_region == west  # what its machines follow
        # Spot is back at home before any machine there claimed the run: the wish goes.
        control.set_faults(spot_capacity_gone=[])
        in_region(REGION)
        back = check_run(check, run)
        assert back["decision"] == "stay" and "withdrawn" in back["reason"], back
        assert sizes(REGION)[f"{REGION}-spot"] == 1
        replicate_the_wish()
        in_region(west)
        assert check_run(check, run)["decision"] == "follow-the-run"
        assert sizes(west) == {f"{west}-spot": 0, f"{west}-on-demand": 0}
    finally:
        control.set_faults(spot_capacity_gone=[])
        for region in (REGION, west):
            aws("dynamodb", region).delete_table(TableName=catalog_name)
        tables[west].delete()


@pytest.mark.integration
def test_a_run_of_several_regions_that_stays_decides_its_on_demand_by_spot_anywhere(
    http_cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run with a deadline in two regions, idle at home with spot gone in both: it does not
    move (no spot elsewhere), and the deadline policy here decides between on-demand and
    waiting by the record of spot anywhere, as `outage_fill.across` (what `cost simulate`
    replays) does. Its checks saw spot somewhere 23 of 24 hours, at home never: by spot
    anywhere it waits (by home's record alone it would take on-demand), and it keeps no
    second record of home beside its regions' records."""
    from spotrain.core import run_lifecycle
    from spotrain.core.outage_fill import RegionRecords, SpotRecord

    run, _, declared = _run_of_two_regions("stayer")
    start, per_hour = DEADLINE_START, STEPS_PER_HOUR
    now = start + 2 * 3600
    iso = lambda epoch: datetime.fromtimestamp(epoch, UTC).isoformat()  # noqa: E731
    catalog_name = _deadline_catalog(run, (REGION,), monkeypatch)
    monkeypatch.setattr(runtime_settings, "now", lambda: now)
    # 9 h of work left in 12 h: spot anywhere (23 h of 24) carries it; home's spot (none)
    # would leave 7 h to on-demand, more than two thirds of the outages to come.
    deadline = RunDeadline(started_at=iso(start), finish_by=iso(start + 14 * 3600),
                           total_steps=10 * per_hour, changeover_minutes=15)  # fmt: skip
    declare_run(declared, run=run, run_deadline=deadline, instance_types=("g6.xlarge",))
    run_lifecycle.mark_started(http_cloud.table, run, start)
    day, looked = 24 * 3600.0, now - 300
    never = SpotRecord(observed_s=day, available_s=0.0, spells=0, last_at=looked)
    mostly = SpotRecord(observed_s=day, available_s=23 * 3600.0, spells=2, last_at=looked)
    fleet_state.set_spot_records(
        http_cloud.table, run, RegionRecords((never, mostly), anywhere=mostly).to_item()
    )
    fleet_state.set_spot_record(http_cloud.table, run, never)
    control.set_faults(spot_capacity_gone=["*/*"])
    try:
        for group in declared:
            create_group(group.name, group.region, f"{group.region}b",
                         int(group.region == REGION and group.lifecycle == "spot"), run=run,
                         distribution={"OnDemandBaseCapacity": 0,
                                       "OnDemandPercentageAboveBaseCapacity": 0}
                         if group.lifecycle == "spot" else None)  # fmt: skip
        decided = check_run(event("scheduled-capacity-check"), run)
        assert decided["decision"] == "wait-for-spot", decided
        assert "deadline policy: no spot capacity; 9.00 h of work in 12.00 h; spot alone " \
               "trains 78% of the time as seen" in decided["reason"], decided  # fmt: skip
        assert desired(f"{run}-{REGION}-on-demand", REGION) == 0
        state = fleet_state.run_state(http_cloud.table, run)
        assert state.spot_record == never  # not looked at again: its regions' records are
        kept = RegionRecords.from_item(state.spot_records, 2).anywhere
        assert kept.last_at == now and kept.observed_s == day + 300
    finally:
        control.set_faults(spot_capacity_gone=[])
        aws("dynamodb").delete_table(TableName=catalog_name)


# --- a run pays only while it trains ---------------------------------------------------------
def _lifecycle_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The groups deployed empty with the run's declared sizes, its configuration bucket and
    the catalog (with its stream) configured as the stack configures them; the catalog."""
    from helpers import create_catalog_table

    from spotrain.trainer.catalog import DynamoCatalog
    from spotrain.trainer.storage import LocalStorage

    create_group("east-spot", "us-east-1", "us-east-1b", 0)
    create_group("east-on-demand", "us-east-1", "us-east-1b", 0)
    aws("s3").create_bucket(Bucket="configs")
    create_catalog_table(aws("dynamodb"), "catalog", stream=True)
    monkeypatch.setenv(HandlerSettings.variable("config_bucket"), "configs")
    monkeypatch.setenv(HandlerSettings.variable("checkpoints_table"), "catalog")
    declare_run([
        CapacityGroup(name="east-spot", region="us-east-1", lifecycle="spot", holds_data=True,
                      min_size=1, desired=2),
        CapacityGroup(name="east-on-demand", region="us-east-1", lifecycle="on-demand",
                      holds_data=True),
    ])  # fmt: skip
    return DynamoCatalog("catalog", RUN, LocalStorage(tmp_path / "store"),
                         client=aws("dynamodb"))  # fmt: skip


def _sizes(name: str) -> tuple[int, int, int]:
    [group] = aws("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[name])[
        "AutoScalingGroups"
    ]
    in_service = sum(i["LifecycleState"] == "InService" for i in group["Instances"])
    return int(group["MinSize"]), int(group["DesiredCapacity"]), in_service


def _publish(
    catalog: Any, tmp_path: Path, generation: int, step: int, *, final: bool, run: str = RUN
) -> None:
    from spotrain.trainer import checkpoint_store

    folder = tmp_path / f"{run}-step{step}"
    folder.mkdir()
    (folder / "model.pt").write_bytes(bytes([step]) * 64)
    from spotrain.trainer.storage import LocalStorage

    storage = LocalStorage(tmp_path / "store")
    checkpoint_store.publish(folder, storage=storage, run=run, catalog=catalog,
                             generation=generation, step=step, world_size=1, zero_stage=2,
                             config_hash="c", code_version="v", final=final)  # fmt: skip


def test_a_run_waits_for_its_configuration_starts_and_has_no_machine_once_finished(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from helpers import stream_records

    from spotrain.core import run_lifecycle

    catalog = _lifecycle_environment(monkeypatch, tmp_path)
    check = event("scheduled-capacity-check")
    waiting = check_run(check)
    assert waiting["decision"] == "wait" and "`spotrain config put" in waiting["reason"]
    assert _sizes("east-spot") == (0, 0, 0)
    aws("s3").put_object(Bucket="configs", Key=f"runs/{RUN}/config/1-a.json", Body=b"{}")
    started = check_run(check)
    assert started["decision"] == "start", started
    assert _sizes("east-spot") == (1, 2, 2) and _sizes("east-on-demand") == (0, 0, 0)
    assert check_run(check)["decision"] == "none"  # started once; the usual rules now
    cloud.notices()

    generation = catalog.acquire_lease("trainer")
    _publish(catalog, tmp_path, generation, 10, final=False)
    _publish(catalog, tmp_path, generation, 20, final=True)
    records = stream_records(aws("dynamodb"), aws("dynamodbstreams"), "catalog")
    assert handler.handle({"Records": records})["finished"] == {RUN: 20}
    assert _sizes("east-spot") == (0, 0, 0)
    [finished] = cloud.notices()
    assert (finished["kind"], finished["run"], finished["step"]) == ("finished", RUN, 20)
    assert {"spend_usd", "on_demand_usd", "machine_hours"} <= set(finished)
    handler.handle({"Records": records})  # redelivered: nothing said twice
    assert cloud.notices() == []
    # Checks keep it there, and a machine that leaves is not counted as a crash.
    assert check_run(check)["decision"] == "hold" and _sizes("east-spot") == (0, 0, 0)
    verdict = fleet_state.record_exit(cloud.table, RUN, run_instance(), 143, max_crashes=1)
    assert (verdict.kind, verdict.crashes) == ("stopped", 0)
    assert run_lifecycle.read(cloud.table, RUN).finished_step == 20


@pytest.mark.integration
def test_a_gang_that_does_not_come_whole_in_time_is_released_and_asked_for_again(
    http_cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 8, on the local cloud with its spot capacity gone: a run of two machines (its
    coordinator on-demand, the other spot) starts, and only the coordinator comes. The checks
    within the gang timeout keep asking; the first past it releases the one that came (groups
    to 0, not kept idle and billed) and says what the wait cost. Once spot is back, the next
    check asks again from none, and the gang comes whole."""
    import time

    groups = {}
    for market in ("spot", "on-demand"):  # the coordinator on-demand, its peer spot
        groups[market] = f"gang-{random.getrandbits(32):08x}-{market}"
        create_group(groups[market], REGION, "us-east-1b", 0, distribution={
            "OnDemandBaseCapacity": int(market == "spot"),
            "OnDemandPercentageAboveBaseCapacity": 100 * (market == "on-demand")})  # fmt: skip
    aws("s3").create_bucket(Bucket=f"configs-{os.environ[ENVIRONMENT_VARIABLE]}")
    bucket = f"configs-{os.environ[ENVIRONMENT_VARIABLE]}"
    monkeypatch.setenv(HandlerSettings.variable("config_bucket"), bucket)
    declare_run([
        CapacityGroup(name=groups["spot"], region=REGION, lifecycle="spot", holds_data=True,
                      min_size=2, desired=2),
        CapacityGroup(name=groups["on-demand"], region=REGION, lifecycle="on-demand",
                      holds_data=True),
    ])  # fmt: skip
    aws("s3").put_object(Bucket=bucket, Key=f"runs/{RUN}/config/1-a.json", Body=b"{}")
    started = float(int(time.time()))  # whole seconds: kept to the millisecond
    clock = [started]
    monkeypatch.setattr(runtime_settings, "now", lambda: clock[0])
    check = event("scheduled-capacity-check")

    def sizes() -> tuple[int, int, int]:
        return _sizes(groups["spot"])

    control.set_faults(spot_capacity_gone=[f"{REGION}/*"])
    try:
        assert check_run(check)["decision"] == "start"
        assert sizes() == (2, 2, 1)  # the on-demand coordinator came, its spot peer did not
        assert fleet_state.run_state(http_cloud.table, RUN).gang_asked.since == started
        clock[0] = started + 5 * 60
        waiting = check_run(check)
        assert waiting["decision"] == "wait-for-spot" and sizes() == (2, 2, 1), waiting
        http_cloud.notices()
        clock[0] = started + 16 * 60  # past the timeout (15 min)
        released = check_run(check)
        assert released["decision"] == "gang-released", released
        assert sizes() == (0, 0, 0)
        said = released["reason"]
        assert "1 of the 2 machines its rendezvous needs came in 16 min (limit 15 min)" in said
        cost = float(re.search(r"the wait cost \$([\d.]+)", said)[1])  # type: ignore[index]
        assert cost > 0, said  # the coordinator's time while it waited
        assert [n["action"] for n in http_cloud.notices()] == ["gang-released"]
        assert fleet_state.run_state(http_cloud.table, RUN).gang_asked is None
    finally:
        control.set_faults(spot_capacity_gone=[])
    # Spot is back, but the run waits a timeout after its release before asking again.
    clock[0] = started + 21 * 60
    waits = check_run(check)
    assert sizes() == (0, 0, 0) and "it asks again at " in waits["reason"], waits
    assert fleet_state.run_state(http_cloud.table, RUN).queued.startswith(  # type: ignore[union-attr]
        "its gang did not come whole in time (once): it asks again at "
    )
    clock[0] = started + 31 * 60
    again = check_run(check)
    assert again["decision"] == "release" and sizes() == (2, 2, 2), again
    state = fleet_state.run_state(http_cloud.table, RUN)
    assert (state.gang_asked.since, state.queued, state.gang_releases) == (clock[0], None, 1)
    clock[0] = started + 36 * 60
    assert check_run(check)["decision"] == "none"
    state = fleet_state.run_state(http_cloud.table, RUN)
    assert (state.gang_asked, state.gang_releases) == (None, 0)  # whole: rule 7's now


@pytest.mark.integration
def test_a_released_gang_gives_its_place_in_the_queue_to_the_run_behind_it(
    http_cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 8 with a queue, on the local cloud with its spot capacity gone: two runs on a
    ceiling that fits one. The first's gang (an on-demand coordinator and a spot peer) never
    comes whole; past the gang timeout its part is released and it goes back to the queue as
    if submitted then, so the run that waited behind it starts at the next check and it waits
    behind that one, until that one finishes."""
    import time

    from spotrain.core import run_lifecycle
    from spotrain.core.admission import QueuePolicy

    policy = QueuePolicy(ceilings={REGION: {"spot/G and VT": 96}})
    monkeypatch.setenv(HandlerSettings.variable("queue_policy"), policy.to_json())
    suffix = f"{random.getrandbits(32):08x}"
    first, second = f"a-{suffix}", f"b-{suffix}"  # in the queue's order: submitted together
    create_group(f"{first}-spot", REGION, "us-east-1b", 0, run=first, distribution={
        "OnDemandBaseCapacity": 1, "OnDemandPercentageAboveBaseCapacity": 0})  # fmt: skip
    create_group(f"{second}-on-demand", REGION, "us-east-1b", 0, run=second)
    for run, group, machines in ((first, f"{first}-spot", 2), (second, f"{second}-on-demand", 1)):
        declare_run([CapacityGroup(name=group, region=REGION, lifecycle="spot", holds_data=True,
                                   min_size=machines, desired=machines)],
                    run=run, gpus=4 * machines, vcpus={"spot/G and VT": 48 * machines})  # fmt: skip
    started = float(int(time.time()))
    clock = [started]
    monkeypatch.setattr(runtime_settings, "now", lambda: clock[0])
    check = event("scheduled-capacity-check")

    def decided() -> dict[str, dict[str, Any]]:
        runs = handler.handle(check)["runs"]
        return {run: runs[run] for run in (first, second)}

    control.set_faults(spot_capacity_gone=[f"{REGION}/*"])
    try:
        runs = decided()
        assert [runs[r]["decision"] for r in (first, second)] == ["start", "wait"], runs
        assert _sizes(f"{first}-spot") == (2, 2, 1)  # the coordinator came, its peer did not
        clock[0] = started + 16 * 60  # past the gang timeout (15 min)
        runs = decided()
        assert [runs[r]["decision"] for r in (first, second)] == ["gang-released", "wait"], runs
        state = fleet_state.run_state(http_cloud.table, first)
        assert state.gang_released_at == clock[0] and state.gang_releases == 1
        assert (state.queued or "").startswith("its gang did not come whole in time"), state
        # Out of the queue while it waits to ask again: the run behind it starts.
        clock[0] = started + 21 * 60
        runs = decided()
        assert [runs[r]["decision"] for r in (first, second)] == ["wait", "start"], runs
        assert "it asks again at " in runs[first]["reason"], runs[first]
        assert _sizes(f"{first}-spot")[:2] == (0, 0) and _sizes(f"{second}-on-demand")[2] == 1
        # Past its wait it is back in the queue as if submitted at its release: behind the
        # run that started meanwhile.
        clock[0] = started + 31 * 60
        runs = decided()
        assert runs[first]["reason"].startswith(
            "queued: #1 in the queue: needs 96 vCPUs of spot/G and VT in us-east-1, 48 of its "
            "ceiling 96 free"), runs[first]  # fmt: skip
        # The second finishes: the first is admitted again and asks for its gang anew.
        run_lifecycle.mark_finished(http_cloud.table, second, 10, clock[0])
        clock[0] = started + 36 * 60
        runs = decided()
        assert runs[first]["decision"] == "release", runs
        assert _sizes(f"{first}-spot")[:2] == (2, 2)
    finally:
        control.set_faults(spot_capacity_gone=[])


@pytest.mark.integration
def test_the_queue_holds_runs_under_what_the_accounts_quota_leaves_free(
    http_cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An environment whose queue counts the account's quotas, on the local cloud: another
    workload of the account runs a 48-vCPU machine and its quota of on-demand G vCPUs leaves
    48 beside what runs, so of two runs asking 48 each, one starts and the other waits, saying
    what is free; when that machine ends, the next check starts it."""
    from spotrain.core.admission import QueuePolicy

    monkeypatch.setenv(HandlerSettings.variable("queue_policy"),
                       QueuePolicy(account_quotas=True).to_json())  # fmt: skip
    suffix = f"{random.getrandbits(32):08x}"
    runs = [f"first-{suffix}", f"second-{suffix}"]
    for run in runs:
        create_group(f"{run}-on-demand", REGION, "us-east-1b", 0, run=run)
        declare_run([CapacityGroup(name=f"{run}-on-demand", region=REGION, lifecycle="spot",
                                   holds_data=True, min_size=1, desired=1)],
                    run=run, gpus=4, vcpus={"on-demand/G and VT": 48})  # fmt: skip
    ec2 = aws("ec2")
    [elsewhere] = ec2.run_instances(ImageId=control.stock_image(ec2), MinCount=1, MaxCount=1,
                                    InstanceType="g5.12xlarge")["Instances"]  # fmt: skip
    # The quota leaves room for one run beside what runs (that machine, and this cloud's
    # machines of earlier tests).
    now = datetime.now(UTC)
    [running] = aws("cloudwatch").get_metric_statistics(
        Namespace="AWS/Usage", MetricName="ResourceCount", Period=60, Statistics=["Maximum"],
        Dimensions=[{"Name": k, "Value": v} for k, v in (
            ("Service", "EC2"), ("Type", "Resource"), ("Resource", "vCPU"),
            ("Class", "G/OnDemand"))],
        StartTime=now.replace(year=now.year - 1), EndTime=now)["Datapoints"]  # fmt: skip
    control.set_faults(vcpu_quotas={f"{REGION}/on-demand/G and VT": int(running["Maximum"]) + 48})
    check = event("scheduled-capacity-check")
    try:
        decided = handler.handle(check)["runs"]
        assert [decided[r]["decision"] for r in runs] == ["start", "wait"], decided
        assert (
            "#1 in the queue: needs 48 vCPUs of on-demand/G and VT in us-east-1, 0 of its "
            "ceiling 48 free"
        ) in decided[runs[1]]["reason"]
        ec2.terminate_instances(InstanceIds=[elsewhere["InstanceId"]])
        assert handler.handle(check)["runs"][runs[1]]["decision"] == "start"
    finally:
        control.set_faults(vcpu_quotas={})


def test_the_capacity_check_finishes_a_run_whose_stream_notice_was_missed(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    catalog = _lifecycle_environment(monkeypatch, tmp_path)
    aws("s3").put_object(Bucket="configs", Key=f"runs/{RUN}/config/1-a.json", Body=b"{}")
    check = event("scheduled-capacity-check")
    assert check_run(check)["decision"] == "start"
    _publish(catalog, tmp_path, catalog.acquire_lease("trainer"), 5, final=True)
    cloud.notices()
    result = check_run(check)
    assert result["decision"] == "hold" and "finished" in result["reason"], result
    assert _sizes("east-spot") == (0, 0, 0)
    assert [n["kind"] for n in cloud.notices() if "kind" in n] == ["finished"]


def test_a_cancelled_run_is_not_requeued_stays_at_0_and_its_machines_may_not_start(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from spotrain import cli
    from spotrain.core import run_lifecycle

    _lifecycle_environment(monkeypatch, tmp_path)
    aws("s3").put_object(Bucket="configs", Key=f"runs/{RUN}/config/1-a.json", Body=b"{}")
    check = event("scheduled-capacity-check")
    check_run(check)
    run_lifecycle.mark_cancelled(cloud.table, RUN, by="on-call", at=1.0)
    assert not run_lifecycle.mark_cancelled(cloud.table, RUN, by="again", at=2.0)
    result = handler.handle(for_instance("spot-interruption-warning", run_instance()))
    assert result["decision"] == "hold" and "cancelled by on-call" in result["reason"]
    assert check_run(check)["decision"] == "hold" and _sizes("east-spot")[:2] == (0, 0)
    tables = ["--events-table", TABLE, "--run", RUN]
    assert cli.main(["fleet", "may-start", *tables]) == 3
    assert "cancelled by on-call" in capsys.readouterr().out
    run_lifecycle.clear_cancelled(cloud.table, RUN)
    assert cli.main(["fleet", "may-start", *tables]) == 0


# --- one handler, every run of its environment ---------------------------------------------
def test_runs_that_do_not_fit_wait_in_the_queue_with_their_place_and_start_when_one_finishes(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Three runs of two teams, each of one g5.12xlarge spot machine (48 vCPUs), on a ceiling
    that fits two: the check starts the first two submitted and keeps the third waiting with
    its place and reason (what `run list` shows); when the first announces its final
    checkpoint, the third starts at once, on its machines while it publishes (a warm start).
    A run the queue admitted is never stopped by it."""
    from helpers import stream_records

    from spotrain.core.admission import QueuePolicy, Team

    catalog = _lifecycle_environment(monkeypatch, tmp_path)
    policy = QueuePolicy(teams=(Team(name="vision", gpus=8), Team(name="speech", gpus=8)),
                         ceilings={REGION: {"spot/G and VT": 96}})  # fmt: skip
    monkeypatch.setenv(HandlerSettings.variable("queue_policy"), policy.to_json())
    asks = {"gpus": 4, "vcpus": {"spot/G and VT": 48}}
    declare_run([CapacityGroup(name="east-spot", region=REGION, lifecycle="spot",
                               holds_data=True, min_size=1, desired=1)],
                team="vision", **asks)  # fmt: skip
    for run, team in (("gpt-speech", "speech"), ("gpt-vision", "vision")):
        create_group(f"{run}-spot", REGION, "us-east-1b", 0, run=run)
        declare_run([CapacityGroup(name=f"{run}-spot", region=REGION, lifecycle="spot",
                                   holds_data=True, min_size=1, desired=1)],
                    run=run, team=team, **asks)  # fmt: skip
    for run in (RUN, "gpt-speech", "gpt-vision"):  # submitted in this order
        aws("s3").put_object(Bucket="configs", Key=f"runs/{run}/config/1-a.json",
                                      Body=b"{}")  # fmt: skip
    check = event("scheduled-capacity-check")
    runs = handler.handle(check)["runs"]
    assert {r: d["decision"] for r, d in runs.items()} == {
        RUN: "start", "gpt-speech": "start", "gpt-vision": "wait"}, runs  # fmt: skip
    waiting = ("#1 in the queue: needs 48 vCPUs of spot/G and VT in us-east-1, 0 of its "
               "ceiling 96 free: it starts when runs there finish, or with a higher ceiling "
               "(and AWS quota)")  # fmt: skip
    assert runs["gpt-vision"]["reason"].startswith(f"queued: {waiting}")
    assert fleet_state.run_state(cloud.table, "gpt-vision").queued == waiting
    assert _sizes("gpt-vision-spot")[:2] == (0, 0)
    # Checked again, the admitted keep their machines and the third still waits.
    runs = handler.handle(check)["runs"]
    assert runs["gpt-vision"]["decision"] == "wait" and _sizes("east-spot")[:2] == (1, 1)

    # The first run announces its final checkpoint (the catalog's stream brings it; no
    # scheduled check is waited for): the third starts on its machines while it publishes
    # (a warm start), which keep training's last publish going meanwhile.
    catalog.announce_finishing(20)
    records = stream_records(aws("dynamodb"), aws("dynamodbstreams"), "catalog")
    changed = handler.handle({"Records": records})
    assert (changed["finishing"], changed["finished"]) == ({RUN: 20}, {}), changed
    assert changed["queue"]["gpt-vision"]["decision"] == "start", changed
    assert _sizes("gpt-vision-spot")[:2] == (1, 1) and _sizes("east-spot")[:2] == (1, 1)
    assert fleet_state.run_state(cloud.table, "gpt-vision").queued is None
    assert handler.handle(check)["runs"][RUN]["decision"] != "preempt"  # nor is it preempted
    # It publishes: its groups go to 0; the third keeps its machines.
    _publish(catalog, tmp_path, catalog.acquire_lease("trainer"), 20, final=True)
    records = stream_records(aws("dynamodb"), aws("dynamodbstreams"), "catalog")
    changed = handler.handle({"Records": records})
    assert changed["finished"] == {RUN: 20}
    assert _sizes("east-spot")[:2] == (0, 0) and _sizes("gpt-vision-spot")[:2] == (1, 1)


def test_a_higher_priority_run_preempts_a_lower_one_which_resumes_when_it_finishes(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two runs hold the ceiling's two machines, one of them with a deadline; an urgent run
    submitted later preempts the other (its groups to 0, sizes remembered: its machines
    publish their emergency checkpoints as they leave), never the one with a deadline. The
    preempted run waits with its reason; when the urgent run finishes, the catalog's stream
    admits it again and its groups get their sizes back."""
    from helpers import stream_records

    from spotrain.core.admission import QueuePolicy, Team
    from spotrain.trainer.catalog import DynamoCatalog
    from spotrain.trainer.storage import LocalStorage

    _lifecycle_environment(monkeypatch, tmp_path)
    policy = QueuePolicy(teams=(Team(name="vision", gpus=8), Team(name="speech", gpus=8)),
                         ceilings={REGION: {"spot/G and VT": 96}})  # fmt: skip
    monkeypatch.setenv(HandlerSettings.variable("queue_policy"), policy.to_json())
    asks = {"gpus": 4, "vcpus": {"spot/G and VT": 48}}
    deadline = RunDeadline(
        started_at="2026-11-01T00:00:00+00:00",
        finish_by="2026-12-31T00:00:00+00:00",
        total_steps=1000,
    )
    runs = {"promised": ("speech", 0, deadline), "urgent": ("speech", 5, None)}
    declare_run([CapacityGroup(name="east-spot", region=REGION, lifecycle="spot",
                               holds_data=True, min_size=1, desired=1)],
                team="vision", **asks)  # fmt: skip
    for run, (team, priority, promise) in runs.items():
        create_group(f"{run}-spot", REGION, "us-east-1b", 0, run=run)
        declare_run([CapacityGroup(name=f"{run}-spot", region=REGION, lifecycle="spot",
                                   holds_data=True, min_size=1, desired=1)],
                    run=run, team=team, priority=priority, run_deadline=promise,
                    **asks)  # fmt: skip
    check = event("scheduled-capacity-check")

    def submit(run: str) -> None:
        aws("s3").put_object(Bucket="configs", Key=f"runs/{run}/config/1-a.json",
                                      Body=b"{}")  # fmt: skip

    for run in (RUN, "promised"):
        submit(run)
    decided = handler.handle(check)["runs"]
    assert {decided[r]["decision"] for r in (RUN, "promised")} == {"start"}, decided
    submit("urgent")
    decided = handler.handle(check)["runs"]
    assert (decided["urgent"]["decision"], decided[RUN]["decision"]) == ("start", "preempt")
    assert decided["promised"]["decision"] != "preempt"  # a deadline is not preempted
    preempted = fleet_state.run_state(cloud.table, RUN)
    assert preempted.queued.startswith("#1 in the queue: preempted by run urgent (priority 5 "
                                       "over its 0)")  # fmt: skip
    assert preempted.held_sizes == {"east-spot": {"min_size": 1, "desired": 1}}
    assert _sizes("east-spot")[:2] == (0, 0) and _sizes("urgent-spot")[:2] == (1, 1)
    # A warning for one of its leaving machines requeues nothing; it waits while the urgent
    # run trains, and resumes the moment it finishes.
    warned = handler.handle(for_instance("spot-interruption-warning", run_instance()))
    assert (warned["decision"], warned["reason"]) == (
        "hold", "not requeued: the run waits in the queue")  # fmt: skip
    assert _sizes("east-spot")[:2] == (0, 0)
    assert handler.handle(check)["runs"][RUN]["decision"] == "wait"
    waiting = fleet_state.run_state(cloud.table, RUN)
    # It now waits for room, and still says who took its machines (`run list`'s reason).
    assert "preempted" not in waiting.queued, waiting.queued
    assert waiting.waiting_reason.startswith(f"{waiting.queued} (preempted by run urgent at ")
    urgent = DynamoCatalog("catalog", "urgent", LocalStorage(tmp_path / "store"),
                           client=aws("dynamodb"))  # fmt: skip
    _publish(urgent, tmp_path, urgent.acquire_lease("trainer"), 20, final=True, run="urgent")
    records = stream_records(aws("dynamodb"), aws("dynamodbstreams"), "catalog")
    changed = handler.handle({"Records": records})
    assert changed["finished"] == {"urgent": 20}
    assert changed["queue"][RUN]["decision"] == "release", changed
    assert _sizes("east-spot")[:2] == (1, 1)
    released = fleet_state.run_state(cloud.table, RUN)
    assert (released.queued, released.preempted_by, released.waiting_reason) == (None,) * 3
    # A queue that cannot be judged stops no training run.
    from spotrain.constructs.interruption_handler.runtime import run_queue

    def unreadable(*_: Any) -> Any:
        raise RuntimeError("the ledgers do not answer")

    monkeypatch.setattr(run_queue, "verdicts", unreadable)
    decided = handler.handle(check)["runs"]
    assert decided[RUN]["decision"] not in ("preempt", "wait", "hold"), decided[RUN]
    assert _sizes("east-spot")[:2] == (1, 1) and _sizes("promised-spot")[:2] == (1, 1)


def test_one_handler_serves_each_run_of_its_environment_on_its_own(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two runs declared by their stacks: each waits for its own configuration and starts on
    its own; one finishing stops its groups only; a spot warning requeues the warned machine's
    run; a group not tagged with the environment is never scaled, and a declaration that
    cannot be read leaves the other runs served."""
    from helpers import stream_records

    catalog = _lifecycle_environment(monkeypatch, tmp_path)
    other = "gpt-sweep"
    create_group("sweep-spot", "us-east-1", "us-east-1b", 0, run=other)
    declare_run([CapacityGroup(name="sweep-spot", region="us-east-1", lifecycle="spot",
                               holds_data=True, min_size=1, desired=1)], run=other)  # fmt: skip
    check = event("scheduled-capacity-check")
    runs = handler.handle(check)["runs"]
    assert {r: d["decision"] for r, d in runs.items()} == {RUN: "wait", other: "wait"}
    aws("s3").put_object(Bucket="configs", Key=f"runs/{other}/config/1-a.json",
                                  Body=b"{}")  # fmt: skip
    runs = handler.handle(check)["runs"]
    assert (runs[RUN]["decision"], runs[other]["decision"]) == ("wait", "start")
    assert (_sizes("sweep-spot"), _sizes("east-spot")) == ((1, 1, 1), (0, 0, 0))
    aws("s3").put_object(Bucket="configs", Key=f"runs/{RUN}/config/1-a.json", Body=b"{}")
    assert check_run(check)["decision"] == "start" and _sizes("east-spot") == (1, 2, 2)

    # A warning for the other run's machine is that run's: its group is the one kept.
    [sweeper] = [i["InstanceId"] for i in aws("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=["sweep-spot"])["AutoScalingGroups"][0]["Instances"]]  # fmt: skip
    warned = handler.handle(for_instance("spot-interruption-warning", sweeper, id="sweep-1"))
    assert (warned["run"], warned["decision"]) == (other, "replace-in-place"), warned
    assert fleet_state.instance_status(cloud.table, other, sweeper) == "INTERRUPTING"
    assert fleet_state.instance_status(cloud.table, RUN, sweeper) is None

    # The first run finishes: its groups go to 0; the other trains on.
    _publish(catalog, tmp_path, catalog.acquire_lease("trainer"), 20, final=True)
    records = stream_records(aws("dynamodb"), aws("dynamodbstreams"), "catalog")
    assert handler.handle({"Records": records})["finished"] == {RUN: 20}
    assert _sizes("east-spot") == (0, 0, 0) and _sizes("sweep-spot")[:2] == (1, 1)

    # A group named in a declaration but tagged with another environment is not scaled.
    create_group("foreign-spot", "us-east-1", "us-east-1b", 1, run="intruder")
    aws("autoscaling").create_or_update_tags(
        Tags=[
            {
                "ResourceId": "foreign-spot",
                "ResourceType": "auto-scaling-group",
                "Key": "spotrain:environment",
                "Value": "someone-elses",
                "PropagateAtLaunch": True,
            }
        ]
    )
    declare_run(
        [
            CapacityGroup(
                name="foreign-spot",
                region="us-east-1",
                lifecycle="spot",
                holds_data=True,
                min_size=1,
                desired=3,
            )
        ],
        run="intruder",
    )
    aws("s3").put_object(Bucket="configs", Key="runs/intruder/config/1-a.json",
                                  Body=b"{}")  # fmt: skip
    # And a declaration that is not one: logged, left out; the others are checked.
    aws("ssm").put_parameter(
        Name=run_parameter_name(os.environ[ENVIRONMENT_VARIABLE], "broken"), Type="SecureString",
        Value="{not json",
    )  # fmt: skip
    runs = handler.handle(check)["runs"]
    assert sorted(runs) == ["gpt-small", "gpt-sweep", "intruder"]
    assert runs[RUN]["decision"] == "hold" and "finished" in runs[RUN]["reason"]
    assert _sizes("foreign-spot")[1] == 1  # as it was: not the handler's to scale


def test_a_burst_of_warnings_reads_the_declarations_once_and_a_new_run_at_once(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool reclaimed at once sends a warning per machine: a warm handler reads its runs'
    declarations once for all of them (SSM would throttle a read per warning), reads again
    for a machine of a run it does not know yet, and each capacity check reads afresh."""
    reads: list[str] = []
    read = runtime_settings.read_declarations

    def counted(settings: Any) -> Any:
        reads.append(settings.handler.runs_parameter_path)
        return read(settings)

    monkeypatch.setattr(runtime_settings, "read_declarations", counted)
    create_group("east-spot", "us-east-1", "us-east-1b", 2)
    for number in range(5):
        result = handler.handle(for_instance("spot-interruption-warning", run_instance(),
                                             id=f"burst-{number}"))  # fmt: skip
        assert result["recorded"] is True and result["run"] == RUN
    assert len(reads) == 1
    # A run declared a moment ago: its machine's warning is its, not a foreign one.
    create_group("sweep-spot", "us-east-1", "us-east-1b", 1, run="gpt-sweep")
    declare_run([CapacityGroup(name="sweep-spot", region="us-east-1", lifecycle="spot",
                               holds_data=True)], run="gpt-sweep")  # fmt: skip
    newcomer = launch_instance(
        aws("ec2"),
        {"spotrain:run": "gpt-sweep", "aws:autoscaling:groupName": "sweep-spot"},
    )
    result = handler.handle(for_instance("spot-interruption-warning", newcomer, id="new-run"))
    assert (result["recorded"], result["run"]) == (True, "gpt-sweep"), result
    assert len(reads) == 2
    handler.handle(event("scheduled-capacity-check"))
    assert len(reads) == 3
    # Past its time, a warm handler reads them again.
    monkeypatch.setattr(runtime_settings, "DECLARATIONS_TTL_S", 0.0)
    handler.handle(for_instance("spot-interruption-warning", run_instance(), id="later"))
    assert len(reads) == 4


def test_a_warm_handler_makes_no_aws_client_again(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients are made once for the execution environment (runtime/clients.py): after a
    warning and a capacity check, more of each makes none."""
    made: list[str] = []
    for factory in ("client", "resource"):
        original = getattr(boto3, factory)

        def counted(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            made.append(args[0] if args else kwargs["service_name"])
            return _original(*args, **kwargs)

        monkeypatch.setattr(boto3, factory, counted)
    monkeypatch.setattr(runtime_settings, "DECLARATIONS_TTL_S", 0.0)  # each reads SSM again
    create_group("east-spot", "us-east-1", "us-east-1b", 2)
    instances = [run_instance() for _ in range(3)]  # the test's own clients, before counting

    def warning_and_check(number: int) -> None:
        warned = handler.handle(for_instance("spot-interruption-warning", instances[number],
                                             id=f"warm-{number}"))  # fmt: skip
        assert warned["recorded"] is True, warned
        assert check_run(event("scheduled-capacity-check"))["decision"]

    warning_and_check(0)
    assert {"ec2", "ssm", "autoscaling", "dynamodb"} <= set(made), made
    made.clear()
    warning_and_check(1)
    warning_and_check(2)
    assert made == []


def test_the_handlers_clients_retry_in_standard_mode_within_its_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call that keeps failing is tried 5 times in standard mode (`runtime/clients.py`), by
    the function's own clients and its tables alike: its backoff stays within half the
    function's 30 s timeout, where boto3's default tried DynamoDB 10 times (up to 25.6 s)."""
    import time

    from botocore.awsrequest import AWSResponse

    for variable in ("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in (("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_ACCESS_KEY_ID", "test"),
                            ("AWS_SECRET_ACCESS_KEY", "test")):  # fmt: skip
        monkeypatch.setenv(variable, value)  # the function's own; no request leaves the test
    monkeypatch.setattr(time, "sleep", lambda _seconds: None)  # the backoff, not the tries
    runtime_clients.forget()
    tried: list[str] = []

    def unavailable(request: Any, **_: Any) -> AWSResponse:
        tried.append(request.url)
        response = AWSResponse(request.url, 503, {}, None)
        response._content = b""
        return response

    events = runtime_clients.dynamodb().Table("events")
    groups = runtime_clients.client("autoscaling", "us-west-2")
    for made, call in ((events.meta.client, lambda: events.get_item(Key={"pk": "x", "sk": "y"})),
                       (groups, groups.describe_auto_scaling_groups)):  # fmt: skip
        made.meta.events.register("before-send", unavailable)
        tried.clear()
        with pytest.raises(Exception, match="reached max retries: 4"):
            call()
        assert len(tried) == runtime_clients.ATTEMPTS == 5
    runtime_clients.forget()


def test_the_handlers_settings_own_their_environment_variables() -> None:
    """The construct writes the function's environment from the settings and the handler reads
    it back with them: each variable named once, the defaults filled in, a missing or
    malformed one refused (the handler sends such an event to its dead letters)."""
    given = HandlerSettings(events_table="t", environment="dev", alert_topic_arn="arn:topic",
                            rate_window_minutes=30)  # fmt: skip
    written = given.to_environment()
    assert written == {
        "EVENTS_TABLE": "t", "EVENT_RETENTION_DAYS": "90", "ENVIRONMENT": "dev",
        "RUNS_PARAMETER_PATH": "/spotrain/dev/runs", "ALERT_TOPIC_ARN": "arn:topic",
        "HOT_POOL_THRESHOLD": "2", "RATE_WINDOW_MINUTES": "30",
        "ON_DEMAND_DEADLINE_MINUTES": "10", "CAPACITY_CHECK_MINUTES": "5",
        "GANG_TIMEOUT_MINUTES": "15", "FAILOVER_AFTER_CHECKS": "3",
    }  # fmt: skip
    assert HandlerSettings.from_environment(written) == given
    assert HandlerSettings.variable("dead_letter_queue_url") == "DEAD_LETTER_QUEUE_URL"
    with pytest.raises(KeyError, match="EVENTS_TABLE"):
        HandlerSettings.from_environment({"ENVIRONMENT": "dev"})
    with pytest.raises(ValueError):
        HandlerSettings.from_environment({**written, "HOT_POOL_THRESHOLD": "two"})


def test_a_warning_judges_on_demand_by_spot_anywhere_for_a_run_that_may_move() -> None:
    """An interruption warning for a run with a deadline decides its on-demand by the record
    its checks keep (`deadline.kept_record`): spot in any of its regions when it may move (it
    trains on spot wherever spot is), spot here when it has one region or no such record yet."""
    from dataclasses import replace

    from spotrain.constructs.interruption_handler.runtime import deadline
    from spotrain.core.outage_fill import RegionRecords, SpotRecord

    here = SpotRecord(observed_s=3600.0, available_s=600.0, spells=1)
    there = SpotRecord(observed_s=3600.0, available_s=3000.0, spells=2)
    anywhere = SpotRecord(observed_s=3600.0, available_s=3300.0, spells=2)
    state = fleet_state.RunState(
        spot_record=here, spot_records=RegionRecords((here, there), anywhere).to_item()
    )

    def settings(*regions: str) -> runtime_settings.Settings:
        groups = tuple(CapacityGroup(name=f"fleet-{r}", region=r, lifecycle="spot",
                                     holds_data=i == 0) for i, r in enumerate(regions))  # fmt: skip
        due = RunDeadline(started_at="2026-11-29T00:00:00Z", finish_by="2026-12-01T00:00:00Z",
                          total_steps=100)  # fmt: skip
        return runtime_settings.Settings(
            HandlerSettings(events_table="t", environment="dev", alert_topic_arn="arn:topic"),
            RunDeclaration(run=RUN, groups=groups, run_deadline=due),
        )

    assert deadline.kept_record(settings("us-east-1", "us-west-2"), state) == anywhere
    assert deadline.kept_record(settings("us-east-1"), state) == here
    assert deadline.kept_record(
        settings("us-east-1", "us-west-2"), replace(state, spot_records=None)
    ) == here  # fmt: skip


def test_a_plan_solved_for_another_deadline_or_other_regions_is_not_decided_by(
    cloud: Cloud,
) -> None:
    """A run whose deadline (or changeover) changed since its plan was solved, or whose plan
    names other regions, is decided by outage fill until it is planned again; the plan it was
    solved for is used, and its reasons say when the run has seen a day or more of another
    market than the plan assumed, with the command that plans with it."""
    from spotrain.constructs.interruption_handler.runtime import deadline
    from spotrain.core import deadline_plan
    from spotrain.cost import markov_policy

    run_deadline = RunDeadline(started_at="2027-01-15T08:00:00Z",
                               finish_by="2027-01-15T22:00:00Z", total_steps=100)  # fmt: skip
    declare_run([CapacityGroup(name="east-spot", region=REGION, lifecycle="spot", holds_data=True)],
                run_deadline=run_deadline)  # fmt: skip
    [settings] = runtime_settings.read_declarations(runtime_settings.from_environment()).values()
    plan = markov_policy.Plan([markov_policy.RegionRates(3.0, 2.0)],
                              markov_policy.Prices(1.0, 3.0, 0.0), tick_h=1.0, ticks=14,
                              work=14, changeover=1)  # fmt: skip
    progress = Progress(elapsed_h=2.0, deadline_h=14.0, work_h=8.0, done_h=1.0,
                        changeover_h=0.25, decision_interval_h=1.0)  # fmt: skip
    later = replace(run_deadline, finish_by="2027-01-16T08:00:00Z")
    for solved_for, regions, used in (
        (later, (REGION,), False), (run_deadline, (REGION, "us-west-2"), False),
        (run_deadline, (REGION,), True),
    ):  # fmt: skip
        header = replace(plan.header(regions), plan_id=f"{random.getrandbits(32):08x}",
                         deadline=deadline_plan.solved_for(solved_for))  # fmt: skip
        deadline_plan.store(cloud.table, RUN, header, plan.slices())
        found = deadline.stored_plan(settings, cloud.table, progress)
        assert (found is not None) == used, (solved_for, regions)
    # Its reasons say when the run's own checks (a day at least) saw another market.
    hours = 3600.0
    for record, says in ((SpotRecord(observed_s=48 * hours, available_s=40 * hours, spells=4),
                          True),
                         (SpotRecord(observed_s=12 * hours, available_s=11 * hours, spells=1),
                          False),
                         (SpotRecord(observed_s=48 * hours, available_s=28 * hours, spells=9),
                          False)):  # fmt: skip
        found = deadline.stored_plan(settings, cloud.table, progress, records=(record,))
        assert found is not None
        note = (
            f"; this run's checks saw another market than the plan's ({REGION}: spells of "
            f"{record.spell_h():.1f} h, outages of {record.outage_h():.1f} h over 48 h): "
            f"`spotrain run deadline-plan {settings.handler.environment} {RUN} --spot-seen-by "
            f"{RUN}` plans with it"
        )
        assert found.note == (note if says else ""), (record, found.note)
        chosen = found.choose(progress, current="idle", spot_here=False)
        assert chosen.reason.startswith("plan: ") and chosen.reason.endswith(found.note)
