"""A spot interruption warning or rebalance recommendation for one instance: recorded once
(keyed by the EventBridge event id: a redelivered event does nothing twice), the instance
marked in its run's fleet state and tagged with its newest event, and for a warning the lost
capacity requeued as the capacity policy decides (in place, to a healthier group, or to
on-demand) among the groups of this handler's region, unless the policy holds the run or the
run trains in another region (EventBridge delivers a warning in its machine's region, to that
region's handler); the alert topic is told."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

from spotrain.constructs.interruption_handler.runtime import aws, clients, deadline, settings
from spotrain.constructs.interruption_handler.runtime.settings import Settings
from spotrain.core import capacity_policy, fleet_state, run_lifecycle, spend_ledger
from spotrain.core.catalog_schema import (
    INSTANCE_STATUS_INTERRUPTING,
    INSTANCE_STATUS_REBALANCING,
    OCCURRED_AT_KEY,
    POOL_INDEX,
    POOL_KEY,
    UNKNOWN_POOL,
)
from spotrain.core.events import INTERRUPTION_WARNING

log = logging.getLogger()


def on_instance_event(environment: Settings, fields: dict[str, str]) -> dict[str, Any]:
    table = aws.events_table(environment)
    ec2 = clients.client("ec2")
    instance = aws.describe_instance(ec2, fields["instance_id"])
    runs = settings.declared_runs(environment)
    if "run" in instance and instance["run"] not in runs:  # a run declared since the last read?
        runs = settings.declared_runs(environment, fresh=True)
    if "run" in instance and instance["run"] not in runs:
        # The rules see every spot warning of the account and region: a machine tagged with
        # no run of this environment is not this handler's to mark, tag, requeue or
        # dead-letter.
        count = fleet_state.count_foreign_event(table)
        reason = (f"{fields['instance_id']} belongs to run {instance['run'] or '(none)'}, "
                  f"not to a run of environment {environment.handler.environment}")  # fmt: skip
        log.info("ignored %s %s: %s (%d so far)", fields["kind"], fields["event_id"], reason,
                 count)  # fmt: skip
        return {"recorded": False, "event_id": fields["event_id"], "ignored": reason}
    run_settings = environment
    if "run" in instance:
        run_settings = runs[instance["run"]]
    elif len(runs) == 1:  # a machine already gone: the environment's one run
        run_settings = next(iter(runs.values()))
    # else: gone, and any of several runs': recorded, and the next capacity check covers it.
    run = run_settings.run
    if not aws.record(table, fields, instance["pool"], environment.handler.event_retention_days):
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
        aws.tag_newest(ec2, table, run, fields["instance_id"], label)
    decision = capacity_policy.Decision("none", "a rebalance recommendation: capacity "
                                        "rebalancing launches the replacement, the trainer "
                                        "checkpointed")  # fmt: skip
    if interrupting and not run:
        decision = capacity_policy.Decision("none", "the machine is gone and its run cannot "
                                            "be told among the environment's: recorded; the "
                                            "next capacity check covers its run")  # fmt: skip
    elif interrupting:
        decision = _requeue(run_settings, table, instance, fields)
    result = {
        "recorded": True, "event_id": fields["event_id"], "run": run, "pool": instance["pool"],
        "decision": decision.action, "reason": decision.reason, "desired": decision.desired,
    }  # fmt: skip
    subject = f"spotrain: {fields['kind']} for {fields['instance_id']} (run {run or 'unknown'})"
    aws.notify(environment.handler.alert_topic_arn, subject, {**fields, **result})
    log.info("%s", json.dumps(result))
    return result


def _requeue(
    run_settings: Settings, table: Any, instance: dict[str, str], fields: dict[str, str]
) -> capacity_policy.Decision:
    """The warned machine's capacity, moved as the policy decides, unless it holds the run."""
    run, handler = run_settings.run, run_settings.handler
    state = fleet_state.run_state(table, run)
    ledger = spend_ledger.read(table, run)
    held = capacity_policy.hold_for(capacity_policy.Standing(
        run=run, lifecycle=run_lifecycle.read(table, run), crashed=state.failed,
        spend_usd=ledger.spend_usd, cap_usd=ledger.cap_usd, at_cap=ledger.held,
        queued=state.queued,  # preempted: its leaving machines are not replaced
    ))  # fmt: skip
    autoscaling = clients.by_region("autoscaling")
    here, region = aws.own_region(), aws.current_epoch(run_settings).region
    groups = aws.capacity_groups(run_settings, autoscaling, region=here)
    if held is not None:  # the scheduled check scales a held run's groups
        decision = capacity_policy.Decision("hold", held.not_requeued)
    elif region != here:  # a machine the run left: this region's check empties its groups
        # Nothing is applied: the run's fleet state (its shortage) is its region's handler's.
        return capacity_policy.Decision("none", f"the run trains in {region}: its machines "
                                        f"in {here} are leaving, none is requeued")  # fmt: skip
    else:
        pools = {p for g in groups for p in g.pools} | {instance["pool"]}
        now = settings.now()
        progress, _ = deadline.deadline_progress(run_settings, now)
        decision = capacity_policy.after_interruption(
            group=instance.get("group") or None, pool=instance["pool"], groups=groups,
            pool_interruptions=recent_interruptions(table, pools, fields["time"],
                                                        60 * handler.rate_window_minutes),
            hot_threshold=handler.hot_pool_threshold, short_since=state.short_since, now=now,
            on_demand_deadline_s=60 * handler.on_demand_deadline_minutes, progress=progress,
            record=deadline.kept_record(run_settings, state),
            # A warning does not look at the run's other regions: spot there counts as gone.
            plan=deadline.stored_plan(run_settings, table, progress),
        )  # fmt: skip
    aws.apply(decision, groups, table, run, autoscaling)
    return decision


def recent_interruptions(
    table: Any, pools: set[str], until: str, window_s: float
) -> dict[str, int]:
    """Interruption warnings per pool in the window that ends at `until`."""
    since = (aws.parse_time(until) - timedelta(seconds=window_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
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
