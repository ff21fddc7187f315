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
from dataclasses import dataclass
from typing import Any, Protocol

from spotrain.core import catalog_schema as schema
from spotrain.core.errors import SpotrainError, no_region_fix
from spotrain.trainer.manifest import (
    Manifest,
    parse_record_key,
    record_key,
    records_prefix,
)
from spotrain.trainer.storage import AlreadyExists, Storage, StorageError


class CatalogError(SpotrainError):
    """The catalog could not be read or written, or refused what was asked."""


class StaleWriter(CatalogError):
    """This writer lost the run's lease, or its checkpoint is not newer than the published
    head: it must stop and never publish."""


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

    def read(self) -> dict[str, tuple[int, str, dict[str, Any]]]:
        """manifest key -> (step, its latest decision, that decision's details)."""
        latest: dict[str, tuple[int, str, str]] = {}
        for key in self.storage.list(records_prefix(self.run)):
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
            # The key holds the decision; only its details (reason, parent, size) are lost.
            return {"reason": f"(record {key} is unreadable)"}


class StoreCatalog:
    """The catalog as recorded in the store: the catalog of runs without a table, and the way
    to find checkpoints while the table cannot be reached. One writer per run (no shared
    lease): a folder run is trained from one place."""

    def __init__(self, storage: Storage, run: str) -> None:
        self.storage, self.run = storage, run
        self.records = RunRecords(storage, run)

    def acquire_lease(self, owner: str) -> int:
        return 0

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
        found = []
        for manifest_key, (step, kind, details) in self.records.read().items():
            found.append(
                CatalogEntry(
                    step=step,
                    manifest_key=manifest_key,
                    status=_STATUS_OF.get(kind, schema.STATUS_COMPLETE),
                    generation=int(details.get("generation") or 0),
                    parent=details.get("parent"),
                    total_bytes=int(details.get("bytes") or 0),
                    reason=str(details.get("reason") or ""),
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

    @property
    def client(self) -> Any:
        if self._client is None:
            from spotrain.trainer.storage import aws_client

            self._client = aws_client("dynamodb")
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
            return CatalogError(
                f"{action} in catalog table {self.table_name!r} failed: {error}; check your "
                "credentials' permissions on the table, or retry"
            )
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

    def acquire_lease(self, owner: str) -> int:
        """Take the run's lease with a new generation; every older writer is now stale."""
        result = self._call(
            "update_item",
            Key=self._key(schema.LEASE_SORT_KEY),
            UpdateExpression="ADD #generation :one SET #owner = :owner, acquired_at = :now",
            ExpressionAttributeNames={"#generation": "generation", "#owner": "owner"},
            ExpressionAttributeValues={
                ":one": {"N": "1"},
                ":owner": {"S": owner},
                ":now": {"S": _now()},
            },
            ReturnValues="UPDATED_NEW",
        )
        return int(result["Attributes"]["generation"]["N"])

    def publish(self, manifest: Manifest, manifest_key: str, generation: int) -> None:
        if manifest.run != self.run:
            raise CatalogError(f"manifest of run {manifest.run!r} offered to run {self.run!r}")
        item: dict[str, Any] = {
            **self._key(schema.checkpoint_sort_key(manifest.step)),
            "status": {"S": schema.STATUS_COMPLETE},
            "step": {"N": str(manifest.step)},
            "manifest": {"S": manifest_key},
            "generation": {"N": str(generation)},
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
                self._lease_check(generation),
                {"Put": {"TableName": self.table_name, "Item": item}},
                self._head_update(
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
            parent=manifest.parent, bytes=manifest.total_bytes,
        )  # fmt: skip

    def _key(self, sort_key: str) -> dict[str, Any]:
        return {schema.PARTITION_KEY: self._pk, schema.SORT_KEY: {"S": sort_key}}

    def _lease_check(self, generation: int) -> dict[str, Any]:
        """Transaction item: the writer still holds lease `generation` (always item 0)."""
        return {
            "ConditionCheck": {
                "TableName": self.table_name,
                "Key": self._key(schema.LEASE_SORT_KEY),
                "ConditionExpression": "#generation = :generation",
                "ExpressionAttributeNames": {"#generation": "generation"},
                "ExpressionAttributeValues": {":generation": {"N": str(generation)}},
            }
        }

    def _head_update(
        self, step: int, generation: int, *, condition: str | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        """Transaction item: the run's head names checkpoint `step`."""
        values = {
            ":latest": {"S": schema.checkpoint_sort_key(step)},
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
        update: dict[str, Any] = {
            "TableName": self.table_name,
            "Key": self._key(schema.HEAD_SORT_KEY),
            "UpdateExpression": expression,
            "ExpressionAttributeNames": {"#step": "step", "#generation": "generation"},
            "ExpressionAttributeValues": values,
        }
        if condition:
            update["ConditionExpression"] = condition
        return {"Update": update}

    def _transact(self, items: list[dict[str, Any]], *, action: str, refused: CatalogError) -> None:
        """One transaction whose first item is the lease check: a failed lease check raises
        StaleWriter, any other failed condition raises `refused`."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.transact_write_items(TransactItems=items)
        except ClientError as error:
            if error.response["Error"]["Code"] != "TransactionCanceledException":
                raise self._error(action, error) from error
            reasons = [r.get("Code") for r in error.response.get("CancellationReasons", [])]
            if reasons and reasons[0] == "ConditionalCheckFailed":
                raise StaleWriter(
                    f"run {self.run!r}: the lease this writer held was taken over by a newer "
                    f"start; {action} did not happen (it must come from the run's current holder)"
                ) from error
            raise refused from error
        except BotoCoreError as error:
            raise self._error(action, error) from error

    def head(self) -> CatalogEntry | None:
        head = self._get(schema.HEAD_SORT_KEY)
        if not head:
            return None
        item = self._get(schema.checkpoint_sort_key(int(head["step"]["N"])))
        return self._entry(item) if item else None

    def _get(self, sort_key: str) -> dict[str, Any] | None:
        item: dict[str, Any] | None = self._call(
            "get_item", Key=self._key(sort_key), ConsistentRead=True
        ).get("Item")
        return item

    @staticmethod
    def _entry(item: dict[str, Any]) -> CatalogEntry:
        return CatalogEntry(
            step=int(item["step"]["N"]),
            manifest_key=item["manifest"]["S"],
            status=item["status"]["S"],
            generation=int(item["generation"]["N"]),
            parent=item.get(schema.LINEAGE_KEY, {}).get("S"),
            total_bytes=int(item["bytes"]["N"]),
            reason=item.get("status_reason", {}).get("S", ""),
        )

    def entries(self) -> list[CatalogEntry]:
        """Every recorded checkpoint of the run, by step."""
        found, start = [], None
        while True:
            page = self._call(
                "query",
                KeyConditionExpression="pk = :pk AND begins_with(sk, :checkpoint)",
                ExpressionAttributeValues={
                    ":pk": self._pk,
                    ":checkpoint": {"S": schema.CHECKPOINT_PREFIX},
                },
                ConsistentRead=True,
                **({"ExclusiveStartKey": start} if start else {}),
            )
            found += [self._entry(item) for item in page.get("Items", [])]
            start = page.get("LastEvaluatedKey")
            if not start:
                return found

    def retire(self, entry: CatalogEntry) -> None:
        """Mark a garbage-collected checkpoint: its history stays, its data is gone."""
        self._set_status(entry.step, schema.STATUS_COLLECTED, "collected")
        self.records.write(COLLECTED, entry.manifest_key)

    def roll_back(self, step: int, generation: int, reason: str) -> list[int]:
        """Make complete checkpoint `step` the run's head again; every complete checkpoint
        after it becomes ROLLED_BACK (never restored). Only the lease holder `generation` may;
        returns the steps rolled back. Safe to repeat after a crash halfway."""
        newer = [e for e in self.entries() if e.step > step and e.status == schema.STATUS_COMPLETE]
        action = f"roll back of run {self.run!r} to step {step}"
        # Newer ones first, so a crash halfway never leaves one restorable past the head; each
        # write checks the lease (a transaction holds at most 100 items).
        for start in range(0, len(newer), 99):
            marks = [
                {
                    "Update": {
                        "TableName": self.table_name,
                        "Key": self._key(schema.checkpoint_sort_key(later.step)),
                        "UpdateExpression": "SET #status = :status, status_reason = :reason",
                        "ExpressionAttributeNames": {"#status": "status"},
                        "ExpressionAttributeValues": {
                            ":status": {"S": schema.STATUS_ROLLED_BACK},
                            ":reason": {"S": reason},
                        },
                    }
                }
                for later in newer[start : start + 99]
            ]
            self._transact(
                [self._lease_check(generation), *marks],
                action=action,
                refused=_not_complete(self.run, step),
            )
        target_is_complete = {
            "ConditionCheck": {
                "TableName": self.table_name,
                "Key": self._key(schema.checkpoint_sort_key(step)),
                "ConditionExpression": "#status = :complete",
                "ExpressionAttributeNames": {"#status": "status"},
                "ExpressionAttributeValues": {":complete": {"S": schema.STATUS_COMPLETE}},
            }
        }
        self._transact(
            [
                self._lease_check(generation),
                target_is_complete,
                self._head_update(step, generation, reason=reason),
            ],
            action=action,
            refused=_not_complete(self.run, step),
        )
        for later in reversed(newer):
            self.records.write(ROLLED_BACK, later.manifest_key, reason=reason, to_step=step)
        return [e.step for e in newer]

    def quarantine(self, step: int, reason: str) -> None:
        entry = self._set_status(step, schema.STATUS_QUARANTINED, reason)
        self.records.write(QUARANTINED, entry.manifest_key, reason=reason)

    def _set_status(self, step: int, status: str, reason: str) -> CatalogEntry:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            answer = self.client.update_item(
                TableName=self.table_name,
                Key=self._key(schema.checkpoint_sort_key(step)),
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
