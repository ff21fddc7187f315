"""What the interruption handler may do (its role's one policy), kept apart from its other
parts: read its environment's run declarations, record events and its runs' fleet state,
spend and lifecycle, read their crashes, releases and caps, count interruptions by pool, tag
only its environment's instances with the interruption mark, scale only its environment's
groups, notify, price and publish its runs' spend, dead-letter, use its key through the
services that hold its data, read its runs' progress and whether their configuration is
stored, and where its queue counts them, the account's GPU quotas and their usage. Its
environment has its own tables and bucket; every run of it is the handler's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spotrain.constructs.policy import leading_keys, statement, via_services
from spotrain.constructs.run_access import read_run_crashes_and_releases
from spotrain.core.catalog_schema import (
    ENVIRONMENT_TAG,
    FOREIGN_EVENTS_KEY,
    INTERRUPTION_TAG,
    configs_prefix,
    deadline_plan_key,
    event_key,
    handler_state_key,
    lifecycle_key,
    run_key,
    spend_key,
)
from spotrain.core.handler_settings import runs_parameter_path
from spotrain.core.resource_names import METRIC_NAMESPACE

EVERY_RUN = "*"
"""Every run of the environment (its tables and bucket are the environment's own)."""

if TYPE_CHECKING:
    from spotrain.constructs.interruption_handler.construct import InterruptionHandlerProps


def handler_statements(
    props: InterruptionHandlerProps, *, log_group_arn: str, topic_arn: str,
    dead_letter_queue_arn: str,
) -> list[dict[str, Any]]:  # fmt: skip
    """The handler role's statements."""
    # Its own region's groups and instances only: every region has its handler.
    group_arns = [
        f"arn:aws:autoscaling:{props.region}:{props.account_id}:autoScalingGroup:*:"
        f"autoScalingGroupName/{props.group_name_prefix}*"
    ]
    of_the_environment = ("StringEquals", f"aws:ResourceTag/{ENVIRONMENT_TAG}",
                          [props.environment])  # fmt: skip
    watch_catalog = []
    if props.catalog_stream_arn is not None:
        watch_catalog = [
            statement(
                "ReadCatalogStream",
                actions=[
                    "dynamodb:DescribeStream",
                    "dynamodb:GetRecords",
                    "dynamodb:GetShardIterator",
                ],
                resources=[props.catalog_stream_arn],
            ),
            # Lambda's poller lists the table's streams; ListStreams has no resource-level
            # permission.
            statement("ListCatalogStreams", actions=["dynamodb:ListStreams"], resources=["*"]),
        ]
    read_progress = []
    if props.checkpoints_table_arn is not None:
        read_progress = [
            statement(
                # The run's head and checkpoint records: whether its final step is published,
                # and with a deadline its progress and throughput.
                "ReadRunProgress",
                actions=["dynamodb:GetItem", "dynamodb:Query"],
                resources=[props.checkpoints_table_arn],
                conditions=[leading_keys(run_key(EVERY_RUN))],
            )
        ]
    if props.config_bucket_arn is not None:
        read_progress.append(
            statement(
                # Whether the run's training configuration is stored (its groups start then):
                # listing its configuration prefix only, never reading an object.
                "ListRunConfiguration",
                actions=["s3:ListBucket"],
                resources=[props.config_bucket_arn],
                conditions=[("StringLike", "s3:prefix", [f"{configs_prefix(EVERY_RUN)}*"])],
            )
        )
    parameters = runs_parameter_path(props.environment)
    return [
        *_read_account_quotas(props),
        statement(
            # Each run's stack declares the run (its groups, cap and deadline) here.
            "ReadRunDeclarations",
            actions=["ssm:GetParametersByPath"],
            resources=[f"arn:aws:ssm:{props.region}:{props.account_id}:parameter{parameters}"],
        ),
        statement(
            "WriteOwnLogs",
            actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[f"{log_group_arn}:*"],
        ),
        statement(
            "RecordEventsAndFleetState",
            actions=[
                "dynamodb:PutItem",
                "dynamodb:GetItem",
                "dynamodb:UpdateItem",
                "dynamodb:Query",
            ],
            resources=[props.events_table_arn],
            # Events (EVENT#<id>), the runs' machines, its own state of each run, spend
            # ledgers and lifecycles, and the count of foreign events; never a machine's crash
            # records or an operator's releases and caps.
            conditions=[
                leading_keys(
                    event_key("*"),
                    run_key(EVERY_RUN),
                    handler_state_key(EVERY_RUN),
                    spend_key(EVERY_RUN),
                    lifecycle_key(EVERY_RUN),
                    FOREIGN_EVENTS_KEY,
                )
            ],
        ),
        # A run held after repeated crashes is not requeued; only reading: releases and raised
        # spend caps are the operator's.
        read_run_crashes_and_releases(props.events_table_arn, EVERY_RUN, caps=True),
        statement(
            # A run with a deadline follows its plan; operators store it, the handler only
            # reads it (`core/deadline_plan.py`).
            "ReadRunDeadlinePlans",
            actions=["dynamodb:GetItem"],
            resources=[props.events_table_arn],
            conditions=[leading_keys(deadline_plan_key(EVERY_RUN))],
        ),
        statement(
            "CountInterruptionsByPool",
            actions=["dynamodb:Query"],
            resources=[f"{props.events_table_arn}/index/*"],
        ),
        statement(
            "TagTheRunsInstances",
            actions=["ec2:CreateTags"],
            resources=[f"arn:aws:ec2:{props.region}:{props.account_id}:instance/*"],
            conditions=[
                of_the_environment,
                # Only its own mark: never the run tag or anything else.
                ("ForAllValues:StringEquals", "aws:TagKeys", [INTERRUPTION_TAG]),
            ],
        ),
        statement(
            "ScaleTheRunsGroups",
            actions=[
                "autoscaling:SetDesiredCapacity",
                # A held run's groups go to 0, minimum included, and come back.
                "autoscaling:UpdateAutoScalingGroup",
            ],
            resources=group_arns,
            conditions=[of_the_environment],
        ),
        statement("Notify", actions=["sns:Publish"], resources=[topic_arn]),
        statement(
            # The run's spend ledger: prices of its pools. Neither call supports
            # resource-level permissions.
            "PriceTheRunsMachines",
            actions=["ec2:DescribeSpotPriceHistory", "pricing:GetProducts"],
            resources=["*"],
        ),
        statement(
            # Where a run with a deadline may find spot in its other regions (a move for
            # spot: runtime/deadline.py). No resource-level permissions either.
            "ScoreSpotInTheRunsRegions",
            actions=["ec2:GetSpotPlacementScores"],
            resources=["*"],
        ),
        statement(
            "PublishTheRunsSpend",
            actions=["cloudwatch:PutMetricData"],
            resources=["*"],
            conditions=[
                (
                    "StringEquals",
                    "cloudwatch:namespace",
                    [METRIC_NAMESPACE],
                )
            ],
        ),
        statement(
            "DeadLetter",
            actions=["sqs:SendMessage"],
            resources=[dead_letter_queue_arn],
        ),
        statement(
            "UseKey",
            actions=["kms:Decrypt", "kms:GenerateDataKey"],
            resources=[props.kms_key_arn],
            # Through the services that hold its data only (the table, queue,
            # topic; Lambda for its environment; SSM for the runs' declarations), never KMS
            # directly.
            conditions=[
                (
                    "StringLike",
                    "kms:ViaService",
                    via_services("dynamodb", "sqs", "sns", "lambda", "ssm"),
                )
            ],
        ),
        # Describe and X-Ray calls do not support resource-level permissions.
        statement(
            "LookUpInstancesAndGroups",
            actions=[
                "ec2:DescribeInstances",
                "autoscaling:DescribeAutoScalingGroups",
            ],
            resources=["*"],
        ),
        statement(
            "Trace",
            actions=["xray:PutTraceSegments", "xray:PutTelemetryRecords"],
            resources=["*"],
        ),
        *watch_catalog,
        *read_progress,
    ]


def _read_account_quotas(props: InterruptionHandlerProps) -> list[dict[str, Any]]:
    """Where the queue counts the account's quotas: the five GPU quotas in every region
    (each region's handler judges the whole queue), and their usage metrics."""
    from spotrain.core.admission import QueuePolicy
    from spotrain.core.gpu_types import INSTANCE_QUOTAS

    if props.queue_policy is None or not QueuePolicy.from_json(props.queue_policy).account_quotas:
        return []
    return [
        statement(
            "ReadGpuQuotas",
            actions=["servicequotas:GetServiceQuota"],
            resources=[
                f"arn:aws:servicequotas:*:{props.account_id}:ec2/{quota.code}"
                for quota in INSTANCE_QUOTAS.values()
            ],
        ),
        # Reading a metric has no resource-level permission.
        statement("ReadQuotaUsage", actions=["cloudwatch:GetMetricStatistics"], resources=["*"]),
    ]
