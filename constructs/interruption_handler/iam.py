"""What the interruption handler may do (its role's one policy), kept apart from its other
parts: record events and its run's fleet state and spend, read its run's crashes, releases
and caps, count interruptions by pool, tag only its run's instances with the interruption mark,
scale only its run's groups, notify, price and publish its run's spend, dead-letter, use its
key through the services that hold its data, and (with a deadline) read its run's progress."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spotrain.constructs.interruption_handler.handler import METRIC_NAMESPACE
from spotrain.constructs.policy import leading_keys, statement, via_services
from spotrain.constructs.run_access import read_run_crashes_and_releases
from spotrain.core.catalog_schema import (
    INTERRUPTION_TAG,
    RUN_TAG,
    configs_prefix,
    event_key,
    lifecycle_key,
    run_key,
    spend_key,
)

if TYPE_CHECKING:
    from spotrain.constructs.interruption_handler.construct import InterruptionHandlerProps


def handler_statements(
    props: InterruptionHandlerProps, *, log_group_arn: str, topic_arn: str,
    dead_letter_queue_arn: str,
) -> list[dict[str, Any]]:  # fmt: skip
    """The handler role's statements."""
    group_arns = [
        f"arn:aws:autoscaling:{g.region}:{props.account_id}:autoScalingGroup:*:"
        f"autoScalingGroupName/{g.name}"
        for g in props.capacity_groups
    ]
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
                conditions=[leading_keys(run_key(props.run_name))],
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
                conditions=[("StringLike", "s3:prefix", [f"{configs_prefix(props.run_name)}*"])],
            )
        )
    return [
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
            # Events (EVENT#<id>), this run's fleet state, spend ledger and lifecycle
            # only: not another run's in a table two environments could share.
            conditions=[
                leading_keys(
                    event_key("*"),
                    run_key(props.run_name),
                    spend_key(props.run_name),
                    lifecycle_key(props.run_name),
                )
            ],
        ),
        # A run held after repeated crashes is not requeued; only reading: releases and raised
        # spend caps are the operator's.
        read_run_crashes_and_releases(props.events_table_arn, props.run_name, caps=True),
        statement(
            "CountInterruptionsByPool",
            actions=["dynamodb:Query"],
            resources=[f"{props.events_table_arn}/index/*"],
        ),
        statement(
            "TagTheRunsInstances",
            actions=["ec2:CreateTags"],
            resources=[f"arn:aws:ec2:*:{props.account_id}:instance/*"],
            conditions=[
                ("StringEquals", f"aws:ResourceTag/{RUN_TAG}", [props.run_name]),
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
            # topic; Lambda for its environment), never KMS directly.
            conditions=[
                (
                    "StringLike",
                    "kms:ViaService",
                    via_services("dynamodb", "sqs", "sns", "lambda"),
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
