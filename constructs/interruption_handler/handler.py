"""Lambda: acts on EC2 spot interruption warnings and rebalance recommendations, and on a
scheduled capacity check.

For a warning or recommendation it
1. records the event once, keyed by the EventBridge event id (EventBridge delivers at least
   once: a redelivered event is recognised and nothing is done twice);
2. marks the instance in the run's fleet state (interrupting / rebalancing) and tags it;
3. for a warning, requeues: keeps the capacity in place, shifts it to a healthier group, or
   after a deadline falls back to on-demand (`requeue.py` decides);
4. notifies the alert topic.
One handler serves every run of its environment: each run's stack declares the run (its
groups, cap and deadline) in an SSM parameter under RUNS_PARAMETER_PATH (read by every
capacity check, and reused by a warm handler for DECLARATIONS_TTL_S in between unless an event
names a run it does not know), and an instance's run is its `spotrain:run` tag. The handler
scales only groups tagged with its environment and the run that declares them; each run's
cap, deadline policy, crash hold and requeue are its own, and one run's failure does not stop
the others' checks.
The scheduled check (EventBridge schedule) covers a shortfall with on-demand after the
deadline and gives on-demand back when spot returns; for a run with a deadline it follows the
deadline policy instead, on the run's progress read from the checkpoint catalog
(`run_progress`). Changes to the checkpoint catalog (its
table's stream) that rewrite history (a head moved back without a roll back, a complete
checkpoint's record rewritten or removed) are alarms to the same topic (`catalog_watch.py`).

A run pays only while it trains (`spotrain.core.run_lifecycle`): its groups are deployed
empty and the capacity check starts them at the sizes the run declares once its training
configuration is stored (CONFIG_BUCKET); when the run publishes its final step (a catalog
record marked final, seen on the stream, and by each check as a backstop) its groups go to 0
and the topic gets the run's cost summary; a cancelled run's groups stay at 0.

Nothing raises: an event that is malformed, of an unknown kind, or that fails half-way is
logged and sent to the dead-letter queue with the reason, from where it can be redriven.

Each scheduled check also moves the run's spend ledger (`spend_ledger.py`), keeps a spend
point for the run's report, and judges it against the run's cap (its declaration's, raised by
operators): notices at 50, 80 and 100% (each kept too), and at 100% the run is held like a
run that crashed too often.

Runs with boto3 and the standard library only; ships with spotrain/core/catalog_schema.py,
spotrain/core/fleet_state.py, spotrain/core/deadline_policy.py, spotrain/core/spend_ledger.py,
spotrain/core/prices.py, spotrain/core/errors.py, requeue.py and catalog_watch.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import datetime, timedelta
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

try:  # packaged: the modules sit side by side in the zip
    import catalog_watch  # type: ignore[import-not-found,no-redef]
    import requeue  # type: ignore[import-not-found,no-redef]
except ImportError:
    from spotrain.constructs.interruption_handler import (  # type: ignore[no-redef]
        catalog_watch,
        requeue,
    )

from spotrain.core import deadline_policy, fleet_state, run_lifecycle, spend_ledger
from spotrain.core import handler_settings as defaults
from spotrain.core import prices as price_book
from spotrain.core.catalog_schema import (
    ENVIRONMENT_TAG,
    EVENT_SORT_KEY,
    EXPIRES_AT_KEY,
    INSTANCE_STATUS_INTERRUPTING,
    INSTANCE_STATUS_REBALANCING,
    INTERRUPTION_TAG,
    OCCURRED_AT_KEY,
    PARTITION_KEY,
    POOL_INDEX,
    POOL_KEY,
    RUN_TAG,
    SORT_KEY,
    UNKNOWN_POOL,
    configs_prefix,
    event_key,
    pool_key,
)
from spotrain.core.deadline_policy import Progress, RunDeadline
from spotrain.core.events import (
    CAPACITY_CHECK,
    INTERRUPTION_WARNING,
    KIND_OF,
    SOURCE_OF,
)

METRIC_NAMESPACE = "spotrain"
"""CloudWatch namespace of the run's spend (the role may publish to no other)."""
GROUP_TAG = "aws:autoscaling:groupName"

log = logging.getLogger()
log.setLevel(logging.INFO)


class UnhandledEvent(ValueError):
    """The event is malformed or of a kind this handler does not take."""


# --- configuration -----------------------------------------------------------------------------
def _settings() -> dict[str, Any]:
    given = defaults.HandlerSettings.from_environment(os.environ)
    return {
        "events_table": given.events_table,
        "retention_days": given.event_retention_days,
        "environment": given.environment,
        "runs_path": given.runs_parameter_path,
        # A run's own (`declared_runs` fills them in for each).
        "run": "",
        "groups": [],
        "run_deadline": None,
        "max_spend_usd": None,
        "topic": given.alert_topic_arn,
        "dead_letter_queue": given.dead_letter_queue_url,
        "hot_threshold": given.hot_pool_threshold,
        "window_s": 60 * given.rate_window_minutes,
        "deadline_s": 60 * given.on_demand_deadline_minutes,
        "checkpoints_table": given.checkpoints_table,
        # Where the run's training configuration is stored: its groups start once it is.
        "config_bucket": given.config_bucket,
        # A deadline decision holds until the next check.
        "check_every_h": given.capacity_check_minutes / 60,
    }


def run_settings(settings: dict[str, Any], run: str, declared: Any) -> dict[str, Any]:
    """The settings of one run's check: the environment's, with what the run's stack declares
    (its groups, cap and deadline; `construct.declared_run` writes it)."""
    if not isinstance(declared, dict) or declared.get("run") != run:
        raise ValueError(f"the declaration does not name run {run!r}")
    groups = declared["groups"]
    if not isinstance(groups, list) or not all(isinstance(g, dict) and g.get("name")
                                               for g in groups):  # fmt: skip
        raise ValueError("its groups are not a list of named groups")
    cap, deadline = declared.get("max_spend_usd"), declared.get("run_deadline")
    return {
        **settings, "run": run, "groups": groups,
        "max_spend_usd": float(cap) if cap is not None else None,
        "run_deadline": RunDeadline(**deadline) if deadline else None,
    }  # fmt: skip


DECLARATIONS_TTL_S = 30.0
"""How long a warm handler reuses the runs' declarations: a pool reclaimed at once sends
hundreds of warnings a minute, and reading SSM for each would exceed its throughput."""
_declarations: dict[str, tuple[float, dict[str, dict[str, Any]]]] = {}
"""Per RUNS_PARAMETER_PATH: when read (monotonic) and what."""


def declared_runs(settings: dict[str, Any], *, fresh: bool = False) -> dict[str, dict[str, Any]]:
    """Every run of the environment, by name, as the settings of its check: each run's stack
    declares it under RUNS_PARAMETER_PATH. Read again when `fresh` or older than
    DECLARATIONS_TTL_S. A declaration that cannot be read is logged and left out (the other
    runs are served)."""
    path = settings["runs_path"]
    read_at, runs = _declarations.get(path, (-DECLARATIONS_TTL_S, {}))
    if fresh or time.monotonic() - read_at >= DECLARATIONS_TTL_S:
        runs = _read_declarations(settings)
        _declarations[path] = (time.monotonic(), runs)
    return runs


def _read_declarations(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    runs = {}
    pages = (
        boto3.client("ssm")
        .get_paginator("get_parameters_by_path")
        .paginate(Path=settings["runs_path"], Recursive=False, WithDecryption=True)
    )
    for page in pages:
        for parameter in page["Parameters"]:
            run = parameter["Name"].rsplit("/", 1)[-1]
            try:
                runs[run] = run_settings(settings, run, json.loads(parameter["Value"]))
            except (ValueError, TypeError, KeyError) as error:
                log.error("run %s is not served: its declaration %s is unusable (%s: %s)",
                          run, parameter["Name"], type(error).__name__, error)  # fmt: skip
    return runs


def _now() -> float:
    """Wall clock of requeue decisions (the deadline); one seam for tests."""
    return time.time()


# --- parsing -----------------------------------------------------------------------------------
def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def parse(event: Any) -> dict[str, str]:
    """The fields we act on, or UnhandledEvent naming what is wrong."""
    if not isinstance(event, dict):
        raise UnhandledEvent(f"an event is a JSON object, got {type(event).__name__}")
    kind = KIND_OF.get(str(event.get("detail-type")))
    if kind is None or event.get("source") != SOURCE_OF[kind]:
        raise UnhandledEvent(
            f"detail-type {event.get('detail-type')!r} from {event.get('source')!r} is not handled"
        )
    detail = event.get("detail")
    fields = {"event_id": event.get("id"), "time": event.get("time"), "region": event.get("region")}
    if kind != CAPACITY_CHECK:
        fields["instance_id"] = detail.get("instance-id") if isinstance(detail, dict) else None
    missing = sorted(
        name for name, value in fields.items() if not isinstance(value, str) or not value
    )
    if missing:
        raise UnhandledEvent(f"event lacks {', '.join(missing)}")
    try:
        _parse_time(fields["time"])  # type: ignore[arg-type]
    except ValueError as error:
        raise UnhandledEvent(f"time {fields['time']!r} is not ISO 8601: {error}") from error
    return {"kind": kind, **fields}  # type: ignore[dict-item]


# --- AWS lookups -------------------------------------------------------------------------------
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


def capacity_groups(
    settings: dict[str, Any], autoscaling: Callable[[str], Any]
) -> list[requeue.Group]:
    """The run's groups as they are now (as its stack declares them, read from each region).
    A group that is not tagged with the handler's environment and this run is not the
    handler's to scale: it is left out."""
    groups = []
    for spec in settings["groups"]:
        found = autoscaling(spec["region"]).describe_auto_scaling_groups(
            AutoScalingGroupNames=[spec["name"]]
        )["AutoScalingGroups"]
        if not found:
            log.warning("capacity group %s in %s does not exist", spec["name"], spec["region"])
            continue
        group = found[0]
        tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
        owner = (tags.get(ENVIRONMENT_TAG), tags.get(RUN_TAG))
        if owner != (settings["environment"], settings["run"]):
            log.warning("capacity group %s is tagged environment %s, run %s: not scaled for run "
                        "%s of %s", spec["name"], *owner, settings["run"],
                        settings["environment"])  # fmt: skip
            continue
        policy = group.get("MixedInstancesPolicy", {}).get("LaunchTemplate", {})
        types = [o["InstanceType"] for o in policy.get("Overrides", []) if "InstanceType" in o]
        pools = tuple(pool_key(t, zone) for t in types for zone in group["AvailabilityZones"])
        groups.append(
            requeue.Group(
                name=spec["name"],
                region=spec["region"],
                lifecycle=spec["lifecycle"],
                holds_data=bool(spec.get("holds_data")),
                pools=pools,
                desired=int(group["DesiredCapacity"]),
                min_size=int(group["MinSize"]),
                max_size=int(group["MaxSize"]),
                in_service=sum(
                    i.get("LifecycleState") == "InService" for i in group.get("Instances", [])
                ),
            )
        )
    return groups


def recent_interruptions(
    table: Any, pools: set[str], until: str, window_s: float
) -> dict[str, int]:
    """Interruption warnings per pool in the window that ends at `until`."""
    since = (_parse_time(until) - timedelta(seconds=window_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    counts = {}
    for pool in sorted(pools - {UNKNOWN_POOL}):
        query: dict[str, Any] = {
            "IndexName": POOL_INDEX,
            "KeyConditionExpression": "#p = :pool AND #t BETWEEN :since AND :until",
            "FilterExpression": "#k = :kind",
            "ExpressionAttributeNames": {"#p": POOL_KEY, "#t": OCCURRED_AT_KEY, "#k": "kind"},
            "ExpressionAttributeValues": {
                ":pool": pool, ":since": since, ":until": until, ":kind": INTERRUPTION_WARNING,
            },
            "Select": "COUNT",
        }  # fmt: skip
        count = 0
        while True:
            page = table.query(**query)
            count += int(page["Count"])
            if "LastEvaluatedKey" not in page:
                break
            query["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        counts[pool] = count
    return counts


def run_progress(
    table: Any, run: str, deadline: RunDeadline, now: float, check_every_h: float = 0.0
) -> tuple[Progress | None, str]:
    """The run against its deadline, in hours of its gang's compute: its progress is the
    catalog head's step, its throughput the steps per hour between checkpoints published by
    one trainer start (a restart's downtime is not throughput); a decision holds for
    `check_every_h`, until the next scheduled check. None (and why) until two checkpoints of
    one start are published."""
    pace = deadline_policy.read_pace(table, run)
    if pace.steps_per_hour is None:
        return None, ("throughput unknown until two checkpoints of one trainer start are "
                      "published: the fixed on-demand deadline applies")  # fmt: skip
    per_hour, done = pace.steps_per_hour, pace.step
    progress = Progress(
        elapsed_h=max(0.0, now - deadline.start_s) / 3600, deadline_h=deadline.deadline_h,
        work_h=deadline.total_steps / per_hour, done_h=done / per_hour,
        changeover_h=deadline.changeover_minutes / 60, decision_interval_h=check_every_h,
    )  # fmt: skip
    left_h = deadline.deadline_h - progress.elapsed_h
    return progress, (
        f"step {done} of {deadline.total_steps} at {per_hour:,.0f} steps/h, {left_h:.1f} h "
        "to the deadline"
    )


def deadline_progress(settings: dict[str, Any], now: float) -> tuple[Progress | None, str]:
    """The progress of the checked run when it has a deadline (else None, '')."""
    if settings["run_deadline"] is None or not settings["run"]:
        return None, ""
    table = boto3.resource("dynamodb").Table(settings["checkpoints_table"])
    return run_progress(
        table, settings["run"], settings["run_deadline"], now, settings["check_every_h"]
    )


def configuration_stored(settings: dict[str, Any]) -> bool:
    """Whether the run's training configuration is in its bucket (any stored version: they are
    checked when stored, the dataset they name included). Without CONFIG_BUCKET the handler
    cannot tell, and the run starts at the first check."""
    if not settings["config_bucket"]:
        return True
    listed = boto3.client("s3").list_objects_v2(
        Bucket=settings["config_bucket"], Prefix=configs_prefix(settings["run"]), MaxKeys=1
    )
    return int(listed.get("KeyCount", 0)) > 0


def final_step(settings: dict[str, Any]) -> int | None:
    """The run's published head when it is marked final (the run is done), else None."""
    if not settings["checkpoints_table"] or not settings["run"]:
        return None
    catalog = boto3.resource("dynamodb").Table(settings["checkpoints_table"])
    head = run_lifecycle.published_head(catalog, settings["run"])
    return head.step if head is not None and head.final else None


def declared_sizes(settings: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The sizes the run declares for its groups (the deployment's), which a start puts in
    place."""
    return {
        spec["name"]: {"min_size": int(spec["min_size"]), "desired": int(spec["desired"])}
        for spec in settings["groups"]
        if "desired" in spec
    }


# --- actions -----------------------------------------------------------------------------------
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
    decision: requeue.Decision,
    groups: list[requeue.Group],
    table: Any,
    run: str,
    autoscaling: Callable[[str], Any],
) -> None:
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


TAG_ATTEMPTS = 3


def tag_newest(ec2: Any, table: Any, run: str, instance_id: str, own: str) -> None:
    """Tag the instance with its newest event, as its mark in the fleet state keeps it
    whatever order events arrive in (`own`, this event's label, when it has no run or mark).
    The mark is read again after tagging: a handler of an older event that tags last sees the
    newer label there and tags again, so the tag ends as the mark."""
    current = (fleet_state.latest_label(table, run, instance_id) if run else None) or own
    for _ in range(TAG_ATTEMPTS):
        ec2.create_tags(Resources=[instance_id], Tags=[{"Key": INTERRUPTION_TAG, "Value": current}])
        if not run:
            return
        again = fleet_state.latest_label(table, run, instance_id) or own
        if again == current:
            return
        current = again


def notify(topic: str | None, subject: str, message: dict[str, Any]) -> None:
    if topic:
        boto3.client("sns").publish(
            TopicArn=topic, Subject=subject[:100], Message=json.dumps(message, default=str)
        )


DEAD_LETTER_EVENT_LIMIT = 200_000
"""Bytes of an event's JSON a dead letter carries whole (for redrive); SQS takes 256 KiB per
message, and a larger event goes as its summary alone."""


def dead_letter(event: Any, reason: str) -> str:
    """The dead-letter message: the event's id, source, detail type, size, digest and the
    reason, with the event itself when it fits."""
    try:
        body = json.dumps(event, default=str)
    except (TypeError, ValueError) as error:  # e.g. a circular structure
        body = f"<unserialisable: {error}>"
    fields = event if isinstance(event, dict) else {}
    message: dict[str, Any] = {
        "id": str(fields.get("id"))[:200],
        "source": str(fields.get("source"))[:200],
        "detail-type": str(fields.get("detail-type"))[:200],
        "size": len(body),
        "sha256": hashlib.sha256(body.encode()).hexdigest(),
        "reason": reason[:1000],
    }
    if len(body) <= DEAD_LETTER_EVENT_LIMIT:
        message["event"] = event
    else:
        message["truncated"] = "the event is too large for a dead letter; this is its summary"
    return json.dumps(message, default=str)


def reject(event: Any, reason: str, queue_url: str | None) -> dict[str, Any]:
    """Log the event and send its dead letter; never raises (the Lambda's last step)."""
    message = dead_letter(event, reason)
    log.error("rejected event: %s", message[:2000])
    if queue_url:
        try:
            boto3.client("sqs").send_message(
                QueueUrl=queue_url,
                MessageBody=message,
                MessageAttributes={"reason": {"DataType": "String", "StringValue": reason[:1000]}},
            )
        except (ClientError, BotoCoreError) as error:
            log.error("the dead letter could not be sent to %s: %s", queue_url, error)
    return {"rejected": reason}


def _clients_by_region(service: str) -> Callable[[str], Any]:
    """One client of `service` per region, made when first needed (groups may be anywhere)."""
    clients: dict[str, Any] = {}

    def client(region: str) -> Any:
        if region not in clients:
            clients[region] = boto3.client(service, region_name=region)
        return clients[region]

    return client


def _autoscaling_by_region() -> Callable[[str], Any]:
    return _clients_by_region("autoscaling")


# --- entry point -------------------------------------------------------------------------------
def _on_instance_event(settings: dict[str, Any], fields: dict[str, str]) -> dict[str, Any]:
    table = boto3.resource("dynamodb").Table(settings["events_table"])
    ec2 = boto3.client("ec2")
    instance = describe_instance(ec2, fields["instance_id"])
    runs = declared_runs(settings)
    if "run" in instance and instance["run"] not in runs:  # a run declared since the last read?
        runs = declared_runs(settings, fresh=True)
    if "run" in instance and instance["run"] not in runs:
        # The rules see every spot warning of the account and region: a machine tagged with
        # no run of this environment is not this handler's to mark, tag, requeue or
        # dead-letter.
        count = fleet_state.count_foreign_event(table)
        reason = (f"{fields['instance_id']} belongs to run {instance['run'] or '(none)'}, "
                  f"not to a run of environment {settings['environment']}")  # fmt: skip
        log.info("ignored %s %s: %s (%d so far)", fields["kind"], fields["event_id"], reason,
                 count)  # fmt: skip
        return {"recorded": False, "event_id": fields["event_id"], "ignored": reason}
    if "run" in instance:
        settings = runs[instance["run"]]
    elif len(runs) == 1:  # a machine already gone: the environment's one run
        settings = next(iter(runs.values()))
    # else: gone, and any of several runs': recorded, and the next capacity check covers it.
    run = settings["run"]
    if not record(table, fields, instance["pool"], settings["retention_days"]):
        log.info(
            "duplicate %s %s for %s", fields["kind"], fields["event_id"], fields["instance_id"]
        )
        return {"recorded": False, "event_id": fields["event_id"]}
    interrupting = fields["kind"] == INTERRUPTION_WARNING
    label = f"{fields['kind']}@{fields['time']}"
    if run:
        fleet_state.mark_instance(
            table, run, fields["instance_id"],
            status=INSTANCE_STATUS_INTERRUPTING if interrupting else INSTANCE_STATUS_REBALANCING,
            pool=instance["pool"], event_id=fields["event_id"], at=fields["time"], label=label,
        )  # fmt: skip
    if instance["pool"] != UNKNOWN_POOL:
        tag_newest(ec2, table, run, fields["instance_id"], label)
    decision = requeue.Decision("none", "a rebalance recommendation: capacity rebalancing "
                                "launches the replacement, the trainer checkpointed")  # fmt: skip
    if interrupting and not run:
        decision = requeue.Decision("none", "the machine is gone and its run cannot be told "
                                    "among the environment's: recorded; the next capacity "
                                    "check covers its run")  # fmt: skip
    elif interrupting:
        autoscaling = _autoscaling_by_region()
        groups = capacity_groups(settings, autoscaling)
        pools = {p for g in groups for p in g.pools} | {instance["pool"]}
        state = fleet_state.run_state(table, run) if run else fleet_state.RunState()
        held_for_spend = bool(run) and spend_ledger.read(table, run).held
        now = _now()
        progress, _ = deadline_progress(settings, now)
        decision = requeue.after_interruption(
            group=instance.get("group") or None,
            pool=instance["pool"],
            groups=groups,
            pool_interruptions=recent_interruptions(
                table, pools, fields["time"], settings["window_s"]
            ),
            hot_threshold=settings["hot_threshold"],
            run_failed=state.failed,
            short_since=state.short_since,
            now=now,
            on_demand_deadline_s=settings["deadline_s"],
            progress=progress,
        )
        if held_for_spend and not state.failed:
            decision = requeue.Decision("hold", "the run reached its spend cap: not requeued "
                                        "(`spotrain fleet release` raises the cap)")  # fmt: skip
        stopped = run_lifecycle.read(table, run) if run else run_lifecycle.Lifecycle()
        if stopped.stopped:
            decision = requeue.Decision("hold", f"not requeued: {stopped.why_stopped}")
        apply(decision, groups, table, run, autoscaling)
    result = {
        "recorded": True, "event_id": fields["event_id"], "run": run, "pool": instance["pool"],
        "decision": decision.action, "reason": decision.reason, "desired": decision.desired,
    }  # fmt: skip
    notify(settings["topic"], f"spotrain: {fields['kind']} for {fields['instance_id']} "
           f"(run {run or 'unknown'})", {**fields, **result})  # fmt: skip
    log.info("%s", json.dumps(result))
    return result


def _on_capacity_check(settings: dict[str, Any]) -> dict[str, Any]:
    """Every run of the environment, each on its own: one run's failure is reported in its
    result (and logged) and the others are checked."""
    results: dict[str, Any] = {}
    for run, run_settings_ in sorted(declared_runs(settings, fresh=True).items()):
        try:
            results[run] = _check_run(run_settings_)
        except Exception as error:  # the other runs' checks go on; the next check retries
            log.exception("the capacity check of run %s failed", run)
            results[run] = {"decision": "error", "reason": f"{type(error).__name__}: {error}"}
    return {"runs": results}


def _check_run(settings: dict[str, Any]) -> dict[str, Any]:
    now = _now()
    run = settings["run"]
    table = boto3.resource("dynamodb").Table(settings["events_table"])
    autoscaling = _autoscaling_by_region()
    groups = capacity_groups(settings, autoscaling)
    state = fleet_state.run_state(table, run)
    try:
        counted, ledger = update_ledger(settings, table, now)
    except Exception as error:  # the capacity decision goes on; the next check counts the time
        log.exception("the spend ledger was not updated")
        counted = {"error": f"{type(error).__name__}: {error}"}
        ledger = spend_ledger.read(table, run) if run else None
    over_cap = ledger is not None and _judge_spend(settings, table, ledger, now)
    lifecycle = run_lifecycle.read(table, run) if run else run_lifecycle.Lifecycle()
    if run and lifecycle.finished_step is None and (step := final_step(settings)) is not None:
        # The stream's notice was missed (or is still on its way): the check makes sure.
        # The lifecycle decision below takes the groups to 0.
        lifecycle = _finish(settings, table, step, now, ledger, stop=False)
    decision = _lifecycle_decision(settings, table, groups, lifecycle, now)
    if decision is not None:
        apply(decision, groups, table, run, autoscaling)
    elif not state.failed and not over_cap and state.held_sizes:
        decision = requeue.release(groups, state.held_sizes)
        apply(decision, groups, table, run, autoscaling)
        fleet_state.set_held_sizes(table, run, None)
    else:
        progress, measured = deadline_progress(settings, now)
        decision = requeue.reconcile(
            groups=groups, run_failed=state.failed, short_since=state.short_since,
            now=now, on_demand_deadline_s=settings["deadline_s"], progress=progress,
        )  # fmt: skip
        if over_cap and not state.failed:
            assert ledger is not None and ledger.cap_usd is not None
            decision = requeue.hold(
                groups, f"the run spent ${ledger.spend_usd:,.2f} of its ${ledger.cap_usd:,.2f} cap",
                f"`spotrain fleet release --run {run} --max-spend-usd N` raises it",
            )  # fmt: skip
        if measured:
            decision = replace(decision, reason=f"{decision.reason} ({measured})")
        if decision.min_sizes:  # holding: remember what to put back first
            fleet_state.set_held_sizes(table, run, {
                g.name: {"min_size": g.min_size, "desired": g.desired}
                for g in groups if g.name in decision.min_sizes
            })  # fmt: skip
        apply(decision, groups, table, run, autoscaling)
    if decision.desired:
        notify(settings["topic"], f"spotrain: {decision.action} (run {run})", asdict(decision))
    return {"decision": decision.action, "reason": decision.reason, "desired": decision.desired,
            "ledger": counted}  # fmt: skip


def _lifecycle_decision(
    settings: dict[str, Any], table: Any, groups: list[requeue.Group],
    lifecycle: run_lifecycle.Lifecycle, now: float,
) -> requeue.Decision | None:  # fmt: skip
    """Whether the run may have machines at all: a finished or cancelled run, and one whose
    configuration is not stored yet, has its groups at 0; a run whose configuration was just
    stored starts. None: the run trains, and the usual rules decide."""
    run = settings["run"]
    if not run:
        return None
    if lifecycle.stopped:
        return requeue.hold(groups, lifecycle.why_stopped, "no machine runs for it")
    if lifecycle.started_at is not None:
        return None
    if not configuration_stored(settings):
        bucket = f"s3://{settings['config_bucket']}"
        waiting = requeue.hold(groups, f"waiting: run {run} has no training configuration in "
                               f"{bucket}", "until one is stored")  # fmt: skip
        return replace(waiting, action="wait", reason=f"{waiting.reason}; `spotrain config put "
                       f"CONFIG --store {bucket}` stores one, and the next check starts the "
                       "run")  # fmt: skip
    run_lifecycle.mark_started(table, run, now)
    fleet_state.set_held_sizes(table, run, None)  # the declared sizes replace any remembered
    started = requeue.start(groups, declared_sizes(settings))
    return started if started.desired else None


def _finish(
    settings: dict[str, Any], table: Any, step: int, now: float,
    ledger: spend_ledger.Ledger | None = None, *, stop: bool = True,
) -> run_lifecycle.Lifecycle:  # fmt: skip
    """The run published its final step: mark it finished, take its groups to 0 (unless the
    caller does: `stop`) and, the first time, send the topic the run's cost summary."""
    run = settings["run"]
    first = run_lifecycle.mark_finished(table, run, step, now)
    lifecycle = run_lifecycle.read(table, run)
    if stop:
        autoscaling = _autoscaling_by_region()
        groups = capacity_groups(settings, autoscaling)
        apply(requeue.hold(groups, lifecycle.why_stopped, "no machine runs for it"), groups,
              table, run, autoscaling)  # fmt: skip
    if first:
        ledger = ledger or spend_ledger.read(table, run)
        notify(settings["topic"], f"spotrain: run {run} finished at step {step}", {
            "run": run, "kind": "finished", "step": step,
            "decision": f"{lifecycle.why_stopped}: its groups go to 0",
            "spend_usd": round(ledger.spend_usd, 2),
            "on_demand_usd": round(ledger.on_demand_usd, 2),
            "machine_hours": round(sum(p["seconds"] for p in ledger.per_pool.values()) / 3600, 3),
            "report": f"spotrain cost report --run {run} --events-table {settings['events_table']}",
        })  # fmt: skip
        log.info("run %s finished at step %d", run, step)
    return lifecycle


def _judge_spend(
    settings: dict[str, Any], table: Any, ledger: spend_ledger.Ledger, now: float
) -> bool:
    """Announce the percentages of the run's cap its spend newly reached (and keep each notice
    for the run's report); True when the spend reached the cap (the run is held)."""
    run = settings["run"]
    cap = spend_ledger.current_cap(table, run, settings["max_spend_usd"])
    check = spend_ledger.judge(ledger, cap)
    if (check.ledger.cap_usd, check.ledger.notified, check.ledger.held) != (
        ledger.cap_usd,
        ledger.notified,
        ledger.held,
    ):
        spend_ledger.save_cap_state(table, run, check.ledger)
    for percent in check.crossed:
        assert cap is not None
        notice = spend_ledger.CapNotice(now, percent, ledger.spend_usd, cap)
        spend_ledger.record_notice(table, run, notice, settings["retention_days"])
        notify(settings["topic"], f"spotrain: run {run} spent {percent}% of its cap", {
            "run": run, "percent": percent, "spend_usd": round(ledger.spend_usd, 2),
            "cap_usd": cap, "held": check.ledger.held,
        })  # fmt: skip
    return check.ledger.held


def update_ledger(
    settings: dict[str, Any], table: Any, now: float
) -> tuple[dict[str, Any], spend_ledger.Ledger | None]:
    """Count the run's machine time since the ledger's as_of, and publish the spend; what was
    done, and the ledger as it stands."""
    run = settings["run"]
    if not run:
        return {}, None
    counted = spend_ledger.count(
        table, run, regions=sorted({g["region"] for g in settings["groups"]}),
        ec2_for=_clients_by_region("ec2"),
        pricing=boto3.client("pricing", region_name=price_book.PRICE_LIST_REGION), now=now,
        retention_days=settings["retention_days"],
    )  # fmt: skip
    ledger = counted.ledger
    if counted.already_counted:
        return {"counted": False, "as_of": ledger.as_of, "why": "already counted"}, ledger
    if not counted.written:
        return {"counted": False, "why": "another check counted this time first"}, ledger
    boto3.client("cloudwatch").put_metric_data(
        Namespace=METRIC_NAMESPACE,
        MetricData=[
            {"MetricName": name, "Dimensions": [{"Name": "Run", "Value": run}],
             "Value": value, "Unit": "None"}
            for name, value in (("RunSpendUSD", ledger.spend_usd),
                                ("RunOnDemandEquivalentUSD", ledger.on_demand_usd))
        ],
    )  # fmt: skip
    return {"counted": True, "as_of": ledger.as_of, "spend_usd": round(ledger.spend_usd, 4),
            "on_demand_usd": round(ledger.on_demand_usd, 4), "machines": counted.machines,
            "unpriced_seconds": ledger.unpriced_seconds}, ledger  # fmt: skip


def _on_catalog_changes(settings: dict[str, Any], records: list[Any]) -> dict[str, Any]:
    found = catalog_watch.findings(records)
    for item in found:
        severity = "ALARM" if item["severity"] == catalog_watch.ALARM else "notice"
        notify(settings["topic"], f"spotrain {severity}: {item['kind']} (run {item['run']})", item)
        log.warning("%s", json.dumps(item, default=str))
    final: dict[str, int] = {}
    for run, step in catalog_watch.final_publishes(records):
        final[run] = max(step, final.get(run, step))
    finished = {}
    if final:
        runs = declared_runs(settings)
        if set(final) - set(runs):  # a run declared since the last read?
            runs = declared_runs(settings, fresh=True)
        table = boto3.resource("dynamodb").Table(settings["events_table"])
        for run, step in sorted(final.items()):
            if run in runs:  # a run of the environment: its groups go to 0
                _finish(runs[run], table, step, _now())
                finished[run] = step
    return {"catalog_changes": len(records), "findings": found, "finished": finished}


def _is_stream_batch(event: Any) -> bool:
    records = event.get("Records") if isinstance(event, dict) else None
    return bool(records) and all(
        isinstance(r, dict) and r.get("eventSource") == "aws:dynamodb" for r in records
    )


def handle(event: Any, context: Any = None) -> dict[str, Any]:
    try:
        settings = _settings()
    except (KeyError, ValueError) as error:
        dead_letters = os.environ.get(defaults.HandlerSettings.variable("dead_letter_queue_url"))
        return reject(event, f"the handler is misconfigured: {type(error).__name__}: {error}",
                      dead_letters)  # fmt: skip
    if _is_stream_batch(event):
        try:
            return _on_catalog_changes(settings, event["Records"])
        except Exception as error:  # as below: to the dead letters, never a retry storm
            return reject(event, f"failed while watching the catalog: {type(error).__name__}: "
                          f"{error}", settings["dead_letter_queue"])  # fmt: skip
    try:
        fields = parse(event)
    except UnhandledEvent as error:
        return reject(event, str(error), settings["dead_letter_queue"])
    try:
        if fields["kind"] == CAPACITY_CHECK:
            return _on_capacity_check(settings)
        return _on_instance_event(settings, fields)
    except Exception as error:  # the last line of defence: nothing escapes to a retry storm
        # Half-handled: the record (if written) stays; the dead-letter copy can be redriven.
        return reject(event, f"failed while handling: {type(error).__name__}: {error}",
                      settings["dead_letter_queue"])  # fmt: skip
