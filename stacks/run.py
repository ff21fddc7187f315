"""A run's own stack, `<env>-run-<run>`: its fleet (spot group with the on-demand coordinator,
the on-demand fallback group, launch template, instance role scoped to the run's prefix and
items, security group, log group) and its declaration to the environment's interruption
handler (the run's groups, cap and deadline, as an SSM parameter the handler reads). Every
resource carries the run and its owner as cost-allocation tags."""

from __future__ import annotations

from spotrain.cdk import Construct, TerraformOutput, aws
from spotrain.constructs.private_network import PrivateNetwork
from spotrain.constructs.spot_fleet import SpotFleet, SpotFleetProps
from spotrain.core import resource_names as names
from spotrain.core.capacity import ON_DEMAND, SPOT, CapacityGroup, RunDeclaration
from spotrain.core.errors import ConfigError
from spotrain.core.gpu_types import efa_interfaces
from spotrain.core.handler_settings import run_parameter_name
from spotrain.stacks.base import EnvironmentStack
from spotrain.stacks.config import EnvironmentConfig
from spotrain.stacks.runs import RunConfig


def capacity_groups(config: EnvironmentConfig, run: RunConfig) -> tuple[CapacityGroup, ...]:
    """The run's groups the handler may scale: spot first (started at the run's declared
    sizes), on-demand as the fallback (empty until needed). Both run in the primary region,
    which holds the run's data."""
    spot = names.fleet_group(config.name, run.name)
    return (
        CapacityGroup(
            name=spot,
            region=config.primary_region,
            lifecycle=SPOT,
            holds_data=True,
            min_size=run.min_size,
            desired=run.desired_size,
        ),
        CapacityGroup(
            name=names.on_demand_group(spot),
            region=config.primary_region,
            lifecycle=ON_DEMAND,
            holds_data=True,
        ),
    )


class RunStack(EnvironmentStack):
    def __init__(
        self,
        scope: Construct,
        *,
        config: EnvironmentConfig,
        run: RunConfig,
        network: PrivateNetwork,
        key_arns: dict[str, str],
        checkpoint_bucket_arns: dict[str, str],
        checkpoint_bucket_name: str,
        catalog_table_arn: str,
        catalog_table_name: str,
        events_table_arn: str,
        events_table_name: str,
        image_repository_arn: str,
    ) -> None:
        super().__init__(
            scope, names.run_stack_part(run.name), config=config, run_tags=run.run_tags
        )
        self.run = run
        home = config.primary_region
        zones = config.region(home).availability_zones
        endpoints = network.interface_endpoints
        registry_endpoint_ids = tuple(str(endpoints[s].id) for s in ("ecr.api", "ecr.dkr"))
        # An EFA run trains in one zone (EFA traffic stays in its subnet); a tcp run in all.
        mode = run.network_mode
        subnets = network.subnet_ids
        if mode != "tcp":
            zone = run.zone or zones[0]
            if zone not in zones:
                raise ConfigError(f"run {run.source or run.name}", [
                    f"zone {zone!r} is not one of environment {config.name}'s: use one of "
                    f"{', '.join(zones)}"])  # fmt: skip
            subnets = [subnets[zones.index(zone)]]
        self.fleet = SpotFleet(
            self,
            "Fleet",
            props=SpotFleetProps(
                name=names.fleet_group(config.name, run.name),
                run_name=run.name,
                instance_types=run.instance_types,
                subnet_ids=subnets,
                vpc_id=str(network.vpc.id),
                image_parameter_name=names.image_parameter(config.name),
                min_size=run.min_size,
                desired_size=run.desired_size,
                max_size=run.max_size,
                on_demand_base_capacity=run.on_demand_base_capacity,
                checkpoint_bucket_arn=checkpoint_bucket_arns[home],
                checkpoint_bucket_name=checkpoint_bucket_name,
                replica_bucket_arns=tuple(
                    checkpoint_bucket_arns[r] for r in config.replica_regions
                ),
                catalog_table_arn=catalog_table_arn,
                catalog_table_name=catalog_table_name,
                events_table_arn=events_table_arn,
                events_table_name=events_table_name,
                vpc_endpoint_ids=network.endpoint_ids,
                autoscaling_endpoint_id=str(endpoints["autoscaling"].id),
                logs_endpoint_id=str(endpoints["logs"].id),
                session_endpoint_ids=tuple(
                    str(endpoints[s].id) for s in ("ssm", "ssmmessages", "ec2messages")
                ),
                endpoint_security_group_id=str(network.endpoint_security_group.id),
                data_kms_key_arns=tuple(key_arns[r] for r in config.region_names),
                log_kms_key_arn=key_arns[home],
                log_retention_days=config.log_retention_days,
                region=config.primary_region,
                account_id=self.account_id,
                tags={**config.all_tags, **run.run_tags},
                efa_interfaces={t: efa_interfaces(t) for t in run.instance_types}
                if mode != "tcp"
                else {},
                placement_group=mode == "cluster",
                image=run.image,
                image_repository_arn=image_repository_arn,
                registry_endpoint_ids=registry_endpoint_ids,
                emulator_drift_tolerance=config.is_local,
            ),
        )
        # The run declares itself to the environment's interruption handler: its groups and
        # sizes, its cap and its deadline. Retiring the run (destroying this stack) removes it.
        self.declaration = aws.ssm_parameter.SsmParameter(
            self,
            "HandlerDeclaration",
            name=run_parameter_name(config.name, run.name),
            description=f"Run {run.name}: its groups, cap and deadline, for the handler",
            # Nothing secret, but encrypted at rest as everything is: the handler decrypts it
            # through SSM with the environment's key.
            type="SecureString",
            key_id=key_arns[home],
            value=RunDeclaration(
                run=run.name,
                groups=capacity_groups(config, run),
                max_spend_usd=run.max_spend_usd,
                run_deadline=run.deadline,
            ).to_json(),
        )
        TerraformOutput(self, "fleet_group", value=self.fleet.group.name)
        TerraformOutput(self, "on_demand_group", value=self.fleet.on_demand_group.name)
        TerraformOutput(self, "launch_template", value=self.fleet.launch_template.id)
        TerraformOutput(self, "machine_log_group", value=self.fleet.log_group.name)
        # Named by every run, so the network stack exports them whenever the environment has a
        # run: a run submitted later that pins its image finds them deployed (`run submit`
        # applies the run's stack alone, and an output no stack used is not exported).
        TerraformOutput(self, "registry_endpoints", value=list(registry_endpoint_ids))
