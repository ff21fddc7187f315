"""A private VPC for an environment's fleets: no internet gateway, no public addresses.

Instances reach S3 and DynamoDB through gateway endpoints (free, stay on the AWS network), and
the few other APIs their machines call through interface endpoints shared by every run of the
environment (one per service: a VPC holds one private DNS name per service): Auto Scaling for
a machine's health, CloudWatch Logs for its output, the container registry's two (login and
pull) for a run that pins its image, and Session Manager's three. Nothing else is routable.
Flow logs go to an encrypted log group.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from spotrain.cdk import Construct, aws
from spotrain.constructs.policy import assume_role_policy, policy_document, statement
from spotrain.core.errors import raise_if_problems
from spotrain.core.image_reference import REGISTRY_PULL_ACTIONS
from spotrain.core.standing_cost import INTERFACE_ENDPOINT_SERVICES


@dataclass(frozen=True, kw_only=True)
class PrivateNetworkProps:
    name: str
    """Name tag prefix of the VPC and its parts."""
    region: str
    """Region of the VPC (names the gateway endpoints' services)."""
    account_id: str
    """Account of the flow-log role's trust guard and the only principals the endpoints
    serve."""
    cidr: str
    """Address range of the VPC (a /16); each zone gets a /20 slice."""
    availability_zones: tuple[str, ...]
    """Zones that get a private subnet."""
    log_kms_key_arn: str
    """Key that encrypts the flow-log group."""
    log_retention_days: int
    """Retention of the flow-log group."""
    s3_buckets: tuple[str, ...]
    """ARNs of the only buckets the VPC may reach (its S3 endpoint's policy)."""
    dynamodb_tables: tuple[str, ...]
    """ARNs of the only tables the VPC may reach (its DynamoDB endpoint's policy)."""
    image_repositories: tuple[str, ...]
    """ARNs of the only container repositories the machines may pull from (the registry's
    endpoints' policy)."""
    fleet_name_prefix: str
    """What every fleet of the environment is named with (`spotrain-<env>-`): the interface
    endpoints serve only their groups' health reports and their machines' log streams."""

    def __post_init__(self) -> None:
        problems = []
        try:
            network = ipaddress.ip_network(self.cidr)
            if network.prefixlen != 16:
                problems.append(f"cidr {self.cidr!r} must be a /16")
        except ValueError:
            problems.append(f"cidr {self.cidr!r} is not an address range: use e.g. 10.40.0.0/16")
        if not 1 <= len(self.availability_zones) <= 16:
            problems.append("availability_zones must name 1 to 16 zones")
        raise_if_problems("PrivateNetworkProps", problems)


class PrivateNetwork(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: PrivateNetworkProps) -> None:
        super().__init__(scope, id_)
        self.vpc = aws.vpc.Vpc(
            self,
            "Vpc",
            cidr_block=props.cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={"Name": props.name},
        )
        # Take over the default security group and leave it without rules.
        aws.default_security_group.DefaultSecurityGroup(
            self, "DefaultSecurityGroup", vpc_id=self.vpc.id
        )
        slices = list(ipaddress.ip_network(props.cidr).subnets(new_prefix=20))
        self.route_table = aws.route_table.RouteTable(
            self, "PrivateRouteTable", vpc_id=self.vpc.id, tags={"Name": f"{props.name}-private"}
        )
        self.subnets = []
        for index, zone in enumerate(props.availability_zones):
            subnet = aws.subnet.Subnet(
                self,
                f"PrivateSubnet{index}",
                vpc_id=self.vpc.id,
                cidr_block=str(slices[index]),
                availability_zone=zone,
                map_public_ip_on_launch=False,
                tags={"Name": f"{props.name}-private-{zone}"},
            )
            aws.route_table_association.RouteTableAssociation(
                self,
                f"PrivateSubnet{index}Routes",
                subnet_id=subnet.id,
                route_table_id=self.route_table.id,
            )
            self.subnets.append(subnet)
        self.endpoints = self._gateway_endpoints(props)

        log_group = aws.cloudwatch_log_group.CloudwatchLogGroup(
            self,
            "FlowLogGroup",
            name=f"/spotrain/{props.name}/vpc-flow-logs",
            retention_in_days=props.log_retention_days,
            kms_key_id=props.log_kms_key_arn,
        )
        flow_role = aws.iam_role.IamRole(
            self,
            "FlowLogRole",
            name=f"{props.name}-flow-logs",
            assume_role_policy=assume_role_policy(
                self, "FlowLogTrust", "vpc-flow-logs.amazonaws.com", source_account=props.account_id
            ),
        )
        aws.iam_role_policy.IamRolePolicy(
            self,
            "FlowLogPolicy",
            role=flow_role.id,
            name="write-flow-logs",
            policy=policy_document(
                self,
                "FlowLogPolicyDocument",
                [
                    statement(
                        "WriteFlowLogs",
                        actions=[
                            "logs:CreateLogStream",
                            "logs:PutLogEvents",
                            "logs:DescribeLogStreams",
                        ],
                        resources=[f"{log_group.arn}:*"],
                    )
                ],
            ),
        )
        aws.flow_log.FlowLog(
            self,
            "FlowLog",
            vpc_id=self.vpc.id,
            traffic_type="ALL",
            log_destination_type="cloud-watch-logs",
            log_destination=log_group.arn,
            iam_role_arn=flow_role.arn,
        )

        self.endpoint_security_group = self._endpoint_security_group(props)
        self.interface_endpoints = self._interface_endpoints(props)

    def _gateway_endpoints(self, props: PrivateNetworkProps) -> dict[str, Any]:
        """S3 and DynamoDB, free and on the AWS network, for the environment's own buckets and
        tables only."""
        # The endpoints reach the environment's own buckets and tables only: credentials used
        # from inside the VPC cannot write anywhere else (and, with the roles' aws:SourceVpce
        # conditions, are of no use outside it).
        reachable = {
            "s3": [r for arn in props.s3_buckets for r in (arn, f"{arn}/*")],
            "dynamodb": [r for arn in props.dynamodb_tables for r in (arn, f"{arn}/index/*")],
        }
        # The registry keeps image layers in its own bucket in the region: a pull fetches them
        # from there through this endpoint, by URLs the registry signed (AWS's bucket, not the
        # account's, so no account condition).
        image_layers = statement(
            "ImageLayersOfThePullsTheRegistrySigned",
            actions=["s3:GetObject"],
            resources=[f"arn:aws:s3:::prod-{props.region}-starport-layer-bucket/*"],
            principals={"AWS": ["*"]},
        )
        endpoints = {}
        for service, resources in reachable.items():
            endpoints[service] = aws.vpc_endpoint.VpcEndpoint(
                self,
                f"{service.capitalize()}GatewayEndpoint",
                vpc_id=self.vpc.id,
                service_name=f"com.amazonaws.{props.region}.{service}",
                vpc_endpoint_type="Gateway",
                route_table_ids=[self.route_table.id],
                policy=policy_document(
                    self,
                    f"{service.capitalize()}EndpointPolicy",
                    [
                        statement(
                            f"OnlyThisEnvironments{service.capitalize()}",
                            actions=[f"{service}:*"],
                            resources=resources,
                            principals={"AWS": ["*"]},
                            conditions=[
                                ("StringEquals", "aws:PrincipalAccount", [props.account_id])
                            ],
                        ),
                        *([image_layers] if service == "s3" else []),
                    ],
                ),
                tags={"Name": f"{props.name}-{service}"},
            )
        return endpoints

    def _interface_endpoints(self, props: PrivateNetworkProps) -> dict[str, Any]:
        """One per service the machines call besides S3 and DynamoDB, shared by every run
        (the services the standing cost counts: `INTERFACE_ENDPOINT_SERVICES`)."""
        fleets = f"{props.fleet_name_prefix}*"
        endpoints = {
            # A machine that cannot train tells its group (SetInstanceHealth).
            "autoscaling": self._interface_endpoint(props, "autoscaling", _only_the_account(
                "OnlyReportTheFleetsHealth", ["autoscaling:SetInstanceHealth"],
                [f"arn:aws:autoscaling:{props.region}:{props.account_id}:autoScalingGroup:*:"
                 f"autoScalingGroupName/{fleets}"], props.account_id)),
            # A reclaimed machine's output outlives it: every machine sends its output to its
            # run's log group (`spotrain logs ship`).
            "logs": self._interface_endpoint(props, "logs", _only_the_account(
                "OnlyTheFleetsLogs", ["logs:CreateLogStream", "logs:PutLogEvents"],
                [f"arn:aws:logs:{props.region}:{props.account_id}:log-group:/spotrain/{fleets}"
                 ":log-stream:*"], props.account_id)),
            # A run that pins its image pulls it from the environment's registry: the login
            # (ecr.api) and the pull itself (ecr.dkr), of the environment's repositories only.
            "ecr.api": self._interface_endpoint(props, "ecr.api", _only_the_account(
                "OnlyLogInToTheRegistry", ["ecr:GetAuthorizationToken"], ["*"],
                props.account_id)),
            "ecr.dkr": self._interface_endpoint(props, "ecr.dkr", _only_the_account(
                "OnlyPullTheEnvironmentsImages", list(REGISTRY_PULL_ACTIONS),
                list(props.image_repositories), props.account_id)),
            # On-call reaches a machine without SSH or an open port: Session Manager, whose
            # agent talks to these (the image carries the agent).
            **{service: self._interface_endpoint(props, service)
               for service in SESSION_MANAGER_SERVICES},
        }  # fmt: skip
        assert tuple(endpoints) == INTERFACE_ENDPOINT_SERVICES, "count them where they cost"
        return endpoints

    def _endpoint_security_group(self, props: PrivateNetworkProps) -> Any:
        sg = aws.security_group
        return sg.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            name=f"{props.name}-endpoints",
            description="Interface endpoints: HTTPS from the private subnets only",
            vpc_id=self.vpc.id,
            ingress=[
                sg.SecurityGroupIngress(
                    description="HTTPS from the machines of the fleets",
                    from_port=443,
                    to_port=443,
                    protocol="tcp",
                    cidr_blocks=[props.cidr],
                )
            ],
            egress=[],
        )

    def _interface_endpoint(
        self, props: PrivateNetworkProps, service: str, only: dict[str, Any] | None = None
    ) -> Any:
        """An interface endpoint in the private subnets, with private DNS: the service's usual
        name finds it. `only`: the one statement its policy allows (None: the service's
        default)."""
        policy = (
            policy_document(self, f"{_construct_id(service)}InterfaceEndpointPolicy", [only])
            if only is not None
            else None
        )
        return aws.vpc_endpoint.VpcEndpoint(
            self,
            f"{_construct_id(service)}Endpoint",
            vpc_id=self.vpc.id,
            service_name=f"com.amazonaws.{props.region}.{service}",
            vpc_endpoint_type="Interface",
            subnet_ids=self.subnet_ids,
            security_group_ids=[self.endpoint_security_group.id],
            private_dns_enabled=True,
            policy=policy,
            tags={"Name": f"{props.name}-{service}"},
        )

    @property
    def endpoint_ids(self) -> tuple[str, ...]:
        return tuple(str(e.id) for e in self.endpoints.values())

    @property
    def subnet_ids(self) -> list[str]:
        return [str(s.id) for s in self.subnets]


SESSION_MANAGER_SERVICES = ("ssm", "ssmmessages", "ec2messages")
"""Interface endpoints Session Manager needs in a VPC without internet access."""


def _only_the_account(
    sid: str, actions: list[str], resources: list[str], account_id: str
) -> dict[str, Any]:
    """An interface endpoint's one statement: these calls, by the account's principals."""
    return statement(
        sid,
        actions=actions,
        resources=resources,
        principals={"AWS": ["*"]},
        conditions=[("StringEquals", "aws:PrincipalAccount", [account_id])],
    )


def _construct_id(service: str) -> str:
    """`ecr.dkr` -> `EcrDkr`: an endpoint's construct id from its service's name."""
    return "".join(part.capitalize() for part in service.split("."))
