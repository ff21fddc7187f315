"""The checkpoint core under adversity: stale writers, transient read errors, a restore folder
that holds other files, the catalog out of reach, one damaged object, torn manifests.

Each test names the promise it holds the core to. Fast ones run on folders and in-process moto;
the ones that need S3's own behaviour (conditional writes, checksums computed by the store,
503s and retries) run against the local cloud over HTTPS.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import create_catalog_table, kms_only_bucket

from spotrain import cli
from spotrain.core import catalog_schema as schema
from spotrain.core.manifest import Manifest, ManifestError, check_manifest_bytes, run_prefix
from spotrain.localcloud import control
from spotrain.trainer import checkpoint_store, restore_policy
from spotrain.trainer.catalog import DynamoCatalog, StaleWriter, StoreCatalog
from spotrain.trainer.storage import AlreadyExists, LocalStorage, S3Storage, StorageError

RUN = "adversity"
REGION = "us-east-1"


def folder_of(tmp_path: Path, step: int, *, salt: str = "") -> Path:
    """A checkpoint folder: a frozen embedding every step shares, and state that changes."""
    folder = tmp_path / f"step{step}{salt}"
    files = {
        f"step_{step:09d}/embedding.pt": b"frozen" * 8192,
        f"step_{step:09d}/optimizer.pt": f"{step}{salt}".encode() * 4096,
        "latest": f"step_{step:09d}".encode(),
    }
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def publish(storage: Any, catalog: Any, tmp_path: Path, step: int, generation: int = 0,
            salt: str = "") -> checkpoint_store.PublishReport:  # fmt: skip
    return checkpoint_store.publish(
        folder_of(tmp_path, step, salt=salt), storage=storage, catalog=catalog,
        generation=generation, run=RUN, step=step, world_size=1, zero_stage=2,
        config_hash="c0ffee", code_version="test",
    )  # fmt: skip


def snapshot(storage: LocalStorage) -> dict[str, bytes]:
    return {key: storage.get_bytes(key) for key in storage.list(run_prefix(RUN))}


def restored_optimizer(folder: Path, step: int) -> bytes:
    return (folder / f"step_{step:09d}" / "optimizer.pt").read_bytes()


# --- 1. nothing published is ever rewritten -------------------------------------------------
def test_a_refused_stale_writer_changes_no_published_byte(dynamo: Any, tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "store")
    catalog = DynamoCatalog("catalog", RUN, storage, client=dynamo)
    stale = catalog.acquire_lease("preempted machine")
    publish(storage, catalog, tmp_path, 10, stale)
    current = catalog.acquire_lease("replacement")
    publish(storage, catalog, tmp_path, 20, current)
    before = snapshot(storage)
    # The preempted machine wakes up and publishes the same step, and an older one.
    for step in (20, 10):
        with pytest.raises(StaleWriter):
            publish(storage, catalog, tmp_path / "stale", step, stale, salt="stale")
    after = snapshot(storage)
    assert {key: after[key] for key in before} == before  # new objects beside, none replaced
    restore_policy.restore(tmp_path / "out", storage=storage, catalog=catalog, run=RUN)
    assert restored_optimizer(tmp_path / "out", 20) == b"20" * 4096


def test_a_folder_run_refuses_an_older_step_without_touching_the_published_one(
    tmp_path: Path,
) -> None:
    storage = LocalStorage(tmp_path / "store")
    catalog = StoreCatalog(storage, RUN)
    for step in (10, 20):
        publish(storage, catalog, tmp_path, step)
    before = snapshot(storage)
    with pytest.raises(StaleWriter, match="not newer than the published head, step 20"):
        publish(storage, catalog, tmp_path / "again", 10, salt="again")
    after = snapshot(storage)
    assert {key: after[key] for key in before} == before
    report = restore_policy.restore(tmp_path / "out", storage=storage, catalog=catalog, run=RUN)
    assert report.manifest.step == 20 and report.skipped == []


# --- 2. only proof of damage passes over a checkpoint ---------------------------------------
class Unreachable(LocalStorage):
    """A folder store whose reads of some objects fail as an unreachable S3 would (503 after
    retries, a momentary 403): nothing about the data is proven."""

    def __init__(self, root: Path, failing: set[str]) -> None:
        super().__init__(root)
        self.failing = failing

    def get_file(self, key: str, path: Path) -> Any:
        if key in self.failing:
            raise StorageError(f"download of {key} failed: 503 SlowDown (after retries)")
        return super().get_file(key, path)


def test_a_transient_read_error_stops_the_start_and_keeps_the_head(
    dynamo: Any, tmp_path: Path
) -> None:
    healthy = LocalStorage(tmp_path / "store")
    catalog = DynamoCatalog("catalog", RUN, healthy, client=dynamo)
    generation = catalog.acquire_lease("trainer")
    publish(healthy, catalog, tmp_path, 10, generation)
    newest = publish(healthy, catalog, tmp_path, 20, generation).manifest
    changed = next(s for s in newest.shards if s.name.endswith("optimizer.pt"))
    flaky = Unreachable(tmp_path / "store", set(changed.keys))
    with pytest.raises(
        checkpoint_store.StoreUnreadable, match="Nothing was passed over or rolled back"
    ):
        restore_policy.restore_as_writer(tmp_path / "out", storage=flaky, catalog=catalog, run=RUN,
                                     generation=generation)  # fmt: skip
    assert catalog.head().step == 20  # type: ignore[union-attr]
    assert {e.status for e in catalog.entries()} == {schema.STATUS_COMPLETE}
    # Once the store answers again, the next start restores the newest checkpoint.
    report = restore_policy.restore_as_writer(tmp_path / "out", storage=healthy, catalog=catalog,
                                          run=RUN, generation=generation)  # fmt: skip
    assert report.manifest.step == 20 and report.rolled_back_from is None
    # Proof of damage is another matter: the checkpoint is passed over and the head follows.
    healthy.delete(list(changed.keys))
    report = restore_policy.restore_as_writer(tmp_path / "again", storage=healthy, catalog=catalog,
                                          run=RUN, generation=generation)  # fmt: skip
    assert (report.manifest.step, report.rolled_back_from) == (10, 20)
    assert "does not exist" in report.skipped[0][1]
    assert catalog.head().step == 10  # type: ignore[union-attr]


# --- 3. a restore touches nothing it did not put there --------------------------------------
def test_restore_into_a_folder_that_holds_other_files_is_refused_and_touches_nothing(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LocalStorage(tmp_path / "store")
    publish(storage, StoreCatalog(storage, RUN), tmp_path, 10)
    store = ["--store", f"file://{tmp_path / 'store'}", "--run", RUN]
    home = tmp_path / "home"
    (home / "notes").mkdir(parents=True)
    (home / "notes" / "todo.txt").write_text("keep me")
    assert cli.main(["checkpoints", "restore", *store, "--to", str(home)]) == 2
    assert "holds no earlier restore of run 'adversity'" in capsys.readouterr().err
    assert (home / "notes" / "todo.txt").read_text() == "keep me"
    assert sorted(p.name for p in home.iterdir()) == ["notes"]

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    assert cli.main(["checkpoints", "restore", *store, "--to", "."]) == 0
    assert "restored step 10" in capsys.readouterr().out
    assert (empty / "latest").read_bytes() == b"step_000000010"

    # Restoring again replaces the earlier restore, and only it.
    (empty / "my-eval.log").write_text("mine")
    publish(storage, StoreCatalog(storage, RUN), tmp_path, 20)
    assert cli.main(["checkpoints", "restore", *store, "--to", "."]) == 0
    assert (empty / "latest").read_bytes() == b"step_000000020"
    assert not (empty / "step_000000010").exists()
    assert (empty / "my-eval.log").read_text() == "mine"
    other = ["--store", f"file://{tmp_path / 'store'}", "--run", "another-run"]
    assert cli.main(["checkpoints", "restore", *other, "--to", "."]) != 0
    assert (empty / "latest").read_bytes() == b"step_000000020"


# --- 4. without the catalog, the store's records say what the catalog decided ---------------
def test_restore_without_the_catalog_never_returns_what_the_catalog_refused_or_retracted(
    dynamo: Any, tmp_path: Path
) -> None:
    storage = LocalStorage(tmp_path / "store")
    catalog = DynamoCatalog("catalog", RUN, storage, client=dynamo)
    unreachable = DynamoCatalog("catalog-in-a-region-that-is-down", RUN, storage, client=dynamo)
    stale = catalog.acquire_lease("preempted")
    for step in (10, 20, 30):
        publish(storage, catalog, tmp_path, step, stale)
    catalog.quarantine(30, "loss spike")
    current = catalog.acquire_lease("replacement")
    with pytest.raises(StaleWriter):
        publish(storage, catalog, tmp_path / "stale", 40, stale, salt="stale")

    def restored_without_catalog(name: str) -> checkpoint_store.RestoreReport:
        report = restore_policy.restore(
            tmp_path / name, storage=storage, catalog=unreachable, run=RUN
        )
        assert "does not exist" in (report.catalog_unavailable or "")
        return report

    assert restored_without_catalog("a").manifest.step == 20  # not 40 (refused), not 30
    catalog.roll_back(10, current, "bad data after step 10")
    assert restored_without_catalog("b").manifest.step == 10
    publish(storage, catalog, tmp_path / "redo", 20, current, salt="redo")
    report = restored_without_catalog("c")
    assert report.manifest.step == 20
    assert restored_optimizer(tmp_path / "c", 20) == b"20redo" * 4096
    # The same decisions, read from the store alone, as `spotrain checkpoints list` shows them.
    statuses = {(e.step, e.status) for e in StoreCatalog(storage, RUN).entries()}
    assert statuses == {
        (10, schema.STATUS_COMPLETE), (20, schema.STATUS_ROLLED_BACK),
        (20, schema.STATUS_COMPLETE), (30, schema.STATUS_QUARANTINED),
    }  # fmt: skip


# --- 5. one damaged object never makes a run unrestorable -----------------------------------
def test_no_single_damaged_or_missing_object_makes_the_run_unrestorable(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "store")
    catalog = StoreCatalog(storage, RUN)
    for step in (10, 20, 30):
        publish(storage, catalog, tmp_path, step)
    objects = snapshot(storage)
    assert len(objects) >= 12  # shards (the shared one twice), manifests, records
    for key, data in objects.items():
        path = storage.root / key
        for damage in ("flip", "delete"):
            if damage == "flip":
                path.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])
            else:
                path.unlink()
            out = tmp_path / f"restore-{damage}"
            report = restore_policy.restore(out, storage=storage, catalog=catalog, run=RUN)
            assert report.manifest.step in (20, 30), (key, damage)
            shutil.rmtree(out)
            path.write_bytes(data)


# --- 7. every fallback names what it passed over ----------------------------------------------
def test_a_torn_manifest_on_a_folder_store_is_named_when_passed_over(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "store")
    catalog = StoreCatalog(storage, RUN)
    publish(storage, catalog, tmp_path, 10)
    newest = publish(storage, catalog, tmp_path, 20).manifest
    path = storage.root / checkpoint_store.key_of(newest)
    path.write_bytes(path.read_bytes()[:100])  # torn
    report = restore_policy.restore(tmp_path / "out", storage=storage, catalog=catalog, run=RUN)
    assert report.manifest.step == 10
    [(step, reason)] = report.skipped
    assert step == 20 and "is damaged" in reason


# --- through the local cloud: S3's own answers ------------------------------------------------
@pytest.fixture
def s3_run(local_cloud: control.RunningCloud) -> Iterator[dict[str, Any]]:
    s3 = control.client("s3", local_cloud.endpoint, REGION)
    dynamodb = control.client("dynamodb", local_cloud.endpoint, REGION)
    bucket = f"adversity-{os.urandom(4).hex()}"
    key = kms_only_bucket(s3, control.client("kms", local_cloud.endpoint, REGION), bucket)
    create_catalog_table(dynamodb, bucket)
    storage = S3Storage(bucket, "", kms_key_id=key, client=s3)
    yield {"s3": s3, "bucket": bucket, "key": key, "storage": storage,
           "catalog": DynamoCatalog(bucket, RUN, storage, client=dynamodb)}  # fmt: skip
    control.set_faults(unavailable=[])


@pytest.mark.integration
def test_s3_objects_are_write_once_and_reuse_trusts_only_s3s_checksum(
    s3_run: dict[str, Any], tmp_path: Path
) -> None:
    """A stored shard overwritten outside spotrain (bit rot, a buggy tool) but still carrying
    the metadata its writer set is not reused: the next checkpoint stores good copies and
    restores. And nothing the seam writes can replace an object."""
    storage, catalog, s3 = s3_run["storage"], s3_run["catalog"], s3_run["s3"]
    generation = catalog.acquire_lease("trainer")
    first = publish(storage, catalog, tmp_path, 10, generation).manifest
    frozen = next(s for s in first.shards if s.name.endswith("embedding.pt"))
    [only_copy] = frozen.keys
    with pytest.raises(AlreadyExists):
        storage.put_bytes(only_copy, b"anything")
    s3.put_object(Bucket=s3_run["bucket"], Key=only_copy, Body=b"rotten" * 8192,
                  Metadata={"sha256": frozen.sha256}, ServerSideEncryption="aws:kms",
                  SSEKMSKeyId=s3_run["key"])  # fmt: skip
    second = publish(storage, catalog, tmp_path, 20, generation).manifest
    reused = next(s for s in second.shards if s.name.endswith("embedding.pt"))
    assert only_copy not in reused.keys and len(reused.keys) == 1
    report = restore_policy.restore(tmp_path / "out", storage=storage, catalog=catalog, run=RUN)
    assert report.manifest.step == 20 and report.skipped == []


@pytest.mark.integration
def test_a_briefly_unavailable_object_is_retried_and_a_lasting_outage_keeps_the_head(
    s3_run: dict[str, Any], tmp_path: Path
) -> None:
    storage, catalog = s3_run["storage"], s3_run["catalog"]
    generation = catalog.acquire_lease("trainer")
    publish(storage, catalog, tmp_path, 10, generation)
    newest = publish(storage, catalog, tmp_path, 20, generation).manifest
    changed = next(s for s in newest.shards if s.name.endswith("optimizer.pt"))
    pattern = f"{s3_run['bucket']}/{changed.keys[0]}"

    def start(name: str) -> checkpoint_store.RestoreReport:
        return restore_policy.restore_as_writer(tmp_path / name, storage=storage, catalog=catalog,
                                            run=RUN, generation=generation)  # fmt: skip

    control.set_faults(unavailable=[{"id": "blip", "pattern": pattern, "requests": 1}])
    report = start("blip")  # botocore's standard retry mode takes the 503 in its stride
    assert (report.manifest.step, report.skipped) == (20, [])
    control.set_faults(unavailable=[{"id": "outage", "pattern": pattern, "requests": 1000}])
    with pytest.raises(checkpoint_store.StoreUnreadable, match="503"):
        start("outage")
    assert catalog.head().step == 20  # type: ignore[union-attr]
    assert {e.status for e in catalog.entries()} == {schema.STATUS_COMPLETE}
    control.set_faults(unavailable=[])
    assert start("after").manifest.step == 20


def test_manifest_is_named_by_its_own_bytes() -> None:
    manifest = Manifest(run=RUN, step=5, shards=(), world_size=1, zero_stage=2,
                        config_hash="x", code_version="y", created_at="now")  # fmt: skip
    key = checkpoint_store.key_of(manifest)
    assert key.startswith(f"runs/{RUN}/checkpoints/step_000000005/manifest-")
    assert check_manifest_bytes(key, manifest.to_json()) == manifest
    with pytest.raises(ManifestError, match="damaged"):
        check_manifest_bytes(key, manifest.to_json().replace(b"now", b"later"))
