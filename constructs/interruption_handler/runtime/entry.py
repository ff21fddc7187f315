"""The interruption handler's Lambda entry (`handle`): one function for every run of its
environment, taking three kinds of event.

- A spot interruption warning or rebalance recommendation (EventBridge):
  `instance_events.on_instance_event` records it once, marks and tags the instance, and for a
  warning requeues the lost capacity as the capacity policy decides.
- The scheduled capacity check (EventBridge schedule): `capacity_check.on_capacity_check`
  checks each run: its spend ledger and cap (`spend`), whether it may have machines (held,
  waiting, started, released) and the reconciliation of its groups (on-demand for a spot
  shortfall, or as the deadline policy says).
- A batch of the checkpoint catalog's stream: `catalog_watch.on_catalog_changes` raises an
  alarm for a change that rewrites history and finishes a run that published its final step.

Each run's stack declares the run (its groups, cap and deadline: `capacity.RunDeclaration`) in
an SSM parameter that `settings.declared_runs` reads; an instance's run is its `spotrain:run`
tag. The handler scales only groups tagged with its environment and the run that declares
them. Every decision is a pure function of `spotrain.core.capacity_policy`; `aws` holds the
calls that read and act.

Nothing raises: an event that is malformed, of an unknown kind, or that fails half-way is
logged and sent to the dead-letter queue with the reason, from where it can be redriven.

Runs with boto3, the standard library and spotrain's core only (the zip ships this folder and
the core, whole).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from spotrain.constructs.interruption_handler.runtime import (
    aws,
    capacity_check,
    catalog_watch,
    clients,
    instance_events,
    settings,
)
from spotrain.core.events import CAPACITY_CHECK, KIND_OF, SOURCE_OF
from spotrain.core.handler_settings import HandlerSettings

log = logging.getLogger()
log.setLevel(logging.INFO)


class UnhandledEvent(ValueError):
    """The event is malformed or of a kind this handler does not take."""


def handle(event: Any, context: Any = None) -> dict[str, Any]:
    try:
        environment = settings.from_environment()
    except (KeyError, ValueError) as error:
        dead_letters = os.environ.get(HandlerSettings.variable("dead_letter_queue_url"))
        return reject(event, f"the handler is misconfigured: {type(error).__name__}: {error}",
                      dead_letters)  # fmt: skip
    dead_letters = environment.handler.dead_letter_queue_url
    if _is_stream_batch(event):
        try:
            return catalog_watch.on_catalog_changes(environment, event["Records"])
        except Exception as error:  # as below: to the dead letters, never a retry storm
            return reject(event, f"failed while watching the catalog: {type(error).__name__}: "
                          f"{error}", dead_letters)  # fmt: skip
    try:
        fields = parse(event)
    except UnhandledEvent as error:
        return reject(event, str(error), dead_letters)
    try:
        if fields["kind"] == CAPACITY_CHECK:
            return capacity_check.on_capacity_check(environment)
        return instance_events.on_instance_event(environment, fields)
    except Exception as error:  # the last line of defence: nothing escapes to a retry storm
        # Half-handled: the record (if written) stays; the dead-letter copy can be redriven.
        return reject(event, f"failed while handling: {type(error).__name__}: {error}",
                      dead_letters)  # fmt: skip


def _is_stream_batch(event: Any) -> bool:
    records = event.get("Records") if isinstance(event, dict) else None
    return bool(records) and all(
        isinstance(r, dict) and r.get("eventSource") == "aws:dynamodb" for r in records
    )


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
        aws.parse_time(fields["time"])  # type: ignore[arg-type]
    except ValueError as error:
        raise UnhandledEvent(f"time {fields['time']!r} is not ISO 8601: {error}") from error
    return {"kind": kind, **fields}  # type: ignore[dict-item]


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
            clients.client("sqs").send_message(
                QueueUrl=queue_url,
                MessageBody=message,
                MessageAttributes={"reason": {"DataType": "String", "StringValue": reason[:1000]}},
            )
        except (ClientError, BotoCoreError) as error:
            log.error("the dead letter could not be sent to %s: %s", queue_url, error)
    return {"rejected": reason}
