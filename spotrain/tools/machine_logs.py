"""A machine's output to CloudWatch Logs, so on-call can read a reclaimed spot machine's boot
and training output after the machine is gone.

The boot script pipes everything it and the trainer print through `spotrain logs ship`, which
copies each line to its own output (the journal still has it) and to the run's log group
(one stream per machine) through watchtower's CloudWatch handler, every few seconds. It
outlives the trainer on purpose: SIGTERM (a spot reclaim stops the whole service) is ignored,
and it sends what is left when its input ends, after the trainer's emergency checkpoint has
been logged. CloudWatch being unreachable never stops training: lines still reach the
journal, and the handler reports the failure there.

Before it reads a line it creates the machine's stream (with the only calls the machine's role
may make): a log group that does not exist, or a name CloudWatch refuses, ends it at once with
one message and a non-zero exit, so the boot script's `|| cat` takes the whole output to the
journal instead of a shipper that would drop every line.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
from typing import IO, Any

from spotrain.core.errors import SpotrainError

SEND_INTERVAL_S = 5
"""At most this much output is lost with a machine that dies without warning (a spot reclaim
gives two minutes)."""


_GROUP_NAME = re.compile(r"[.\-_/#A-Za-z0-9]{1,512}")
_STREAM_NAME = re.compile(r"[^:*]{1,512}")


def check_names(group: str, stream: str) -> None:
    """SpotrainError unless CloudWatch takes these names."""
    if not _GROUP_NAME.fullmatch(group):
        raise SpotrainError(f"--group {group!r} is not a log group name: give the run's log "
                            "group (the run stack's output machine_log_group)")  # fmt: skip
    if not _STREAM_NAME.fullmatch(stream):
        raise SpotrainError(f"--stream {stream!r} is not a log stream name: 1-512 "
                            "characters without ':' or '*' (the boot script gives the "
                            "instance id)")  # fmt: skip


def create_stream(client: Any, group: str, stream: str) -> None:
    """Create `stream` in `group` (it may be there already), or SpotrainError when the group
    does not exist."""
    from botocore.exceptions import ClientError

    try:
        client.create_log_stream(logGroupName=group, logStreamName=stream)
    except ClientError as error:
        code = error.response["Error"]["Code"]
        if code == "ResourceAlreadyExistsException":
            return
        if code == "ResourceNotFoundException":
            raise SpotrainError(f"log group {group} does not exist: give the run's log group "
                                "(the run stack's output machine_log_group)") from None  # fmt: skip
        raise


def ship(source: IO[str], *, group: str, stream: str, echo: IO[str] | None) -> None:
    """Send each line of `source` to `group`/`stream` (copying it to `echo`)."""
    import watchtower

    from spotrain.core import aws_clients

    check_names(group, stream)  # before a client, which needs a region
    client = aws_clients.client("logs")
    create_stream(client, group, stream)
    handler = watchtower.CloudWatchLogHandler(
        log_group_name=group,
        log_stream_name=stream,
        boto3_client=client,
        create_log_group=False,  # Terraform made it: encrypted, with its retention
        send_interval=SEND_INTERVAL_S,
    )
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.Logger(f"spotrain.tools.machine_logs.{stream}")
    logger.addHandler(handler)
    try:
        for line in source:
            if echo is not None:
                echo.write(line)
                echo.flush()
            if line.strip():  # CloudWatch takes no empty message, and a blank line says nothing
                logger.info(line.rstrip("\n"))
    finally:
        handler.close()  # sends what is queued


def main_ship(group: str, stream: str, echo: bool) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the input's end decides when we are done
    ship(sys.stdin, group=group, stream=stream, echo=sys.stdout if echo else None)
    return 0
