"""Snapshot, then write: DeepSpeed's checkpoint engine replaced by one whose `save` copies the
state into host buffers and returns (pinned memory and non-blocking copies on GPUs), and the
writers that serialise those copies later, off the training loop's time, hashing each byte
once (SHA-256 for the content address, CRC32 for S3's transfer check) on its way to a file or
straight to the store's uploaders. Buffers are kept per tier and file and reused."""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from spotrain.trainer.manifest import RECORD_BYTES, Chunk, ChunkHasher, Shard

if TYPE_CHECKING:
    from spotrain.trainer.checkpoint_store import PieceUploader


class HashingWriter:
    """Where torch.save writes: the bytes are cut into chunks and each byte is hashed once,
    into its chunk's SHA-256 (the content address) and CRC32 (the upload's checksum), on its
    way to a file, or (`hand_over`) by the uploaders that take each chunk to the store, never
    touching the disk."""

    def __init__(
        self, target: Any = None, hand_over: Callable[[bytes], Future[Chunk]] | None = None
    ) -> None:
        self.target, self.hasher = target, ChunkHasher(hand_over=hand_over)

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        self.hasher.update(data, alone=size >= RECORD_BYTES)
        return int(self.target.write(data)) if self.target is not None else size

    def flush(self) -> None:
        if self.target is not None:
            self.target.flush()


def _tensors_in(item: Any, found: dict[int, torch.Tensor]) -> None:
    if isinstance(item, torch.Tensor):
        found.setdefault(id(item), item)
    elif isinstance(item, dict):
        for value in item.values():
            _tensors_in(value, found)
    elif isinstance(item, (list, tuple)):
        for value in item:
            _tensors_in(value, found)


@dataclass
class Staged:
    path: Path
    """Where DeepSpeed meant the file to go."""
    state: Any
    """A copy of what it meant to write: tensors in host buffers, everything else deep-copied."""


def make_snapshot_engine() -> Any:
    """DeepSpeed's checkpoint engine, replaced: `save` copies the state into host buffers and
    returns; `Checkpointer` writes the copies later, off the training loop's time."""
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

    class Snapshots(CheckpointEngine):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.name = "spotrain-snapshots"
            self.staged: list[Staged] = []
            self.tier = "save"
            # One set of buffers per tier and file name, reused by that tier's next checkpoint
            # (a full one is never snapshot while the previous is still being written):
            # allocating (and on GPUs pinning) them costs more than the copy itself.
            self._buffers: dict[str, list[torch.Tensor]] = {}

        def create(self, info: Any) -> None:
            pass

        def save(self, state_dict: Any, path: str) -> None:
            found: dict[int, torch.Tensor] = {}
            _tensors_in(state_dict, found)
            buffers = self._buffers.setdefault(f"{self.tier}/{Path(path).name}", [])
            memo: dict[int, Any] = {}
            for index, tensor in enumerate(found.values()):
                source = tensor.detach()
                if index == len(buffers) or not _fits(buffers[index], source):
                    buffer = torch.empty(source.shape, dtype=source.dtype,
                                         pin_memory=source.is_cuda)  # fmt: skip
                    buffers[index:index + 1] = [buffer]  # fmt: skip
                buffers[index].copy_(source, non_blocking=source.is_cuda)
                memo[id(tensor)] = buffers[index]
            # Whatever is not a tensor (step counters, learning rates, the loss scaler) is
            # copied too: the optimizer changes it while the snapshot waits to be written.
            self.staged.append(Staged(Path(path), copy.deepcopy(state_dict, memo)))

        def load(self, path: str, map_location: Any = None) -> Any:
            return torch.load(path, map_location=map_location, weights_only=False)

        def commit(self, info: Any) -> bool:
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the non-blocking copies have landed
            return True

        def preserves_storage_sharing(self) -> bool:
            return False  # every tensor is copied on its own already: no need to clone first

        def take(self) -> list[Staged]:
            staged, self.staged = self.staged, []
            return staged

    return Snapshots()


def _fits(buffer: torch.Tensor, source: torch.Tensor) -> bool:
    return buffer.shape == source.shape and buffer.dtype == source.dtype


def write_staged(staged: list[Staged], root: Path) -> list[Shard]:
    """Serialise each snapshot file under `root`, hashed as it is written."""
    shards = []
    for item in staged:
        item.path.parent.mkdir(parents=True, exist_ok=True)
        with item.path.open("wb") as target:
            writer = HashingWriter(target)
            torch.save(item.state, writer)
        shards.append(writer.hasher.shard(item.path.relative_to(root).as_posix()))
    return shards


def stream_staged(staged: list[Staged], root: Path, uploader: PieceUploader) -> list[Shard]:
    """Serialise each snapshot file straight to the store: each chunk is handed to `uploader`
    as soon as it is cut (its workers hash it, in parallel), so hashing and uploading overlap
    serialising and nothing is written here."""
    shards = []
    for item in staged:
        writer = HashingWriter(hand_over=uploader.put_bytes)
        torch.save(item.state, writer)
        shards.append(writer.hasher.shard(item.path.relative_to(root).as_posix()))
    return shards
