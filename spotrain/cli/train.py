"""`spotrain train CONFIG`: check the configuration, then hand the process to torchrun over the
trainer, or over the run's own script when the configuration names an entry point (one
machine, or one node of many)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from spotrain.cli.arguments import whole
from spotrain.cli.output import say
from spotrain.core.entry_point import EntryPoint
from spotrain.core.errors import SpotrainError

DEFAULT_SHUTDOWN_TIMEOUT_S = 90


MAX_REGROUPS = 20


def _nnodes(text: str) -> str:
    """N, or MIN:MAX, machines (whole numbers, 1 <= MIN <= MAX)."""
    parts = text.split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) not in (1, 2) or min(numbers) < 1 or numbers != sorted(numbers):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give N machines, or MIN:MAX for an elastic run (1 <= MIN <= MAX)"
        )
    return text


def _endpoint(text: str) -> str:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: write HOST:PORT, e.g. 10.0.1.5:29400")
    return text


def torchrun_command(args: argparse.Namespace, entry_point: EntryPoint | None = None) -> list[str]:
    """The torchrun command line `spotrain train` runs: over the built-in trainer, or over the
    run's own `entry_point`."""
    launcher = [sys.executable, "-m", "spotrain.trainer.launch",  # torchrun, repaired
                "--nproc-per-node", str(args.nproc_per_node),
                # SIGTERM -> emergency checkpoint -> exit: torchrun must wait that long before
                # it SIGKILLs the ranks (its own default is 30 s).
                "--shutdown-timeout", str(args.shutdown_timeout)]  # fmt: skip
    if args.nnodes == "1":
        launcher.append("--standalone")
    else:
        if not args.rdzv_endpoint:
            raise SpotrainError(
                f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (the coordinator's "
                "address that every node can reach)"
            )
        rdzv_conf = [f"last_call_timeout={args.rdzv_last_call}"]
        if args.rdzv_host is not None:
            # Said, not guessed: torch guesses from the endpoint's address, and every machine
            # played on one host (all on loopback) would otherwise race to host the store.
            rdzv_conf.append(f"is_host={str(args.rdzv_host).lower()}")
        launcher += ["--nnodes", args.nnodes, "--rdzv-backend", "c10d",
                     "--rdzv-endpoint", args.rdzv_endpoint, "--rdzv-id", args.rdzv_id,
                     # A machine of the group that leaves (its ranks exit 0) or stays while
                     # another leaves (they exit REJOIN_EXIT) re-forms the group this many
                     # times before torchrun gives up.
                     "--max-restarts", str(MAX_REGROUPS),
                     "--rdzv-conf", ",".join(rdzv_conf)]  # fmt: skip
    if entry_point is not None:  # the run's own script, each rank under the same launch
        return [*launcher, "-m", "spotrain.trainer.entry_point", *entry_point.target, "--",
                *entry_point.args]  # fmt: skip
    launcher += ["-m", "spotrain.trainer.train", str(args.config)]
    for override in args.set:
        launcher += ["--set", override]
    return launcher


def cmd_train(args: argparse.Namespace) -> int:
    from spotrain.trainer import entry_point
    from spotrain.trainer.preflight import preflight
    from spotrain.trainer.train import load_any

    entry = None
    config = load_any(args.config, args.set)  # every problem now, before any process starts
    if isinstance(config, entry_point.EntryPointConfig):  # the run's own script
        # Its code (fetched when the run names a bundle), script, store and folder, before any
        # rank; the ranks run in the code's folder.
        os.chdir(entry_point.preflight(config))
        # The run's coordinates reach the script's Checkpointer as environment variables.
        os.environ.update(config.environment())
        entry = config.entry_point
    else:
        preflight(config)  # and the store, data and folders, before any rank takes the lease
    run = config.run
    if args.nproc_per_node is None:
        import torch

        args.nproc_per_node = torch.cuda.device_count() or 1
    command = torchrun_command(args, entry)
    say(f"training {run}: {' '.join(command[1:])}")
    sys.stdout.flush()
    os.execv(sys.executable, command)  # torchrun takes this process: signals reach it directly
    return 0  # not reached


def add_parsers(commands: Any) -> None:
    train = commands.add_parser("train", help="train: torchrun over spotrain.trainer")
    train.add_argument("config", type=Path, help="training configuration (JSON)")
    train.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                       help="override one configuration field (model.width=128)")  # fmt: skip
    train.add_argument("--nproc-per-node", type=whole(1),
                       help="ranks on this machine (default: its GPUs, or 1 without)")  # fmt: skip
    train.add_argument("--nnodes", default="1", type=_nnodes,
                       help="machines: N, or MIN:MAX for an elastic run")  # fmt: skip
    train.add_argument("--rdzv-endpoint", type=_endpoint,
                       help="HOST:PORT every machine meets at (nnodes > 1)")  # fmt: skip
    train.add_argument("--rdzv-id", default="spotrain", help="rendezvous id shared by the run")
    train.add_argument("--rdzv-host", action=argparse.BooleanOptionalAction,
                       help="this machine hosts the rendezvous (the run's coordinator), or not; "
                       "default: when the endpoint's address is this machine's")  # fmt: skip
    train.add_argument("--rdzv-last-call", type=whole(1), default=30,
                       help="seconds the rendezvous waits for more machines once the fewest "
                       "it needs have come")  # fmt: skip
    train.add_argument("--shutdown-timeout", type=whole(1), default=DEFAULT_SHUTDOWN_TIMEOUT_S,
                       help="seconds between SIGTERM and SIGKILL of the ranks; longer than an "
                       "emergency checkpoint takes to publish")  # fmt: skip
    train.set_defaults(handler=cmd_train)
