"""A run's own stack, `<env>-run-<run>`: its fleet in every region of its environment (spot
group with the on-demand coordinator, the on-demand fallback group, launch template, instance
role scoped to the run's prefix and items, security group, log group; at 0 where the run does
not train) and its declaration to the environment's interruption handlers (the run's groups,
cap and deadline, as an SSM parameter in every region, which that region's handler reads).
Every resource carries the run and its owner as cost-allocation tags."""

from __future__ import annotations

from dataclasses import dataclass

from spotrain.cdk import Construct, TerraformOutput, aws
from spotrain.constructs.private_network import PrivateNetwork
from spotrain.constructs.spot_fleet import SpotFleet, SpotFleetProps
from spotrain.core import resource_names as names
from spotrain.core.admission import asked
from spotrain.core.capacity import ON_DEMAND, SPOT, CapacityGroup, RunDeclaration
from spotrain.core.errors import raise_if_problems
from spotrain.core.gpu_types import efa_interfaces
from spotrain.core.handler_settings import run_parameter_name
from spotrain.core.image_reference import image_in_region, image_repository_name
from spotrain.stacks.base import EnvironmentStack, place_in, region_label
from spotrain.stacks.config import EnvironmentConfig
from spotrain.stacks.runs import RunConfig, environment_problems


def capacity_groups(config: EnvironmentConfig, run: RunConfig) -> tuple[CapacityGroup, ...]:
    """The run's groups the handler may scale, in every region of its environment: spot
    (started at the run's declared sizes in the region it trains in) and on-demand as the
    fallback (empty until needed). It starts at home, which `holds_data`; the handler keeps
    the groups of the other regions at 0 until the run moves there."""
    groups = []
    for region in config.region_names:
        home = region == config.primary_region
        spot = names.fleet_group(config.name, run.name, None if home else region)
        groups += [
            CapacityGroup(name=spot, region=region, lifecycle=SPOT, holds_data=home,
                          min_size=run.min_size, desired=run.desired_size),
            CapacityGroup(name=names.on_demand_group(spot), region=region, lifecycle=ON_DEMAND,
                          holds_data=home),
        ]  # fmt: skip
    return tuple(groups)


def run_declaration(config: EnvironmentConfig, run: RunConfig) -> RunDeclaration:
    """What the run declares to its environment's handlers: its groups, cap and deadline, and
    what the queue judges it by (its team, priority, and the GPUs and vCPUs per quota of its
    declared machines: the coordinator on-demand, the rest spot). A team the environment does
    not have is refused before anything is synthesized."""
    raise_if_problems(f"run {run.source or run.name!r}", environment_problems(config, run))
    gpus, vcpus = asked(run.instance_types, {
        SPOT: run.desired_size - run.on_demand_base_capacity,
        ON_DEMAND: run.on_demand_base_capacity})  # fmt: skip
    return RunDeclaration(
        run=run.name, groups=capacity_groups(config, run), max_spend_usd=run.max_spend_usd,
        run_deadline=run.deadline, team=run.team, priority=run.priority, gpus=gpus, vcpus=vcpus,
        instance_types=tuple(run.instance_types), gang_timeout_minutes=run.gang_timeout_minutes,
    )  # fmt: skip


@dataclass(frozen=True)
class RegionGround:
    """What a run's fleet in one region stands on: the environment's stacks there."""

    network: PrivateNetwork
    key_arn: str
    checkpoint_bucket_arn: str
    checkpoint_bucket_name: str


class RunStack(EnvironmentStack):
    """The run's fleet in every region of its environment (one stack: a run is submitted and
    retired whole), each under its region's provider, and its declaration to the handler."""

    def __init__(
        self,
        scope: Construct,
        *,
        config: EnvironmentConfig,
        run: RunConfig,
        grounds: dict[str, RegionGround],
        catalog_table_name: str,
        events_table_name: str,
    ) -> None:
        super().__init__(
            scope, names.run_stack_part(run.name), config=config, run_tags=run.run_tags
        )
        self.run = run
        # Checked first: what the run names of its environment (its team, its zone).
        declaration = run_declaration(config, run).to_json()
        self.fleets = {
            region: self._fleet(config, run, region, grounds, catalog_table_name,
                                events_table_name)
            for region in config.region_names
        }  # fmt: skip
        self.fleet = self.fleets[config.primary_region]
        # The run declares itself to every region's interruption handler (each reads its own
        # region's parameters: one region's outage leaves the others' handlers serving it):
        # its groups and sizes, its cap and its deadline. Retiring the run (destroying this
        # stack) removes it.
        self.declarations = {}
        for region in config.region_names:
            home = region == config.primary_region
            self.declarations[region] = aws.ssm_parameter.SsmParameter(
                self,
                "HandlerDeclaration" + ("" if home else region_label(config, region)),
                name=run_parameter_name(config.name, run.name),
                description=f"Run {run.name}: its groups, cap and deadline, for the handler",
                # Nothing secret, but encrypted at rest as everything is: the handler decrypts
                # it through SSM with its region's key.
                type="SecureString",
                key_id=grounds[region].key_arn,
                value=declaration,
            )
            if not home:
                place_in(self.declarations[region], self.provider(region))
        self.declaration = self.declarations[config.primary_region]
        TerraformOutput(self, "fleet_group", value=self.fleet.group.name)
        TerraformOutput(self, "on_demand_group", value=self.fleet.on_demand_group.name)
        TerraformOutput(self, "launch_template", value=self.fleet.launch_template.id)
        TerraformOutput(self, "machine_log_group", value=self.fleet.log_group.name)
        TerraformOutput(
            self, "fleet_groups", value={r: f.group.name for r, f in self.fleets.items()}
        )
        # Named by every run, so each region's network stack exports them whenever the
        # environment has a run: a run submitted later that pins its image finds them deployed
        # (`run submit` applies the run's stack alone, and an output no stack used is not
        # exported).
        TerraformOutput(self, "registry_endpoints", value={
            region: list(self._registry_endpoint_ids(ground.network))
            for region, ground in grounds.items()})  # fmt: skip

    @staticmethod
    def _registry_endpoint_ids(network: PrivateNetwork) -> tuple[str, ...]:
        return tuple(str(network.interface_endpoints[s].id) for s in ("ecr.api", "ecr.dkr"))

    def _fleet(
        self,
        config: EnvironmentConfig,
        run: RunConfig,
        region: str,
        grounds: dict[str, RegionGround],
        catalog_table_name: str,
        events_table_name: str,
    ) -> SpotFleet:
        home = region == config.primary_region
        ground, network = grounds[region], grounds[region].network
        zones = config.region(region).availability_zones
        endpoints = network.interface_endpoints
        # An EFA run trains in one zone (EFA traffic stays in its subnet); a tcp run in all.
        # The run's zone names one of home's; elsewhere its fleet takes the region's first.
        mode = run.network_mode
        subnets = network.subnet_ids
        if mode != "tcp":
            zone = (run.zone if home else None) or zones[0]  # home's: checked
            subnets = [subnets[zones.index(zone)]]

        def table_arn(table: str) -> str:  # the global table's replica in this region
            return self.arn_in(region, "dynamodb", f"table/{table}")

        fleet = SpotFleet(
            self,
            "Fleet" if home else f"Fleet{region_label(config, region)}",
            props=SpotFleetProps(
                name=names.fleet_group(config.name, run.name, None if home else region),
                run_name=run.name,
                instance_types=run.instance_types,
                subnet_ids=subnets,
                vpc_id=str(network.vpc.id),
                image_parameter_name=names.image_parameter(config.name),
                min_size=run.min_size,
                desired_size=run.desired_size,
                max_size=run.max_size,
                on_demand_base_capacity=run.on_demand_base_capacity,
                checkpoint_bucket_arn=ground.checkpoint_bucket_arn,
                checkpoint_bucket_name=ground.checkpoint_bucket_name,
                replica_bucket_arns=tuple(
                    grounds[r].checkpoint_bucket_arn for r in config.region_names if r != region
                ),
                catalog_table_arn=table_arn(catalog_table_name),
                catalog_table_name=catalog_table_name,
                events_table_arn=table_arn(events_table_name),
                events_table_name=events_table_name,
                vpc_endpoint_ids=network.endpoint_ids,
                autoscaling_endpoint_id=str(endpoints["autoscaling"].id),
                logs_endpoint_id=str(endpoints["logs"].id),
                session_endpoint_ids=tuple(
                    str(endpoints[s].id) for s in ("ssm", "ssmmessages", "ec2messages")
                ),
                endpoint_security_group_id=str(network.endpoint_security_group.id),
                # This region's key first: the machines write with it.
                data_kms_key_arns=(ground.key_arn, *(
                    grounds[r].key_arn for r in config.region_names if r != region)),
                log_kms_key_arn=ground.key_arn,
                log_retention_days=config.log_retention_days,
                region=region,
                account_id=self.account_id,
                tags={**config.all_tags, **run.run_tags},
                efa_interfaces={t: efa_interfaces(t) for t in run.instance_types}
                if mode != "tcp"
                else {},
                placement_group=mode == "cluster",
                # The image, pulled from this region's copy of the registry (replicated).
                image=image_in_region(run.image, region) if run.image else None,
                image_repository_arn=self.arn_in(
                    region, "ecr", f"repository/{image_repository_name(config.name)}"
                ),
                registry_endpoint_ids=self._registry_endpoint_ids(network),
                emulator_drift_tolerance=config.is_local,
            ),
        )  # fmt: skip
        if not home:
            place_in(fleet, self.provider(region))
        return fleet
