"""A machine's output to CloudWatch Logs, so on-call can read a reclaimed spot machine's boot
and training output after the machine is gone.

The boot script pipes everything it and the trainer print through `spotrain logs ship`, which
copies each line to its own output (the journal still has it) and to the run's log group
(one stream per machine) through watchtower's CloudWatch handler, every few seconds. It
outlives the trainer on purpose: SIGTERM (a spot reclaim stops the whole service) is ignored,
and it sends what is left when its input ends, after the trainer's emergency checkpoint has
been logged. CloudWatch being unreachable never stops training: lines still reach the
journal, and the handler reports the failure there.
"""

from __future__ import annotations

import logging
import signal
import sys
from typing import IO

SEND_INTERVAL_S = 5
"""At most this much output is lost with a machine that dies without warning (a spot reclaim
gives two minutes)."""


def ship(source: IO[str], *, group: str, stream: str, echo: IO[str] | None) -> None:
    """Send each line of `source` to `group`/`stream` (copying it to `echo`)."""
    import boto3
    import watchtower

    handler = watchtower.CloudWatchLogHandler(
        log_group_name=group,
        log_stream_name=stream,
        boto3_client=boto3.client("logs"),
        create_log_group=False,  # Terraform made it: encrypted, with its retention
        send_interval=SEND_INTERVAL_S,
    )
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.Logger(f"spotrain.machine_logs.{stream}")
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
