"""A run's lifecycle: whether its machines may run at all.

A run pays only while it trains. Its groups are deployed empty; the interruption handler's
capacity check starts them (at the sizes the run declares) once the run's training
configuration is in the checkpoint bucket, and takes them back to nothing when the run
publishes its final step (the catalog's stream tells the handler at once, the next check makes
sure) or an operator cancels it. A finished or cancelled run has no machine in service.

The lifecycle lives under a key of its own (`catalog_schema.lifecycle_key`): the handler and
operators write it, machines may only read it, so no machine can restart a run that was
stopped. Shared by the handler (it ships in the Lambda zip: boto3 and the standard library
only), `spotrain run` and `spotrain fleet may-start`.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from spotrain.core.catalog_schema import (
    FINAL_KEY,
    LOSS_KEY,
    PARTITION_KEY,
    RUN_STATE_SORT_KEY,
    SORT_KEY,
    lifecycle_key,
    run_key,
)
from spotrain.core.run_epochs import Epoch, read_head

WAITING = "waiting"
"""Not started by the handler yet: no configuration stored (`spotrain config put`), or stored
and waiting for the next capacity check; or kept in the queue with no machine (it waits for
room, or was preempted by a run of higher priority)."""
STARTING = "starting"
"""Started: machines are booting or meeting, no step trained by this start yet."""
IDLE = "idle"
"""Started and nothing holds it, yet its groups want no machine: scaled to 0 by hand (the
capacity check keeps a group's desired capacity; `spotrain fleet scale` gives it back)."""
TRAINING = "training"
HELD = "held"
"""At its spend cap: groups at 0 until an operator raises the cap."""
FAILED = "failed"
"""Held after repeated crashes: groups at 0 until an operator releases it."""
FINISHED = "finished"
CANCELLED = "cancelled"
PHASES = (WAITING, STARTING, TRAINING, IDLE, HELD, FAILED, FINISHED, CANCELLED)

FINISHING_FOR_S = 30 * 60
"""How long a run that said it is finishing (its last step trained, its final checkpoint being
published) counts as finishing: the queue starts the next runs on its machines meanwhile
(`admission` rule 5). A final publish that never came (the run crashed during it and trains
again) stops counting after this, and its machines count again."""


@dataclass(frozen=True)
class Lifecycle:
    started_at: float | None = None
    """When the handler first started the run's groups (its configuration was stored)."""
    finished_step: int | None = None
    """The final step the run published (it is done)."""
    finished_at: float | None = None
    cancelled_at: float | None = None
    cancelled_by: str = ""
    finishing_step: int | None = None
    """The last step the run said it is publishing as its final one (its catalog's
    announcement, recorded by the handler)."""
    finishing_at: float | None = None

    def finishing(self, now: float) -> bool:
        """Its final checkpoint is publishing now: announced less than FINISHING_FOR_S ago and
        not yet published."""
        return (self.finishing_at is not None and self.finished_step is None
                and now - self.finishing_at < FINISHING_FOR_S)  # fmt: skip

    @property
    def stopped(self) -> bool:
        """Finished or cancelled: the run's groups stay at 0."""
        return self.finished_step is not None or self.cancelled_at is not None

    @property
    def why_stopped(self) -> str:
        # A run cancelled while its last step was publishing finished all the same: finished
        # wins, as `run resume` (which refuses a finished run) has it.
        if self.finished_step is not None:
            return f"the run finished: its final step {self.finished_step} is published"
        if self.cancelled_at is not None:
            by = f" by {self.cancelled_by}" if self.cancelled_by else ""
            return f"the run was cancelled{by} (`spotrain run resume` starts it again)"
        return ""


@dataclass(frozen=True)
class PublishedHead:
    step: int
    final: bool
    """Its catalog record is marked final: the run published its last step."""
    loss: float | None = None
    """The training loss of its step, if the loop gave it."""
    created_at: str = ""
    """When it was written (ISO 8601, UTC)."""
    manifest: str = ""
    """Its manifest's key in the checkpoint bucket."""


def published_head(
    catalog: Any, run: str, chain: list[Epoch] | None = None
) -> PublishedHead | None:
    """The run's head in the checkpoint catalog (a boto3 Table), and whether it is final; None
    before anything is published. `chain`: the run's epochs, when the caller has read them."""
    head = read_head(catalog, run, chain)
    if not head or "latest" not in head:
        return None
    record = catalog.get_item(Key={PARTITION_KEY: run_key(run), SORT_KEY: head["latest"]},
                              ConsistentRead=True).get("Item") or {}  # fmt: skip
    loss = record.get(LOSS_KEY)
    return PublishedHead(
        int(head["step"]), bool(record.get(FINAL_KEY)),
        loss=float(loss) if loss is not None else None,
        created_at=str(record.get("created_at", "")), manifest=str(record.get("manifest", "")),
    )  # fmt: skip


def _key(run: str) -> dict[str, str]:
    return {PARTITION_KEY: lifecycle_key(run), SORT_KEY: RUN_STATE_SORT_KEY}


def _number(value: Any) -> float | None:
    return float(value) if value is not None else None


def read(table: Any, run: str) -> Lifecycle:
    item = table.get_item(Key=_key(run), ConsistentRead=True).get("Item") or {}
    step, finishing = item.get("finished_step"), item.get("finishing_step")
    return Lifecycle(
        started_at=_number(item.get("started_at")),
        finished_step=int(step) if step is not None else None,
        finished_at=_number(item.get("finished_at")),
        cancelled_at=_number(item.get("cancelled_at")),
        cancelled_by=str(item.get("cancelled_by", "")),
        finishing_step=int(finishing) if finishing is not None else None,
        finishing_at=_number(item.get("finishing_at")),
    )


def _at(epoch_s: float) -> Decimal:
    return Decimal(str(round(epoch_s, 3)))


def _set_once(table: Any, run: str, values: dict[str, Any], guard: str) -> bool:
    """Set `values` unless `guard` is already set; True when this call set them."""
    from botocore.exceptions import ClientError

    names = {f"#{i}": name for i, name in enumerate(values)}
    try:
        table.update_item(
            Key=_key(run),
            UpdateExpression="SET " + ", ".join(f"#{i} = :{i}" for i in range(len(values))),
            ConditionExpression=f"attribute_not_exists({guard})",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues={f":{i}": v for i, v in enumerate(values.values())},
        )
    except ClientError as error:
        if error.response["Error"]["Code"] == "ConditionalCheckFailedException":
            return False
        raise
    return True


def mark_started(table: Any, run: str, at: float) -> bool:
    return _set_once(table, run, {"started_at": _at(at)}, "started_at")


def mark_finished(table: Any, run: str, step: int, at: float) -> bool:
    """The run published its final step `step`; True the first time (one notice)."""
    return _set_once(table, run, {"finished_step": step, "finished_at": _at(at)}, "finished_step")


def mark_finishing(table: Any, run: str, step: int, at: float) -> None:
    """The run said it is publishing `step` as its final checkpoint. The latest announcement
    wins: a run that crashed during its final publish and announces again counts anew."""
    table.update_item(
        Key=_key(run), UpdateExpression="SET finishing_step = :step, finishing_at = :at",
        ExpressionAttributeValues={":step": step, ":at": _at(at)},
    )  # fmt: skip


def mark_cancelled(table: Any, run: str, *, by: str, at: float) -> bool:
    """Operator: the run stops (its machines checkpoint and go); False if already cancelled."""
    return _set_once(table, run, {"cancelled_at": _at(at), "cancelled_by": by}, "cancelled_at")


def clear_cancelled(table: Any, run: str) -> None:
    """Operator: a cancelled run may start again."""
    table.update_item(Key=_key(run), UpdateExpression="REMOVE cancelled_at, cancelled_by")


def phase(
    lifecycle: Lifecycle,
    *,
    failed: bool,
    over_cap: bool,
    in_service: int,
    published: bool,
    desired: int | None = None,
    queued: bool = False,
) -> str:
    """One word for where the run stands (see PHASES); `published`: the run has a published
    checkpoint (a started run with machines and one is training); `desired`: its groups'
    desired capacity together (None: not known); `queued`: the queue keeps it waiting."""
    if lifecycle.finished_step is not None:
        return FINISHED
    if lifecycle.cancelled_at is not None:
        return CANCELLED
    if failed:
        return FAILED
    if over_cap:
        return HELD
    if lifecycle.started_at is None or (queued and not in_service):
        return WAITING
    if desired == 0 and not in_service:
        return IDLE
    return TRAINING if in_service and published else STARTING
