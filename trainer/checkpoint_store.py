"""Publishing a checkpoint folder and restoring the newest good one.

Publish order (nothing is visible to a restore until the last step):
  1. every piece (a small file, or a chunk of a larger one: manifest.py) is stored
     content-addressed and verified; a piece whose bytes are already stored is reused only if
     the store's own checksum of the stored object matches, and a piece that becomes shared by
     two checkpoints is kept in two independent objects;
  2. the manifest naming them is written under a key made from its own digest (never over
     another manifest);
  3. the catalog records the checkpoint and moves the run's head, in one conditional write
     (and records that decision in the store).
A crash anywhere before 3 leaves the previous checkpoint the run's head.

Restore walks the published checkpoints newest first; the first whose manifest and every shard
verify is restored, and each one passed over is reported with its reason. Only proof of damage
(a digest that does not match, an object that is not there, a malformed manifest) passes over
a checkpoint; any other failure to read it stops the restore, so a store that is briefly
unreachable never costs a run its newest checkpoint.

Garbage collection keeps the newest `keep` (at least 2) complete checkpoints and removes only
what an older, superseded checkpoint alone referenced. Run it from the run's writer between
publishes, or while the run is stopped: a publish in flight may be reusing an old shard.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import math
import os
import shutil
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from spotrain.core import catalog_schema as schema
from spotrain.core.errors import SpotrainError
from spotrain.core.manifest import (
    Chunk,
    Manifest,
    ManifestError,
    Shard,
    check_manifest_bytes,
    chunk_of,
    describe_file,
    manifest_key,
    shard_copy_key,
    shard_key,
)
from spotrain.trainer import failpoints
from spotrain.trainer.catalog import Catalog, CatalogEntry, CatalogError
from spotrain.trainer.storage import (
    AlreadyExists,
    ObjectMissing,
    Storage,
    StorageError,
)

DESCRIBE_WORKERS = 4
PIECE_WORKERS = 16
"""Pieces (small files, chunks) stored or fetched at once: enough requests in flight to fill
the endpoint's bandwidth with 4 MiB objects."""
PIECES_IN_MEMORY = 32
"""Pieces handed over from memory that may wait to be stored (at most 128 MiB)."""
MIN_KEEP = 2
SHARED_COPIES = 2
"""Independent objects kept of a shard that more than one checkpoint uses."""
RESTORE_MARKER = ".spotrain-restore.json"
"""Written into a folder restored by `restore` or `fetch`: which run and step, and what it put
there, so a later restore replaces exactly that and nothing else."""
_STAGING = ".spotrain-restore.partial"


class RestoreError(SpotrainError):
    """No checkpoint of the run could be restored."""


class NothingPublished(RestoreError):
    """The run has no complete checkpoint at all (a new run)."""


class StoreUnreadable(RestoreError):
    """A checkpoint could not be read, and nothing shows it is damaged (an unreachable store,
    refused credentials): the restore stops rather than passing over it."""


class DamagedCheckpoint(SpotrainError):
    """Proof that a checkpoint cannot be restored: a shard whose every copy is missing or does
    not match its digest."""


class DestinationError(SpotrainError):
    """The folder to restore into holds something a restore must not touch."""


PROOF_OF_DAMAGE = (DamagedCheckpoint, ObjectMissing, ManifestError)


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
    """Why checkpoints were found from the store's records instead of the catalog, if they were."""
    head_step: int | None = None
    """The published head when the restore began (newer than `manifest` after a fallback)."""
    notes: list[str] = field(default_factory=list)
    """Damaged copies passed over while another copy of the same bytes served."""
    rolled_back_from: int | None = None
    """The head this restore moved back from (`restore_as_writer` after a fallback)."""
    fetched_bytes: int = 0
    reused_bytes: int = 0
    """Bytes an earlier restore into the same folder already held (`fetch`), not fetched."""

    @property
    def fell_back(self) -> bool:
        return self.head_step is not None and self.manifest.step < self.head_step


def describe_folder(folder: Path) -> list[Shard]:
    """Every file under the checkpoint folder, with its digests (each file read once)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    if not files:
        raise SpotrainError(f"checkpoint folder {folder} is empty: nothing to publish")
    with ThreadPoolExecutor(DESCRIBE_WORKERS) as pool:
        return list(pool.map(lambda p: describe_file(p, p.relative_to(folder).as_posix()), files))


@dataclass(frozen=True)
class UploadReport:
    shards: list[Shard]
    """Every file of the folder, each with the objects that hold it."""
    uploaded_bytes: int
    """Bytes sent, second copies of newly shared shards included."""
    reused_bytes: int
    """Bytes of shards an object already held, not sent as new content."""
    stored_keys: frozenset[str] = frozenset()
    """Objects this upload wrote itself (the store confirmed each), as opposed to reused."""


def _holds(storage: Storage, key: str, piece: Chunk) -> bool:
    """Whether the object at `key` holds the piece's bytes, by the checksum the store computed
    over what it stores (never by metadata a writer set)."""
    stored = storage.stat(key)
    return stored is not None and stored.size == piece.size and stored.crc32 == piece.crc32


def _read(path: Path, offset: int, size: int) -> bytes:
    with path.open("rb") as source:
        source.seek(offset)
        return source.read(size)


def _store_piece(
    piece: Chunk, read: Callable[[], bytes], known: dict[str, list[str]] | None,
    storage: Storage, run: str,
) -> tuple[Chunk, int, bool]:  # fmt: skip
    """Make sure the piece's bytes are stored: reused if an object already holds them (then in
    two independent objects, since an earlier checkpoint shares them), else uploaded (`read`
    gives the bytes). `known`: objects an earlier checkpoint (the parent) stored, by digest: a
    piece among them is checked where it is; any other is written at once, and only if its
    address is taken are the objects holding that digest looked up, so the requests grow with
    the checkpoint, never with the run's history (bytes stored by an older checkpoint than the
    parent are then sent once before the store refuses them). None: every piece's objects are
    looked up first (one listing each). Returns the piece with its object keys, the bytes
    stored, and whether stored bytes were reused."""
    first = shard_key(run, piece.sha256)
    sent = 0
    data: bytes | None = None
    if known is None:
        existing = storage.list(first)  # the first object and its copies
    elif piece.sha256 in known:
        existing = list(known[piece.sha256])
    else:
        data = read()
        try:
            storage.put_bytes(first, data, crc32=piece.crc32)
            failpoints.hit("after-shard-upload")
            return replace(piece, keys=(first,)), piece.size, False
        except AlreadyExists:  # stored before: by an older checkpoint, or another rank now
            existing = storage.list(first)
    good = [key for key in existing if _holds(storage, key, piece)]
    reused = bool(good)
    wanted = SHARED_COPIES if reused else 1
    while len(good) < wanted:
        key = shard_copy_key(run, piece.sha256) if existing else first
        existing.append(key)
        if data is None:
            data = read()
        try:
            storage.put_bytes(key, data, crc32=piece.crc32)
            sent += piece.size
            failpoints.hit("after-shard-upload")
        except AlreadyExists:
            # Another rank stored the same bytes at the same moment: use it if it holds them.
            if not _holds(storage, key, piece):
                continue
        good.append(key)
    return replace(piece, keys=tuple(good[:wanted])), sent, reused


def known_pieces(shards: Iterable[Shard]) -> dict[str, list[str]]:
    """The objects holding each piece of `shards`, by digest (what a next upload may reuse)."""
    return {piece.sha256: list(piece.keys) for shard in shards for piece in shard.pieces}


class PieceUploader:
    """Stores pieces as they are handed over (from memory while a file is being serialised, or
    read back from disk), PIECE_WORKERS at a time, each digest once however often it occurs.
    Bytes handed over from memory are hashed by the workers, in parallel. At most
    `PIECES_IN_MEMORY` pieces wait in memory: handing over more blocks until one is stored.
    Publishes nothing: `commit` does."""

    def __init__(
        self, *, storage: Storage, run: str, known: dict[str, list[str]] | None = None
    ) -> None:
        """`known`: the objects of an earlier checkpoint (`known_pieces`), checked for reuse
        where they are, other stored bytes found when their address is taken; None looks
        every piece up (see `_store_piece`)."""
        self.storage, self.run = storage, run
        self._known = known
        self._pool = ThreadPoolExecutor(PIECE_WORKERS, thread_name_prefix="piece")
        self._room = threading.BoundedSemaphore(PIECES_IN_MEMORY)
        self._work: list[Future[Any]] = []
        self._claimed: set[str] = set()
        self._claim = threading.Lock()
        self._results: dict[str, tuple[Chunk, int, bool]] = {}

    def _store_once(self, piece: Chunk, read: Callable[[], bytes]) -> None:
        with self._claim:
            if piece.sha256 in self._claimed:
                return  # the same bytes again (a tensor stored twice): one upload serves both
            self._claimed.add(piece.sha256)
        self._results[piece.sha256] = _store_piece(piece, read, self._known, self.storage, self.run)

    def put_bytes(self, data: bytes) -> Future[Chunk]:
        """A chunk's bytes, hashed and stored by a worker; the future gives its digests."""
        self._room.acquire()

        def hash_and_store() -> Chunk:
            try:
                piece = chunk_of(data)
                self._store_once(piece, lambda: data)
                return piece
            finally:
                self._room.release()

        future = self._pool.submit(hash_and_store)
        self._work.append(future)
        return future

    def put_file(self, folder: Path, shard: Shard) -> None:
        """Every piece of a file already on disk and described, read when it is needed."""
        offset = 0
        for piece in shard.pieces:
            read = partial(_read, folder / shard.name, offset, piece.size)
            self._work.append(self._pool.submit(self._store_once, piece, read))
            offset += piece.size

    def abandon(self) -> None:
        """Stop storing (what is under way finishes; nothing is published)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def finish(self, shards: list[Shard]) -> UploadReport:
        """Wait for every piece; `shards` (whose pieces were all handed over) with their
        objects."""
        try:
            for future in self._work:
                future.result()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
        keys = {sha: piece.keys for sha, (piece, _, _) in self._results.items()}

        def with_keys(shard: Shard) -> Shard:
            if shard.chunks:
                return replace(shard, chunks=tuple(replace(c, keys=keys[c.sha256])
                                                   for c in shard.chunks))  # fmt: skip
            return replace(shard, keys=keys[shard.sha256])

        return UploadReport(
            shards=[with_keys(s) for s in shards],
            stored_keys=frozenset(
                key
                for piece, _, reused in self._results.values()
                if not reused
                for key in piece.keys
            ),
            uploaded_bytes=sum(sent for _, sent, _ in self._results.values()),
            reused_bytes=sum(p.size for p, _, reused in self._results.values() if reused),
        )


def upload_folder(folder: Path, *, storage: Storage, run: str) -> UploadReport:
    """Store every file of `folder` content-addressed and verified, reusing bytes already
    stored. Publishes nothing: `commit` does, once every machine's upload is done."""
    return upload_shards(folder, describe_folder(folder), storage=storage, run=run)


def upload_shards(folder: Path, shards: list[Shard], *, storage: Storage, run: str) -> UploadReport:
    """`upload_folder` for files whose digests are known (taken while they were written)."""
    uploader = PieceUploader(storage=storage, run=run)
    for shard in shards:
        uploader.put_file(folder, shard)
    return uploader.finish(shards)


def thinned(pairs: Sequence[tuple[int, float]], at_most: int) -> list[list[float]]:
    """At most `at_most` of `pairs`, evenly spaced, the last always kept: a long interval's
    curve keeps its shape."""
    every = max(1, math.ceil(len(pairs) / at_most))
    kept = list(pairs[::every])
    if kept[-1] != pairs[-1]:
        kept[-1] = pairs[-1]
    return [[step, loss] for step, loss in kept]


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
    config: dict[str, Any] | None = None,
    timings: dict[str, float] | None = None,
    final: bool = False,
    loss: float | None = None,
    step_losses: Sequence[tuple[int, float]] = (),
    just_stored: Collection[str] = (),
) -> Manifest:
    """Write the manifest naming `shards` (all stored and verified) and make it the run's head
    in the catalog. `config`: the definition the checkpoint was trained with, kept in the
    manifest so a later start can tell whether it changed; `timings`: what the checkpoint cost
    the run (`stall_s`, `upload_s`, `machines`), for its cost report; `final`: the run's last
    step (the catalog record says so, and the fleet's machines go); `loss`: the training loss
    of `step` (the catalog record shows it; a loss that is not a finite number is left out);
    `step_losses`: `(step, loss)` of each step trained since the checkpoint before (thinned to
    schema.STEP_LOSSES_AT_MOST, for `run status --plot`)."""
    keys = sorted({key for s in shards for key in s.stored_keys})
    if not all(piece.keys for s in shards for piece in s.pieces):
        raise SpotrainError(f"step {step}: every shard must be stored before it is committed")
    # Reused pieces were checked before their uploads were skipped; check again just before the
    # manifest names them, so a concurrent clean-up cannot leave it pointing at nothing. What
    # this publish wrote itself (`just_stored`) the store has just confirmed.
    doubtful = [key for key in keys if key not in set(just_stored)]
    with ThreadPoolExecutor(PIECE_WORKERS) as pool:
        present = list(pool.map(storage.exists, doubtful))
    missing = [key for key, there in zip(doubtful, present, strict=True) if not there]
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
        created_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
        parent=parent,
        extra={
            **({"config": config} if config is not None else {}),
            **({"timings": timings} if timings else {}),
            **({"final": True} if final else {}),
            **({"loss": loss} if loss is not None and math.isfinite(loss) else {}),
            **(
                {"step_losses": thinned(step_losses, schema.STEP_LOSSES_AT_MOST)}
                if step_losses
                else {}
            ),
        },
    )
    content = manifest.to_json()
    key = manifest_key(run, step, content)
    with contextlib.suppress(AlreadyExists):  # named by its digest: the same bytes are there
        storage.put_bytes(key, content)
    failpoints.hit("before-catalog-publish")
    catalog.publish(manifest, key, generation)
    return manifest


def key_of(manifest: Manifest) -> str:
    """Where `manifest` is stored."""
    return manifest_key(manifest.run, manifest.step, manifest.to_json())


def publish(folder: Path, *, storage: Storage, run: str, **commit_args: Any) -> PublishReport:
    """Upload one folder holding the whole checkpoint, then commit it (`commit_args` as for
    `commit`)."""
    upload = upload_folder(folder, storage=storage, run=run)
    manifest = commit(upload.shards, storage=storage, run=run,
                      just_stored=upload.stored_keys, **commit_args)  # fmt: skip
    return PublishReport(
        manifest=manifest, uploaded_bytes=upload.uploaded_bytes, reused_bytes=upload.reused_bytes
    )


def read_manifest(storage: Storage, key: str) -> Manifest:
    """The manifest at `key`: ObjectMissing or ManifestError prove it unusable; any other
    StorageError proves nothing."""
    return check_manifest_bytes(key, storage.get_bytes(key))


@dataclass(frozen=True)
class Fetched:
    """What `fetch` put into its folder, and how."""

    manifest: Manifest
    notes: list[str]
    """Damaged copies passed over while another copy of the same bytes served."""
    fetched_bytes: int
    reused_bytes: int
    """Bytes taken from the folder's earlier restore, which held them (by their digests)."""


def _download(
    storage: Storage, manifest: Manifest, into: Path, *, every_copy: bool = False,
    earlier: Path | None = None,
) -> Fetched:  # fmt: skip
    """Download every shard into `into`, each piece checked against its digest, trying its
    copies in turn; a piece whose bytes an earlier restore's file under `earlier` holds at the
    same place (its digest says) is taken from there instead. Returns notes on damaged copies
    that another copy stood in for, and the bytes fetched and taken from `earlier`."""
    notes: list[str] = []
    fetched: list[int] = []
    reused: list[int] = []
    jobs = []
    for shard in manifest.shards:
        target = into / shard.name
        target.parent.mkdir(parents=True, exist_ok=True)
        if shard.chunks:
            with target.open("wb") as created:
                created.truncate(shard.size)
            offset = 0
            for chunk in shard.chunks:
                jobs.append((shard, chunk, target, offset))
                offset += chunk.size
        else:
            jobs.append((shard, shard.pieces[0], target, None))

    def fetch_one(shard: Shard, piece: Chunk, target: Path, offset: int | None) -> None:
        if earlier is not None and _take_from_earlier(earlier / shard.name, piece, target, offset):
            reused.append(piece.size)
            return
        damage, doubt = [], []
        served = False
        for key in piece.keys:
            if served and not every_copy:
                break
            try:
                if offset is None:  # a whole file, streamed to disk
                    got = storage.get_file(key, target if not served else target.with_name(
                        f".{target.name}.check"))  # fmt: skip
                    sha256, size, data = got.sha256, got.size, b""
                else:
                    data = storage.get_bytes(key)
                    sha256, size = hashlib.sha256(data).hexdigest(), len(data)
            except ObjectMissing as error:
                damage.append(str(error))
                continue
            except StorageError as error:
                doubt.append(str(error))
                continue
            if sha256 != piece.sha256 or size != piece.size:
                damage.append(f"{storage.uri}/{key} is corrupt (sha256 {sha256[:12]}...)")
                continue
            if offset is not None and not served:
                with target.open("r+b") as out:
                    out.seek(offset)
                    out.write(data)
            if not served:
                fetched.append(piece.size)
            served = True
        target.with_name(f".{target.name}.check").unlink(missing_ok=True)
        where = shard.name if offset is None else f"{shard.name} (bytes from {offset:,})"
        if not served:
            if doubt:
                raise StorageError(f"shard {where}: {'; '.join(doubt + damage)}")
            raise DamagedCheckpoint(f"shard {where}: {'; '.join(damage)}")
        notes.extend(f"shard {where}: {problem}" for problem in damage + doubt)

    with ThreadPoolExecutor(PIECE_WORKERS) as pool:
        list(pool.map(lambda job: fetch_one(*job), jobs))
    return Fetched(manifest, notes, sum(fetched), sum(reused))


def _take_from_earlier(earlier: Path, piece: Chunk, target: Path, offset: int | None) -> bool:
    """Put the piece into `target` from the earlier restore's file `earlier`, if that holds its
    bytes at the same place; False (nothing written) if it does not, or cannot be read. The
    digest is checked here, as a fetched piece's is: a file that changed on this disk since
    its restore (or a torn earlier one) only costs the fetch it would have cost anyway."""
    try:
        if offset is None:
            if earlier.stat().st_size != piece.size:
                return False
            with earlier.open("rb") as source:
                if hashlib.file_digest(source, "sha256").hexdigest() != piece.sha256:
                    return False
            shutil.copyfile(earlier, target)
            return True
        data = _read(earlier, offset, piece.size)
    except OSError:
        return False
    if len(data) != piece.size or hashlib.sha256(data).hexdigest() != piece.sha256:
        return False
    with target.open("r+b") as out:
        out.seek(offset)
        out.write(data)
    return True


def _claimed_by_earlier_restore(destination: Path, run: str, incoming: set[str]) -> list[str]:
    """What in `destination` an earlier restore of `run` put there (to be replaced). Raises if
    it holds anything else the new one would have to touch, or anything at all that is not an
    earlier restore of the run."""
    if destination.exists() and not destination.is_dir():
        raise DestinationError(f"{destination} is a file: name a folder to restore into")
    present = (
        {p.name for p in destination.iterdir()} - {_STAGING} if destination.is_dir() else set()
    )
    if not present:
        return []
    claimed = _restored_by_marker(destination, run)
    if claimed is None:
        raise DestinationError(
            f"{destination} is not empty and holds no earlier restore of run {run!r}: restore "
            "into an empty or new folder (nothing in it was touched)"
        )
    strangers = (present - claimed - {RESTORE_MARKER}) & incoming
    if strangers:
        raise DestinationError(
            f"{destination} holds {', '.join(sorted(strangers))}, which an earlier restore did "
            "not put there: restore into an empty or new folder (nothing was touched)"
        )
    return sorted(present & claimed)


def _restored_by_marker(folder: Path, run: str) -> set[str] | None:
    """What an earlier restore of `run` into `folder` put there, as its marker says; None
    without a readable marker of that run."""
    try:
        earlier = json.loads((folder / RESTORE_MARKER).read_text())
        return set(earlier["entries"]) if earlier.get("run") == run else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def keep_only_a_restore(folder: Path, run: str) -> None:
    """Empty `folder` of everything but an earlier restore of `run` (what its marker says it
    put there), whose pieces the next `fetch` into it takes instead of fetching them again;
    without one, of everything."""
    if not folder.is_dir():
        return
    restored = _restored_by_marker(folder, run)
    kept = set() if restored is None else restored | {RESTORE_MARKER}
    for entry in folder.iterdir():
        if entry.name in kept:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _write_marker(destination: Path, run: str, step: int, entries: set[str]) -> None:
    partial = destination / f"{RESTORE_MARKER}.partial"
    partial.write_text(json.dumps({"run": run, "step": step, "entries": sorted(entries)}))
    os.replace(partial, destination / RESTORE_MARKER)


def fetch(storage: Storage, manifest_key_: str, destination: Path, *, run: str) -> Fetched:
    """Download one checkpoint into `destination` (absent, empty, or an earlier restore of the
    same run, which it replaces), every shard checked. Pieces the earlier restore holds (in a
    file of the same name, at the same place) are taken from there, checked the same way, not
    fetched again: a move's check (`RunCheckpoints.move_here`) leaves the checkpoint where the
    trainer's restore then finds it whole. Nothing else in the folder is touched; until the
    last step the folder holds either the earlier restore or this one."""
    destination = destination.absolute()
    manifest = read_manifest(storage, manifest_key_)
    incoming = {shard.name.split("/", 1)[0] for shard in manifest.shards}
    earlier = _claimed_by_earlier_restore(destination, run, incoming)
    staging = destination / _STAGING
    created = not destination.exists()
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        downloaded = _download(storage, manifest, staging,
                               earlier=destination if earlier else None)  # fmt: skip
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            destination.rmdir()
        raise
    # The marker claims both restores while one replaces the other, so a crash here leaves a
    # folder the next restore may still clean up.
    _write_marker(destination, run, manifest.step, set(earlier) | incoming)
    for name in set(earlier) | incoming:
        old = destination / name
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink(missing_ok=True)
    for name in incoming:
        (staging / name).rename(destination / name)
    staging.rmdir()
    _write_marker(destination, run, manifest.step, incoming)
    return downloaded


def entry_at(catalog: Catalog, step: int | None) -> CatalogEntry:
    """The catalog's entry for `step` (the head if None), or a CatalogError saying what exists."""
    if step is None:
        head = catalog.head()
        if head is None:
            raise CatalogError("the run has no published checkpoint: name one with --step")
        return head
    matching = [e for e in catalog.entries() if e.step == step]
    if not matching:
        raise CatalogError(f"no checkpoint at step {step}: `spotrain checkpoints list` shows them")
    complete = [e for e in matching if e.status == schema.STATUS_COMPLETE]
    return (complete or matching)[-1]


def verify(storage: Storage, manifest_key_: str, scratch: Path) -> tuple[Manifest, list[str]]:
    """Download every copy of every shard of one checkpoint into `scratch` and check it; raises
    DamagedCheckpoint if a shard has no good copy. Returns the manifest and notes on copies
    that are damaged while another serves."""
    manifest = read_manifest(storage, manifest_key_)
    try:
        notes = _download(storage, manifest, scratch, every_copy=True).notes
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return manifest, notes


@dataclass(frozen=True)
class CollectReport:
    kept: list[int]
    collected: list[int]
    freed_bytes: int


def collect_garbage(
    *, storage: Storage, catalog: Catalog, run: str, keep: int = MIN_KEEP,
    say: Callable[[str], None] | None = None,
) -> CollectReport:  # fmt: skip
    """Remove superseded checkpoints beyond the newest `keep` complete ones: objects only they
    reference, and their manifests. Stops before deleting anything if a manifest it must read
    cannot be read."""
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
    manifests = {}
    for entry in entries:
        if entry.status == schema.STATUS_COLLECTED:
            continue
        try:
            manifests[entry.manifest_key] = read_manifest(storage, entry.manifest_key)
        except SpotrainError as error:
            if isinstance(error, PROOF_OF_DAMAGE) and entry.status != schema.STATUS_COMPLETE:
                continue  # quarantined or rolled back, and damaged: never restored, protects none
            raise SpotrainError(
                f"garbage collection stopped before deleting anything: the manifest of step "
                f"{entry.step} could not be read ({error}); verify and quarantine it, or retry"
            ) from error
    doomed_keys = {e.manifest_key for e in superseded}
    referenced = {
        key
        for manifest_key_, manifest in manifests.items()
        if manifest_key_ not in doomed_keys
        for shard in manifest.shards
        for key in shard.stored_keys
    }
    doomed: dict[str, int] = {}
    for entry in superseded:
        for shard in manifests[entry.manifest_key].shards:
            for piece in shard.pieces:
                doomed |= {key: piece.size for key in piece.keys if key not in referenced}
    for entry in superseded:  # retired first: nothing listed complete ever lacks its data
        catalog.retire(entry)
    storage.delete(sorted(doomed))
    storage.delete(sorted(doomed_keys))
    if say is not None:
        say(f"collected {len(superseded)} checkpoint(s), {len(doomed)} object(s)")
    return CollectReport(
        kept=sorted(kept_steps),
        collected=[e.step for e in superseded],
        freed_bytes=sum(doomed.values()),
    )
