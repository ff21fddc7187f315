"""A checkpoint's manifest: what it is made of and how to check it.

Shards are stored content-addressed (`runs/<run>/shards/<sha256>`), so a shard whose bytes did
not change since an earlier checkpoint (frozen layers, embeddings) is not uploaded again; the
manifest maps each shard's file name in the checkpoint folder to its digest and size.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from spotrain.catalog_schema import checkpoint_id, checkpoint_tag

FORMAT_VERSION = 1


class ManifestError(ValueError):
    """The manifest is malformed or of an unknown format version."""


@dataclass(frozen=True)
class Shard:
    name: str
    """Path of the file inside the checkpoint folder, '/'-separated."""
    sha256: str
    size: int


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
            if document.get("format_version") != FORMAT_VERSION:
                raise ManifestError(
                    f"manifest format {document.get('format_version')} is not {FORMAT_VERSION}: "
                    "restore with the spotrain version that wrote it"
                )
            document["shards"] = tuple(Shard(**s) for s in document["shards"])
            return cls(**document)
        except (TypeError, KeyError, json.JSONDecodeError) as error:
            raise ManifestError(f"manifest is malformed: {error}") from error


def run_prefix(run: str) -> str:
    return f"runs/{run}"


def shard_key(run: str, sha256: str) -> str:
    return f"{run_prefix(run)}/shards/{sha256}"


def manifest_key(run: str, step: int) -> str:
    return f"{run_prefix(run)}/checkpoints/{checkpoint_tag(step)}/manifest.json"
