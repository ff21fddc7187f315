"""A run's training fleet: a spot Auto Scaling group over several GPU types with an on-demand
coordinator, capacity rebalancing, an empty on-demand fallback group for when spot capacity
cannot be had, and an instance role scoped to the run.

The on-demand base capacity keeps the coordinator (torchrun rendezvous host) off spot; every
other instance is spot, placed by price-capacity-optimized allocation across the instance
types x zones. Instances require IMDSv2, have encrypted volumes, get no public address, and
may touch only their run's prefix in the checkpoint buckets and their run's catalog items.
Their boot and training output goes to the fleet's encrypted log group (a stream each), and
on-call reaches them with Session Manager: both through the environment's interface endpoints.
The fleet's security group lets its own members talk to each other (another run's machines
cannot reach them) and reach only those endpoints and S3 and DynamoDB.

On instance types that take EFA a run may attach it: each type then launches from its own
template with one EFA interface per network card, in one zone's subnet and, optionally, one
cluster placement group. A run that pins its image writes it into the user data, and only
then may its machines pull, from the environment's repository, through the registry's
endpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spotrain.cdk import Construct, Fn, TerraformResourceLifecycle, aws
from spotrain.constructs.policy import assume_role_policy, policy_document
from spotrain.constructs.spot_fleet_iam import machine_statements
from spotrain.core import resource_names as names
from spotrain.core.errors import raise_if_problems


@dataclass(frozen=True, kw_only=True)
class SpotFleetProps:
    name: str
    """Name of the group, launch template, role and security group."""
    run_name: str
    """Run the fleet trains; IAM allows only this run's prefix and catalog items."""
    instance_types: tuple[str, ...]
    """GPU instance types, most preferred first (the on-demand coordinator uses the first)."""
    subnet_ids: list[str]
    """Private subnets, one per zone."""
    vpc_id: str
    """VPC of the subnets."""
    image_parameter_name: str
    """SSM parameter holding the image id; the image build writes it."""
    min_size: int
    """Fewest instances while the run trains (the group is deployed empty; the interruption
    handler starts it at these sizes)."""
    desired_size: int
    """Instances when the run starts."""
    max_size: int
    """Most instances."""
    on_demand_base_capacity: int
    """On-demand instances kept before spot is used (the coordinator)."""
    checkpoint_bucket_arn: str
    """Primary checkpoint bucket."""
    replica_bucket_arns: tuple[str, ...]
    """The other regions' checkpoint buckets (read for cross-region restore)."""
    checkpoint_bucket_name: str
    """Primary bucket name, passed to the trainer."""
    catalog_table_arn: str
    """Checkpoint catalog table."""
    catalog_table_name: str
    """Catalog table name, passed to the trainer."""
    events_table_arn: str
    """Interruption events table; machines read and update their run's fleet state there."""
    events_table_name: str
    """Its name, passed to the boot service."""
    vpc_endpoint_ids: tuple[str, ...]
    """Gateway endpoints of the fleet's VPC: the role's S3 and DynamoDB access holds only
    through them (aws:SourceVpce), so its credentials are useless outside the VPC."""
    autoscaling_endpoint_id: str
    """The environment's Auto Scaling interface endpoint (the machines' health reports)."""
    logs_endpoint_id: str
    """Its CloudWatch Logs interface endpoint (the machines' output)."""
    session_endpoint_ids: tuple[str, ...]
    """Its Session Manager interface endpoints."""
    endpoint_security_group_id: str
    """The security group of those interface endpoints: the fleet's HTTPS goes there."""
    data_kms_key_arns: tuple[str, ...]
    """Keys the trainer encrypts and decrypts checkpoints and catalog items with."""
    log_kms_key_arn: str
    """Key of the machines' log group."""
    log_retention_days: int
    """Retention of the machines' log group."""
    region: str
    """Region of the fleet."""
    account_id: str
    """Account of the fleet (its groups' ARNs)."""
    tags: dict[str, str]
    """Tags on instances and volumes launched by the group."""
    image: str | None = None
    """The image the machines train in, by digest (the run pins it); None: the image baked
    into the machine image."""
    image_repository_arn: str | None = None
    """The environment's registry, the one the machines may pull `image` from."""
    registry_endpoint_ids: tuple[str, ...] = ()
    """The registry's interface endpoints (`ecr.api`, `ecr.dkr`): pulls hold only through
    them."""
    efa_interfaces: Mapping[str, int] = field(default_factory=dict)
    """EFA interfaces per instance type (every type's, or none): each such type gets its own
    launch template with that many (one per network card). Empty: no EFA."""
    placement_group: bool = False
    """Put the machines in one cluster placement group (the subnets must be one zone's)."""
    emulator_drift_tolerance: bool = False
    """Local cloud only: ignore launch-template tag drift the emulator reports on every read."""

    def __post_init__(self) -> None:
        problems = []
        if len(self.instance_types) < 2:
            problems.append("instance_types needs at least two types so spot can choose a pool")
        if self.on_demand_base_capacity < 1:
            problems.append("on_demand_base_capacity must be at least 1 (the coordinator)")
        if not (
            self.on_demand_base_capacity <= self.min_size <= self.desired_size <= self.max_size
        ):
            problems.append(
                "sizes must satisfy on_demand_base_capacity <= min <= desired <= max, got "
                f"{self.on_demand_base_capacity} <= {self.min_size} <= {self.desired_size} "
                f"<= {self.max_size}"
            )
        if not self.subnet_ids:
            problems.append("subnet_ids is empty: give at least one private subnet")
        if self.efa_interfaces and set(self.efa_interfaces) != set(self.instance_types):
            problems.append("efa_interfaces must give every instance type's count, or none")
        if any(n < 1 for n in self.efa_interfaces.values()):
            problems.append("efa_interfaces counts must be 1 or more")
        if self.placement_group and len(self.subnet_ids) != 1:
            problems.append("a cluster placement group is in one zone: give that zone's subnet")
        if self.image is not None and not (
            self.image_repository_arn and self.registry_endpoint_ids
        ):
            problems.append(
                "image needs image_repository_arn and registry_endpoint_ids: the machines pull "
                "it from the environment's registry through its endpoints"
            )
        raise_if_problems("SpotFleetProps", problems)


USER_DATA = """#!/bin/bash
set -euo pipefail
root=$(printenv SPOTRAIN_ROOT || true)
install -d -m 0755 "$root/etc/spotrain"
cat > "$root/etc/spotrain/run.env" <<'ENV'
SPOTRAIN_RUN=%s
SPOTRAIN_REGION=%s
SPOTRAIN_BUCKET=%s
SPOTRAIN_CATALOG_TABLE=%s
SPOTRAIN_KMS_KEY_ID=%s
SPOTRAIN_EVENTS_TABLE=%s
SPOTRAIN_NNODES=%s
SPOTRAIN_RDZV_PORT=%s
SPOTRAIN_LOG_GROUP=%s
SPOTRAIN_IMAGE=%s
ENV
if [ -z "$root" ] && systemctl list-unit-files spotrain-trainer.service >/dev/null 2>&1; then
  systemctl enable --now spotrain-trainer.service
fi
"""
"""Boot script: hand the run's coordinates to the trainer service baked into the image.
SPOTRAIN_ROOT, empty on a machine, lets a test run the deployed script into a scratch folder.
The values (`user_data_values`) are Terraform references: Terraform fills them in and encodes
the result (`format`, `base64encode`), never Python, which sees only unresolved tokens."""


def user_data_values(props: SpotFleetProps) -> list[str]:
    """What fills USER_DATA's placeholders, in order."""
    return [
        props.run_name,
        props.region,
        props.checkpoint_bucket_name,
        props.catalog_table_name,
        props.data_kms_key_arns[0],  # the primary region's key
        props.events_table_name,
        nnodes(props.min_size, props.max_size),
        str(RENDEZVOUS_PORT),
        names.machine_log_group(props.name),
        props.image or "",  # empty: the image baked into the machine image
    ]


RENDEZVOUS_PORT = 29400
"""Where the coordinator's torchrun hosts the run's rendezvous (c10d)."""


def nnodes(min_size: int, max_size: int) -> str:
    """torchrun's --nnodes for a group of these sizes: elastic between them (at least one)."""
    return "1" if max_size <= 1 else f"{max(1, min_size)}:{max_size}"


class SpotFleet(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: SpotFleetProps) -> None:
        super().__init__(scope, id_)
        self.security_group = self._security_group(props)
        own_groups = [
            f"arn:aws:autoscaling:{props.region}:{props.account_id}:"
            f"autoScalingGroup:*:autoScalingGroupName/{name}"
            for name in (props.name, names.on_demand_group(props.name))
        ]
        # A reclaimed machine's output outlives it: every machine sends its boot and training
        # output to this group (`spotrain logs ship`), through the environment's logs endpoint.
        self.log_group = aws.cloudwatch_log_group.CloudwatchLogGroup(
            self,
            "MachineLogs",
            name=names.machine_log_group(props.name),
            retention_in_days=props.log_retention_days,
            kms_key_id=props.log_kms_key_arn,
        )
        machine_streams = f"{self.log_group.arn}:log-stream:*"
        self.role = aws.iam_role.IamRole(
            self,
            "InstanceRole",
            name=props.name,
            assume_role_policy=assume_role_policy(
                self, "InstanceTrust", "ec2.amazonaws.com", source_account=None
            ),
        )
        statements = machine_statements(
            props, own_groups=own_groups, machine_streams=machine_streams,
            autoscaling_endpoint_id=props.autoscaling_endpoint_id,
            logs_endpoint_id=props.logs_endpoint_id,
            session_endpoint_ids=list(props.session_endpoint_ids),
        )  # fmt: skip
        aws.iam_role_policy.IamRolePolicy(
            self,
            "RunScopedAccess",
            role=self.role.id,
            name="run-scoped-checkpoint-access",
            policy=policy_document(self, "RunScopedAccessDocument", statements),
        )
        self.instance_profile = aws.iam_instance_profile.IamInstanceProfile(
            self, "InstanceProfile", name=props.name, role=self.role.name
        )
        # With EFA each type has its own template (the interfaces it takes); the first type's
        # is the groups' default.
        efa = props.efa_interfaces
        image_id = aws.data_aws_ssm_parameter.DataAwsSsmParameter(
            self, "ImageId", name=props.image_parameter_name
        ).insecure_value
        self.type_templates = {
            itype: self._launch_template(
                props, "LaunchTemplate" if index == 0 else f"LaunchTemplate{index}",
                props.name if index == 0 else f"{props.name}-{itype.replace('.', '-')}",
                image_id=image_id, efa_interfaces=efa[itype],
            )
            for index, itype in enumerate(props.instance_types if efa else ())
        }  # fmt: skip
        self.launch_template = (
            self.type_templates[props.instance_types[0]]
            if efa
            else self._launch_template(
                props, "LaunchTemplate", props.name, image_id=image_id, efa_interfaces=0
            )
        )
        # Gradient traffic between racks of one spine: the fastest path, from fewer spot pools.
        self.placement = (
            aws.placement_group.PlacementGroup(
                self, "PlacementGroup", name=props.name, strategy="cluster"
            )
            if props.placement_group
            else None
        )
        self.group, self.on_demand_group = self._groups(props)

    def _security_group(self, props: SpotFleetProps) -> Any:
        sg = aws.security_group
        return sg.SecurityGroup(
            self,
            "SecurityGroup",
            name=props.name,
            description="Fleet of one run: its ranks talk to each other; out only to AWS endpoints",
            vpc_id=props.vpc_id,
            ingress=[
                sg.SecurityGroupIngress(
                    description="Collectives and rendezvous between ranks of the fleet",
                    from_port=0,
                    to_port=0,
                    protocol="-1",
                    self_attribute=True,
                )
            ],
            egress=[
                sg.SecurityGroupEgress(
                    description="Collectives and rendezvous between ranks of the fleet",
                    from_port=0,
                    to_port=0,
                    protocol="-1",
                    self_attribute=True,
                ),
                sg.SecurityGroupEgress(
                    description="HTTPS to S3 and DynamoDB through the gateway endpoints",
                    from_port=443,
                    to_port=443,
                    protocol="tcp",
                    prefix_list_ids=[
                        self._prefix_list("S3PrefixList", f"com.amazonaws.{props.region}.s3"),
                        self._prefix_list(
                            "DynamodbPrefixList", f"com.amazonaws.{props.region}.dynamodb"
                        ),
                    ],
                ),
                sg.SecurityGroupEgress(
                    description="HTTPS to the interface endpoints of the environment",
                    from_port=443,
                    to_port=443,
                    protocol="tcp",
                    security_groups=[props.endpoint_security_group_id],
                ),
            ],
        )

    def _launch_template(
        self, props: SpotFleetProps, id_: str, name: str, *, image_id: str, efa_interfaces: int
    ) -> Any:
        lt = aws.launch_template
        # EFA: one interface per network card, the first also the machine's address, the
        # others EFA only (no address of their own); the fleet's security group on each.
        interfaces = [
            lt.LaunchTemplateNetworkInterfaces(
                network_card_index=card, device_index=0 if card == 0 else 1,
                interface_type="efa" if card == 0 else "efa-only",
                security_groups=[self.security_group.id],
                associate_public_ip_address="false", delete_on_termination="true",
            )
            for card in range(efa_interfaces)
        ]  # fmt: skip
        return lt.LaunchTemplate(
            self,
            id_,
            name=name,
            image_id=image_id,
            update_default_version=True,
            ebs_optimized="true",
            iam_instance_profile={"arn": self.instance_profile.arn},
            vpc_security_group_ids=None if interfaces else [self.security_group.id],
            network_interfaces=interfaces or None,
            metadata_options={
                "http_endpoint": "enabled",
                "http_tokens": "required",
                # 1 hop: the trainer container runs with host networking.
                "http_put_response_hop_limit": 1,
                "instance_metadata_tags": "enabled",
            },
            monitoring={"enabled": True},
            block_device_mappings=[
                lt.LaunchTemplateBlockDeviceMappings(
                    device_name="/dev/sda1",
                    ebs={
                        "volume_size": 200,
                        "volume_type": "gp3",
                        "encrypted": "true",
                        "delete_on_termination": "true",
                    },
                )
            ],
            user_data=Fn.base64encode(Fn.format(Fn.raw_string(USER_DATA), user_data_values(props))),
            tag_specifications=[
                lt.LaunchTemplateTagSpecifications(resource_type=kind, tags=props.tags)
                for kind in ("instance", "volume")
            ],
            lifecycle=(
                TerraformResourceLifecycle(ignore_changes=["tag_specifications"])
                if props.emulator_drift_tolerance
                else None
            ),
        )

    def _groups(self, props: SpotFleetProps) -> tuple[Any, Any]:
        """The spot group (with its on-demand coordinator) and the empty on-demand fallback."""
        asg = aws.autoscaling_group
        overrides = [
            asg.AutoscalingGroupMixedInstancesPolicyLaunchTemplateOverride(
                instance_type=t,
                launch_template_specification={
                    "launch_template_id": self.type_templates[t].id, "version": "$Latest"
                } if t in self.type_templates else None,
            )
            for t in props.instance_types
        ]  # fmt: skip
        placement = self.placement.name if self.placement is not None else None
        launch_template = {
            "launch_template_specification": {
                "launch_template_id": self.launch_template.id,
                "version": "$Latest",
            },
            "override": overrides,
        }
        tags = [
            asg.AutoscalingGroupTag(key=key, value=value, propagate_at_launch=True)
            for key, value in sorted(props.tags.items())
        ]
        # Deployed empty: a run pays only while it trains. The interruption handler starts
        # the group at the declared sizes once the run's configuration is stored, moves
        # capacity between the groups, and empties them when the run is done; a later deploy
        # must not move any of that back.
        handler_owned = TerraformResourceLifecycle(ignore_changes=["desired_capacity", "min_size"])
        group = asg.AutoscalingGroup(
            self,
            "Group",
            name=props.name,
            min_size=0,
            desired_capacity=0,
            max_size=props.max_size,
            vpc_zone_identifier=props.subnet_ids,
            placement_group=placement,
            capacity_rebalance=True,
            health_check_type="EC2",
            mixed_instances_policy={
                "instances_distribution": {
                    "on_demand_base_capacity": props.on_demand_base_capacity,
                    "on_demand_percentage_above_base_capacity": 0,
                    "on_demand_allocation_strategy": "prioritized",
                    "spot_allocation_strategy": "price-capacity-optimized",
                },
                "launch_template": launch_template,
            },
            tag=tags,
            lifecycle=handler_owned,
        )
        # Empty until spot capacity cannot be had for the handler's deadline; then it runs
        # the shortfall on demand, and is emptied again when spot returns.
        on_demand_group = asg.AutoscalingGroup(
            self,
            "OnDemandFallbackGroup",
            name=names.on_demand_group(props.name),
            min_size=0,
            desired_capacity=0,
            max_size=props.max_size,
            vpc_zone_identifier=props.subnet_ids,
            placement_group=placement,
            health_check_type="EC2",
            mixed_instances_policy={
                "instances_distribution": {
                    "on_demand_base_capacity": 0,
                    "on_demand_percentage_above_base_capacity": 100,
                    "on_demand_allocation_strategy": "prioritized",
                },
                "launch_template": launch_template,
            },
            tag=tags,
            lifecycle=handler_owned,
        )
        return group, on_demand_group

    def _prefix_list(self, id_: str, service: str) -> str:
        return str(aws.data_aws_prefix_list.DataAwsPrefixList(self, id_, name=service).id)
