"""Publishing a checkpoint folder and restoring the newest good one.

Publish order (nothing is visible to a restore until the last step):
  1. every shard is uploaded content-addressed and verified (unchanged shards are skipped);
  2. the manifest naming them is written;
  3. the catalog records the checkpoint and moves the run's head, in one conditional write.
A crash anywhere before 3 leaves the previous checkpoint the run's head.

Restore walks the complete checkpoints newest first; the first whose manifest and every shard
are present with the recorded SHA-256 is restored, and each one passed over is reported with
its reason.

Garbage collection keeps the newest `keep` (at least 2) complete checkpoints and removes only
what an older, superseded checkpoint alone referenced. Run it from the run's writer between
publishes, or while the run is stopped: a publish in flight may be reusing an old shard.
"""

from __future__ import annotations

import datetime
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotrain import catalog_schema as schema
from spotrain.errors import SpotrainError
from spotrain.trainer import failpoints
from spotrain.trainer.catalog import Catalog, CatalogError, ManifestCatalog
from spotrain.trainer.manifest import Manifest, Shard, manifest_key, shard_key
from spotrain.trainer.storage import Storage, sha256_of

UPLOAD_WORKERS = 4
MIN_KEEP = 2


class RestoreError(SpotrainError):
    """No checkpoint of the run could be restored."""


class NothingPublished(RestoreError):
    """The run has no complete checkpoint at all (a new run)."""


@dataclass(frozen=True)
class PublishReport:
    manifest: Manifest
    uploaded_bytes: int
    reused_bytes: int
    """Bytes of shards already stored by an earlier checkpoint, not sent again."""


@dataclass
class RestoreReport:
    manifest: Manifest
    skipped: list[tuple[int, str]] = field(default_factory=list)
    """(step, reason) of each newer checkpoint that could not be used."""
    catalog_unavailable: str | None = None
    """Why checkpoints were found from manifests instead of the catalog, if they were."""
    head_step: int | None = None
    """The published head when the restore began (newer than `manifest` after a fallback)."""


def describe_folder(folder: Path) -> list[Shard]:
    """Every file under the checkpoint folder, with its digest."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    if not files:
        raise SpotrainError(f"checkpoint folder {folder} is empty: nothing to publish")
    with ThreadPoolExecutor(UPLOAD_WORKERS) as pool:
        digests = list(pool.map(sha256_of, files))
    return [
        Shard(name=p.relative_to(folder).as_posix(), sha256=d, size=p.stat().st_size)
        for p, d in zip(files, digests, strict=True)
    ]


@dataclass(frozen=True)
class UploadReport:
    shards: list[Shard]
    uploaded_bytes: int
    reused_bytes: int


def upload_folder(folder: Path, *, storage: Storage, run: str) -> UploadReport:
    """Store every file of `folder` content-addressed, verified, skipping shards already
    stored. Publishes nothing: `commit` does, once every node's upload is done."""
    shards = describe_folder(folder)
    unique = {s.sha256: s for s in shards}

    def store(shard: Shard) -> int:
        key = shard_key(run, shard.sha256)
        existing = storage.stat(key)
        if existing is not None and existing.size == shard.size and existing.sha256 == shard.sha256:
            return 0
        stored = storage.put_file(folder / shard.name, key)
        if stored.sha256 != shard.sha256:
            raise SpotrainError(f"{shard.name} changed while it was being published")
        failpoints.hit("after-shard-upload")
        return shard.size

    with ThreadPoolExecutor(UPLOAD_WORKERS) as pool:
        uploaded = sum(pool.map(store, unique.values()))
    reused = sum(s.size for s in unique.values()) - uploaded
    return UploadReport(shards=shards, uploaded_bytes=uploaded, reused_bytes=reused)


def commit(
    shards: list[Shard],
    *,
    storage: Storage,
    catalog: Catalog,
    generation: int,
    run: str,
    step: int,
    world_size: int,
    zero_stage: int,
    config_hash: str,
    code_version: str,
    parent: str | None = None,
) -> Manifest:
    """Write the manifest naming `shards` (all uploaded and verified) and make it the run's
    head in the catalog."""
    unique = list({s.sha256: s for s in shards}.values())
    # Reused shards were checked before their uploads were skipped; check again just before the
    # manifest names them, so a concurrent clean-up cannot leave it pointing at nothing.
    with ThreadPoolExecutor(UPLOAD_WORKERS) as pool:
        present = list(pool.map(lambda s: storage.exists(shard_key(run, s.sha256)), unique))
    missing = [s.name for s, there in zip(unique, present, strict=True) if not there]
    if missing:
        raise SpotrainError(f"shards vanished during publish of step {step}: {missing}")
    manifest = Manifest(
        run=run,
        step=step,
        shards=tuple(sorted(shards, key=lambda s: s.name)),
        world_size=world_size,
        zero_stage=zero_stage,
        config_hash=config_hash,
        code_version=code_version,
        created_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        parent=parent,
    )
    storage.put_bytes(manifest_key(run, step), manifest.to_json())
    failpoints.hit("before-catalog-publish")
    catalog.publish(manifest, generation)
    return manifest


def publish(folder: Path, *, storage: Storage, run: str, **commit_args: Any) -> PublishReport:
    """Upload one folder holding the whole checkpoint, then commit it (`commit_args` as for
    `commit`)."""
    upload = upload_folder(folder, storage=storage, run=run)
    manifest = commit(upload.shards, storage=storage, run=run, **commit_args)
    return PublishReport(
        manifest=manifest, uploaded_bytes=upload.uploaded_bytes, reused_bytes=upload.reused_bytes
    )


def _fetch(storage: Storage, manifest: Manifest, destination: Path) -> None:
    """Download every shard into `destination`, checking each digest."""

    def fetch(shard: Shard) -> None:
        got = storage.get_file(shard_key(manifest.run, shard.sha256), destination / shard.name)
        if got.sha256 != shard.sha256 or got.size != shard.size:
            raise SpotrainError(f"shard {shard.name} is corrupt (sha256 {got.sha256[:12]}...)")

    with ThreadPoolExecutor(UPLOAD_WORKERS) as pool:
        list(pool.map(fetch, manifest.shards))


def restore(destination: Path, *, storage: Storage, catalog: Catalog, run: str) -> RestoreReport:
    """Restore the newest complete checkpoint that verifies; fall back past any that do not.
    If the catalog cannot be read, the checkpoints are found from their manifests instead."""
    unavailable = None
    try:
        entries, head = catalog.entries(), catalog.head()
    except CatalogError as error:
        unavailable = str(error)
        fallback = ManifestCatalog(storage, run)
        entries, head = fallback.entries(), fallback.head()
    candidates = [e for e in entries if e.status == schema.STATUS_COMPLETE]
    if head is not None:  # never restore past the published head (a newer one may be torn)
        candidates = [e for e in candidates if e.step <= head.step]
    skipped: list[tuple[int, str]] = []
    for entry in sorted(candidates, key=lambda e: e.step, reverse=True):
        try:
            manifest = fetch(storage, entry.manifest_key, destination)
        except (SpotrainError, ValueError) as error:
            skipped.append((entry.step, str(error)))
            continue
        return RestoreReport(
            manifest=manifest,
            skipped=skipped,
            catalog_unavailable=unavailable,
            head_step=head.step if head else None,
        )
    if not skipped:
        raise NothingPublished(f"run {run!r} has no complete checkpoint")
    reasons = "; ".join(f"step {s}: {r}" for s, r in skipped)
    raise RestoreError(
        f"run {run!r} has no restorable checkpoint ({reasons}); check the store with "
        "`spotrain checkpoints verify`, or start afresh under a new run name"
    )


def fetch(storage: Storage, manifest_key_: str, destination: Path) -> Manifest:
    """Download one named checkpoint into `destination`, every shard checked; `destination`
    appears only complete."""
    manifest = Manifest.from_json(storage.get_bytes(manifest_key_))
    staging = destination.with_name(f".{destination.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _fetch(storage, manifest, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(destination, ignore_errors=True)
    staging.rename(destination)
    return manifest


def verify(storage: Storage, manifest_key_: str, scratch: Path) -> Manifest:
    """Download every shard of one checkpoint into `scratch` and check it; raises if any is
    missing or corrupt."""
    manifest = Manifest.from_json(storage.get_bytes(manifest_key_))
    try:
        _fetch(storage, manifest, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return manifest


@dataclass(frozen=True)
class CollectReport:
    kept: list[int]
    collected: list[int]
    freed_bytes: int


def collect_garbage(
    *, storage: Storage, catalog: Catalog, run: str, keep: int = MIN_KEEP
) -> CollectReport:
    """Remove superseded checkpoints beyond the newest `keep` complete ones."""
    if keep < MIN_KEEP:
        raise SpotrainError(
            f"keep={keep}: keep at least {MIN_KEEP} complete checkpoints so a corrupt newest one "
            "still has a fallback"
        )
    entries = catalog.entries()
    complete = sorted(
        (e for e in entries if e.status == schema.STATUS_COMPLETE), key=lambda e: e.step
    )
    head = catalog.head()
    kept = [e for e in complete if head is None or e.step <= head.step][-keep:]
    kept_steps = {e.step for e in kept}
    superseded = [e for e in complete if e.step < min(kept_steps, default=0)]
    if not superseded:
        return CollectReport(kept=sorted(kept_steps), collected=[], freed_bytes=0)
    superseded_steps = {e.step for e in superseded}
    referenced = set()
    for entry in entries:
        if entry.step in superseded_steps:
            continue
        try:
            referenced |= {
                s.sha256 for s in Manifest.from_json(storage.get_bytes(entry.manifest_key)).shards
            }
        except (SpotrainError, ValueError):
            continue  # an unreadable manifest protects nothing it cannot name
    doomed: dict[str, int] = {}
    for entry in superseded:
        manifest = Manifest.from_json(storage.get_bytes(entry.manifest_key))
        doomed |= {s.sha256: s.size for s in manifest.shards if s.sha256 not in referenced}
    storage.delete([shard_key(run, digest) for digest in doomed])
    for entry in superseded:
        catalog.retire(entry.step)
        storage.delete([entry.manifest_key])
    return CollectReport(
        kept=sorted(kept_steps),
        collected=[e.step for e in superseded],
        freed_bytes=sum(doomed.values()),
    )
