"""Network: one stack per region of the environment (`<env>-network` at home,
`<env>-network-<region>` elsewhere): its private VPC, its gateway endpoints and the interface
endpoints every run's fleet in that region shares.

A region's stack stands alone, so an outage of one region never blocks a plan or an apply of
another's network.
"""

from __future__ import annotations

from spotrain.cdk import Construct, TerraformOutput
from spotrain.constructs.private_network import PrivateNetwork, PrivateNetworkProps
from spotrain.core import resource_names as names
from spotrain.core.image_reference import image_repository_name
from spotrain.stacks.base import EnvironmentStack, regional_part
from spotrain.stacks.config import EnvironmentConfig


def network_part(config: EnvironmentConfig, region: str) -> str:
    """The stack part of `region`'s network."""
    return regional_part(config, "network", region)


class NetworkStack(EnvironmentStack):
    def __init__(
        self,
        scope: Construct,
        *,
        config: EnvironmentConfig,
        region: str,
        key_arn: str,
        checkpoint_bucket_arn: str,
        catalog_table_name: str,
        events_table_name: str,
    ) -> None:
        part = network_part(config, region)
        super().__init__(scope, part, config=config, region=region)
        zones = config.region(region)

        self.network = PrivateNetwork(
            self,
            "Network",
            props=PrivateNetworkProps(
                name=self.resource_name(part),
                region=region,
                account_id=self.account_id,
                cidr=zones.vpc_cidr,
                availability_zones=zones.availability_zones,
                log_kms_key_arn=key_arn,
                log_retention_days=config.log_retention_days,
                # Each region's machines reach their own region's bucket and tables; the
                # other regions' copies arrive by replication.
                s3_buckets=(checkpoint_bucket_arn,),
                dynamodb_tables=tuple(
                    self.arn_in(region, "dynamodb", f"table/{table}")
                    for table in (catalog_table_name, events_table_name)
                ),
                # The trainer image's repository in this region (home's, or its replica).
                image_repositories=(
                    self.arn_in(region, "ecr", f"repository/{image_repository_name(config.name)}"),
                ),
                fleet_name_prefix=names.fleet_name_prefix(config.name),
            ),
        )
        TerraformOutput(self, "vpc", value=self.network.vpc.id)
