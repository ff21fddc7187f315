"""Snapshot, then write: DeepSpeed's checkpoint engine replaced by one whose `save` copies the
state into host buffers and returns (pinned memory and non-blocking copies on GPUs), and the
writers that serialise those copies later, off the training loop's time, hashing each byte
once (SHA-256 for the content address, CRC32 for S3's transfer check) on its way to a file or
straight to the store's uploaders. Buffers are kept per tier and file and reused, matched to
tensors by shape and type; buffers for the optimizer state that a first step creates are
reserved before training (`reserve`), so even the first checkpoint's stall is only a copy."""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from spotrain.core.manifest import RECORD_BYTES, Chunk, ChunkHasher, Shard

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
            # Each buffer is kept with its fit (`_fit`: shape, type, pinned), known when it
            # is allocated, so matching never asks the device about a buffer.
            self._buffers: dict[str, list[tuple[_Fit, torch.Tensor]]] = {}
            # Per tier, buffers reserved for tensors that do not exist yet (`reserve`), taken
            # by that tier's next snapshot; what it leaves is let go.
            self._reserved: dict[str, list[tuple[_Fit, torch.Tensor]]] = {}
            self.allocated_bytes = 0
            """Host buffer bytes the snapshot under way allocated: 0 once buffers are warm."""

        def create(self, info: Any) -> None:
            self.allocated_bytes = 0  # DeepSpeed starts a checkpoint

        def save(self, state_dict: Any, path: str) -> None:
            found: dict[int, torch.Tensor] = {}
            _tensors_in(state_dict, found)
            name = f"{self.tier}/{Path(path).name}"
            # The file's own buffers first, then the reserved ones, each matched by shape and
            # type in order: the same tensor gets the same buffer from one checkpoint to the
            # next even when a first step inserted new state among the old.
            fitting: dict[_Fit, list[torch.Tensor]] = defaultdict(list)
            for fit, buffer in self._buffers.get(name, []) + self._reserved.pop(self.tier, []):
                fitting[fit].append(buffer)
            buffers, memo = [], {}
            for tensor in found.values():
                source = tensor.detach()
                fit = _fit(source)
                matches = fitting[fit]
                if matches:
                    buffer = matches.pop(0)
                else:
                    buffer = _buffer_for(source)
                    self.allocated_bytes += buffer.numel() * buffer.element_size()
                buffer.copy_(source, non_blocking=source.is_cuda)
                buffers.append((fit, buffer))
                memo[id(tensor)] = buffer
            self._buffers[name] = buffers
            # What this file did not use stays reserved for the tier's other files.
            self._reserved[self.tier] = [(f, b) for f, left in fitting.items() for b in left]
            # Whatever is not a tensor (step counters, learning rates, the loss scaler) is
            # copied too: the optimizer changes it while the snapshot waits to be written.
            self.staged.append(Staged(Path(path), copy.deepcopy(state_dict, memo)))

        def reserve(self, tier: str, like: list[torch.Tensor]) -> None:
            """Allocate buffers now for tensors shaped as `like` that `tier`'s next snapshot
            will hold and that do not exist yet."""
            self._reserved[tier] = self._reserved.get(tier, []) + [
                (_fit(t), _buffer_for(t)) for t in like
            ]

        def load(self, path: str, map_location: Any = None) -> Any:
            return torch.load(path, map_location=map_location, weights_only=False)

        def commit(self, info: Any) -> bool:
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the non-blocking copies have landed
            return True

        def preserves_storage_sharing(self) -> bool:
            return False  # every tensor is copied on its own already: no need to clone first

        def take(self) -> list[Staged]:
            """The snapshot's staged files; reserved buffers it did not use are let go."""
            staged, self.staged = self.staged, []
            self._reserved.pop(self.tier, None)
            return staged

    return Snapshots()


_Fit = tuple[tuple[int, ...], torch.dtype, bool]


def _fit(source: torch.Tensor) -> _Fit:
    """What a host buffer must match to take `source`: its shape and type, and pinned memory
    for a tensor on a GPU."""
    return tuple(source.shape), source.dtype, source.is_cuda


def _buffer_for(source: torch.Tensor) -> torch.Tensor:
    return torch.empty(source.shape, dtype=source.dtype, pin_memory=source.is_cuda)


def state_a_first_step_creates(optimizer: Any) -> list[torch.Tensor]:
    """Tensors shaped as the optimizer state that the first step will create: torch's Adam
    family makes two moments shaped as each parameter and a scalar step count on that step
    (an optimizer with less leaves some unused). `optimizer` may be DeepSpeed's wrapper,
    whose ZeRO optimizers step the one they hold on their flat fp32 partitions."""
    inner = optimizer
    while not isinstance(inner, torch.optim.Optimizer) and hasattr(inner, "optimizer"):
        inner = inner.optimizer
    if not isinstance(inner, torch.optim.Optimizer):
        return []
    stepped = [p for group in inner.param_groups for p in group["params"]]
    # ZeRO-3 hands its held optimizer one partition at a time, only while stepping it.
    stepped += getattr(optimizer, "fp32_partitioned_groups_flat", None) or []
    step_count = torch.empty((), dtype=torch.float32)
    return [like for p in stepped if not inner.state.get(p) for like in (p, p, step_count)]


def _save_without_zip_checksums(state: Any, target: Any) -> None:
    """`torch.save(state, target)` without the zip's CRC32 of every record. It was most of the
    serialising thread's time: about 1.1 s of its 1.4 s per 1.5 GiB on a 2-core x86 machine
    (the rest is cutting the chunks, `bench/checkpoint.md`), and that thread is what a publish
    waits for where the uploaders have cores to hash in parallel and the training loop leaves
    the interpreter free. A checkpoint needs none of it: each chunk carries its SHA-256, checked
    on every restore, and its own CRC32 for S3's transfer check; torch.load reads a file without
    the zip's checksums as well. torch's own switch (`set_crc32_options`) is process-wide: a
    torch.save on another thread of the process (the script's own), or in a DataLoader worker
    forked meanwhile, wrote files that zip tools call corrupt. So this writer is given the
    setting itself, as torch.save makes its own (torch 2.13's serialization internals, pinned;
    tests/test_checkpoint_store.py checks the file and that the process's setting stays)."""
    import pickle

    from torch import serialization

    writer = torch._C.PyTorchFileWriter(target, False, serialization._get_storage_alignment())
    serialization._save(state, writer, pickle, serialization.DEFAULT_PROTOCOL, False)
    writer.write_end_of_file()
    target.flush()


def write_staged(staged: list[Staged], root: Path) -> list[Shard]:
    """Serialise each snapshot file under `root`, hashed as it is written."""
    shards = []
    for item in staged:
        item.path.parent.mkdir(parents=True, exist_ok=True)
        with item.path.open("wb") as target:
            writer = HashingWriter(target)
            _save_without_zip_checksums(item.state, writer)
        shards.append(writer.hasher.shard(item.path.relative_to(root).as_posix()))
    return shards


def stream_staged(staged: list[Staged], root: Path, uploader: PieceUploader) -> list[Shard]:
    """Serialise each snapshot file straight to the store: each chunk is handed to `uploader`
    as soon as it is cut (its workers hash it, in parallel), so hashing and uploading overlap
    serialising and nothing is written here."""
    shards = []
    for item in staged:
        writer = HashingWriter(hand_over=uploader.put_bytes)
        _save_without_zip_checksums(item.state, writer)
        shards.append(writer.hasher.shard(item.path.relative_to(root).as_posix()))
    return shards
