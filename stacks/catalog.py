"""Catalog: the checkpoint catalog table and the interruption events table.

Both tables are global tables with a replica in every other region (the local cloud too:
it replicates asynchronously, last writer wins, as AWS does), so the catalog and the events
outlive the loss of the primary region.
"""

from __future__ import annotations

from spotrain.cdk import Construct, TerraformOutput
from spotrain.constructs.catalog_table import (
    CatalogTable,
    CatalogTableProps,
    SecondaryIndex,
    TableReplica,
)
from spotrain.core import catalog_schema as schema
from spotrain.stacks.base import EnvironmentStack
from spotrain.stacks.config import EnvironmentConfig


class CatalogStack(EnvironmentStack):
    def __init__(
        self,
        scope: Construct,
        *,
        config: EnvironmentConfig,
        key_arns: dict[str, str],
    ) -> None:
        super().__init__(scope, "catalog", config=config)
        primary_key_arn = key_arns[config.primary_region]
        replicas = tuple(
            TableReplica(region=region, kms_key_arn=key_arns[region])
            for region in config.replica_regions
        )
        self.checkpoints = CatalogTable(
            self,
            "CheckpointCatalog",
            props=CatalogTableProps(
                table_name=self.resource_name(schema.CHECKPOINTS_TABLE_SUFFIX),
                kms_key_arn=primary_key_arn,
                indexes=(
                    SecondaryIndex(
                        name=schema.LINEAGE_INDEX,
                        partition_key=schema.LINEAGE_KEY,
                        sort_key=schema.SORT_KEY,
                    ),
                ),
                replicas=replicas,
                deletion_protection=not config.is_local,
            ),
        )
        self.events = CatalogTable(
            self,
            "InterruptionEvents",
            props=CatalogTableProps(
                table_name=self.resource_name(schema.EVENTS_TABLE_SUFFIX),
                kms_key_arn=primary_key_arn,
                indexes=(
                    SecondaryIndex(
                        name=schema.POOL_INDEX,
                        partition_key=schema.POOL_KEY,
                        sort_key=schema.OCCURRED_AT_KEY,
                    ),
                ),
                ttl_attribute=schema.EXPIRES_AT_KEY,
                replicas=replicas,
                deletion_protection=not config.is_local,
            ),
        )
        TerraformOutput(self, "checkpoint_catalog_table", value=self.checkpoints.name)
        TerraformOutput(self, "events_table", value=self.events.name)
