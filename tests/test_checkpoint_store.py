"""The checkpoint core: storage seam, verified publish, catalog fencing, restore with fallback.

Runs against local folders, in-process moto (DynamoDB), and the local cloud over HTTPS (S3
with the checkpoint bucket policy, DynamoDB with the catalog schema).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from helpers import create_catalog_table, kms_only_bucket

from spotrain.core import catalog_schema as schema
from spotrain.core.manifest import Manifest, Shard, shard_key
from spotrain.core.run_epochs import EpochId
from spotrain.localcloud import control
from spotrain.trainer import checkpoint_store, restore_policy
from spotrain.trainer.catalog import CatalogError, DynamoCatalog, StaleWriter, StoreCatalog
from spotrain.trainer.storage import (
    AlreadyExists,
    LocalStorage,
    S3Storage,
    StorageError,
    open_storage,
    sha256_of,
)

RUN = "demo"
REGION = "us-east-1"


def write_folder(folder: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def shards_of_step(step: int, frozen: bytes = b"embedding" * 4096) -> dict[str, bytes]:
    """A checkpoint folder as DeepSpeed lays it out: one changing file per rank, one frozen."""
    return {
        f"global_step{step}/mp_rank_00_model_states.pt": frozen,
        f"global_step{step}/zero_pp_rank_0_mp_rank_00_optim_states.pt": os.urandom(50_000),
        f"global_step{step}/zero_pp_rank_1_mp_rank_00_optim_states.pt": os.urandom(50_000),
        "latest": f"global_step{step}".encode(),
    }


def publish(
    folder: Path, storage: Any, catalog: Any, step: int, generation: int = 1, **kw: Any
) -> Any:
    return checkpoint_store.publish(
        folder, storage=storage, catalog=catalog, generation=generation, run=RUN, step=step,
        world_size=2, zero_stage=2, config_hash="c0ffee", code_version="test", **kw,
    )  # fmt: skip


# --- storage seam ---------------------------------------------------------------------------
def test_open_storage_understands_paths_files_and_buckets(tmp_path: Path) -> None:
    assert isinstance(open_storage(str(tmp_path)), LocalStorage)
    assert isinstance(open_storage(f"file://{tmp_path}"), LocalStorage)
    s3 = open_storage("s3://bucket/some/prefix")
    assert isinstance(s3, S3Storage) and (s3.bucket, s3.prefix) == ("bucket", "some/prefix")
    with pytest.raises(StorageError, match="file:// paths or s3:// buckets"):
        open_storage("gs://bucket/x")
    with pytest.raises(StorageError, match="names no bucket"):
        open_storage("s3:///x")


def test_local_storage_refuses_keys_outside_its_root(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="escapes"):
        LocalStorage(tmp_path / "root").put_bytes("../outside", b"x")


def test_local_storage_leaves_no_partial_file_when_a_write_fails(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)

    def failing() -> Iterator[bytes]:
        yield b"half"
        raise OSError("disk full")

    with pytest.raises(StorageError, match="disk full"):
        storage._write_once("runs/demo/x", failing())
    assert storage.list("runs") == []


# --- publish and restore --------------------------------------------------------------------
def test_round_trip_restores_every_file_bit_for_bit(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    catalog = StoreCatalog(storage, RUN)
    files = shards_of_step(10)
    publish(write_folder(tmp_path / "ckpt", files), storage, catalog, step=10)
    report = restore_policy.restore(
        tmp_path / "restored", storage=storage, catalog=catalog, run=RUN
    )
    assert report.manifest.step == 10 and report.skipped == []
    restored = {p.relative_to(tmp_path / "restored").as_posix(): p.read_bytes()
                for p in (tmp_path / "restored").rglob("*")
                if p.is_file() and p.name != checkpoint_store.RESTORE_MARKER}  # fmt: skip
    assert restored == files


def test_unchanged_shards_are_not_uploaded_again_and_shared_ones_have_two_copies(
    tmp_path: Path,
) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    catalog = StoreCatalog(storage, RUN)
    first, second, third = (
        publish(write_folder(tmp_path / f"s{step}", shards_of_step(step)), storage, catalog, step)
        for step in (10, 20, 30)
    )
    frozen = len(b"embedding" * 4096)
    assert (first.reused_bytes, first.uploaded_bytes) == (0, first.manifest.total_bytes)
    # The second checkpoint shares the frozen shard: its bytes get a second, independent object.
    assert (second.reused_bytes, second.uploaded_bytes) == (frozen, second.manifest.total_bytes)
    assert (third.reused_bytes, third.uploaded_bytes) == (
        frozen,
        third.manifest.total_bytes - frozen,
    )
    shared = [s for s in third.manifest.shards if s.size == frozen]
    assert len(shared) == 1 and len(shared[0].keys) == 2
    assert shared[0].keys == next(s for s in second.manifest.shards if s.size == frozen).keys


def test_corrupt_shard_falls_back_to_the_previous_checkpoint(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    catalog = StoreCatalog(storage, RUN)
    publish(write_folder(tmp_path / "a", shards_of_step(10)), storage, catalog, step=10)
    newest = publish(write_folder(tmp_path / "b", shards_of_step(20)), storage, catalog, step=20)
    victim = next(s for s in newest.manifest.shards if "rank_1" in s.name)
    path = tmp_path / "bucket" / shard_key(RUN, victim.sha256)
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    report = restore_policy.restore(
        tmp_path / "restored", storage=storage, catalog=catalog, run=RUN
    )
    assert report.manifest.step == 10
    assert report.skipped[0][0] == 20 and "corrupt" in report.skipped[0][1]
    assert (tmp_path / "restored" / "latest").read_bytes() == b"global_step10"


def test_missing_shard_falls_back_and_nothing_restorable_is_a_clear_error(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    catalog = StoreCatalog(storage, RUN)
    only = publish(write_folder(tmp_path / "a", shards_of_step(10)), storage, catalog, step=10)
    storage.delete([shard_key(RUN, only.manifest.shards[0].sha256)])
    with pytest.raises(checkpoint_store.RestoreError, match=r"step 10: .*does not exist"):
        restore_policy.restore(tmp_path / "restored", storage=storage, catalog=catalog, run=RUN)
    assert not (tmp_path / "restored").exists()


def test_crash_before_the_manifest_leaves_the_last_good_checkpoint(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    catalog = StoreCatalog(storage, RUN)
    publish(write_folder(tmp_path / "a", shards_of_step(10)), storage, catalog, step=10)
    # A second checkpoint whose shards were uploaded but whose manifest never was.
    for name, data in shards_of_step(20).items():
        source = write_folder(tmp_path / "b", {name: data}) / name
        with contextlib.suppress(AlreadyExists):  # the frozen shard is stored already
            storage.put_file(source, shard_key(RUN, sha256_of(source)))
    assert catalog.head().step == 10  # type: ignore[union-attr]
    report = restore_policy.restore(
        tmp_path / "restored", storage=storage, catalog=catalog, run=RUN
    )
    assert report.manifest.step == 10


def test_a_long_interval_keeps_at_most_so_many_step_losses_evenly_and_the_last() -> None:
    pairs = [(step, 1.0 / step) for step in range(1, 2502)]
    kept = checkpoint_store.thinned(pairs, 1000)
    assert len(kept) <= 1000 and kept[0] == [1, 1.0] and kept[-1] == [2501, 1.0 / 2501]
    assert {b[0] - a[0] for a, b in pairwise(kept[:-1])} == {3}
    assert checkpoint_store.thinned(pairs[:5], 1000) == [[s, v] for s, v in pairs[:5]]


# --- DynamoDB catalog -----------------------------------------------------------------------
def test_publish_moves_the_head_and_records_lineage(dynamo: Any, tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    catalog = DynamoCatalog("catalog", RUN, storage, client=dynamo)
    generation = catalog.acquire_lease("host-a")
    publish(write_folder(tmp_path / "a", shards_of_step(10)), storage, catalog, 10, generation)
    publish(write_folder(tmp_path / "b", shards_of_step(20)), storage, catalog, 20, generation,
            parent="demo/step_000000010", loss=2.375,
            step_losses=[(s, 3.0 - s / 20) for s in range(11, 21)])  # fmt: skip
    assert catalog.head().step == 20  # type: ignore[union-attr]
    # The loss the loop gave with the step is on its record (`spotrain run status` shows it).
    records = dynamo.query(
        TableName="catalog", KeyConditionExpression="#pk = :pk",
        ExpressionAttributeNames={"#pk": schema.PARTITION_KEY},
        ExpressionAttributeValues={":pk": {"S": schema.run_key(RUN)}},
    )["Items"]  # fmt: skip
    losses = {r["sk"]["S"]: r.get(schema.LOSS_KEY, {}).get("N") for r in records
              if r["sk"]["S"].startswith(schema.CHECKPOINT_PREFIX)}  # fmt: skip
    assert losses == {"CKPT#000000000010": None, "CKPT#000000000020": "2.375"}
    # And each step's since the checkpoint before, for `run status --plot`.
    [each_step] = [json.loads(r[schema.STEP_LOSSES_KEY]["S"]) for r in records
                   if schema.STEP_LOSSES_KEY in r]  # fmt: skip
    assert each_step == [[s, 3.0 - s / 20] for s in range(11, 21)]
    assert [(e.step, e.parent) for e in catalog.entries()] == [
        (10, None), (20, "demo/step_000000010")
    ]  # fmt: skip
    children = dynamo.query(
        TableName="catalog", IndexName=schema.LINEAGE_INDEX,
        KeyConditionExpression="#p = :p", ExpressionAttributeNames={"#p": schema.LINEAGE_KEY},
        ExpressionAttributeValues={":p": {"S": "demo/step_000000010"}},
    )["Items"]  # fmt: skip
    assert [c["sk"]["S"] for c in children] == ["CKPT#000000000020"]


def test_a_writer_whose_lease_was_taken_cannot_publish(dynamo: Any, tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    catalog = DynamoCatalog("catalog", RUN, storage, client=dynamo)
    old = catalog.acquire_lease("preempted-host")
    new = catalog.acquire_lease("replacement-host")
    assert new == old + 1
    with pytest.raises(StaleWriter, match="taken over"):
        publish(write_folder(tmp_path / "a", shards_of_step(30)), storage, catalog, 30, old)
    assert catalog.head() is None and catalog.entries() == []
    publish(write_folder(tmp_path / "b", shards_of_step(20)), storage, catalog, 20, new)
    assert catalog.head().step == 20  # type: ignore[union-attr]


def test_an_older_step_never_replaces_a_newer_head(dynamo: Any, tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    catalog = DynamoCatalog("catalog", RUN, storage, client=dynamo)
    generation = catalog.acquire_lease("host")
    publish(write_folder(tmp_path / "a", shards_of_step(20)), storage, catalog, 20, generation)
    with pytest.raises(StaleWriter, match="not newer"):
        publish(write_folder(tmp_path / "b", shards_of_step(10)), storage, catalog, 10, generation)
    assert catalog.head().step == 20  # type: ignore[union-attr]


def test_quarantined_checkpoint_is_skipped_by_restore(dynamo: Any, tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    catalog = DynamoCatalog("catalog", RUN, storage, client=dynamo)
    generation = catalog.acquire_lease("host")
    publish(write_folder(tmp_path / "a", shards_of_step(10)), storage, catalog, 10, generation)
    publish(write_folder(tmp_path / "b", shards_of_step(20)), storage, catalog, 20, generation)
    catalog.quarantine(20, "loss spike after step 15")
    report = restore_policy.restore(
        tmp_path / "restored", storage=storage, catalog=catalog, run=RUN
    )
    assert report.manifest.step == 10


def test_missing_catalog_table_names_the_fix(dynamo: Any, tmp_path: Path) -> None:
    from spotrain.trainer.catalog import CatalogError

    storage = LocalStorage(tmp_path / "bucket")
    with pytest.raises(CatalogError, match="deploy the environment's catalog stack"):
        DynamoCatalog("no-such-table", RUN, storage, client=dynamo).entries()


# --- the real path: local cloud over HTTPS --------------------------------------------------
def test_publish_and_restore_through_the_local_cloud(local_cloud: Any, tmp_path: Path) -> None:
    s3 = control.client("s3", local_cloud.endpoint, REGION)
    dynamodb = control.client("dynamodb", local_cloud.endpoint, REGION)
    bucket, table = "ckpt-store-test", "ckpt-store-test-catalog"
    key = kms_only_bucket(s3, control.client("kms", local_cloud.endpoint, REGION), bucket)
    create_catalog_table(dynamodb, table)
    storage = S3Storage(bucket, "", kms_key_id=key, client=s3)
    catalog = DynamoCatalog(table, RUN, storage, client=dynamodb)
    generation = catalog.acquire_lease("host-a")
    files = {**shards_of_step(10), "global_step10/big.pt": os.urandom(12 * 1024 * 1024)}
    report = publish(write_folder(tmp_path / "a", files), storage, catalog, 10, generation)
    assert report.uploaded_bytes == report.manifest.total_bytes
    big = next(s for s in report.manifest.shards if s.name.endswith("big.pt"))
    assert [c.size for c in big.chunks] == [4 * 1024 * 1024] * 3  # three conditional PUTs
    head = s3.head_object(Bucket=bucket, Key=checkpoint_store.key_of(report.manifest))
    assert head["SSEKMSKeyId"] == key
    # Without a key named (operators' commands), writes name the bucket's default key.
    S3Storage(bucket, "", client=s3).put_bytes("runs/demo/by-default", b"x")
    assert s3.head_object(Bucket=bucket, Key="runs/demo/by-default")["SSEKMSKeyId"] == key
    s3.delete_bucket_encryption(Bucket=bucket)
    with pytest.raises(StorageError, match=r"(403|AccessDenied).*pass the bucket's key"):
        S3Storage(bucket, "", client=s3).put_bytes("runs/demo/stray", b"x")
    restored = restore_policy.restore(
        tmp_path / "restored", storage=storage, catalog=catalog, run=RUN
    )
    assert restored.manifest == report.manifest
    assert (tmp_path / "restored" / "global_step10" / "big.pt").read_bytes() == files[
        "global_step10/big.pt"
    ]


@pytest.fixture
def global_catalog(local_cloud: Any) -> Iterator[tuple[str, Any, Any]]:
    """A catalog table in us-east-1 with its global-table replica in us-west-2 (the local
    cloud's: asynchronous, last writer wins), and the faults cleared afterwards."""
    east = control.client("dynamodb", local_cloud.endpoint, "us-east-1")
    west = control.client("dynamodb", local_cloud.endpoint, "us-west-2")
    table = f"fenced-{os.urandom(4).hex()}"
    create_catalog_table(east, table, stream=True)
    east.update_table(TableName=table, ReplicaUpdates=[{"Create": {"RegionName": "us-west-2"}}])
    yield table, east, west
    control.set_faults(regions_partitioned=[])


def _until(check: Any, timeout: float = 20.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "replication never caught up"
        time.sleep(0.05)


def test_a_run_moved_to_another_region_keeps_one_history_whatever_the_old_region_wrote(
    global_catalog: tuple[str, Any, Any], tmp_path: Path
) -> None:
    """The old region is cut off; the run moves; both regions' writers publish the same steps;
    the old region rejoins. Every region then reads the mover's head, the old writer's later
    checkpoints stay listed but FENCED, and the old region's writers are refused."""
    table, east, west = global_catalog
    storage = LocalStorage(tmp_path / "bucket")  # both regions' copies: not the subject here
    home = DynamoCatalog(table, RUN, storage, client=east)
    home_lease = home.acquire_lease("machine in us-east-1")
    for step in (10, 20):
        publish(write_folder(tmp_path / f"e{step}", shards_of_step(step)), storage, home, step,
                home_lease)  # fmt: skip
    away = DynamoCatalog(table, RUN, storage, client=west)
    _until(lambda: (head := away.head()) is not None and head.step == 20)

    control.set_faults(regions_partitioned=["us-east-1"])
    base = away.head()
    assert base is not None
    claim = away.claim_move(base, by="test: capacity gone in us-east-1")
    assert (claim.id.number, claim.id.region, claim.base_step) == (1, "us-west-2", 20)
    away_lease = away.acquire_lease("machine in us-west-2")
    moved = publish(write_folder(tmp_path / "w30", shards_of_step(30)), storage, away, 30,
                    away_lease)  # fmt: skip
    # Cut off, the old region cannot know: its writer goes on publishing there.
    stale = {step: publish(write_folder(tmp_path / f"s{step}", shards_of_step(step)), storage,
                           home, step, home_lease) for step in (30, 40)}  # fmt: skip
    assert home.head().step == 40  # type: ignore[union-attr]  # in its own copy, for now

    control.set_faults(regions_partitioned=[])
    _until(lambda: len(home.chain()) == 2)
    moved_key = checkpoint_store.key_of(moved.manifest)
    for reader in (home, away):
        _until(lambda r=reader: len(r.entries()) == 5)
        head = reader.head()
        assert head is not None and (head.step, head.manifest_key) == (30, moved_key)
        statuses = {(e.step, e.epoch.number if e.epoch else 0): e.status for e in reader.entries()}
        assert statuses == {
            (10, 0): schema.STATUS_COMPLETE, (20, 0): schema.STATUS_COMPLETE,
            (30, 1): schema.STATUS_COMPLETE,
            (30, 0): schema.STATUS_FENCED, (40, 0): schema.STATUS_FENCED,
        }  # fmt: skip
        restored = restore_policy.restore(tmp_path / f"r-{reader.region}", storage=storage,
                                          catalog=reader, run=RUN)  # fmt: skip
        assert restored.manifest == moved.manifest
    # Without the table (a restore while it cannot be reached), the store's records, the
    # stale writer's among them, count the same checkpoints: the move was recorded there too.
    by_records = StoreCatalog(storage, RUN)
    assert by_records.head().manifest_key == moved_key  # type: ignore[union-attr]
    assert {(e.step, e.status) for e in by_records.entries()} == {
        (10, schema.STATUS_COMPLETE), (20, schema.STATUS_COMPLETE), (30, schema.STATUS_COMPLETE),
        (30, schema.STATUS_FENCED), (40, schema.STATUS_FENCED),
    }  # fmt: skip
    # The old region's history stays readable: its manifests are where they were written.
    assert {e.manifest_key for e in home.entries() if e.status == schema.STATUS_FENCED} == {
        checkpoint_store.key_of(r.manifest) for r in stale.values()}  # fmt: skip
    # Its writer is refused once the move reached it, and so is any new one there.
    with pytest.raises(StaleWriter, match="moved on from this writer's epoch"):
        publish(write_folder(tmp_path / "s50", shards_of_step(50)), storage, home, 50, home_lease)
    with pytest.raises(StaleWriter, match="trains in us-west-2 since epoch 1"):
        DynamoCatalog(table, RUN, storage, client=east).acquire_lease("a restarted machine")
    # The mover's writer goes on, its publishes reaching every region.
    publish(write_folder(tmp_path / "w40", shards_of_step(41)), storage, away, 40, away_lease)
    _until(lambda: home.head().step == 40 and home.head().epoch == claim.id)  # type: ignore[union-attr]


def test_a_machine_booting_where_the_handler_ordered_the_move_claims_the_run_there(
    global_catalog: tuple[str, Any, Any], tmp_path: Path, local_cloud: Any,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The run's region stopped answering, and the next region's handler ordered the move
    there (in its fleet state: `core.failover`). The first machine to boot there (`fleet
    may-start`, as the boot script runs it) claims the run's next epoch from the newest
    checkpoint whose every piece is there and verifies, passing over one whose piece never
    arrived; the next machine finds it claimed; with no order, nothing moves."""
    from spotrain import cli
    from spotrain.core import fleet_state, run_epochs
    from spotrain.core.failover import MoveOrder
    from spotrain.trainer.run_checkpoints import RESTORE_FOLDER

    table, east, west = global_catalog
    storage = LocalStorage(tmp_path / "bucket")  # the destination's copy
    home = DynamoCatalog(table, RUN, storage, client=east)
    lease = home.acquire_lease("machine in us-east-1")
    published = {step: publish(write_folder(tmp_path / f"h{step}", shards_of_step(step)), storage,
                               home, step, lease) for step in (10, 20)}  # fmt: skip
    away = DynamoCatalog(table, RUN, storage, client=west)
    _until(lambda: (head := away.head()) is not None and head.step == 20)
    # Step 20's changed piece has not replicated yet.
    missing = next(s for s in published[20].manifest.shards if "rank_1" in s.name).stored_keys[0]
    (storage.root / missing).unlink()
    events = f"events-{os.urandom(4).hex()}"
    create_catalog_table(west, events)
    for name, value in control.aws_environment(local_cloud.endpoint, "us-west-2").items():
        monkeypatch.setenv(name, value)
    boot = ["fleet", "may-start", "--events-table", events, "--run", RUN, "--instance", "i-0a",
            "--store", storage.uri, "--catalog-table", table,
            "--work-dir", str(tmp_path / "work")]  # fmt: skip
    control.set_faults(regions_down=["us-east-1"])
    try:
        assert cli.main(boot) == 0  # no order yet: a machine there moves nothing
        assert "may start" in capsys.readouterr().out and len(away.chain()) == 1
        state = control.resource("dynamodb", local_cloud.endpoint, "us-west-2").Table(events)
        fleet_state.set_failover_state(state, RUN, "us-west-2", fleet_state.FailoverState(
            move_order=MoveOrder(from_epoch=0, from_region="us-east-1", to_region="us-west-2",
                                 ordered_at=0.0, reason="us-east-1 has not answered for 3 checks"),
        ))  # fmt: skip
        assert cli.main(boot) == 0
        said = capsys.readouterr().out
        assert "passed over step 20" in said, said
        assert f"run {RUN}: moved to us-west-2 (epoch 1) from step 10, as ordered" in said
        claim = run_epochs.current(away.chain())
        assert claim is not None and (claim.id, claim.base_step) == (EpochId(1, "us-west-2"), 10)
        assert "us-east-1 has not answered for 3 checks" in claim.claimed_by
        # The move was checked by restoring step 10 where the trainer restores: its start
        # (as rank 0 restores) fetches none of it again.
        into = tmp_path / "work" / RESTORE_FOLDER
        restored = restore_policy.restore(into, storage=storage, catalog=away, run=RUN)
        size = sum(shard.size for shard in published[10].manifest.shards)
        assert (restored.manifest.step, restored.fetched_bytes, restored.reused_bytes) == (
            10, 0, size)  # fmt: skip
        assert cli.main([*boot[:7], "i-0b", *boot[8:]]) == 0  # the next machine
        assert "no move: the run already trains here (epoch 1)" in capsys.readouterr().out
        assert len(away.chain()) == 2
    finally:
        control.set_faults(regions_down=[])


def test_two_regions_that_claim_the_same_epoch_end_agreeing_on_one(
    global_catalog: tuple[str, Any, Any], tmp_path: Path
) -> None:
    """Cut off from each other, both regions move the run (epoch 1) and publish; once joined,
    both read the same winner, and the loser's writer and checkpoints are fenced."""
    table, east, west = global_catalog
    storage = LocalStorage(tmp_path / "bucket")
    first = DynamoCatalog(table, RUN, storage, client=east)
    lease = first.acquire_lease("machine in us-east-1")
    publish(write_folder(tmp_path / "a10", shards_of_step(10)), storage, first, 10, lease)
    regions = {"us-east-1": DynamoCatalog(table, RUN, storage, client=east),
               "us-west-2": DynamoCatalog(table, RUN, storage, client=west)}  # fmt: skip
    _until(lambda: (head := regions["us-west-2"].head()) is not None and head.step == 10)
    control.set_faults(regions_partitioned=["us-west-2"])
    leases = {}
    for region, catalog in regions.items():
        catalog.claim_move(catalog.head(), by=f"the handler in {region}")  # type: ignore[arg-type]
        leases[region] = catalog.acquire_lease(f"machine in {region}")
        publish(write_folder(tmp_path / region, shards_of_step(20)), storage, catalog, 20,
                leases[region])  # fmt: skip
    control.set_faults(regions_partitioned=[])
    _until(lambda: all(len(c.entries()) == 3 for c in regions.values()))
    _until(lambda: len({c.chain()[-1].id for c in regions.values()}) == 1)
    winner = regions["us-east-1"].chain()[-1].id.region
    loser = next(r for r in regions if r != winner)
    for catalog in regions.values():
        head = catalog.head()
        assert head is not None and head.epoch == EpochId(1, winner)
        fenced = [e for e in catalog.entries() if e.status == schema.STATUS_FENCED]
        assert [(e.step, e.epoch) for e in fenced] == [(20, EpochId(1, loser))]
    with pytest.raises(StaleWriter):
        publish(write_folder(tmp_path / "late", shards_of_step(30)), storage, regions[loser], 30,
                leases[loser])  # fmt: skip


# --- retention ------------------------------------------------------------------------------
def test_gc_keeps_the_newest_two_and_frees_only_what_they_do_not_share(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    catalog = StoreCatalog(storage, RUN)
    reports = [
        publish(write_folder(tmp_path / f"s{step}", shards_of_step(step)), storage, catalog, step)
        for step in (10, 20, 30, 40)
    ]
    result = checkpoint_store.collect_garbage(storage=storage, catalog=catalog, run=RUN)
    assert (result.kept, result.collected) == ([30, 40], [10, 20])
    assert [(e.step, e.status) for e in catalog.entries()] == [
        (10, schema.STATUS_COLLECTED), (20, schema.STATUS_COLLECTED),
        (30, schema.STATUS_COMPLETE), (40, schema.STATUS_COMPLETE),
    ]  # fmt: skip
    frozen = reports[0].manifest.shards[0]
    assert storage.stat(shard_key(RUN, frozen.sha256)) is not None  # shared with 30 and 40
    old_optimizer = next(s for s in reports[0].manifest.shards if "rank_0_mp" in s.name)
    assert storage.stat(shard_key(RUN, old_optimizer.sha256)) is None
    assert result.freed_bytes == sum(
        s.size for r in reports[:2] for s in r.manifest.shards if s.sha256 != frozen.sha256
    )
    for report in reports[2:]:
        checkpoint_store.verify(
            storage, checkpoint_store.key_of(report.manifest), tmp_path / "scratch"
        )


def test_gc_deletes_nothing_when_a_manifest_it_must_judge_cannot_be_read(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    catalog = StoreCatalog(storage, RUN)
    for step in (10, 20, 30):
        publish(write_folder(tmp_path / f"s{step}", shards_of_step(step)), storage, catalog, step)
    retained = storage.root / catalog.head().manifest_key  # type: ignore[union-attr]
    retained.write_bytes(retained.read_bytes()[:-10])
    before = storage.list("runs")
    with pytest.raises(checkpoint_store.SpotrainError, match="stopped before deleting anything"):
        checkpoint_store.collect_garbage(storage=storage, catalog=catalog, run=RUN)
    assert storage.list("runs") == before


def test_gc_refuses_to_keep_fewer_than_two(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    with pytest.raises(checkpoint_store.SpotrainError, match="keep at least 2"):
        checkpoint_store.collect_garbage(
            storage=storage, catalog=StoreCatalog(storage, RUN), run=RUN, keep=1
        )


def test_gc_marks_collected_checkpoints_in_the_catalog(dynamo: Any, tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    catalog = DynamoCatalog("catalog", RUN, storage, client=dynamo)
    generation = catalog.acquire_lease("host")
    for step in (10, 20, 30):
        publish(
            write_folder(tmp_path / f"s{step}", shards_of_step(step)),
            storage,
            catalog,
            step,
            generation,
        )
    first = catalog.entries()[0]
    checkpoint_store.collect_garbage(storage=storage, catalog=catalog, run=RUN)
    assert [(e.step, e.status) for e in catalog.entries()] == [
        (10, schema.STATUS_COLLECTED), (20, schema.STATUS_COMPLETE), (30, schema.STATUS_COMPLETE)
    ]  # fmt: skip
    assert storage.stat(first.manifest_key) is None
    report = restore_policy.restore(
        tmp_path / "restored", storage=storage, catalog=catalog, run=RUN
    )
    assert report.manifest.step == 30


# --- spotrain checkpoints -------------------------------------------------------------------
def test_checkpoints_command_lists_verifies_restores_and_collects(
    tmp_path: Path, capsys: Any
) -> None:
    from spotrain import cli

    storage = LocalStorage(tmp_path / "bucket")
    catalog = StoreCatalog(storage, RUN)
    for step in (10, 20, 30):
        publish(write_folder(tmp_path / f"s{step}", shards_of_step(step)), storage, catalog, step)
    store = ["--store", f"file://{tmp_path / 'bucket'}", "--run", RUN]

    assert cli.main(["checkpoints", "list", *store]) == 0
    listing = capsys.readouterr().out
    assert "30  COMPLETE" in listing and "<- head" in listing.splitlines()[-1]
    assert cli.main(["checkpoints", "verify", *store]) == 0
    assert "step 30: all 4 files present" in capsys.readouterr().out
    assert cli.main(["checkpoints", "show", *store, "--step", "20"]) == 0
    assert Manifest.from_json(capsys.readouterr().out.encode()).step == 20

    newest = Manifest.from_json(storage.get_bytes(catalog.head().manifest_key))  # type: ignore[union-attr]
    storage.delete(list(next(s for s in newest.shards if "rank_1" in s.name).keys))
    assert cli.main(["checkpoints", "verify", *store]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["checkpoints", "restore", *store]) == 2
    assert "restore needs --to DIR" in capsys.readouterr().err
    to = ["--to", str(tmp_path / "out")]
    assert cli.main(["checkpoints", "restore", *store, *to, "--no-roll-back"]) == 0
    out = capsys.readouterr().out
    assert "skipped checkpoint step 30" in out and "restored step 20" in out
    assert "the head is still step 30: --no-roll-back was given" in out
    assert catalog.head().step == 30  # type: ignore[union-attr]
    # As a restarting run would: the head moves back past the damaged checkpoint.
    assert cli.main(["checkpoints", "restore", *store, *to]) == 0
    assert "head moved back from step 30 to 20" in capsys.readouterr().out
    assert catalog.head().step == 20  # type: ignore[union-attr]
    assert cli.main(["checkpoints", "list", *store]) == 0
    assert "30  ROLLED_BACK" in capsys.readouterr().out
    assert cli.main(["checkpoints", "gc", *store]) == 0
    assert "kept steps [10, 20]; collected nothing" in capsys.readouterr().out


def test_large_files_are_stored_in_chunks_and_only_changed_chunks_are_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fine-tuning run with frozen layers: DeepSpeed rewrites the same file at the same
    offsets, and only the chunks whose bytes changed are sent (once each has its two copies)."""
    from spotrain.core import manifest as manifest_module

    chunk = 64 * 1024
    monkeypatch.setattr(manifest_module, "CHUNK_BYTES", chunk)
    storage = LocalStorage(tmp_path / "bucket")
    catalog = StoreCatalog(storage, RUN)
    weights = bytearray(os.urandom(16 * chunk + 1000))  # 17 chunks, the last one short
    name = "step/model_states.pt"

    def publish_with(step: int, changed: list[int]) -> Any:
        for index in changed:
            weights[index * chunk : index * chunk + 10] = os.urandom(10)
        folder = write_folder(tmp_path / f"s{step}", {name: bytes(weights)})
        return publish(folder, storage, catalog, step)

    first = publish_with(1, [])
    [shard] = first.manifest.shards
    assert len(shard.chunks) == 17 and shard.chunks[-1].size == 1000 and not shard.keys
    assert first.uploaded_bytes == len(weights)
    second = publish_with(2, [5])  # unchanged chunks gain their second copy now, once
    assert second.uploaded_bytes == len(weights) - chunk + chunk
    third = publish_with(3, [7])  # chunk 7 is new; chunk 5 (as in step 2) gains its second copy
    assert third.uploaded_bytes == 2 * chunk and third.reused_bytes == len(weights) - chunk
    fourth = publish_with(4, [9])
    assert fourth.uploaded_bytes == 2 * chunk  # what changed, and step 3's chunk 7's copy

    for report in (first, third, fourth):  # each restores bit for bit, chunk by chunk
        restored = tmp_path / f"restored-{report.manifest.step}"
        checkpoint_store.fetch(storage, checkpoint_store.key_of(report.manifest), restored, run=RUN)
        assert (restored / name).read_bytes() == (tmp_path / f"s{report.manifest.step}" / name
                                                  ).read_bytes()  # fmt: skip
    # Restored over an earlier restore, only what differs is fetched: step 4 over step 3 is
    # chunk 9, and chunk 0, whose bytes changed on this disk since (each piece is checked).
    over = tmp_path / "restored-3"
    with (over / name).open("r+b") as changed_here:
        changed_here.write(b"bit rot")
    again = checkpoint_store.fetch(storage, checkpoint_store.key_of(fourth.manifest), over, run=RUN)
    assert (again.fetched_bytes, again.reused_bytes) == (2 * chunk, len(weights) - 2 * chunk)
    assert (over / name).read_bytes() == (tmp_path / "s4" / name).read_bytes()
    same = checkpoint_store.fetch(storage, checkpoint_store.key_of(fourth.manifest), over, run=RUN)
    assert (same.fetched_bytes, same.reused_bytes) == (0, len(weights))
    # One damaged copy of a shared chunk: the other serves, and the restore says so.
    shared = fourth.manifest.shards[0].chunks[0]
    assert len(shared.keys) == 2
    (tmp_path / "bucket" / shared.keys[0]).write_bytes(b"rot")
    report = restore_policy.restore(
        tmp_path / "after-rot", storage=storage, catalog=catalog, run=RUN
    )
    assert report.manifest.step == 4 and "bytes from 0" in report.notes[0]
    assert (tmp_path / "after-rot" / name).read_bytes() == bytes(weights)
    # Collection keeps what the newest two reference and frees only older chunks' objects.
    collected = checkpoint_store.collect_garbage(storage=storage, catalog=catalog, run=RUN)
    assert collected.collected == [1, 2]
    # Only steps 1 and 2 held chunk 5 as first written (one object) and chunk 7 before it
    # changed (two objects by then); everything else is still referenced.
    assert collected.freed_bytes == 3 * chunk
    checkpoint_store.fetch(
        storage, checkpoint_store.key_of(third.manifest), tmp_path / "third", run=RUN
    )


def test_the_trainers_chunks_follow_its_tensors_so_an_unchanged_tensor_is_reused_whole(
    tmp_path: Path,
) -> None:
    """torch.save writes each tensor's bytes in one piece; the checkpointer cuts chunks there,
    so a frozen tensor makes the same chunks whatever changed beside it."""
    import torch

    from spotrain.trainer.snapshot import HashingWriter

    def chunks_of(state: dict[str, Any]) -> dict[str, int]:
        with (tmp_path / "state.pt").open("wb") as target:
            writer = HashingWriter(target)
            torch.save(state, writer)
        shard = writer.hasher.shard("state.pt")
        assert shard.size == (tmp_path / "state.pt").stat().st_size
        return {c.sha256: c.size for c in shard.chunks}

    torch.manual_seed(0)
    frozen, trained = torch.randn(300_000), torch.randn(1_200_000)  # 1.1 MiB, 4.6 MiB
    before = chunks_of({"step": 1, "frozen": frozen, "trained": trained, "bias": torch.ones(3)})
    after = chunks_of({"step": 2, "frozen": frozen, "trained": trained + 1, "bias": torch.ones(3)})
    shared = set(before) & set(after)
    # The frozen tensor is one chunk of its own, unchanged; of the rest only a few bytes of
    # records between tensors stay the same (the trained tensor's two chunks, 4 MiB and the
    # rest, the step and the zip's directory changed).
    frozen_digest = hashlib.sha256(frozen.numpy().tobytes()).hexdigest()
    assert frozen_digest in shared and before[frozen_digest] == frozen.numel() * 4
    assert sum(before[digest] for digest in shared - {frozen_digest}) < 1024


def test_chunks_handed_to_uploaders_are_the_chunks_hashed_in_place() -> None:
    """Streamed to the uploaders (whole chunks taken in one copy, pieces gathered) or hashed
    where they pass, the same bytes in the same writes make the same chunks."""
    from concurrent.futures import Future

    from spotrain.core.manifest import Chunk, ChunkHasher, chunk_of

    def taken(data: bytes) -> Future[Chunk]:
        done: Future[Chunk] = Future()
        done.set_result(chunk_of(data))
        return done

    size = 1024
    stream = os.urandom(7 * size + 300)
    writes = [(0, 100, False), (100, 2 * size + 100, True), (2 * size + 100, 5 * size, False),
              (5 * size, 7 * size + 300, True)]  # fmt: skip
    shards = []
    for hand_over in (None, taken):
        hasher = ChunkHasher(chunk_bytes=size, hand_over=hand_over)
        for start, end, alone in writes:
            hasher.update(stream[start:end], alone=alone)
        shards.append(hasher.shard("state.pt"))
    assert shards[0] == shards[1] and len(shards[0].chunks) > 6
    assert shards[0].size == len(stream)


def test_a_checkpoint_file_is_written_without_the_zips_checksums_and_loads_whole(
    tmp_path: Path,
) -> None:
    """torch.save's CRC32 of every record is most of the serialising thread's time and the
    checkpoint needs none of it (each chunk has its SHA-256 and CRC32): the checkpointer's files
    carry none and torch.load reads them whole, while torch's process-wide switch is never
    turned, so the script's own files keep theirs."""
    import zipfile

    import torch

    from spotrain.trainer import snapshot

    torch.manual_seed(0)
    state = {"step": 3, "weights": torch.randn(1_200_000), "bias": torch.ones(3)}
    staged = [snapshot.Staged(tmp_path / "ckpt" / "model_states.pt", state)]
    assert torch.serialization.get_crc32_options()
    [shard] = snapshot.write_staged(staged, tmp_path / "ckpt")
    written = tmp_path / "ckpt" / "model_states.pt"
    with zipfile.ZipFile(written) as archive:
        records = [info for info in archive.infolist() if info.file_size]
    assert records and all(info.CRC == 0 for info in records)
    loaded = torch.load(written, weights_only=True)
    assert loaded["step"] == 3 and torch.equal(loaded["weights"], state["weights"])
    assert shard.size == written.stat().st_size
    # The process's own setting is never touched: a torch.save of the script's on another
    # thread (or in a DataLoader worker forked meanwhile) still writes the zip's checksums.
    seen: list[bool] = []
    original = snapshot.HashingWriter.write

    def write(self: Any, data: Any) -> int:
        seen.append(torch.serialization.get_crc32_options())
        scripts = tmp_path / "scripts.pt"
        torch.save({"mine": torch.arange(4)}, scripts)  # mid-serialisation, as another thread
        with zipfile.ZipFile(scripts) as archive:
            assert archive.testzip() is None  # every record's checksum is there and right
        return original(self, data)

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(snapshot.HashingWriter, "write", write)
        again = [snapshot.Staged(tmp_path / "again" / "model_states.pt", state)]
        snapshot.write_staged(again, tmp_path / "again")
    assert seen and all(seen)
    assert (tmp_path / "again" / "model_states.pt").read_bytes() == written.read_bytes()
    # The same bytes as torch.save writes with its process-wide switch off, which it replaced.
    reference = tmp_path / "reference.pt"
    torch.serialization.set_crc32_options(False)
    try:
        with reference.open("wb") as target:  # a file object, as the checkpointer's writer is
            torch.save(state, target)
    finally:
        torch.serialization.set_crc32_options(True)
    assert reference.read_bytes() == written.read_bytes()


def test_the_stores_own_client_has_a_connection_for_every_piece_uploader() -> None:
    """A checkpoint's pieces go up 16 at once: with botocore's default pool of 10, six of them
    would open and discard a connection (a TLS handshake) for every request."""
    from spotrain.trainer.storage import S3Storage

    pool = S3Storage("bucket", "").client.meta.config.max_pool_connections
    assert pool >= checkpoint_store.PIECE_WORKERS + 8  # the pieces, and a transfer's parts


def test_the_trainers_uploader_checks_its_parents_pieces_and_finds_older_ones_by_address(
    tmp_path: Path,
) -> None:
    """Known pieces (the parent's) are checked where they are; others are written at once, and
    a taken address reveals bytes an older checkpoint stored, reused all the same."""
    from spotrain.core.manifest import chunk_of

    storage = LocalStorage(tmp_path / "bucket")

    def upload(known: dict[str, list[str]], *pieces: bytes) -> checkpoint_store.UploadReport:
        uploader = checkpoint_store.PieceUploader(storage=storage, run=RUN, known=known)
        chunks = [uploader.put_bytes(data).result() for data in pieces]
        return uploader.finish([Shard(f"f{i}", c.sha256, c.size, c.crc32)
                                for i, c in enumerate(chunks)])  # fmt: skip

    old, kept, new = os.urandom(1000), os.urandom(1000), os.urandom(1000)
    upload({}, old)  # an older checkpoint
    parent = upload({}, kept)
    assert parent.uploaded_bytes == 1000 and len(parent.stored_keys) == 1
    known = checkpoint_store.known_pieces(parent.shards)
    report = upload(known, kept, old, new)
    keys = {s.sha256: s.keys for s in report.shards}
    # kept: the parent's object checked and a second copy made; old: found at its address,
    # likewise; new: written once.
    assert [len(keys[chunk_of(d).sha256]) for d in (kept, old, new)] == [2, 2, 1]
    assert report.reused_bytes == 2000 and report.uploaded_bytes == 3000
    assert report.stored_keys == {keys[chunk_of(new).sha256][0]}
    # A known object that vanished is not trusted: the bytes go up again beside it.
    storage.delete([known[chunk_of(kept).sha256][0]])
    again = upload(known, kept)
    assert again.uploaded_bytes == 1000 and again.reused_bytes == 0


def test_a_manifest_of_the_previous_format_reads_and_keeps_its_key(tmp_path: Path) -> None:
    """Version 2 manifests (whole-file objects only) stay restorable, under the same key."""
    storage = LocalStorage(tmp_path / "bucket")
    report = publish(write_folder(tmp_path / "s", shards_of_step(10)), storage,
                     StoreCatalog(storage, RUN), 10)  # fmt: skip
    document = json.loads(report.manifest.to_json())
    document["format_version"] = 2
    old = json.dumps(document, sort_keys=True, indent=1).encode()
    assert Manifest.from_json(old).to_json() == old
    assert Manifest.from_json(old).shards == report.manifest.shards


def test_roll_back_moves_the_head_back_and_a_new_publish_follows_it(
    dynamo: Any, tmp_path: Path
) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    catalog = DynamoCatalog("catalog", RUN, storage, client=dynamo)
    generation = catalog.acquire_lease("host")
    for step in (10, 20, 30):
        publish(write_folder(tmp_path / f"s{step}", shards_of_step(step)), storage, catalog,
                step, generation)  # fmt: skip
    with pytest.raises(StaleWriter, match="taken over"):
        catalog.roll_back(10, generation - 1, "loss spike")
    assert catalog.roll_back(10, generation, "loss spike") == [20, 30]
    assert catalog.head().step == 10  # type: ignore[union-attr]
    statuses = {e.step: e.status for e in catalog.entries()}
    assert statuses == {10: schema.STATUS_COMPLETE, 20: schema.STATUS_ROLLED_BACK,
                        30: schema.STATUS_ROLLED_BACK}  # fmt: skip
    report = restore_policy.restore(
        tmp_path / "restored", storage=storage, catalog=catalog, run=RUN
    )
    assert report.manifest.step == 10
    # The run goes on from 10 and publishes 20 again, which the old head would have refused.
    publish(write_folder(tmp_path / "again", shards_of_step(21)), storage, catalog, 20, generation)
    assert catalog.head().step == 20  # type: ignore[union-attr]
    with pytest.raises(CatalogError, match="not a complete checkpoint"):
        catalog.roll_back(30, generation, "rolled back checkpoints cannot become the head")


def test_roll_back_of_a_folder_run_quarantines_the_newer_manifests(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    catalog = StoreCatalog(storage, RUN)
    for step in (10, 20):
        folder = write_folder(tmp_path / f"s{step}", shards_of_step(step))
        publish(folder, storage, catalog, step, 0)
    assert catalog.roll_back(10, 0, "bad data") == [20]
    assert catalog.head().step == 10  # type: ignore[union-attr]


def test_checkpoints_wait_passes_when_the_run_publishes_and_fails_at_once_at_a_crash(
    dynamo: Any, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`spotrain checkpoints wait`, the restore runbook's proof that a fleet trains: a new
    checkpoint passes it; a crash of the run's machines fails it with the crash's reason; a
    run that publishes nothing fails it when its time is up."""
    import time
    from collections.abc import Callable

    import boto3

    from spotrain import cli
    from spotrain.cli import checkpoints as checkpoints_cli
    from spotrain.core import fleet_state

    class Meanwhile:
        """The wait's clock: while it first sleeps, `happens` happens (the fleet's doing)."""

        def __init__(self, happens: Callable[[], Any]) -> None:
            self.happens: Callable[[], Any] | None = happens

        monotonic = staticmethod(time.monotonic)

        def sleep(self, _: float) -> None:
            if self.happens is not None:
                self.happens()
                self.happens = None
            time.sleep(0.01)

    storage = LocalStorage(tmp_path / "bucket")
    catalog = StoreCatalog(storage, RUN)
    publish(write_folder(tmp_path / "s10", shards_of_step(10)), storage, catalog, 10)
    store = ["--store", f"file://{tmp_path / 'bucket'}", "--run", RUN, "--events-table", "catalog"]
    monkeypatch.setattr(checkpoints_cli, "time", Meanwhile(lambda: publish(
        write_folder(tmp_path / "s20", shards_of_step(20)), storage, catalog, 20)))  # fmt: skip
    assert cli.main(["checkpoints", "wait", *store, "--within", "1"]) == 0
    said = capsys.readouterr().out
    assert "past step 10" in said and "step 20 published: run demo trains" in said

    died = "rank 0 died after step 20: CUDA out of memory"
    monkeypatch.setattr(checkpoints_cli, "time", Meanwhile(lambda: fleet_state.record_exit(
        boto3.resource("dynamodb").Table("catalog"), RUN, "i-0abc", 1, reason=died)))  # fmt: skip
    assert cli.main(["checkpoints", "wait", *store, "--within", "1"]) == 2
    refused = capsys.readouterr().err
    assert f"run demo crashed while waiting (i-0abc exit 1: {died})" in refused
    assert "spotrain run logs ENV RUN --machine ID" in refused and "Traceback" not in refused

    monkeypatch.setattr(checkpoints_cli, "time", Meanwhile(lambda: None))
    assert cli.main(["checkpoints", "wait", *store, "--within", "0.001"]) == 2
    assert "published nothing past step 20 within 0.001 min" in capsys.readouterr().err
