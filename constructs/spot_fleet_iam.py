"""What a fleet's machines may do (the instance role's one policy), kept apart from the fleet's
other parts: one run's prefix in the checkpoint buckets (read, write once, never delete), the
shared datasets (read), the run's catalog items and fleet state, its own crash records (add,
never remove), its spend (read), its group's health, its log streams, Session Manager's agent,
and the data keys through S3 and DynamoDB only. Every S3 and DynamoDB grant holds only through
the VPC's own endpoints; the other services' through the fleet's interface endpoints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spotrain.constructs.policy import leading_keys, statement, via_services
from spotrain.constructs.run_access import read_run_crashes_and_releases
from spotrain.core import catalog_schema
from spotrain.core.catalog_schema import (
    crashes_key,
    handler_state_key,
    lifecycle_key,
    run_key,
    spend_key,
)
from spotrain.core.image_reference import REGISTRY_PULL_ACTIONS

if TYPE_CHECKING:
    from spotrain.constructs.spot_fleet import SpotFleetProps

SESSION_MANAGER_AGENT_ACTIONS = (
    "ssm:UpdateInstanceInformation",
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
    "ec2messages:AcknowledgeMessage",
    "ec2messages:DeleteMessage",
    "ec2messages:FailMessage",
    "ec2messages:GetEndpoint",
    "ec2messages:GetMessages",
    "ec2messages:SendReply",
)
"""What Session Manager's agent on a machine calls (none of it names a resource)."""


def machine_statements(
    props: SpotFleetProps,
    *,
    own_groups: list[str],
    machine_streams: str,
    autoscaling_endpoint_id: str,
    logs_endpoint_id: str,
    session_endpoint_ids: list[str],
) -> list[dict[str, Any]]:
    """The instance role's statements for the fleet of `props`."""
    run_prefix = catalog_schema.run_prefix(props.run_name)
    datasets = catalog_schema.DATASETS_PREFIX
    return _through_the_vpc(props.vpc_endpoint_ids, [
        statement(
            "ListRunPrefix",
            actions=["s3:ListBucket"],
            resources=[props.checkpoint_bucket_arn, *props.replica_bucket_arns],
            conditions=[
                (
                    "StringLike",
                    "s3:prefix",
                    [f"{run_prefix}/*", run_prefix, f"{datasets}/*"],
                )
            ],
        ),
        statement(
            # Prepared datasets are shared by runs: machines read, never write.
            "ReadDatasets",
            actions=["s3:GetObject"],
            resources=[
                f"{props.checkpoint_bucket_arn}/{datasets}/*",
                *(f"{arn}/{datasets}/*" for arn in props.replica_bucket_arns),
            ],
        ),
        statement(
            # No delete: a machine never removes published history (garbage
            # collection and quarantine are operator commands); aborting its own
            # unfinished multipart upload touches no published object.
            "ReadWriteRunCheckpoints",
            actions=[
                "s3:GetObject",
                "s3:PutObject",
                "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts",
            ],
            resources=[f"{props.checkpoint_bucket_arn}/{run_prefix}/*"],
        ),
        statement(
            "ReadRunReplicas",
            actions=["s3:GetObject"],
            resources=[f"{arn}/{run_prefix}/*" for arn in props.replica_bucket_arns],
        ),
        statement(
            "RunCatalogItems",
            actions=[
                "dynamodb:GetItem",
                "dynamodb:PutItem",
                "dynamodb:UpdateItem",
                "dynamodb:Query",
                "dynamodb:ConditionCheckItem",
            ],
            resources=[
                props.catalog_table_arn,
                f"{props.catalog_table_arn}/index/*",
            ],
            conditions=[leading_keys(run_key(props.run_name))],
        ),
        statement(
            # A machine whose trainer cannot start has its group replace it.
            "ReplaceItself",
            actions=["autoscaling:SetInstanceHealth"],
            resources=own_groups,
            conditions=[
                (
                    "StringEquals",
                    "aws:SourceVpce",
                    [autoscaling_endpoint_id],
                )
            ],
        ),
        statement(
            # The coordinator claim and the machines' own marks.
            "RunFleetState",
            actions=["dynamodb:GetItem", "dynamodb:UpdateItem"],
            resources=[props.events_table_arn],
            conditions=[leading_keys(run_key(props.run_name))],
        ),
        statement(
            # Add crash records, never change or remove one: a machine cannot
            # release its own run from a hold after repeated crashes.
            "RecordRunCrashes",
            actions=["dynamodb:PutItem"],
            resources=[props.events_table_arn],
            conditions=[leading_keys(crashes_key(props.run_name))],
        ),
        statement(
            # Whether the run is held at its spend cap, finished or cancelled, and where
            # the handler ordered it (may-start): reading only, the ledger, the lifecycle
            # and the handler's state of the run are the handler's and operators'.
            "ReadRunSpendLifecycleAndState",
            actions=["dynamodb:GetItem"],
            resources=[props.events_table_arn],
            conditions=[
                leading_keys(
                    spend_key(props.run_name),
                    lifecycle_key(props.run_name),
                    handler_state_key(props.run_name),
                )
            ],
        ),
        read_run_crashes_and_releases(props.events_table_arn, props.run_name),
        statement(
            "ShipMachineLogs",
            actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[machine_streams],
            conditions=[
                ("StringEquals", "aws:SourceVpce", [logs_endpoint_id])
            ],
        ),
        statement(
            # Session Manager's agent; these calls take no resource but the
            # instance's, and only through the fleet's own endpoints.
            "SessionManagerAgent",
            actions=list(SESSION_MANAGER_AGENT_ACTIONS),
            resources=["*"],
            conditions=[
                (
                    "StringEquals",
                    "aws:SourceVpce",
                    list(session_endpoint_ids),
                )
            ],
        ),
        statement(
            "UseDataKeys",
            actions=["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"],
            resources=list(props.data_kms_key_arns),
            # Through S3 and DynamoDB only, in either region: a stolen credential
            # cannot decrypt with the keys directly.
            conditions=[
                ("StringLike", "kms:ViaService", via_services("s3", "dynamodb"))
            ],
        ),
        *_pull_statements(props),
    ])  # fmt: skip


def _pull_statements(props: SpotFleetProps) -> list[dict[str, Any]]:
    """A run that pins its image pulls it from the environment's registry only, through the
    registry's endpoints; a run on the baked image gets no registry access at all."""
    if props.image is None or props.image_repository_arn is None:
        return []
    through = [("StringEquals", "aws:SourceVpce", list(props.registry_endpoint_ids))]
    return [
        statement("PullRunImage", actions=list(REGISTRY_PULL_ACTIONS),
                  resources=[props.image_repository_arn], conditions=through),
        statement("RegistryLogin", actions=["ecr:GetAuthorizationToken"], resources=["*"],
                  conditions=through),
    ]  # fmt: skip


def _through_the_vpc(
    endpoint_ids: tuple[str, ...], statements: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """S3 and DynamoDB grants hold only for requests through the VPC's own endpoints."""
    for grant in statements:
        if any(a.startswith(("s3:", "dynamodb:")) for a in grant["actions"]):
            grant.setdefault("condition", []).append(
                {"test": "StringEquals", "variable": "aws:SourceVpce", "values": list(endpoint_ids)}
            )
    return statements
