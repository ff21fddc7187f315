"""The checkpoint catalog: which of a run's checkpoints are published, and which is its head.

`DynamoCatalog` is the real one (schema in docs/catalog.md). Publishing is one DynamoDB
transaction that (1) checks the writer still holds the run's lease generation, (2) records the
checkpoint as COMPLETE and (3) moves the run's head to it only if it is newer than the head. A
writer whose lease was taken over by a newer start, or that is behind the head, cannot publish.

Every decision the catalog takes (published, quarantined, rolled back, collected) is also
recorded in the store beside the checkpoints (`RunRecords`, `runs/<run>/records/`), after the
catalog took it. `StoreCatalog` reads those records: it is the catalog of `file://` runs and of
runs without a table, and how checkpoints are found while the table cannot be reached (a
region down, restoring from the replica bucket). It never offers a checkpoint the catalog
refused (a refused publish leaves no record), quarantined, rolled back or collected. A record's
key alone says what was decided about which manifest, so a damaged record changes nothing.
"""

from __future__ import annotations

import contextlib
import datetime
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from spotrain.core import aws_clients, run_epochs
from spotrain.core import catalog_schema as schema
from spotrain.core.errors import SpotrainError, no_region_fix, outage_fix
from spotrain.core.manifest import (
    Manifest,
    parse_record_key,
    record_key,
    records_prefix,
)
from spotrain.core.run_epochs import Epoch, EpochId
from spotrain.trainer.storage import AlreadyExists, Storage, StorageError


class CatalogError(SpotrainError):
    """The catalog could not be read or written, or refused what was asked."""


class StaleWriter(CatalogError):
    """This writer lost the run's lease, or its checkpoint is not newer than the published
    head, or the run moved to another region: it must stop and never publish."""


@dataclass(frozen=True)
class CatalogEntry:
    step: int
    manifest_key: str
    status: str
    generation: int
    parent: str | None = None
    total_bytes: int = 0
    reason: str = ""
    """Why the status is what it is (quarantine and roll back reasons)."""
    sort_key: str = ""
    """Its item's sort key in the catalog table (`CKPT#<step>` and its epoch's suffix)."""
    epoch: EpochId | None = None
    """The epoch that wrote it (None: epoch 0, or a catalog without epochs)."""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


class Catalog(Protocol):
    def acquire_lease(self, owner: str) -> int: ...

    def publish(self, manifest: Manifest, manifest_key: str, generation: int) -> None: ...

    def head(self) -> CatalogEntry | None: ...

    def entries(self) -> list[CatalogEntry]: ...

    def quarantine(self, step: int, reason: str) -> None: ...

    def retire(self, entry: CatalogEntry) -> None: ...

    def roll_back(self, step: int, generation: int, reason: str) -> list[int]: ...

    def announce_finishing(self, step: int) -> None: ...


def open_catalog(
    storage: Storage, run: str, *, table: str | None = None, client: Any = None
) -> Catalog:
    """The run's catalog: its DynamoDB table when one is named, else the store's records."""
    if table:
        return DynamoCatalog(table, run, storage, client=client)
    return StoreCatalog(storage, run)


def _not_a_checkpoint(run: str, step: int) -> CatalogError:
    return CatalogError(
        f"run {run!r} has no checkpoint at step {step}: `spotrain checkpoints list` shows them"
    )


def _not_complete(run: str, step: int) -> CatalogError:
    return CatalogError(
        f"run {run!r}: step {step} is not a complete checkpoint; pick one that "
        "`spotrain checkpoints list` shows COMPLETE"
    )


# Record kinds, one per decision; the statuses they stand for.
PUBLISHED, QUARANTINED, ROLLED_BACK, COLLECTED = (
    "published",
    "quarantined",
    "rolled-back",
    "collected",
)
_STATUS_OF = {
    QUARANTINED: schema.STATUS_QUARANTINED,
    ROLLED_BACK: schema.STATUS_ROLLED_BACK,
    COLLECTED: schema.STATUS_COLLECTED,
}
_CLAIM_PREFIX = "epoch_"
"""A move's record in the store: `records/epoch_<n>-<region>.json`."""
_UNREADABLE = "unreadable"

# A later decision about a checkpoint wins over an earlier one.
_PRECEDENCE = [PUBLISHED, ROLLED_BACK, QUARANTINED, COLLECTED]


class RunRecords:
    """The catalog's decisions about a run's checkpoints, written once each into the store."""

    def __init__(self, storage: Storage, run: str) -> None:
        self.storage, self.run = storage, run

    def write(self, kind: str, manifest_key: str, **details: Any) -> None:
        document = {"kind": kind, "manifest": manifest_key, "at": _now(), **details}
        # AlreadyExists: the same decision about the same manifest was recorded before.
        with contextlib.suppress(AlreadyExists):
            self.storage.put_bytes(
                record_key(manifest_key, kind), json.dumps(document, sort_keys=True).encode()
            )

    def write_claim(self, chain: list[Epoch]) -> None:
        """Record a move in the store: the claim of the chain's last epoch, with the chain as
        the mover read it, so a restore without the table counts the same checkpoints."""
        latest = chain[-1].id
        key = f"{records_prefix(self.run)}{_CLAIM_PREFIX}{latest.number:06d}-{latest.region}.json"
        document = {"chain": [epoch.to_item() for epoch in chain], "at": _now()}
        with contextlib.suppress(AlreadyExists):
            self.storage.put_bytes(key, json.dumps(document, sort_keys=True).encode())

    def keys(self) -> list[str]:
        """Every record's key (one listing, for `read` and `read_chain` both)."""
        return list(self.storage.list(records_prefix(self.run)))

    def read_chain(self, keys: list[str] | None = None) -> list[Epoch]:
        """The run's epochs as the newest move recorded here read them (none: it never moved;
        an unreadable record: its own epoch alone, so nothing before it counts)."""
        claims = [k for k in (self.keys() if keys is None else keys)
                  if k.rsplit("/", 1)[-1].startswith(_CLAIM_PREFIX)]  # fmt: skip
        chains = []
        for key in claims:
            name = key.rsplit("/", 1)[-1].removeprefix(_CLAIM_PREFIX).removesuffix(".json")
            number, _, region = name.partition("-")
            try:
                document = json.loads(self.storage.get_bytes(key))
                chain = [Epoch.from_item(item) for item in document["chain"]]
            except (StorageError, ValueError, KeyError, TypeError):
                chain = [Epoch(EpochId(int(number), region), None, None)]
            chains.append(chain)
        # Two claims of one number (regions that could not see each other): the later wins, as
        # the table's last writer does.
        return max(chains, key=lambda c: (c[-1].id.number, c[-1].claimed_at, c[-1].id.region),
                   default=[])  # fmt: skip

    def read(self, keys: list[str] | None = None) -> dict[str, tuple[int, str, dict[str, Any]]]:
        """manifest key -> (step, its latest decision, that decision's details)."""
        latest: dict[str, tuple[int, str, str]] = {}
        for key in self.keys() if keys is None else keys:
            parsed = parse_record_key(key)
            if parsed is None or parsed[1] not in _PRECEDENCE:
                continue  # not a record
            step, kind, manifest_key = parsed
            known = latest.get(manifest_key)
            if known is None or _PRECEDENCE.index(kind) > _PRECEDENCE.index(known[1]):
                latest[manifest_key] = (step, kind, key)
        # Details (reasons, parent, size) only for checkpoints still there: collected ones pile
        # up over a run's life and need none.
        wanted = [(m, key) for m, (_, kind, key) in latest.items() if kind != COLLECTED]
        with ThreadPoolExecutor(8) as pool:
            read = pool.map(self._details, [key for _, key in wanted])
            details = dict(zip([m for m, _ in wanted], read, strict=True))
        return {m: (step, kind, details.get(m, {})) for m, (step, kind, _) in latest.items()}

    def _details(self, key: str) -> dict[str, Any]:
        try:
            document = json.loads(self.storage.get_bytes(key))
            return document if isinstance(document, dict) else {}
        except (StorageError, ValueError):
            # The key holds the decision; only its details (reason, parent, size, the epoch
            # that wrote it) are lost.
            return {"reason": f"(record {key} is unreadable)", _UNREADABLE: True}


class StoreCatalog:
    """The catalog as recorded in the store: the catalog of runs without a table, and the way
    to find checkpoints while the table cannot be reached. One writer per run (no shared
    lease): a folder run is trained from one place."""

    def __init__(self, storage: Storage, run: str) -> None:
        self.storage, self.run = storage, run
        self.records = RunRecords(storage, run)

    def acquire_lease(self, owner: str) -> int:
        return 0

    def announce_finishing(self, step: int) -> None:
        """Nothing: a run without a table has no queue waiting on its machines."""

    def publish(self, manifest: Manifest, manifest_key: str, generation: int) -> None:
        head = self.head()
        if head is not None and head.step >= manifest.step:
            raise StaleWriter(
                f"run {self.run!r}: step {manifest.step} is not newer than the published "
                f"head, step {head.step}"
            )
        self.records.write(
            PUBLISHED, manifest_key, step=manifest.step, generation=generation,
            parent=manifest.parent, bytes=manifest.total_bytes,
        )  # fmt: skip

    def entries(self) -> list[CatalogEntry]:
        """Every recorded checkpoint, by step; after a move (`run_epochs`), one that is not
        part of the run's history, or whose record no longer says who wrote it, is FENCED."""
        keys = self.records.keys()
        chain = self.records.read_chain(keys)
        line = run_epochs.valid_through(chain) if len(chain) > 1 else None
        first = chain[0].id if chain else None
        found = []
        for manifest_key, (step, kind, details) in self.records.read(keys).items():
            epoch = (EpochId(int(details["epoch"]), str(details["region"]))
                     if "epoch" in details and "region" in details else first)  # fmt: skip
            status = _STATUS_OF.get(kind, schema.STATUS_COMPLETE)
            if line is not None and (details.get(_UNREADABLE) or epoch is None
                                     or not run_epochs.counts(epoch, step, line)):  # fmt: skip
                status = schema.STATUS_FENCED
            found.append(
                CatalogEntry(
                    step=step,
                    manifest_key=manifest_key,
                    status=status,
                    generation=int(details.get("generation") or 0),
                    parent=details.get("parent"),
                    total_bytes=int(details.get("bytes") or 0),
                    reason=str(details.get("reason") or ""),
                    epoch=epoch if epoch is not None and epoch.number else None,
                )
            )
        return sorted(found, key=lambda e: (e.step, e.status != schema.STATUS_COMPLETE))

    def head(self) -> CatalogEntry | None:
        complete = [e for e in self.entries() if e.status == schema.STATUS_COMPLETE]
        return complete[-1] if complete else None

    def _at(self, step: int) -> CatalogEntry:
        """The checkpoint at `step`: the complete one if there is one, else the newest record."""
        matching = [e for e in self.entries() if e.step == step]
        if not matching:
            raise _not_a_checkpoint(self.run, step)
        return matching[0]

    def quarantine(self, step: int, reason: str) -> None:
        self.records.write(QUARANTINED, self._at(step).manifest_key, reason=reason)

    def retire(self, entry: CatalogEntry) -> None:
        self.records.write(COLLECTED, entry.manifest_key)

    def roll_back(self, step: int, generation: int, reason: str) -> list[int]:
        entries = self.entries()
        complete = [e for e in entries if e.status == schema.STATUS_COMPLETE]
        if step not in {e.step for e in complete}:
            raise _not_complete(self.run, step)
        newer = [e for e in complete if e.step > step]
        for entry in reversed(newer):  # newest first: a crash halfway leaves none past the head
            self.records.write(ROLLED_BACK, entry.manifest_key, reason=reason, to_step=step)
        return [e.step for e in newer]


class DynamoCatalog:
    def __init__(self, table_name: str, run: str, storage: Storage, *, client: Any = None) -> None:
        self.table_name, self.run = table_name, run
        self.records = RunRecords(storage, run)
        self._client = client
        self._pk = {"S": schema.run_key(run)}
        self._epoch: EpochId | None = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = aws_clients.client("dynamodb")
        return self._client

    def _error(self, action: str, error: Exception) -> CatalogError:
        from botocore.exceptions import ClientError, NoCredentialsError, NoRegionError

        if isinstance(error, ClientError):
            if error.response["Error"]["Code"] == "ResourceNotFoundException":
                return CatalogError(
                    f"catalog table {self.table_name!r} does not exist: deploy the environment's "
                    "catalog stack, or pass the table name that `spotrain deploy` printed "
                    "(and check AWS_DEFAULT_REGION)"
                )
            fix = (outage_fix(error, aws_clients.region_of(self._client))
                   or "check your credentials' permissions on the table, or retry")  # fmt: skip
            return CatalogError(f"{action} in catalog table {self.table_name!r} failed: {error}; "
                                f"{fix}")  # fmt: skip
        if isinstance(error, NoRegionError):
            return CatalogError(f"catalog table {self.table_name!r}: no AWS region; "
                                f"{no_region_fix()} (the table's region)")  # fmt: skip
        if isinstance(error, NoCredentialsError):
            return CatalogError(
                f"catalog table {self.table_name!r}: {error}; configure AWS credentials (an "
                "instance role on the fleet, AWS_PROFILE or the AWS_* variables)"
            )
        return CatalogError(f"catalog table {self.table_name!r} unreachable: {error}")

    def _call(self, operation: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, operation)(TableName=self.table_name, **kwargs)
        except (ClientError, BotoCoreError) as error:
            raise self._error(operation, error) from error

    @property
    def region(self) -> str:
        """The region whose copy of the catalog this writer reads and writes."""
        return str(self.client.meta.region_name)

    def chain(self) -> list[Epoch]:
        """The run's epoch claims, as this region's copy has them."""
        return [Epoch.from_item(item) for item in self._items(run_epochs.EPOCH_PREFIX)]

    def _items(self, sort_prefix: str) -> list[dict[str, Any]]:
        """Every item of the run whose sort key starts with `sort_prefix`, all pages."""
        found, start = [], None
        while True:
            page = self._call(
                "query",
                KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
                ExpressionAttributeValues={":pk": self._pk, ":prefix": {"S": sort_prefix}},
                ConsistentRead=True,
                **({"ExclusiveStartKey": start} if start else {}),
            )
            found += page.get("Items", [])
            start = page.get("LastEvaluatedKey")
            if not start:
                return found

    def acquire_lease(self, owner: str) -> int:
        """Take the run's lease in its current epoch with a new generation; every older writer
        is now stale. The run's first writer claims epoch 0 for its region; a writer in a
        region the run has moved away from is refused (StaleWriter)."""
        epoch = self._epoch_here(owner)
        result = self._call(
            "update_item",
            Key=self._key(schema.LEASE_SORT_KEY + run_epochs.epoch_suffix(epoch)),
            UpdateExpression="ADD #generation :one SET #owner = :owner, acquired_at = :now",
            ExpressionAttributeNames={"#generation": "generation", "#owner": "owner"},
            ExpressionAttributeValues={
                ":one": {"N": "1"},
                ":owner": {"S": owner},
                ":now": {"S": _now()},
            },
            ReturnValues="UPDATED_NEW",
        )
        self._epoch = epoch
        return int(result["Attributes"]["generation"]["N"])

    def _epoch_here(self, owner: str) -> EpochId:
        chain = self.chain()
        latest = run_epochs.current(chain)
        if latest is None:
            first = Epoch(EpochId(0, self.region), None, None, _now(), owner)
            with contextlib.suppress(StaleWriter):  # another first writer claimed it here
                self._transact(
                    [{"Put": {"TableName": self.table_name,
                              "Item": {**self._key(run_epochs.epoch_sort_key(0)),
                                       **first.to_item()},
                              "ConditionExpression": "attribute_not_exists(pk)"}}],
                    action="claiming epoch 0", refused=StaleWriter("epoch 0 is claimed"),
                    fences=0,
                )  # fmt: skip
            chain = self.chain()
            latest = run_epochs.current(chain)
            assert latest is not None
        if latest.id.region != self.region:
            # Refused as a writer of the last epoch this region had (0 if it had none).
            mine = max((e.id for e in chain if e.id.region == self.region),
                       default=EpochId(0, self.region))  # fmt: skip
            self._say_refused(mine, latest.id, "take the run's lease (a start)")
            raise StaleWriter(
                f"run {self.run!r} trains in {latest.id.region} since epoch {latest.id.number}: "
                f"a writer in {self.region} must not train it (its machines there leave; "
                f"`spotrain run status` says where the run is)"
            )
        return latest.id

    def _say_refused(self, writer: EpochId, latest: EpochId | None, action: str) -> None:
        """Leave the refusal in this region's copy (`run_epochs.refusal_item`), so the
        catalog's watcher alarms that a stale writer tried. Best effort: the refusal stands
        whether or not this is written."""
        from botocore.exceptions import BotoCoreError, ClientError

        item = {schema.PARTITION_KEY: self._pk,
                **run_epochs.refusal_item(writer, latest, action, _now())}  # fmt: skip
        with contextlib.suppress(BotoCoreError, ClientError):
            self.client.put_item(TableName=self.table_name, Item=item,
                                 ConditionExpression="attribute_not_exists(pk)")  # fmt: skip

    def _writer_epoch(self) -> EpochId:
        """This writer's epoch: the one it took its lease in (a catalog that took none writes
        in the epoch its region's copy shows current, or epoch 0 of a run never started)."""
        if self._epoch is None:
            latest = run_epochs.current(self.chain())
            self._epoch = latest.id if latest else EpochId(0, self.region)
        return self._epoch

    def publish(self, manifest: Manifest, manifest_key: str, generation: int) -> None:
        if manifest.run != self.run:
            raise CatalogError(f"manifest of run {manifest.run!r} offered to run {self.run!r}")
        epoch = self._writer_epoch()
        sort_key = schema.checkpoint_sort_key(manifest.step) + run_epochs.epoch_suffix(epoch)
        item: dict[str, Any] = {
            **self._key(sort_key),
            "status": {"S": schema.STATUS_COMPLETE},
            "step": {"N": str(manifest.step)},
            "manifest": {"S": manifest_key},
            "generation": {"N": str(generation)},
            "epoch": {"N": str(epoch.number)},
            "region": {"S": epoch.region},
            "bytes": {"N": str(manifest.total_bytes)},
            "shards": {"N": str(len(manifest.shards))},
            "world_size": {"N": str(manifest.world_size)},
            "zero_stage": {"N": str(manifest.zero_stage)},
            "config_hash": {"S": manifest.config_hash},
            "code_version": {"S": manifest.code_version},
            "tier": {"S": manifest.tier},
            "created_at": {"S": manifest.created_at},
        }
        if manifest.parent:
            item[schema.LINEAGE_KEY] = {"S": manifest.parent}
        if manifest.extra.get("final"):
            item[schema.FINAL_KEY] = {"BOOL": True}
        if manifest.extra.get("loss") is not None:
            item[schema.LOSS_KEY] = {"N": repr(float(manifest.extra["loss"]))}
        if manifest.extra.get("step_losses"):
            item[schema.STEP_LOSSES_KEY] = {"S": json.dumps(manifest.extra["step_losses"])}
        if manifest.extra.get("timings"):
            item[schema.TIMINGS_KEY] = {
                "M": {k: {"N": str(v)} for k, v in manifest.extra["timings"].items()}
            }
        self._transact(
            [
                *self._fence(generation),
                {"Put": {"TableName": self.table_name, "Item": item}},
                self._head_update(
                    sort_key,
                    manifest.step,
                    generation,
                    condition="attribute_not_exists(#step) OR #step < :step",
                ),
            ],
            action=f"publish of step {manifest.step}",
            refused=StaleWriter(
                f"run {self.run!r}: step {manifest.step} is not newer than the published head"
            ),
        )
        self.records.write(
            PUBLISHED, manifest_key, step=manifest.step, generation=generation,
            parent=manifest.parent, bytes=manifest.total_bytes, epoch=epoch.number,
            region=epoch.region,
        )  # fmt: skip

    def _key(self, sort_key: str) -> dict[str, Any]:
        return {schema.PARTITION_KEY: self._pk, schema.SORT_KEY: {"S": sort_key}}

    _FENCES = 3
    """Transaction items that fence a write: the lease, the writer's claim, no next claim."""

    def _fence(self, generation: int) -> list[dict[str, Any]]:
        """The first `_FENCES` items of every write's transaction: the writer still holds
        lease `generation` of its epoch, its region's copy shows its epoch's claim as its own
        (or none, for epoch 0 of a run from before epochs) and no next epoch claimed."""
        epoch = self._writer_epoch()
        lease = {
            "ConditionCheck": {
                "TableName": self.table_name,
                "Key": self._key(schema.LEASE_SORT_KEY + run_epochs.epoch_suffix(epoch)),
                "ConditionExpression": "#generation = :generation",
                "ExpressionAttributeNames": {"#generation": "generation"},
                "ExpressionAttributeValues": {":generation": {"N": str(generation)}},
            }
        }
        claims = []
        for sort_key, condition, values in run_epochs.publish_conditions(epoch):
            claims.append({"ConditionCheck": {
                "TableName": self.table_name, "Key": self._key(sort_key),
                "ConditionExpression": condition,
                "ExpressionAttributeNames": {"#region": "region"},
                **({"ExpressionAttributeValues": values} if values else {}),
            }})  # fmt: skip
        return [lease, *claims]

    def _head_update(
        self,
        sort_key: str,
        step: int,
        generation: int,
        *,
        condition: str | None = None,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """Transaction item: the run's head (its writer's epoch's) names checkpoint item
        `sort_key`, of step `step`."""
        values = {
            ":latest": {"S": sort_key},
            ":step": {"N": str(step)},
            ":generation": {"N": str(generation)},
            ":now": {"S": _now()},
        }
        expression = (
            "SET latest = :latest, #step = :step, #generation = :generation, updated_at = :now"
        )
        if reason is not None:
            expression += ", rolled_back = :reason"
            values[":reason"] = {"S": reason}
        epoch = self._writer_epoch()
        update: dict[str, Any] = {
            "TableName": self.table_name,
            "Key": self._key(schema.HEAD_SORT_KEY + run_epochs.epoch_suffix(epoch)),
            "UpdateExpression": expression,
            "ExpressionAttributeNames": {"#step": "step", "#generation": "generation"},
            "ExpressionAttributeValues": values,
        }
        if condition:
            update["ConditionExpression"] = condition
        return {"Update": update}

    def _transact(
        self,
        items: list[dict[str, Any]],
        *,
        action: str,
        refused: CatalogError,
        fences: int = _FENCES,
    ) -> None:
        """One transaction whose first `fences` items are `_fence`'s: a failed fence raises
        StaleWriter, any other failed condition raises `refused`."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.transact_write_items(TransactItems=items)
        except ClientError as error:
            if error.response["Error"]["Code"] != "TransactionCanceledException":
                raise self._error(action, error) from error
            reasons = [r.get("Code") for r in error.response.get("CancellationReasons", [])]
            failed = [i for i, code in enumerate(reasons) if code == "ConditionalCheckFailed"]
            if failed and failed[0] == 0 and fences:
                raise StaleWriter(
                    f"run {self.run!r}: the lease this writer held was taken over by a newer "
                    f"start; {action} did not happen (it must come from the run's current holder)"
                ) from error
            if failed and failed[0] < fences:
                latest = run_epochs.current(self.chain())
                self._say_refused(self._writer_epoch(), latest.id if latest else None, action)
                raise StaleWriter(
                    f"run {self.run!r}: the run moved on from this writer's epoch "
                    f"({self._writer_epoch().number}, {self.region}); {action} did not happen "
                    "(`spotrain run status` says where the run trains now)"
                ) from error
            raise refused from error
        except BotoCoreError as error:
            raise self._error(action, error) from error

    def claim_move(self, base: CatalogEntry, by: str) -> Epoch:
        """Move the run to this catalog's region: claim the next epoch here, starting from
        checkpoint `base` (one of the run's history whose every piece is in this region's
        bucket, verified). Refused when this region's copy shows another claim of that number,
        or a newer epoch than the one this mover read."""
        chain = self.chain()
        latest = run_epochs.current(chain)
        if latest is None:
            raise CatalogError(f"run {self.run!r} never trained: it has nothing to move")
        base_epoch = run_epochs.written_by(
            base.sort_key or schema.checkpoint_sort_key(base.step), base.step, chain
        )
        if not run_epochs.counts(base_epoch, base.step, run_epochs.valid_through(chain)):
            raise CatalogError(f"run {self.run!r}: step {base.step} is not in its history")
        claim = Epoch(EpochId(latest.id.number + 1, self.region), base_epoch, base.step, _now(), by)
        self._transact(
            [
                {"ConditionCheck": {
                    "TableName": self.table_name,
                    "Key": self._key(run_epochs.epoch_sort_key(latest.id.number)),
                    "ConditionExpression": "#region = :region",
                    "ExpressionAttributeNames": {"#region": "region"},
                    "ExpressionAttributeValues": {":region": {"S": latest.id.region}}}},
                {"Put": {
                    "TableName": self.table_name,
                    "Item": {**self._key(run_epochs.epoch_sort_key(claim.id.number)),
                             **claim.to_item()},
                    "ConditionExpression": "attribute_not_exists(pk)"}},
            ],
            action=f"the move of run {self.run!r} to {self.region}",
            refused=CatalogError(
                f"run {self.run!r}: epoch {claim.id.number} was claimed meanwhile; read "
                "`spotrain run status` and move again if the run still must"),
            fences=0,
        )  # fmt: skip
        self._epoch = None
        self.records.write_claim([*chain, claim])
        return claim

    def announce_finishing(self, step: int) -> None:
        """Say that `step`, the run's last, is being published as its final checkpoint: the
        catalog's stream tells the interruption handler, whose queue starts the next runs on
        this run's machines meanwhile (`catalog_schema.FINISHING_SORT_KEY`). Not fenced: it
        publishes nothing, and a stale writer's announcement only lets a run start early."""
        epoch = self._writer_epoch()
        self._call("put_item", Item={
            **self._key(schema.FINISHING_SORT_KEY), "step": {"N": str(step)},
            "epoch": {"N": str(epoch.number)}, "region": {"S": epoch.region},
            "at": {"S": _now()}})  # fmt: skip

    def head(self) -> CatalogEntry | None:
        chain = self.chain()
        head = self._get(run_epochs.head_sort_key(chain))
        if head:
            item = self._get(head["latest"]["S"])
            return self._entry(item) if item else None
        # The epoch published nothing yet: its head is where it started.
        latest = run_epochs.current(chain)
        base_key = run_epochs.base_sort_key(latest) if latest else None
        item = self._get(base_key) if base_key else None
        return self._entry(item) if item else None

    def _get(self, sort_key: str) -> dict[str, Any] | None:
        item: dict[str, Any] | None = self._call(
            "get_item", Key=self._key(sort_key), ConsistentRead=True
        ).get("Item")
        return item

    @staticmethod
    def _entry(item: dict[str, Any]) -> CatalogEntry:
        sort_key = item["sk"]["S"]
        step = int(item["step"]["N"])
        return CatalogEntry(
            step=step,
            manifest_key=item["manifest"]["S"],
            status=item["status"]["S"],
            generation=int(item["generation"]["N"]),
            parent=item.get(schema.LINEAGE_KEY, {}).get("S"),
            total_bytes=int(item["bytes"]["N"]),
            reason=item.get("status_reason", {}).get("S", ""),
            sort_key=sort_key,
            epoch=run_epochs.parse_epoch_suffix(sort_key, schema.checkpoint_sort_key(step)),
        )

    def entries(self) -> list[CatalogEntry]:
        """Every recorded checkpoint of the run, by step; one a stale writer published after
        the run moved on (or in an epoch whose claim lost) reads as FENCED."""
        found = [self._entry(item) for item in self._items(schema.CHECKPOINT_PREFIX)]
        counted = run_epochs.in_history(self.chain())
        return [e if counted(e.sort_key, e.step) else replace(e, status=schema.STATUS_FENCED)
                for e in found]  # fmt: skip

    def _at(self, step: int) -> CatalogEntry:
        """The run's checkpoint of `step` that counts."""
        for entry in self.entries():
            if entry.step == step and entry.status != schema.STATUS_FENCED:
                return entry
        raise _not_a_checkpoint(self.run, step)

    def retire(self, entry: CatalogEntry) -> None:
        """Mark a garbage-collected checkpoint: its history stays, its data is gone."""
        self._set_status(entry.sort_key or self._at(entry.step).sort_key, entry.step,
                         schema.STATUS_COLLECTED, "collected")  # fmt: skip
        self.records.write(COLLECTED, entry.manifest_key)

    def roll_back(self, step: int, generation: int, reason: str) -> list[int]:
        """Make complete checkpoint `step` the run's head again; every complete checkpoint
        after it becomes ROLLED_BACK (never restored). Only the lease holder `generation` may;
        returns the steps rolled back. Safe to repeat after a crash halfway."""
        entries = self.entries()
        newer = [e for e in entries if e.step > step and e.status == schema.STATUS_COMPLETE]
        action = f"roll back of run {self.run!r} to step {step}"
        target = next((e for e in entries if e.step == step
                       and e.status != schema.STATUS_FENCED), None)  # fmt: skip
        if target is None:
            raise _not_complete(self.run, step)
        # Newer ones first, so a crash halfway never leaves one restorable past the head; each
        # write checks the lease (a transaction holds at most 100 items).
        room = 100 - self._FENCES
        for start in range(0, len(newer), room):
            marks = [
                {
                    "Update": {
                        "TableName": self.table_name,
                        "Key": self._key(later.sort_key),
                        "UpdateExpression": "SET #status = :status, status_reason = :reason",
                        "ExpressionAttributeNames": {"#status": "status"},
                        "ExpressionAttributeValues": {
                            ":status": {"S": schema.STATUS_ROLLED_BACK},
                            ":reason": {"S": reason},
                        },
                    }
                }
                for later in newer[start : start + room]
            ]
            self._transact(
                [*self._fence(generation), *marks],
                action=action,
                refused=_not_complete(self.run, step),
            )
        target_is_complete = {
            "ConditionCheck": {
                "TableName": self.table_name,
                "Key": self._key(target.sort_key),
                "ConditionExpression": "#status = :complete",
                "ExpressionAttributeNames": {"#status": "status"},
                "ExpressionAttributeValues": {":complete": {"S": schema.STATUS_COMPLETE}},
            }
        }
        self._transact(
            [
                *self._fence(generation),
                target_is_complete,
                self._head_update(target.sort_key, step, generation, reason=reason),
            ],
            action=action,
            refused=_not_complete(self.run, step),
        )
        for later in reversed(newer):
            self.records.write(ROLLED_BACK, later.manifest_key, reason=reason, to_step=step)
        return [e.step for e in newer]

    def quarantine(self, step: int, reason: str) -> None:
        entry = self._set_status(self._at(step).sort_key, step, schema.STATUS_QUARANTINED, reason)
        self.records.write(QUARANTINED, entry.manifest_key, reason=reason)

    def _set_status(self, sort_key: str, step: int, status: str, reason: str) -> CatalogEntry:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            answer = self.client.update_item(
                TableName=self.table_name,
                Key=self._key(sort_key),
                UpdateExpression="SET #status = :status, status_reason = :reason",
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeNames={"#status": "status"},
                ExpressionAttributeValues={":status": {"S": status}, ":reason": {"S": reason}},
                ReturnValues="ALL_NEW",
            )
        except ClientError as error:
            if error.response["Error"]["Code"] == "ConditionalCheckFailedException":
                raise _not_a_checkpoint(self.run, step) from error
            raise self._error(f"marking step {step} {status}", error) from error
        except BotoCoreError as error:
            raise self._error(f"marking step {step} {status}", error) from error
        return self._entry(answer["Attributes"])
