"""DynamoDB global tables (version 2019.11.21) for the local cloud: moto ignores UpdateTable's
`ReplicaUpdates`, so Terraform's `replica` blocks would never see a replica.

- Replicas: `ReplicaUpdates` `Create` makes a table of the same name in the named region (same
  keys, indexes, billing and stream, encrypted with the key given for that region, holding the
  table's items) and `Delete` removes it; every member's DescribeTable lists the others under
  `Replicas`, ACTIVE, as AWS reports them once they are built.
- Replication is asynchronous, as in AWS: a write is answered in its own region and reaches
  the others after `table_replication_lag_seconds` (faults; 0 by default, still after the
  answer), in the order written. A region that is partitioned (`regions_partitioned`) or down
  neither sends nor receives: each side keeps serving its own clients and accepting writes,
  and what was held flows both ways once the partition heals.
- Conflicts resolve as AWS resolves them: the last writer wins. Every member keeps the time of
  each item's latest write; a replicated change older than the member's own is dropped, so
  every member ends on the same item whatever order the changes arrive in. A conditional write
  is judged against its own region's copy only, which is why fencing cannot rest on it.
- Each write is atomic, as in AWS: moto checks a write's condition and then makes it in
  Python, so two requests served at once on the server's threads could both pass their
  conditions on one item, the later overwriting a newer value; every write (and every
  replicated change applied) is made under one lock (`_items`).
- Each read sees an item as one write left it, as in AWS: moto's UpdateItem makes a new item
  from its key and then sets its attributes one by one, and changes an existing item in place,
  so a read served meanwhile saw the key alone, or half an update. Reads take the same lock,
  and an update changes a copy of the item that takes the stored one's place: a reply being
  written from the item a read found keeps that version whole.

`install()` patches moto in this process (`extensions.install` calls it).
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from spotrain.localcloud import faults

GLOBAL_TABLE_VERSION = "2019.11.21"
_POLL_SECONDS = 0.05


@dataclass
class _Group:
    """The regions holding one global table, each with the key that encrypts its copy."""

    keys: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class _Change:
    account: str
    table: str
    source: str
    destination: str
    key: tuple[Any, ...]
    item: dict[str, Any] | None
    """The item as written (wire format), or None for a delete."""
    written_at: float
    sequence: int


_lock = threading.Lock()
_items = threading.RLock()
"""Held by every read and write of any table's items (a request's or a replicated change's):
one at a time."""
_groups: dict[tuple[str, str], _Group] = {}  # (account, table name) -> members
_written_at: dict[tuple[str, str, str, tuple[Any, ...]], tuple[float, int]] = {}
_pending: list[_Change] = []
_sequence = 0
_worker: threading.Thread | None = None
_applying = threading.local()
_updating = threading.local()


def _backend(account: str, region: str) -> Any:
    from moto.dynamodb.models import dynamodb_backends

    return dynamodb_backends[account][region]


def _key_of(table: Any, item: Any) -> tuple[Any, ...]:
    range_value = item.range_key.value if getattr(item, "range_key", None) else None
    return (item.hash_key.value, range_value)


def _group_of(table: Any) -> _Group | None:
    group = _groups.get((table.account_id, table.name))
    return group if group is not None and table.region_name in group.keys else None


def _record(table: Any, key: tuple[Any, ...], item: dict[str, Any] | None) -> None:
    """Queue a local write for every other member of the table's group."""
    global _sequence, _worker
    if getattr(_applying, "active", False):
        return  # a replicated change is not replicated again
    with _lock:
        group = _group_of(table)
        if group is None:
            return
        _sequence += 1
        now = time.time()
        _written_at[(table.account_id, table.region_name, table.name, key)] = (now, _sequence)
        for destination in group.keys:
            if destination != table.region_name:
                _pending.append(_Change(table.account_id, table.name, table.region_name,
                                        destination, key, copy.deepcopy(item), now,
                                        _sequence))  # fmt: skip
        if _worker is None:
            _worker = threading.Thread(target=_deliver_forever, daemon=True)
            _worker.start()


def _deliver_forever() -> None:
    while True:
        time.sleep(_POLL_SECONDS)
        with _lock:
            if not _pending:
                continue
        played = faults.read(faults.served_file())
        cut_off = set(played.regions_partitioned) | set(played.regions_down)
        due = time.time() - played.table_replication_lag_seconds
        with _lock:
            ready = [c for c in _pending if c.written_at <= due
                     and c.source not in cut_off and c.destination not in cut_off]  # fmt: skip
            for change in ready:
                _pending.remove(change)
        for change in sorted(ready, key=lambda c: c.sequence):
            _apply(change)


def _apply(change: _Change) -> None:
    """Apply one replicated change unless the destination holds a later write of the item."""
    from moto.dynamodb.exceptions import ResourceNotFoundException
    from moto.dynamodb.models.dynamo_type import DynamoType

    mark = (change.account, change.destination, change.table, change.key)
    with _lock:
        if _written_at.get(mark, (0.0, 0)) >= (change.written_at, change.sequence):
            return  # the last writer wins, everywhere
        _written_at[mark] = (change.written_at, change.sequence)
    try:
        table = _backend(change.account, change.destination).get_table(change.table)
    except ResourceNotFoundException:
        return  # the replica was deleted meanwhile
    _applying.active = True
    try:
        with _items:
            if change.item is not None:
                table.put_item(change.item)
            else:
                hash_value = DynamoType({table.hash_key_type: change.key[0]})
                range_value = (DynamoType({table.range_key_type: change.key[1]})
                               if change.key[1] is not None else None)  # fmt: skip
                table.delete_item(hash_value, range_value)
    finally:
        _applying.active = False


def _create_replica(source: Any, region: str, kms_key: str | None) -> None:
    backend = _backend(source.account_id, region)
    replica = backend.create_table(
        source.name,
        schema=copy.deepcopy(source.schema),
        throughput=None,
        attr=copy.deepcopy(source.attr),
        global_indexes=[index.describe() for index in source.global_indexes],
        indexes=[index.describe() for index in source.indexes],
        streams=copy.deepcopy(source.stream_specification),
        billing_mode=source.billing_mode,
        sse_specification={"Enabled": True, "SSEType": "KMS", "KMSMasterKeyId": kms_key}
        if kms_key
        else None,
        tags=[],
        deletion_protection_enabled=False,
        warm_throughput=None,
    )
    for item in list(source.all_items()):
        replica.put_item(item.to_json()["Attributes"])
    with _lock:
        group = _groups.setdefault((source.account_id, source.name), _Group())
        if not group.keys:
            sse = source.sse_specification or {}
            group.keys[source.region_name] = sse.get("KMSMasterKeyId")
        group.keys[region] = kms_key
        for item in source.all_items():
            key = _key_of(source, item)
            written = _written_at.get((source.account_id, source.region_name, source.name, key))
            _written_at[(source.account_id, region, source.name, key)] = written or (0.0, 0)


def _delete_replica(source: Any, region: str) -> None:
    backend = _backend(source.account_id, region)
    if source.name in backend.tables:
        backend.tables.pop(source.name)
    _leave_group(source.account_id, source.name, region)


def _leave_group(account: str, table: str, region: str) -> None:
    with _lock:
        group = _groups.get((account, table))
        if group is None:
            return
        group.keys.pop(region, None)
        _pending[:] = [
            c for c in _pending if not (c.table == table and region in (c.source, c.destination))
        ]
        if len(group.keys) < 2:
            _groups.pop((account, table))


def install() -> None:
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.table import Table
    from moto.dynamodb.responses import DynamoHandler

    original_update_table = DynamoHandler.update_table

    def update_table(self: DynamoHandler) -> Any:
        updates = self.body.get("ReplicaUpdates") or []
        if updates:
            source = self.dynamodb_backend.get_table(self.body["TableName"])
            for update in updates:
                if "Create" in update:
                    create = update["Create"]
                    _create_replica(source, create["RegionName"], create.get("KMSMasterKeyId"))
                elif "Delete" in update:
                    _delete_replica(source, update["Delete"]["RegionName"])
        return original_update_table(self)

    original_describe = Table.describe

    def describe(self: Table, base_key: str = "TableDescription") -> dict[str, Any]:
        result: dict[str, Any] = original_describe(self, base_key=base_key)
        with _lock:
            group = _group_of(self)
            members = dict(group.keys) if group else {}
        if members:
            result[base_key]["GlobalTableVersion"] = GLOBAL_TABLE_VERSION
            result[base_key]["Replicas"] = [
                {"RegionName": region, "ReplicaStatus": "ACTIVE",
                 **({"KMSMasterKeyId": key} if key else {})}
                for region, key in sorted(members.items()) if region != self.region_name
            ]  # fmt: skip
        return result

    original_put_item = Table.put_item

    def put_item(self: Table, item_attrs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        item = original_put_item(self, item_attrs, *args, **kwargs)
        if not getattr(_updating, "active", False):
            _record(self, _key_of(self, item), item.to_json()["Attributes"])
        return item

    original_delete_item = Table.delete_item

    def delete_item(self: Table, hash_key: Any, range_key: Any = None) -> Any:
        item = original_delete_item(self, hash_key, range_key)
        if item is not None:
            _record(self, _key_of(self, item), None)
        return item

    original_update_item = DynamoDBBackend.update_item

    def update_item(self: DynamoDBBackend, table_name: str, key: dict[str, Any], *args: Any,
                    **kwargs: Any) -> Any:  # fmt: skip
        # moto creates a new item as its keys alone, then updates it: AWS's update is one
        # write, so only the item it leaves is replicated (a reader elsewhere never sees keys
        # without their attributes).
        _copy_before_updating(self, table_name, key)
        _updating.active = True
        try:
            item = original_update_item(self, table_name, key, *args, **kwargs)
        finally:
            _updating.active = False
        table = self.get_table(table_name)
        _record(table, _key_of(table, item), item.to_json()["Attributes"])
        return item

    original_delete_table = DynamoDBBackend.delete_table

    def delete_table(self: DynamoDBBackend, name: str) -> Any:
        table = original_delete_table(self, name)
        _leave_group(self.account_id, name, self.region_name)
        return table

    DynamoHandler.update_table = update_table  # type: ignore[method-assign]
    Table.describe = describe  # type: ignore[method-assign]
    Table.put_item = put_item  # type: ignore[method-assign]
    Table.delete_item = delete_item  # type: ignore[method-assign]
    DynamoDBBackend.update_item = update_item  # type: ignore[method-assign]
    DynamoDBBackend.delete_table = delete_table  # type: ignore[method-assign]
    for name in ("put_item", "update_item", "delete_item", "transact_write_items",
                 "batch_write_item", "get_item", "query", "scan"):  # fmt: skip
        setattr(DynamoDBBackend, name, _one_at_a_time(getattr(DynamoDBBackend, name)))


def _one_at_a_time(operation: Any) -> Any:
    def under_the_lock(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _items:
            return operation(self, *args, **kwargs)

    return under_the_lock


def _copy_before_updating(backend: Any, table_name: str, key: dict[str, Any]) -> None:
    """Put a copy of the item `key` names (if there is one) in its place, for moto's update to
    change: the item a read already found stays as it was."""
    table = backend.get_table(table_name)
    hash_value, range_value = backend.get_keys_value(table, key)
    stored = table.get_item(hash_value, range_value)
    if stored is None:
        return
    if table.range_key_attr:
        table.items[hash_value][range_value] = copy.deepcopy(stored)
    else:
        table.items[hash_value] = copy.deepcopy(stored)
