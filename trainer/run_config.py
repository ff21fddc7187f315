"""The run's training configuration, kept in the checkpoint store where every machine of the
fleet reads it (`runs/<run>/config/<stored at>-<digest>.json`), so changing it needs no new
image. Each `put` adds a version beside the others (nothing is overwritten); machines take
the newest. The machine-specific fields (store, catalog, key, work folder, metadata endpoint)
are filled in by the boot script on each machine, whatever the stored version says.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotrain.core.catalog_schema import configs_prefix
from spotrain.core.errors import SpotrainError, json_kind
from spotrain.core.manifest import config_key
from spotrain.trainer.storage import Storage


@dataclass(frozen=True)
class StoredConfig:
    key: str
    document: dict[str, Any]


def put(storage: Storage, document: dict[str, Any]) -> StoredConfig:
    """Store `document` (a checked training configuration) as the run's newest version."""
    content = json.dumps(document, sort_keys=True, indent=1).encode()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    key = config_key(document["run"], stamp, content)
    storage.put_bytes(key, content)
    return StoredConfig(key, document)


def history(storage: Storage, run: str) -> list[str]:
    """Keys of every stored version, oldest first."""
    return [k for k in storage.list(configs_prefix(run)) if k.endswith(".json")]


def newest(storage: Storage, run: str) -> StoredConfig:
    """The version machines train with, or an error saying how to store one."""
    versions = history(storage, run)
    if not versions:
        raise SpotrainError(
            f"run {run!r} has no training configuration in {storage.uri}: store one with "
            f"`spotrain config put CONFIG --store {storage.uri}`"
        )
    try:
        document = json.loads(storage.get_bytes(versions[-1]))
    except ValueError as error:
        raise SpotrainError(
            f"{storage.uri}/{versions[-1]} is not JSON ({error}): put a corrected "
            "configuration, which becomes the newest"
        ) from error
    if not isinstance(document, dict):
        raise SpotrainError(
            f"{storage.uri}/{versions[-1]} holds {json_kind(document)}, not a training "
            "configuration (an object): put a corrected configuration with `spotrain config "
            "put`, which becomes the newest"
        )
    return StoredConfig(versions[-1], document)


def write(stored: StoredConfig, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stored.document, indent=1))
    except OSError as error:
        raise SpotrainError(
            f"the configuration cannot be written to {path} ({error.strerror or error}): give "
            "--to a file in a folder you may write"
        ) from None
