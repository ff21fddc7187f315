"""One DynamoDB table for the catalog: on-demand billing, SSE-KMS, point-in-time recovery,
streams, deletion protection, and global-table replicas where the cloud supports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spotrain.cdk import Construct, aws
from spotrain.core.catalog_schema import PARTITION_KEY, SORT_KEY
from spotrain.core.errors import raise_if_problems


@dataclass(frozen=True, kw_only=True)
class SecondaryIndex:
    name: str
    """Index name."""
    partition_key: str
    """String attribute the index is partitioned by."""
    sort_key: str
    """String attribute the index is sorted by."""


@dataclass(frozen=True, kw_only=True)
class TableReplica:
    region: str
    """Region of the global-table replica."""
    kms_key_arn: str
    """Key of that region that encrypts the replica."""


@dataclass(frozen=True, kw_only=True)
class CatalogTableProps:
    table_name: str
    """Table name, unique in the region."""
    kms_key_arn: str
    """Customer-managed key that encrypts the table."""
    indexes: tuple[SecondaryIndex, ...] = ()
    """Global secondary indexes (all projected)."""
    ttl_attribute: str | None = None
    """Attribute holding an expiry time in epoch seconds; None keeps items forever."""
    replicas: tuple[TableReplica, ...] = ()
    """Global-table replicas in other regions."""
    deletion_protection: bool = True
    """Refuse deletes of the table (off only for the local cloud)."""

    def __post_init__(self) -> None:
        problems = []
        if not 3 <= len(self.table_name) <= 255:
            problems.append(f"table_name {self.table_name!r} must be 3-255 characters long")
        names = [i.name for i in self.indexes]
        if len(set(names)) != len(names):
            problems.append(f"index names repeat in {names}: give each index its own name")
        raise_if_problems("CatalogTableProps", problems)


class CatalogTable(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: CatalogTableProps) -> None:
        super().__init__(scope, id_)
        dynamodb = aws.dynamodb_table
        attributes = {PARTITION_KEY, SORT_KEY}
        for index in props.indexes:
            attributes |= {index.partition_key, index.sort_key}
        options: dict[str, Any] = {}
        if props.ttl_attribute:
            options["ttl"] = {"attribute_name": props.ttl_attribute, "enabled": True}
        if props.replicas:
            options["replica"] = [
                dynamodb.DynamodbTableReplica(
                    region_name=r.region,
                    kms_key_arn=r.kms_key_arn,
                    point_in_time_recovery=True,
                    propagate_tags=True,
                )
                for r in props.replicas
            ]
        self.table = dynamodb.DynamodbTable(
            self,
            "Table",
            name=props.table_name,
            billing_mode="PAY_PER_REQUEST",
            hash_key=PARTITION_KEY,
            range_key=SORT_KEY,
            attribute=[{"name": a, "type": "S"} for a in sorted(attributes)],
            global_secondary_index=[
                dynamodb.DynamodbTableGlobalSecondaryIndex(
                    name=i.name,
                    hash_key=i.partition_key,
                    range_key=i.sort_key,
                    projection_type="ALL",
                )
                for i in props.indexes
            ],
            server_side_encryption={"enabled": True, "kms_key_arn": props.kms_key_arn},
            point_in_time_recovery={"enabled": True},
            # Streams feed global-table replication and let consumers follow publishes.
            stream_enabled=True,
            stream_view_type="NEW_AND_OLD_IMAGES",
            deletion_protection_enabled=props.deletion_protection,
            **options,
        )

    @property
    def arn(self) -> str:
        return str(self.table.arn)

    @property
    def name(self) -> str:
        return str(self.table.name)

    @property
    def stream_arn(self) -> str:
        """The table's stream (new and old images of every change)."""
        return str(self.table.stream_arn)
