"""A checkpoint's manifest, and where a run's objects live in the store.

Shards are stored content-addressed (`runs/<run>/shards/<sha256>`), so a shard whose bytes did
not change since an earlier checkpoint (frozen layers, embeddings) is not uploaded again; the
manifest maps each shard's file name in the checkpoint folder to its digest, its size and the
objects that hold those bytes. A shard that two checkpoints share is kept in two objects (the
second at `runs/<run>/shards/<sha256>.<copy id>`), so one damaged object cannot make every
checkpoint that shares it unrestorable.

A file larger than `CHUNK_BYTES`, or one the trainer cut at its tensors, is stored as chunks,
each content-addressed the same way, so a checkpoint whose files change only in part (frozen
layers: DeepSpeed writes every parameter of a rank into the same file, the same way each time)
stores only the chunks that changed. A chunked file's digest is the SHA-256 of its chunks'
digests (hex, in order); a file of one chunk has the SHA-256 of its bytes, as before chunks.

Nothing in a run's prefix is ever overwritten: a manifest's key carries the digest of its own
bytes (`checkpoints/step_<n>/manifest-<digest>.json`), so a second writer of the same step
writes a second manifest beside the first, never over it, and a damaged manifest shows itself.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import uuid
import zlib
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spotrain.core.catalog_schema import checkpoint_id, checkpoint_tag, configs_prefix, run_prefix
from spotrain.core.errors import SpotrainError


def crc32_text(value: int) -> str:
    """A CRC32 as S3 writes it: base64 of the 4 big-endian bytes."""
    return base64.b64encode(value.to_bytes(4, "big")).decode()


FORMAT_VERSION = 3
READABLE_VERSIONS = (2, 3)
"""Version 2 manifests (whole-file objects only) read as version 3 ones without chunks."""
CHUNK_BYTES = 4 * 1024 * 1024
"""Largest chunk. Smaller chunks reuse more of a partly changed file but cost a request each.
The trainer also cuts a chunk before and after every tensor of `RECORD_BYTES` or more as it
serialises (torch.save writes each tensor's bytes in one piece), so a file's chunks follow its
tensors and an unchanged tensor is reused whole (bench/checkpoint.md); a file read from disk
is cut every CHUNK_BYTES."""
RECORD_BYTES = 256 * 1024
_MANIFEST_DIGEST_CHARS = 16
_MANIFEST_NAME = re.compile(r"/manifest-([0-9a-f]{16})\.json$")


class ManifestError(SpotrainError, ValueError):
    """The manifest is malformed, damaged, or of an unknown format version."""


@dataclass(frozen=True)
class Chunk:
    """A fixed-size piece of a file (the last one may be shorter), stored on its own."""

    sha256: str
    size: int
    crc32: str
    keys: tuple[str, ...] = ()
    """Objects holding these bytes, each a full copy (restore tries them in order)."""


@dataclass(frozen=True)
class Shard:
    name: str
    """Path of the file inside the checkpoint folder, '/'-separated."""
    sha256: str
    size: int
    crc32: str = ""
    """CRC32 of the bytes, base64 of the big-endian value, as S3 reports full-object CRC32s:
    compared with the checksum the store computed, it tells whether a stored object holds
    these bytes without downloading it."""
    keys: tuple[str, ...] = ()
    """Objects in the store holding these bytes, each a full copy (restore tries them in order);
    empty for a chunked file."""
    chunks: tuple[Chunk, ...] = ()
    """A file larger than CHUNK_BYTES: its chunks, in order, each stored on its own."""

    @property
    def pieces(self) -> tuple[Chunk, ...]:
        """What is stored for this file: its chunks, or the file as one piece."""
        return self.chunks or (Chunk(self.sha256, self.size, self.crc32, self.keys),)

    @property
    def stored_keys(self) -> tuple[str, ...]:
        return tuple(key for piece in self.pieces for key in piece.keys)


class ChunkHasher:
    """A file cut into chunks (CHUNK_BYTES at most) as it streams past, in pieces of any size,
    and each chunk's digests: SHA-256 and CRC32, each byte hashed once, here or (`hand_over`)
    by whoever takes the chunk's bytes. The chunks' sizes go into the manifest, so where they
    were cut needs no rule to be checked later."""

    def __init__(
        self, chunk_bytes: int | None = None,
        hand_over: Callable[[bytes], Future[Chunk]] | None = None,
    ) -> None:  # fmt: skip
        """`hand_over(chunk's bytes)`: called as each chunk is complete, instead of hashing it
        here; its future gives the chunk's digests (a pool of uploaders hashes in parallel
        what one serialising thread produces)."""
        self.chunk_bytes = chunk_bytes or CHUNK_BYTES
        self.done: list[Chunk | Future[Chunk]] = []
        self._sha, self._crc, self._size = hashlib.sha256(), 0, 0
        self._hand_over = hand_over
        self._bytes = bytearray()

    def update(self, data: bytes | memoryview, *, alone: bool = False) -> None:
        """`alone`: these bytes (one tensor's, as torch.save writes them) begin a chunk and
        end one, so a tensor that did not change makes the same chunks wherever its
        neighbours changed."""
        if alone and self._size:
            self._close_chunk()
        self._feed(memoryview(data).cast("B"))
        if alone and self._size:
            self._close_chunk()

    def _feed(self, view: memoryview) -> None:
        while view.nbytes:
            take = min(view.nbytes, self.chunk_bytes - self._size)
            if self._hand_over is None:
                self._sha.update(view[:take])
                self._crc = zlib.crc32(view[:take], self._crc)
            elif not self._size and take == self.chunk_bytes:
                # A whole chunk in one piece (most of a large tensor's): one copy, not two.
                self.done.append(self._hand_over(bytes(view[:take])))
                view = view[take:]
                continue
            else:
                self._bytes += view[:take]
            self._size += take
            view = view[take:]
            if self._size == self.chunk_bytes:
                self._close_chunk()

    def _close_chunk(self) -> None:
        if self._hand_over is not None:
            self.done.append(self._hand_over(bytes(self._bytes)))
            self._bytes = bytearray()
        else:
            self.done.append(Chunk(self._sha.hexdigest(), self._size, crc32_text(self._crc)))
        self._sha, self._crc, self._size = hashlib.sha256(), 0, 0

    def shard(self, name: str) -> Shard:
        """The file as a shard: one piece, or its chunks."""
        if self._size or not self.done:
            self._close_chunk()
        done, self.done = self.done, []
        chunks = [c.result() if isinstance(c, Future) else c for c in done]
        if len(chunks) == 1:
            return Shard(name, chunks[0].sha256, chunks[0].size, chunks[0].crc32)
        root = hashlib.sha256("".join(c.sha256 for c in chunks).encode()).hexdigest()
        return Shard(name, root, sum(c.size for c in chunks), chunks=tuple(chunks))


def chunk_of(data: bytes) -> Chunk:
    """The digests of one chunk's bytes."""
    return Chunk(hashlib.sha256(data).hexdigest(), len(data), crc32_text(zlib.crc32(data)))


def describe_file(path: Path, name: str) -> Shard:
    """The shard of the file at `path` (read once)."""
    hasher = ChunkHasher()
    with path.open("rb") as source:
        while data := source.read(CHUNK_BYTES):
            hasher.update(data)
    return hasher.shard(name)


@dataclass(frozen=True)
class Manifest:
    run: str
    step: int
    shards: tuple[Shard, ...]
    world_size: int
    zero_stage: int
    config_hash: str
    code_version: str
    created_at: str
    tier: str = "full"
    parent: str | None = None
    """Id of the checkpoint this run resumed from or last published before this one."""
    extra: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    @property
    def checkpoint_id(self) -> str:
        return checkpoint_id(self.run, self.step)

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)

    def to_json(self) -> bytes:
        document = asdict(self)
        document["shards"] = [
            {k: v for k, v in asdict(s).items() if k != "chunks" or v} for s in self.shards
        ]
        return json.dumps(document, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        try:
            document = json.loads(data)
            if not isinstance(document, dict):
                raise TypeError(f"a manifest is a JSON object, not {type(document).__name__}")
            if document.get("format_version") not in READABLE_VERSIONS:
                raise ManifestError(
                    f"manifest format {document.get('format_version')} is not one of "
                    f"{READABLE_VERSIONS}: restore it with the spotrain version that wrote it"
                )
            document["shards"] = tuple(
                Shard(**{**s, "keys": tuple(s["keys"]), "chunks": tuple(
                    Chunk(**{**c, "keys": tuple(c["keys"])}) for c in s.get("chunks", ())
                )})
                for s in document["shards"]
            )  # fmt: skip
            return cls(**document)
        except (TypeError, KeyError, AttributeError, ValueError) as error:
            if isinstance(error, ManifestError):
                raise
            raise ManifestError(f"manifest is malformed: {error}") from error


def shards_prefix(run: str) -> str:
    return f"{run_prefix(run)}/shards/"


def shard_key(run: str, sha256: str) -> str:
    """The first object holding a shard's bytes."""
    return f"{shards_prefix(run)}{sha256}"


def shard_copy_key(run: str, sha256: str) -> str:
    """A further, independent object holding the same bytes (a new name every time, since
    nothing is overwritten)."""
    return f"{shard_key(run, sha256)}.{uuid.uuid4().hex[:12]}"


def checkpoints_prefix(run: str) -> str:
    return f"{run_prefix(run)}/checkpoints/"


def manifest_key(run: str, step: int, content: bytes) -> str:
    """Where the manifest with these bytes goes: named by their digest, so it is never
    overwritten and a damaged one is recognised."""
    digest = hashlib.sha256(content).hexdigest()[:_MANIFEST_DIGEST_CHARS]
    return f"{checkpoints_prefix(run)}{checkpoint_tag(step)}/manifest-{digest}.json"


def check_manifest_bytes(key: str, content: bytes) -> Manifest:
    """The manifest stored at `key`, or ManifestError if its bytes are not the ones its name
    was made from, or do not parse."""
    named = _MANIFEST_NAME.search(key)
    if named and hashlib.sha256(content).hexdigest()[:_MANIFEST_DIGEST_CHARS] != named.group(1):
        raise ManifestError(f"manifest {key} is damaged: its bytes do not match its name")
    try:
        return Manifest.from_json(content)
    except ManifestError as error:
        raise ManifestError(f"manifest {key}: {error}") from error


def records_prefix(run: str) -> str:
    """The catalog's decisions about the run, kept in the store too (catalog.RunRecords)."""
    return f"{run_prefix(run)}/records/"


_RECORD_NAME = re.compile(r"/(step_\d+)-([a-z-]+)-([0-9a-f]{16})\.json$")


def record_key(manifest_key_: str, kind: str) -> str:
    """The record of a decision of `kind` about the checkpoint whose manifest is at
    `manifest_key_`. The key alone carries the decision (step, kind, which manifest), so a
    damaged record still says what was decided, and recording it twice is the same record."""
    named = re.search(r"^(.*)/checkpoints/(step_\d+)/manifest-([0-9a-f]{16})\.json$", manifest_key_)
    if not named:
        raise ManifestError(f"{manifest_key_!r} is not a manifest key spotrain writes")
    prefix, tag, digest = named.groups()
    return f"{prefix}/records/{tag}-{kind}-{digest}.json"


def parse_record_key(key: str) -> tuple[int, str, str] | None:
    """(step, kind, manifest key) of a record key; None for anything else."""
    named = _RECORD_NAME.search(key)
    if not named:
        return None
    tag, kind, digest = named.groups()
    prefix = key[: named.start()].removesuffix("/records")
    return (
        int(tag.removeprefix("step_")),
        kind,
        f"{prefix}/checkpoints/{tag}/manifest-{digest}.json",
    )


def config_key(run: str, stored_at: str, content: bytes) -> str:
    """A version of the configuration: when it was stored (UTC, sortable) and its digest."""
    digest = hashlib.sha256(content).hexdigest()[:_MANIFEST_DIGEST_CHARS]
    return f"{configs_prefix(run)}{stored_at}-{digest}.json"
