"""`spotrain run logs ENV RUN [--machine ID] [--follow]`: what a run's machines printed, from
the run's CloudWatch log group, where each machine's boot script ships everything (one stream
per instance, `spotrain logs ship`). A machine that is gone, reclaimed or cancelled, is still
there: on-call reads why it left after it left.

Every machine's lines, each after its instance id, in the order CloudWatch received them; with
`--machine`, one machine's lines alone. `--follow` keeps reading until the run stops (finished,
cancelled or held, with no machine in service) or Ctrl-C."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from typing import Any

from spotrain.cli.output import say
from spotrain.core.errors import SpotrainError

FOLLOW_POLL_S = 2.0
"""Between reads of new lines while following."""
STOPPED_CHECK_S = 10.0
"""Between checks of whether the followed run has stopped."""
LOOKBACK_MS = 60_000
"""While following, lines this much older than the newest one seen are read again (and
printed only if new): each machine ships its lines in batches, so one machine's batch may
arrive after another's newer lines."""


def machine_log_group(environment: str, run: str) -> str:
    from spotrain.core import resource_names as names

    return names.machine_log_group(names.fleet_group(environment, run))


def _events(client: Any, group: str, streams: list[str] | None, start_ms: int | None,
            ) -> Iterator[dict[str, Any]]:  # fmt: skip
    """Every event of `group` (of `streams` only, if given) from `start_ms` on."""
    request: dict[str, Any] = {"logGroupName": group}
    if streams:
        request["logStreamNames"] = streams
    if start_ms is not None:
        request["startTime"] = start_ms
    for page in client.get_paginator("filter_log_events").paginate(**request):
        yield from page["events"]


def _check_the_stream(client: Any, group: str, machine: str, run: str, env: str) -> None:
    found = client.describe_log_streams(logGroupName=group, logStreamNamePrefix=machine)
    if not any(s["logStreamName"] == machine for s in found["logStreams"]):
        raise SpotrainError(f"machine {machine} wrote nothing to run {run}'s log group {group}: "
                            f"`spotrain run logs {env} {run}` shows every machine's lines, "
                            "each after its instance id")  # fmt: skip


def show(where: Any, args: argparse.Namespace,
         stopped: Callable[[], bool] | None = None) -> int:  # fmt: skip
    """Print the run's lines; while following, `stopped()` says whether the run has stopped."""
    from botocore.exceptions import ClientError

    from spotrain.core import aws_clients

    client = aws_clients.client("logs", where.region)
    group = machine_log_group(where.environment, args.run)
    try:
        client.describe_log_streams(logGroupName=group, limit=1)
    except ClientError as error:
        if error.response["Error"]["Code"] != "ResourceNotFoundException":
            raise
        raise SpotrainError(f"run {args.run} has no log group in environment "
                            f"{where.environment} ({group}): its stack is not deployed; "
                            f"`spotrain run submit {where.environment} {args.run}` deploys "
                            "it") from None  # fmt: skip
    if args.machine:
        _check_the_stream(client, group, args.machine, args.run, where.environment)
    streams = [args.machine] if args.machine else None
    seen: dict[str, int] = {}  # event id -> its time, within the lookback
    newest_ms: int | None = None
    next_stop_check = time.monotonic() + STOPPED_CHECK_S
    printed, last_pass = 0, not args.follow
    try:
        while True:
            start = None if newest_ms is None else newest_ms - LOOKBACK_MS
            for event in _events(client, group, streams, start):
                if event["eventId"] in seen:
                    continue
                seen[event["eventId"]] = int(event["timestamp"])
                newest_ms = max(newest_ms or 0, int(event["timestamp"]))
                message = str(event["message"]).rstrip("\n")
                say(message if args.machine else f"{event['logStreamName']}  {message}")
                printed += 1
            if last_pass:
                break
            if newest_ms is not None:
                seen = {k: t for k, t in seen.items() if t >= newest_ms - LOOKBACK_MS}
            if time.monotonic() >= next_stop_check:
                next_stop_check = time.monotonic() + STOPPED_CHECK_S
                last_pass = stopped is not None and stopped()  # one more read, then done
            time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        pass
    if not printed and not args.follow:
        say(f"run {args.run}'s machines wrote nothing yet to {group}")
    return 0
