"""Network: the environment's private VPC, its gateway endpoints and the interface endpoints
every run's fleet shares."""

from __future__ import annotations

from spotrain.cdk import Construct, TerraformOutput
from spotrain.constructs.private_network import PrivateNetwork, PrivateNetworkProps
from spotrain.core import resource_names as names
from spotrain.stacks.base import EnvironmentStack
from spotrain.stacks.config import EnvironmentConfig


class NetworkStack(EnvironmentStack):
    def __init__(
        self,
        scope: Construct,
        *,
        config: EnvironmentConfig,
        primary_key_arn: str,
        checkpoint_bucket_arn: str,
        catalog_table_arn: str,
        events_table_arn: str,
        image_repository_arn: str,
    ) -> None:
        super().__init__(scope, "network", config=config)
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
                image_repositories=(image_repository_arn,),
                fleet_name_prefix=names.fleet_name_prefix(config.name),
            ),
        )
        TerraformOutput(self, "vpc", value=self.network.vpc.id)
