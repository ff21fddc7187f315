"""`spotrain logs ship`: a machine's output to its CloudWatch log stream (the boot script pipes
everything through it)."""

from __future__ import annotations

import argparse
from typing import Any

from spotrain.core.errors import aws_errors


def cmd_logs(args: argparse.Namespace) -> int:
    from spotrain.tools import machine_logs

    with aws_errors(f"the log stream {args.group}/{args.stream} cannot be opened",
                    "check --group, AWS_DEFAULT_REGION and the machine's credentials"):  # fmt: skip
        return machine_logs.main_ship(args.group, args.stream, args.echo)


def add_parsers(commands: Any) -> None:
    logs = commands.add_parser(
        "logs", help="a machine's output to the run's CloudWatch log group (the boot script)"
    )
    logs.add_argument("action", choices=["ship"],
                      help="ship: send standard input, line by line, to the stream")  # fmt: skip
    logs.add_argument("--group", required=True, help="log group (a run stack's machine_log_group)")
    logs.add_argument("--stream", required=True, help="log stream, e.g. the instance id")
    logs.add_argument("--echo", action="store_true",
                      help="also copy each line to standard output (the journal)")  # fmt: skip
    logs.set_defaults(handler=cmd_logs)
