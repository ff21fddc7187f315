"""Light checkpoints: the local tier.

Full checkpoints go to the store and outlive the machine. Light ones stay on the machine's work
disk: they cost only the local save (no upload), and they outlive what kills the training
processes but not the machine: a crash, an out-of-memory kill, a restart by the boot service.
A light checkpoint is complete once its local manifest (every file with its SHA-256) is in
place, written by rename. It records the published checkpoint it descends from; a restart uses
it only if that is still the run's published head (so a machine whose lease passed to another
start never forks the run's history), only if every machine of the run has it, only if the
same number of ranks wrote it, and only if every file still verifies. Otherwise the run
restores from the store as usual.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spotrain.core.manifest import Shard, describe_file
from spotrain.trainer.checkpoint_store import describe_folder

MANIFEST = "light-manifest.json"


@dataclass(frozen=True)
class LightCheckpoint:
    step: int
    parent: str | None
    """Id of the published checkpoint this one descends from (None: nothing published yet)."""
    world_size: int
    """Ranks that wrote it: only the same number can load it."""
    folder: Path
    """DeepSpeed checkpoint root holding the tag `step_<step>`."""
    config: dict[str, Any] | None = None
    """The run's definition it was trained with (TrainConfig.definition)."""


def seal(
    folder: Path, *, step: int, parent: str | None, world_size: int,
    config: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """Mark the light checkpoint in `folder` complete (run after every rank wrote its files)."""
    shards = [asdict(s) for s in describe_folder(folder)]
    partial = folder / f".{MANIFEST}.partial"
    document = {"step": step, "parent": parent, "world_size": world_size, "shards": shards,
                "config": config}  # fmt: skip
    partial.write_text(json.dumps(document))
    os.replace(partial, folder / MANIFEST)


def newest(root: Path) -> LightCheckpoint | None:
    """The newest complete light checkpoint under `root` whose files all verify."""
    for folder in sorted(root.glob("step_*"), reverse=True):
        try:
            document = json.loads((folder / MANIFEST).read_text())
            shards = [Shard(**{**s, "chunks": ()}) for s in document["shards"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # never sealed (the process died while saving), or unreadable
        if all(_intact(folder / s.name, s) for s in shards):
            return LightCheckpoint(
                int(document["step"]), document["parent"], int(document["world_size"]), folder,
                document.get("config"),
            )  # fmt: skip
    return None


def _intact(path: Path, shard: Shard) -> bool:
    return (
        path.is_file()
        and path.stat().st_size == shard.size
        and describe_file(path, shard.name).sha256 == shard.sha256
    )


def prune(root: Path, *, keep: int | None) -> None:
    """Remove every light checkpoint under `root` older than step `keep` (all if None);
    newer ones may still be being written."""
    for folder in root.glob("step_*"):
        if keep is None or int(folder.name.removeprefix("step_")) < keep:
            shutil.rmtree(folder, ignore_errors=True)


def usable_step(
    offers: list[tuple[int, str | None] | None], head_step: int | None, head_id: str | None
) -> int | None:
    """The light step to restore, given each machine's newest (step, parent), or None: every
    machine must offer the same step, descended from the current head and newer than it."""
    if not offers or any(offer is None for offer in offers):
        return None
    if len(set(offers)) != 1:
        return None
    step, parent = offers[0]  # type: ignore[misc]
    if parent != head_id or step <= (head_step or 0):
        return None
    return step
