"""Compute: the fleet's private network and the spot fleet for the environment's run."""

from __future__ import annotations

from spotrain.cdk import Construct, TerraformOutput
from spotrain.constructs.private_network import PrivateNetwork, PrivateNetworkProps
from spotrain.constructs.spot_fleet import SpotFleet, SpotFleetProps
from spotrain.core.catalog_schema import RUN_TAG
from spotrain.stacks.base import EnvironmentStack
from spotrain.stacks.config import EnvironmentConfig


def image_parameter_name(environment: str) -> str:
    """SSM parameter the image build writes the image id to."""
    return f"/spotrain/{environment}/image-id"


def fleet_group_name(config: EnvironmentConfig) -> str:
    """The spot group's name; the interruption handler is told it without a stack reference."""
    return f"spotrain-{config.name}-{config.run_name}-fleet"


class ComputeStack(EnvironmentStack):
    def __init__(
        self,
        scope: Construct,
        *,
        config: EnvironmentConfig,
        primary_key_arn: str,
        replica_key_arn: str,
        checkpoint_bucket_arn: str,
        checkpoint_bucket_name: str,
        replica_bucket_arn: str,
        catalog_table_arn: str,
        catalog_table_name: str,
        events_table_arn: str,
        events_table_name: str,
    ) -> None:
        super().__init__(scope, "compute", config=config)
        name = fleet_group_name(config)
        self.network = PrivateNetwork(
            self,
            "Network",
            props=PrivateNetworkProps(
                name=self.resource_name("network"),
                region=config.primary_region,
                account_id=self.account_id,
                cidr=config.vpc_cidr,
                availability_zones=config.availability_zones,
                log_kms_key_arn=primary_key_arn,
                log_retention_days=config.log_retention_days,
                s3_buckets=(checkpoint_bucket_arn,),  # the replica's region is not this one
                dynamodb_tables=(catalog_table_arn, events_table_arn),
            ),
        )
        self.fleet = SpotFleet(
            self,
            "Fleet",
            props=SpotFleetProps(
                name=name,
                run_name=config.run_name,
                instance_types=config.instance_types,
                subnet_ids=self.network.subnet_ids,
                vpc_id=str(self.network.vpc.id),
                image_parameter_name=image_parameter_name(config.name),
                min_size=config.fleet_min_size,
                desired_size=config.fleet_desired_size,
                max_size=config.fleet_max_size,
                on_demand_base_capacity=config.on_demand_base_capacity,
                checkpoint_bucket_arn=checkpoint_bucket_arn,
                checkpoint_bucket_name=checkpoint_bucket_name,
                replica_bucket_arn=replica_bucket_arn,
                catalog_table_arn=catalog_table_arn,
                catalog_table_name=catalog_table_name,
                events_table_arn=events_table_arn,
                events_table_name=events_table_name,
                vpc_endpoint_ids=self.network.endpoint_ids,
                data_kms_key_arns=(primary_key_arn, replica_key_arn),
                log_kms_key_arn=primary_key_arn,
                log_retention_days=config.log_retention_days,
                region=config.primary_region,
                account_id=self.account_id,
                tags={**config.all_tags, RUN_TAG: config.run_name},
                emulator_drift_tolerance=config.is_local,
            ),
        )
        TerraformOutput(self, "fleet_group", value=self.fleet.group.name)
        TerraformOutput(self, "on_demand_group", value=self.fleet.on_demand_group.name)
        TerraformOutput(self, "launch_template", value=self.fleet.launch_template.id)
        TerraformOutput(self, "machine_log_group", value=self.fleet.log_group.name)
        TerraformOutput(self, "vpc", value=self.network.vpc.id)
