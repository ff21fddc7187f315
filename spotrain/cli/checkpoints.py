"""`spotrain checkpoints list|show|verify|restore|gc|quarantine|rollback|wait|move`: a run's
checkpoints, through `RunCheckpoints`, the part of the training run's `Checkpointer` that needs
no PyTorch (the same restore policy, the same writer lease)."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotrain.cli.arguments import number, run_name, whole
from spotrain.cli.output import say
from spotrain.core.errors import SpotrainError


def _checkpointer(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from spotrain.trainer.run_checkpoints import RunCheckpoints  # no PyTorch: the base install

    run_name(args.run)
    owner = f"spotrain checkpoints {args.action} ({os.environ.get('USER', 'unknown')})"
    return RunCheckpoints.open(run=args.run, store=args.store, catalog_table=args.catalog_table,
                               kms_key_id=args.kms_key_id, lease_owner=owner, say=say)  # fmt: skip


def _list(checkpointer: Any, args: argparse.Namespace) -> int:
    head = checkpointer.head()
    entries = checkpointer.entries()
    if not entries:
        say(f"run {args.run!r} has no checkpoints in {checkpointer.storage.uri}")
        return 1
    say(f"{'step':>10}  {'status':<12} {'bytes':>14}  parent")
    for entry in entries:
        marker = "  <- head" if head is not None and entry.step == head.step else ""
        reason = f"  ({entry.reason})" if entry.reason and entry.status != "COMPLETE" else ""
        say(f"{entry.step:>10}  {entry.status:<12} {entry.total_bytes:>14,}  "
            f"{entry.parent or '-'}{marker}{reason}")  # fmt: skip
    return 0


def _collect(checkpointer: Any, args: argparse.Namespace) -> int:
    report = checkpointer.collect_garbage(args.keep)
    say(f"kept steps {report.kept}; collected {report.collected or 'nothing'}; "
        f"freed {report.freed_bytes:,} bytes")  # fmt: skip
    return 0


def _restore(checkpointer: Any, args: argparse.Namespace) -> int:
    if not args.to:
        raise SpotrainError("restore needs --to DIR (an empty or new folder, or one an "
                            "earlier restore of this run filled)")  # fmt: skip
    result = checkpointer.restore_into(Path(args.to), roll_back=not args.no_roll_back)
    say(f"restored step {result.manifest.step} ({result.manifest.total_bytes:,} bytes, "
        f"{len(result.manifest.shards)} files) into {args.to}")  # fmt: skip
    if result.fell_back and result.rolled_back_from is None:
        say(f"the head is still step {result.head_step}: "
            + ("--no-roll-back was given" if args.no_roll_back else
               "the catalog could not be read"))  # fmt: skip
    return 0


def _step_and_reason(args: argparse.Namespace) -> None:
    if args.step is None or not (args.reason or "").strip():
        raise SpotrainError(f"{args.action} needs --step N and --reason TEXT (kept with the "
                            "checkpoint for whoever looks next)")  # fmt: skip


def _quarantine(checkpointer: Any, args: argparse.Namespace) -> int:
    _step_and_reason(args)
    checkpointer.quarantine(args.step, args.reason)
    say(f"step {args.step} quarantined: restores pass over it")
    return 0


def _roll_back(checkpointer: Any, args: argparse.Namespace) -> int:
    _step_and_reason(args)
    undone = checkpointer.roll_back(args.step, args.reason)  # a writer still running: stale
    say(f"head of {args.run} is step {args.step}; rolled back {undone or 'nothing'}")
    return 0


def _show(checkpointer: Any, args: argparse.Namespace) -> int:
    say(checkpointer.manifest(checkpointer.entry_at(args.step)).to_json().decode())
    return 0


def _verify(checkpointer: Any, args: argparse.Namespace) -> int:
    entry = checkpointer.entry_at(args.step)
    with tempfile.TemporaryDirectory() as scratch:
        manifest, notes = checkpointer.verify(entry, Path(scratch) / "shards")
    for note in notes:
        say(f"damaged copy (another copy of the same bytes is good): {note}")
    copies = sum(len(s.stored_keys) for s in manifest.shards)
    say(f"step {entry.step}: all {len(manifest.shards)} files present and match their SHA-256 "
        f"({copies} stored objects checked)")  # fmt: skip
    return 0


def _move(checkpointer: Any, args: argparse.Namespace) -> int:
    if not (args.reason or "").strip():
        raise SpotrainError("move needs --reason TEXT (kept with the run's new epoch)")
    with tempfile.TemporaryDirectory() as scratch:  # the check's restore, not kept
        claim, passed_over = checkpointer.move_here(args.reason, Path(scratch) / "restored")
    for step, why in passed_over:
        say(f"passed over step {step}: {why}")
    say(f"run {args.run} moved to {claim.id.region} (epoch {claim.id.number}) from step "
        f"{claim.base_step}: it trains there from that checkpoint; writers elsewhere are "
        "fenced (what they publish from now on is listed FENCED, never restored)")  # fmt: skip
    return 0


WAIT_POLL_S = 5.0


def _wait(checkpointer: Any, args: argparse.Namespace) -> int:
    """Until the run publishes a checkpoint past `--past` (default: its head now): proof that
    its machines train, not only that they are up. A crash of its machines meanwhile (with
    --events-table) or nothing within `--within` minutes fails at once, saying why."""
    from spotrain.core import aws_clients, fleet_state

    head = checkpointer.head()
    past = args.past if args.past is not None else (head.step if head else 0)
    events = (
        aws_clients.resource("dynamodb").Table(args.events_table) if args.events_table else None
    )
    crashes = fleet_state.run_state(events, args.run).crashes if events is not None else 0
    say(f"waiting for run {args.run} to publish a checkpoint past step {past} "
        f"(within {args.within:g} min)")  # fmt: skip
    deadline = time.monotonic() + args.within * 60
    while True:
        head = checkpointer.head()
        if head is not None and head.step > past:
            say(f"step {head.step} published: run {args.run} trains")
            return 0
        if events is not None and fleet_state.run_state(events, args.run).crashes > crashes:
            crash = fleet_state.last_crash(events, args.run)
            raise SpotrainError(
                f"run {args.run} crashed while waiting"
                + (f" ({fleet_state.crash_line(crash)})" if crash else "")
                + ": its machines are up but do not train; read the machine's journal "
                "(`spotrain run logs ENV RUN --machine ID`) and fix the cause"
            )  # fmt: skip
        if time.monotonic() > deadline:
            raise SpotrainError(
                f"run {args.run} published nothing past step {past} within {args.within:g} "
                "min: see `spotrain run status ENV RUN` (its machines, crashes and phase) "
                "and the machines' journal (`spotrain run logs ENV RUN`)"
            )  # fmt: skip
        time.sleep(WAIT_POLL_S)


ACTIONS: dict[str, Callable[[Any, argparse.Namespace], int]] = {
    "list": _list, "show": _show, "verify": _verify, "restore": _restore, "gc": _collect,
    "quarantine": _quarantine, "rollback": _roll_back, "wait": _wait, "move": _move,
}  # fmt: skip


def cmd_checkpoints(args: argparse.Namespace) -> int:
    return ACTIONS[args.action](_checkpointer(args), args)


def add_parsers(commands: Any) -> None:
    checkpoints = commands.add_parser("checkpoints", help="a run's checkpoints")
    checkpoints.add_argument("action", choices=list(ACTIONS), help="what to do")
    checkpoints.add_argument(
        "--store", required=True, help="where checkpoints live: s3://BUCKET or file:///PATH"
    )
    checkpoints.add_argument("--run", required=True, help="run name")
    checkpoints.add_argument("--catalog-table", help="DynamoDB catalog table (default: manifests)")
    checkpoints.add_argument(
        "--step",
        type=whole(0),
        help="checkpoint step for show/verify (default: head), quarantine, rollback (the step "
        "that becomes the head)",
    )
    checkpoints.add_argument(
        "--to",
        help="restore: folder to restore into (empty, new, or an earlier restore of the run)",
    )
    checkpoints.add_argument(
        "--no-roll-back",
        action="store_true",
        help="restore: leave the head where it is even when the restore fell back past damaged "
        "checkpoints (by default the head moves back, as when a run restarts, fencing any "
        "writer still running)",
    )
    checkpoints.add_argument("--reason", help="quarantine/rollback/move: why, kept in the catalog")
    checkpoints.add_argument(
        "--kms-key-id", help="the bucket's KMS key, for actions that write to an s3:// store"
    )
    checkpoints.add_argument(
        "--keep", type=whole(2), default=2, help="gc: complete checkpoints to keep (2 or more)"
    )
    checkpoints.add_argument(
        "--past", type=whole(0), help="wait: the step to publish past (default: the head now)"
    )
    checkpoints.add_argument(
        "--within", type=number(), default=30.0, help="wait: minutes before it fails (default 30)"
    )
    checkpoints.add_argument(
        "--events-table", help="wait: the environment's events table, to fail at a crash"
    )
    checkpoints.set_defaults(handler=cmd_checkpoints)
