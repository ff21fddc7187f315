"""The checkpoint catalog: where a run's latest complete checkpoint is recorded.

`DynamoCatalog` is the real one (schema in docs/catalog.md). Publishing is one DynamoDB
transaction that (1) checks the writer still holds the run's lease generation, (2) records the
checkpoint as COMPLETE and (3) moves the run's head to it only if it is newer than the head. A
writer whose lease was taken over by a newer start, or that is behind the head, cannot publish.

`ManifestCatalog` reads the manifests in storage: used for `file://` runs, and as the fallback
for finding checkpoints when the catalog table cannot be reached.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Protocol

from spotrain import catalog_schema as schema
from spotrain.errors import SpotrainError
from spotrain.trainer.manifest import Manifest, ManifestError, manifest_key, run_prefix
from spotrain.trainer.storage import Storage


class CatalogError(SpotrainError):
    """The catalog could not be read or written."""


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


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


class Catalog(Protocol):
    def acquire_lease(self, owner: str) -> int: ...

    def publish(self, manifest: Manifest, generation: int) -> None: ...

    def head(self) -> CatalogEntry | None: ...

    def entries(self) -> list[CatalogEntry]: ...

    def quarantine(self, step: int, reason: str) -> None: ...

    def retire(self, step: int) -> None: ...

    def roll_back(self, step: int, generation: int, reason: str) -> list[int]: ...


class DynamoCatalog:
    def __init__(self, table_name: str, run: str, *, client: Any = None) -> None:
        self.table_name, self.run = table_name, run
        self._client = client
        self._pk = {"S": schema.run_key(run)}

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("dynamodb")
        return self._client

    def _call(self, operation: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, operation)(TableName=self.table_name, **kwargs)
        except ClientError as error:
            if error.response["Error"]["Code"] == "ResourceNotFoundException":
                raise CatalogError(
                    f"catalog table {self.table_name!r} does not exist: deploy the environment's "
                    "catalog stack, or pass the table name that `spotrain deploy` printed"
                ) from error
            raise
        except BotoCoreError as error:
            raise CatalogError(f"catalog table {self.table_name!r} unreachable: {error}") from error

    def acquire_lease(self, owner: str) -> int:
        """Take the run's lease with a new generation; every older writer is now stale."""
        result = self._call(
            "update_item",
            Key={schema.PARTITION_KEY: self._pk, schema.SORT_KEY: {"S": schema.LEASE_SORT_KEY}},
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

    def publish(self, manifest: Manifest, generation: int) -> None:
        if manifest.run != self.run:
            raise CatalogError(f"manifest of run {manifest.run!r} offered to run {self.run!r}")
        item: dict[str, Any] = {
            **self._key(schema.checkpoint_sort_key(manifest.step)),
            "status": {"S": schema.STATUS_COMPLETE},
            "step": {"N": str(manifest.step)},
            "manifest": {"S": manifest_key(self.run, manifest.step)},
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
        from botocore.exceptions import ClientError

        try:
            self.client.transact_write_items(TransactItems=items)
        except ClientError as error:
            if error.response["Error"]["Code"] != "TransactionCanceledException":
                raise CatalogError(f"{action} failed: {error}") from error
            reasons = [r.get("Code") for r in error.response.get("CancellationReasons", [])]
            if reasons and reasons[0] == "ConditionalCheckFailed":
                raise StaleWriter(
                    f"run {self.run!r}: the lease this writer held was taken over by a newer "
                    f"start; {action} did not happen (it must come from the run's current holder)"
                ) from error
            raise refused from error

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
        )

    def entries(self) -> list[CatalogEntry]:
        """Every recorded checkpoint of the run, by step."""
        found, start = [], None
        while True:
            page = self._call(
                "query",
                KeyConditionExpression="pk = :pk AND begins_with(sk, :checkpoint)",
                ExpressionAttributeValues={":pk": self._pk, ":checkpoint": {"S": "CKPT#"}},
                ConsistentRead=True,
                **({"ExclusiveStartKey": start} if start else {}),
            )
            found += [self._entry(item) for item in page.get("Items", [])]
            start = page.get("LastEvaluatedKey")
            if not start:
                return found

    def retire(self, step: int) -> None:
        """Mark a garbage-collected checkpoint: its history stays, its data is gone."""
        self._set_status(step, schema.STATUS_COLLECTED, "collected")

    def roll_back(self, step: int, generation: int, reason: str) -> list[int]:
        """Make complete checkpoint `step` the run's head again; every complete checkpoint
        after it becomes ROLLED_BACK (never restored). Only the lease holder `generation` may;
        returns the steps rolled back. Safe to repeat after a crash halfway."""
        newer = [
            e.step for e in self.entries() if e.step > step and e.status == schema.STATUS_COMPLETE
        ]
        action = f"roll back of run {self.run!r} to step {step}"
        not_complete = CatalogError(
            f"run {self.run!r}: step {step} is not a complete checkpoint; pick one that "
            "`spotrain checkpoints list` shows COMPLETE"
        )
        # Newer ones first, so a crash halfway never leaves one restorable past the head; each
        # write checks the lease (a transaction holds at most 100 items).
        for start in range(0, len(newer), 99):
            marks = [
                {
                    "Update": {
                        "TableName": self.table_name,
                        "Key": self._key(schema.checkpoint_sort_key(later)),
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
                [self._lease_check(generation), *marks], action=action, refused=not_complete
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
            refused=not_complete,
        )
        return newer

    def quarantine(self, step: int, reason: str) -> None:
        self._set_status(step, schema.STATUS_QUARANTINED, reason)

    def _set_status(self, step: int, status: str, reason: str) -> None:
        self._call(
            "update_item",
            Key=self._key(schema.checkpoint_sort_key(step)),
            UpdateExpression="SET #status = :status, status_reason = :reason",
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeNames={"#status": "status"},
            ExpressionAttributeValues={":status": {"S": status}, ":reason": {"S": reason}},
        )


class ManifestCatalog:
    """The checkpoints whose manifests are in storage. A manifest is written only after every
    shard it names is stored and verified, so its presence is the publish."""

    def __init__(self, storage: Storage, run: str) -> None:
        self.storage, self.run = storage, run

    def acquire_lease(self, owner: str) -> int:
        return 0  # one writer per folder; there is no shared lease to take

    def publish(self, manifest: Manifest, generation: int) -> None:
        # The manifest, already written, is the publish; the head is the highest step.
        head = self.head()
        if head is not None and head.step > manifest.step:
            raise StaleWriter(
                f"run {self.run!r}: step {manifest.step} is not newer than {head.step}"
            )

    def entries(self) -> list[CatalogEntry]:
        found = []
        for key in self.storage.list(f"{run_prefix(self.run)}/checkpoints/"):
            if not key.endswith("/manifest.json"):
                continue
            try:
                manifest = Manifest.from_json(self.storage.get_bytes(key))
            except (ManifestError, SpotrainError):
                continue  # an unreadable manifest names no usable checkpoint
            quarantined = self.storage.stat(f"{key}.quarantined") is not None
            found.append(
                CatalogEntry(
                    step=manifest.step,
                    manifest_key=key,
                    status=schema.STATUS_QUARANTINED if quarantined else schema.STATUS_COMPLETE,
                    generation=0,
                    parent=manifest.parent,
                    total_bytes=manifest.total_bytes,
                )
            )
        return sorted(found, key=lambda e: e.step)

    def head(self) -> CatalogEntry | None:
        complete = [e for e in self.entries() if e.status == schema.STATUS_COMPLETE]
        return complete[-1] if complete else None

    def quarantine(self, step: int, reason: str) -> None:
        self.storage.put_bytes(f"{manifest_key(self.run, step)}.quarantined", reason.encode())

    def retire(self, step: int) -> None:
        self.storage.delete([f"{manifest_key(self.run, step)}.quarantined"])

    def roll_back(self, step: int, generation: int, reason: str) -> list[int]:
        complete = [e.step for e in self.entries() if e.status == schema.STATUS_COMPLETE]
        if step not in complete:
            raise CatalogError(
                f"run {self.run!r}: step {step} is not a complete checkpoint; pick one that "
                "`spotrain checkpoints list` shows COMPLETE"
            )
        newer = [later for later in complete if later > step]
        for later in newer:  # the head is the newest complete manifest: mark the rest
            self.quarantine(later, f"rolled back: {reason}")
        return newer
