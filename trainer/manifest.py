"""A checkpoint's manifest, and where a run's objects live in the store.

Shards are stored content-addressed (`runs/<run>/shards/<sha256>`), so a shard whose bytes did
not change since an earlier checkpoint (frozen layers, embeddings) is not uploaded again; the
manifest maps each shard's file name in the checkpoint folder to its digest, its size and the
objects that hold those bytes. A shard that two checkpoints share is kept in two objects (the
second at `runs/<run>/shards/<sha256>.<copy id>`), so one damaged object cannot make every
checkpoint that shares it unrestorable.

Nothing in a run's prefix is ever overwritten: a manifest's key carries the digest of its own
bytes (`checkpoints/step_<n>/manifest-<digest>.json`), so a second writer of the same step
writes a second manifest beside the first, never over it, and a damaged manifest shows itself.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from spotrain.catalog_schema import checkpoint_id, checkpoint_tag, run_prefix
from spotrain.errors import SpotrainError

FORMAT_VERSION = 2
_MANIFEST_DIGEST_CHARS = 16
_MANIFEST_NAME = re.compile(r"/manifest-([0-9a-f]{16})\.json$")


class ManifestError(SpotrainError, ValueError):
    """The manifest is malformed, damaged, or of an unknown format version."""


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
    """Objects in the store holding these bytes, each a full copy (restore tries them in order)."""


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
        document["shards"] = [asdict(s) for s in self.shards]
        return json.dumps(document, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        try:
            document = json.loads(data)
            if not isinstance(document, dict):
                raise TypeError(f"a manifest is a JSON object, not {type(document).__name__}")
            if document.get("format_version") != FORMAT_VERSION:
                raise ManifestError(
                    f"manifest format {document.get('format_version')} is not {FORMAT_VERSION}: "
                    "restore it with the spotrain version that wrote it"
                )
            document["shards"] = tuple(
                Shard(**{**s, "keys": tuple(s["keys"])}) for s in document["shards"]
            )
            return cls(**document)
        except (TypeError, KeyError, AttributeError, ValueError) as error:
            if isinstance(error, ManifestError):
                raise
            raise ManifestError(f"manifest is malformed: {error}") from error


def shard_key(run: str, sha256: str) -> str:
    """The first object holding a shard's bytes."""
    return f"{run_prefix(run)}/shards/{sha256}"


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


def configs_prefix(run: str) -> str:
    """Versions of the run's training configuration (run_config.py), oldest first by key."""
    return f"{run_prefix(run)}/config/"


def config_key(run: str, stored_at: str, content: bytes) -> str:
    """A version of the configuration: when it was stored (UTC, sortable) and its digest."""
    digest = hashlib.sha256(content).hexdigest()[:_MANIFEST_DIGEST_CHARS]
    return f"{configs_prefix(run)}{stored_at}-{digest}.json"
