"""A run's fleet state in the events table: which machines are being interrupted, how often
the trainer crashed, and since when the run lacks spot capacity.

Crashes are records a machine adds and cannot take back; a run is held once `max_crashes` of
them are recorded after its last release, and only an operator's release (a record machines
may not write: IAM keeps them to their run's crash partition) lets it start again.

Shared by the interruption handler (it ships in the Lambda zip: boto3 and the standard
library only) and `spotrain fleet` on the machines and on-call laptops.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from spotrain.core.capacity_policy import GangAsked, gang_waiting
from spotrain.core.catalog_schema import (
    COORDINATOR_SORT_KEY,
    FOREIGN_EVENTS_KEY,
    INSTANCE_STATUS_INTERRUPTING,
    PARTITION_KEY,
    RUN_STATE_SORT_KEY,
    SORT_KEY,
    STAMP_FORMAT,
    crash_sort_key,
    crashes_key,
    failover_sort_key,
    handler_state_key,
    instance_sort_key,
    release_sort_key,
    releases_key,
    run_key,
)
from spotrain.core.errors import SpotrainError
from spotrain.core.failover import MoveOrder, Silence
from spotrain.core.outage_fill import RegionRecords, SpotRecord

DEFAULT_MAX_CRASHES = 3
"""Crashes since the last release that hold a run (the boot script, the handler)."""
COORDINATOR_STALE_S = 180
"""A claim not renewed for this long is the claim of a machine that is gone: the next
on-demand machine may take the role (images/bootstrap.sh renews it every 60 s)."""


@dataclass(frozen=True)
class RunState:
    crashes: int = 0
    """Crashes recorded since the run's last release."""
    failed: bool = False
    """`crashes` reached the limit: the run is held until an operator releases it."""
    short_since: float | None = None
    held_sizes: dict[str, dict[str, int]] | None = None
    """The run's groups' sizes (min_size, desired) before it was held and scaled to 0."""
    spot_record: SpotRecord | None = None
    """What the scheduled checks of a run with a deadline have seen of its spot market."""
    queued: str | None = None
    """Why the environment's queue does not admit the run yet, with its place, as the last
    check judged (`admission`); None: not waiting in the queue."""
    gang_asked: GangAsked | None = None
    """The run asks for its gang and it has not all come yet (`capacity_policy` rule 8)."""
    spot_records: dict[str, Any] | None = None
    """What the checks of a run with a deadline in several regions saw of spot in each
    (`outage_fill.RegionRecords.to_item`), as its home handler keeps it."""
    gang_released_at: float | None = None
    """When the run's gang was last released for not coming whole in time (rule 8): the queue
    takes it as the run's submission, so the run waits behind those queued before it
    (`admission` rule 2; Kueue requeues a workload by its eviction time alike)."""
    gang_releases: int = 0
    """Its gang's releases in a row, since it last came whole: how long the run waits before
    asking again (`capacity_policy.gang_retry_at`)."""
    preempted_by: str | None = None
    """The run that preempted it, kept until the queue admits it again (`queued` says why it
    waits now: the room it needs)."""
    preempted_at: float | None = None

    @property
    def waiting_reason(self) -> str | None:
        """`queued`, and who preempted the run and when, if one did since it last trained."""
        said = f"preempted by run {self.preempted_by} "  # the preempting check's own words
        if self.queued is None or self.preempted_by is None or said in self.queued:
            return self.queued
        at = datetime.fromtimestamp(self.preempted_at or 0, UTC).strftime("%Y-%m-%d %H:%M UTC")
        return f"{self.queued} (preempted by run {self.preempted_by} at {at})"

    def region_records(self, regions: int) -> tuple[SpotRecord, ...]:
        """What the run's checks saw of spot in each of its `regions` (home first): its
        regions' records, or for a run of one region its own record (empty ones where none
        was kept)."""
        if regions == 1 and not self.spot_records and self.spot_record is not None:
            return (self.spot_record,)
        return RegionRecords.from_item(self.spot_records, regions).regions

    def gang_waiting(self, timeout_s: float, now: float) -> str | None:
        """Why the run still waits before asking for its gang again (None: it need not)."""
        return gang_waiting(self.gang_released_at, self.gang_releases, timeout_s, now=now)


@dataclass(frozen=True)
class ExitVerdict:
    kind: str
    """finished | preempted | stopped | crash"""
    crashes: int
    failed: bool


def _state_key(run: str) -> dict[str, str]:
    return {PARTITION_KEY: handler_state_key(run), SORT_KEY: RUN_STATE_SORT_KEY}


def run_state(table: Any, run: str, *, max_crashes: int = DEFAULT_MAX_CRASHES) -> RunState:
    item = table.get_item(Key=_state_key(run), ConsistentRead=True).get("Item") or {}
    short_since = item.get("short_since")
    held = item.get("held_sizes")
    crashes = _count(table, crashes_key(run)) - _forgiven(table, run)
    return RunState(
        crashes=crashes,
        failed=crashes >= max_crashes,
        short_since=float(short_since) if short_since is not None else None,
        held_sizes=(
            {name: {k: int(v) for k, v in sizes.items()} for name, sizes in held.items()}
            if held else None
        ),
        spot_record=SpotRecord.from_item(item["spot_record"]) if "spot_record" in item else None,
        queued=str(item["queued"]) if item.get("queued") else None,
        gang_asked=GangAsked(float(item["gang_asked"]["since"]),
                             float(item["gang_asked"]["spend_usd"]))
        if item.get("gang_asked") else None,
        gang_released_at=float(item["gang_released_at"]) if item.get("gang_released_at")
        else None,
        spot_records=dict(item["spot_records"]) if item.get("spot_records") else None,
        gang_releases=int(item.get("gang_releases", 0)),
        preempted_by=str(item["preempted_by"]) if item.get("preempted_by") else None,
        preempted_at=float(item["preempted_at"]) if item.get("preempted_at") else None,
    )  # fmt: skip


def last_crash(table: Any, run: str) -> dict[str, Any] | None:
    """The run's newest crash record (instance_id, code, at, and the trainer's reason if it
    left one), or None."""
    page = table.query(
        KeyConditionExpression="#pk = :pk",
        ExpressionAttributeNames={"#pk": PARTITION_KEY},
        ExpressionAttributeValues={":pk": crashes_key(run)},
        ScanIndexForward=False, Limit=1, ConsistentRead=True,
    )  # fmt: skip
    items = page.get("Items") or []
    return dict(items[0]) if items else None


def crash_line(crash: dict[str, Any]) -> str:
    """A crash record as people read it: which machine, its exit, the trainer's reason."""
    said = f": {crash['reason']}" if crash.get("reason") else ""
    return f"{crash.get('instance_id', '?')} exit {crash.get('code', '?')}{said}"


def _count(table: Any, partition: str) -> int:
    """Items in a partition (keys only are read)."""
    query: dict[str, Any] = {
        "KeyConditionExpression": "#pk = :pk",
        "ExpressionAttributeNames": {"#pk": PARTITION_KEY},
        "ExpressionAttributeValues": {":pk": partition},
        "Select": "COUNT",
        "ConsistentRead": True,
    }
    total = 0
    while True:
        page = table.query(**query)
        total += int(page["Count"])
        if "LastEvaluatedKey" not in page:
            return total
        query["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _forgiven(table: Any, run: str) -> int:
    """Crashes the run's latest release forgave (0 if it was never released)."""
    latest = table.query(
        KeyConditionExpression="#pk = :pk",
        ExpressionAttributeNames={"#pk": PARTITION_KEY},
        ExpressionAttributeValues={":pk": releases_key(run)},
        ScanIndexForward=False,
        Limit=1,
        ConsistentRead=True,
    )["Items"]
    return int(latest[0]["forgiven"]) if latest else 0


def set_held_sizes(table: Any, run: str, sizes: dict[str, dict[str, int]] | None) -> None:
    """Remember the sizes a held run's groups had (kept if already remembered: the first
    hold's sizes are the run's own), or forget them once they are back (None)."""
    _remember_first(table, run, "held_sizes", sizes)


def set_short_since(table: Any, run: str, since: float | None) -> None:
    """When the run became short of spot capacity (kept from the first check that saw it), or
    None once it is not."""
    stored = None if since is None else Decimal(str(round(since, 3)))
    _remember_first(table, run, "short_since", stored)


def set_spot_record(table: Any, run: str, record: SpotRecord) -> None:
    """Keep the run's record of spot as this check left it (the checks of a run are its
    region's handler's, on a schedule: one at a time)."""
    table.update_item(Key=_state_key(run), UpdateExpression="SET spot_record = :record",
                      ExpressionAttributeValues={":record": _stored(record.to_item())})  # fmt: skip


def set_spot_records(table: Any, run: str, records: dict[str, Any]) -> None:
    """Keep what the run's checks saw of spot in each of its regions (`spot_records`)."""
    table.update_item(Key=_state_key(run), UpdateExpression="SET spot_records = :records",
                      ExpressionAttributeValues={":records": _stored(records)})  # fmt: skip


def set_queued(table: Any, run: str, queued: str | None, *, preempted_by: str | None = None,
               at: float | None = None) -> None:  # fmt: skip
    """Why the queue keeps the run waiting, as this check judged it (None: it does not, which
    also forgets a preemption): what `run list` shows. `preempted_by`: the run that preempts it
    now (at `at`), kept while it waits. Written by the check of the run's region alone, as its
    other state."""
    if queued is None:
        table.update_item(
            Key=_state_key(run), UpdateExpression="REMOVE queued, preempted_by, preempted_at"
        )
    elif preempted_by is not None:
        table.update_item(
            Key=_state_key(run), UpdateExpression="SET queued = :queued, preempted_by = :by, "
            "preempted_at = :at",
            ExpressionAttributeValues={":queued": queued, ":by": preempted_by,
                                       ":at": Decimal(str(round(at or time.time(), 3)))},
        )  # fmt: skip
    else:
        table.update_item(Key=_state_key(run), UpdateExpression="SET queued = :queued",
                          ExpressionAttributeValues={":queued": queued})  # fmt: skip


def release_gang(
    table: Any, run: str, sizes: dict[str, dict[str, int]], at: float, said: str
) -> None:
    """Rule 8 released the part of the run's gang that came: remember its groups' sizes (as a
    hold does), count the release, and put the run back in the queue as if submitted `at`
    (`gang_released_at`), telling it `said` (when it asks again) until a check judges it."""
    table.update_item(  # one write: the held sizes as `set_held_sizes` keeps them (first wins)
        Key=_state_key(run),
        UpdateExpression="SET held_sizes = if_not_exists(held_sizes, :sizes), queued = :queued, "
                         "gang_released_at = :at ADD gang_releases :one",
        ExpressionAttributeValues={":sizes": sizes, ":queued": said, ":one": 1,
                                   ":at": Decimal(str(round(at, 3)))},
    )  # fmt: skip


def gang_came_whole(table: Any, run: str) -> None:
    """The run's gang is in service: it no longer asks, and its releases' count starts again."""
    table.update_item(Key=_state_key(run), UpdateExpression="REMOVE gang_asked, gang_releases")


def set_gang_asked(table: Any, run: str, asked: GangAsked | None, *, anew: bool = False) -> None:
    """Keep when the run asked for its gang (None once it came, or was released). `anew`: an
    operator asks for it now (`spotrain run resume`), so its releases' count starts again."""
    if asked is None:
        table.update_item(Key=_state_key(run), UpdateExpression="REMOVE gang_asked")
    else:
        table.update_item(
            Key=_state_key(run),
            UpdateExpression="SET gang_asked = :asked" + (" REMOVE gang_releases" if anew else ""),
            ExpressionAttributeValues={":asked": _stored(
                {"since": asked.since, "spend_usd": asked.spend_usd})},
        )  # fmt: skip


@dataclass(frozen=True)
class FailoverState:
    """What a region's handler keeps of a run trained elsewhere (`core/failover.py`)."""

    silent: dict[str, Silence] = field(default_factory=dict)
    """The run's regions that did not answer this region's handler at its latest checks."""
    move_order: MoveOrder | None = None
    """This region's handler's order that the run move here."""


def _failover_key(run: str, region: str) -> dict[str, str]:
    return {PARTITION_KEY: handler_state_key(run), SORT_KEY: failover_sort_key(region)}


def failover_state(table: Any, run: str, region: str) -> FailoverState:
    """Region `region`'s failover state for the run (its own item: its handler's alone)."""
    item = table.get_item(Key=_failover_key(run, region), ConsistentRead=True).get("Item") or {}
    return FailoverState(
        silent={r: Silence.from_item(v) for r, v in item.get("silent", {}).items()},
        move_order=MoveOrder.from_item(item["move_order"]) if "move_order" in item else None,
    )  # fmt: skip


def set_failover_state(table: Any, run: str, region: str, state: FailoverState) -> None:
    """Keep what this check heard and ordered (the whole item, one writer: its region's)."""
    item: dict[str, Any] = {"silent": {r: s.to_item() for r, s in state.silent.items()}}
    if state.move_order is not None:
        item["move_order"] = state.move_order.to_item()
    table.put_item(Item={**_failover_key(run, region), **_stored(item)})


def _stored(value: Any) -> Any:
    """`value` as DynamoDB keeps it: floats as Decimals (to the millisecond), maps within."""
    if isinstance(value, float):
        return Decimal(str(round(value, 3)))
    if isinstance(value, dict):
        return {key: _stored(inner) for key, inner in value.items()}
    if isinstance(value, list | tuple):
        return [_stored(inner) for inner in value]
    return value


def _remember_first(table: Any, run: str, attribute: str, value: Any) -> None:
    """Set a run-state attribute unless it is already set; None removes it."""
    if value is None:
        table.update_item(Key=_state_key(run), UpdateExpression=f"REMOVE {attribute}")
    else:
        table.update_item(
            Key=_state_key(run),
            UpdateExpression=f"SET {attribute} = if_not_exists({attribute}, :value)",
            ExpressionAttributeValues={":value": value},
        )


def event_time(value: str) -> str:
    """An event time (ISO 8601) in one fixed-width UTC form, so stored times compare as text."""
    moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime(STAMP_FORMAT)


SPOT_WARNING_LEAD_S = 120
"""EC2 warns two minutes before it stops a spot machine; the metadata service's
`spot/instance-action` time is the stop, not the warning."""


def mark_instance(
    table: Any, run: str, instance_id: str, *, status: str, pool: str, event_id: str, at: str,
    warned_at: str | None = None, label: str | None = None,
) -> None:  # fmt: skip
    """Say the instance is being interrupted (or rebalanced), for the boot service's exit
    accounting, the coordinator and dashboards (`Query pk=RUN#<run>, sk begins_with
    INSTANCE#`). The mark keeps the newest event by event time, whatever order they arrive in,
    and an interruption is never downgraded by a rebalance notice, older or newer; `label`
    (what the instance's tag says of the event) is kept with the newest event that has one
    (`latest_label`). An interruption also keeps its earliest warning (`warned_at`: `at` unless
    given), from which the run's cost report times the preemption."""
    from botocore.exceptions import ClientError

    key = {PARTITION_KEY: run_key(run), SORT_KEY: instance_sort_key(instance_id)}
    interrupting = status == INSTANCE_STATUS_INTERRUPTING
    when = event_time(at)
    values = {":status": status, ":pool": pool, ":event": event_id, ":at": when}
    if label is not None:
        values[":label"] = label
    try:
        table.update_item(
            Key=key,
            UpdateExpression=(
                f"SET #s = {':status' if interrupting else 'if_not_exists(#s, :status)'}, "
                "#pool = :pool, event_id = :event, updated_at = :at"
                + (", latest_label = :label" if label is not None else "")
            ),
            ConditionExpression="attribute_not_exists(updated_at) OR updated_at <= :at",
            ExpressionAttributeNames={"#s": "status", "#pool": "pool"},
            ExpressionAttributeValues=values,
        )
    except ClientError as error:
        if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise
        if interrupting:  # older than the mark, but the machine is still going away
            table.update_item(
                Key=key,
                UpdateExpression="SET #s = :status",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues={":status": status},
            )
    if interrupting:
        warned = event_time(warned_at or at)
        try:
            table.update_item(
                Key=key,
                UpdateExpression="SET warned_at = :warned",
                ConditionExpression="attribute_not_exists(warned_at) OR warned_at > :warned",
                ExpressionAttributeValues={":warned": warned},
            )
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise


def latest_label(table: Any, run: str, instance_id: str) -> str | None:
    """The label of the instance's newest event that has one (see `mark_instance`)."""
    item = table.get_item(
        Key={PARTITION_KEY: run_key(run), SORT_KEY: instance_sort_key(instance_id)},
        ConsistentRead=True,
    ).get("Item")
    return str(item["latest_label"]) if item and "latest_label" in item else None


def instance_status(table: Any, run: str, instance_id: str) -> str | None:
    item = table.get_item(
        Key={PARTITION_KEY: run_key(run), SORT_KEY: instance_sort_key(instance_id)},
        ConsistentRead=True,
    ).get("Item")
    return str(item["status"]) if item else None


def shown_status(item: dict[str, Any]) -> str:
    """An instance mark as people read it: a machine whose trainer's exit was accounted has
    left, so an interruption it got is over (RECLAIMED), not still happening."""
    status = str(item.get("status", "-"))
    if item.get("left_at") is None:
        return status
    return "RECLAIMED" if status == INSTANCE_STATUS_INTERRUPTING else "LEFT"


def instances(table: Any, run: str) -> list[dict[str, Any]]:
    items = table.query(
        KeyConditionExpression="#pk = :run AND begins_with(#sk, :prefix)",
        ExpressionAttributeNames={"#pk": PARTITION_KEY, "#sk": SORT_KEY},
        ExpressionAttributeValues={":run": run_key(run), ":prefix": instance_sort_key("")},
    )["Items"]
    return list(items)


def record_exit(
    table: Any,
    run: str,
    instance_id: str,
    exit_code: int,
    *,
    max_crashes: int = DEFAULT_MAX_CRASHES,
    asked_to_stop: bool = False,
    reason: str | None = None,
) -> ExitVerdict:
    """Account for a trainer exit. A clean exit, any exit of a machine being interrupted, any
    exit of a machine of a run that was stopped (cancelled or finished: its groups went to 0
    and the machine was told to leave), and any exit of a machine `asked_to_stop` (SIGTERM:
    its instance is being stopped, whoever asked) is not a failure; other exits count as
    crashes, and `max_crashes` of them since the run's last release hold it (the handler and
    the boot script hold at DEFAULT_MAX_CRASHES). A crash keeps the trainer's `reason`, if it
    left one (`last_crash`)."""
    from botocore.exceptions import ClientError

    from spotrain.core import run_lifecycle

    try:  # a marked machine has left once its exit is accounted (its mark stays, for reports)
        table.update_item(
            Key={PARTITION_KEY: run_key(run), SORT_KEY: instance_sort_key(instance_id)},
            UpdateExpression="SET left_at = :now",
            ConditionExpression=f"attribute_exists({PARTITION_KEY})",
            ExpressionAttributeValues={":now": datetime.now(UTC).strftime(STAMP_FORMAT)},
        )
    except ClientError as error:
        if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise
    kind = None
    if exit_code == 0:
        kind = "finished"
    elif instance_status(table, run, instance_id) == INSTANCE_STATUS_INTERRUPTING:
        kind = "preempted"
    elif asked_to_stop or run_lifecycle.read(table, run).stopped:
        kind = "stopped"
    if kind is not None:
        state = run_state(table, run, max_crashes=max_crashes)
        return ExitVerdict(kind, state.crashes, state.failed)
    now = time.time()
    table.put_item(
        Item={
            PARTITION_KEY: crashes_key(run),
            SORT_KEY: crash_sort_key(now, instance_id, uuid.uuid4().hex[:8]),
            "instance_id": instance_id, "code": exit_code, "at": int(now),
            **({"reason": reason.strip()[:1000]} if reason and reason.strip() else {}),
        },
        ConditionExpression=f"attribute_not_exists({PARTITION_KEY})",  # a new record, always
    )  # fmt: skip
    state = run_state(table, run, max_crashes=max_crashes)
    return ExitVerdict("crash", state.crashes, state.failed)


def release_coordinator(table: Any, run: str, *, instance_id: str) -> bool:
    """The coordinator leaves (its run finished, was cancelled, or its machine is stopping):
    its claim goes stale at once, so the next on-demand machine of the run takes the role
    without waiting COORDINATOR_STALE_S. False if another machine holds it (nothing changed).
    An update, not a delete: the machines' role may update their run's items only."""
    return _updated_if(
        table, Key=_coordinator_key(run), UpdateExpression="SET #h = :gone",
        ConditionExpression="#i = :me",
        ExpressionAttributeNames={"#i": "instance_id", "#h": "heartbeat_at"},
        ExpressionAttributeValues={":me": instance_id, ":gone": Decimal(0)},
    )  # fmt: skip


def _updated_if(table: Any, **update: Any) -> bool:
    """The conditional `update` done: False if its condition did not hold (nothing changed)."""
    from botocore.exceptions import ClientError

    try:
        table.update_item(**update)
    except ClientError as error:
        if error.response["Error"]["Code"] == "ConditionalCheckFailedException":
            return False
        raise
    return True


def count_foreign_event(table: Any) -> int:
    """An event about a machine of no run of the environment reached its handler: counted, so
    a shared account's noise shows, and nothing else done."""
    item = table.update_item(
        Key={PARTITION_KEY: FOREIGN_EVENTS_KEY, SORT_KEY: RUN_STATE_SORT_KEY},
        UpdateExpression="ADD foreign_events :one",
        ExpressionAttributeValues={":one": 1},
        ReturnValues="UPDATED_NEW",
    )["Attributes"]
    return int(item["foreign_events"])


def reset_crashes(table: Any, run: str, *, released_by: str = "") -> int:
    """After the cause of the crashes is fixed (operator credentials: machines may not write
    releases): the run may start, and be requeued, again. Returns the crashes forgiven."""
    forgiven = _count(table, crashes_key(run))
    now = time.time()
    table.put_item(Item={
        PARTITION_KEY: releases_key(run), SORT_KEY: release_sort_key(now),
        "forgiven": forgiven, "released_by": released_by, "at": int(now),
    })  # fmt: skip
    return forgiven


@dataclass(frozen=True)
class Coordinator:
    instance_id: str
    address: str
    port: int
    heartbeat_at: float

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"

    def fresh(self, now: float) -> bool:
        return now - self.heartbeat_at < COORDINATOR_STALE_S


def _coordinator_key(run: str) -> dict[str, str]:
    return {PARTITION_KEY: run_key(run), SORT_KEY: COORDINATOR_SORT_KEY}


def coordinator(table: Any, run: str) -> Coordinator | None:
    item = table.get_item(Key=_coordinator_key(run), ConsistentRead=True).get("Item")
    if not item:
        return None
    try:
        return Coordinator(
            str(item["instance_id"]), str(item["address"]), int(item["port"]),
            float(item["heartbeat_at"]),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as error:
        fields = ("instance_id", "address", "port", "heartbeat_at")
        raise SpotrainError(
            f"run {run}'s coordinator item ({PARTITION_KEY}={run_key(run)}, "
            f"{SORT_KEY}={COORDINATOR_SORT_KEY}) in table {getattr(table, 'name', '?')} is "
            f"unreadable ({type(error).__name__}: {error}); it needs {', '.join(fields)}: "
            "delete the item: the run's on-demand machine claims the role afresh at its next "
            "renewal, within a minute"
        ) from None


def claim_coordinator(
    table: Any, run: str, *, instance_id: str, address: str, port: int, now: float | None = None
) -> bool:
    """Take (or renew) the coordinator's role: granted if nobody holds it, this machine does,
    or the holder stopped renewing it (its machine is gone). False if another machine holds
    it."""
    now = time.time() if now is None else now
    # An update, not a put: the machines' role may read and update their run's items only.
    return _updated_if(
        table, Key=_coordinator_key(run),
        UpdateExpression="SET #i = :me, #a = :address, #p = :port, #h = :now",
        ConditionExpression="attribute_not_exists(#i) OR #i = :me OR #h < :stale",
        ExpressionAttributeNames={"#i": "instance_id", "#a": "address", "#p": "port",
                                  "#h": "heartbeat_at"},
        ExpressionAttributeValues={
            ":me": instance_id, ":address": address, ":port": port,
            ":now": Decimal(str(round(now, 3))),
            ":stale": Decimal(str(round(now - COORDINATOR_STALE_S, 3))),
        },
    )  # fmt: skip
