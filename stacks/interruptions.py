"""Interruptions: EventBridge rules for spot warnings, rebalance recommendations and a capacity
check -> the handler Lambda, which records, marks, requeues and notifies; and the checkpoint
catalog's stream -> the same Lambda, which alarms when a run's published history is rewritten."""

from __future__ import annotations

from spotrain.cdk import Construct, TerraformOutput
from spotrain.constructs.interruption_handler.construct import (
    CapacityGroup,
    InterruptionHandler,
    InterruptionHandlerProps,
)
from spotrain.constructs.spot_fleet import on_demand_group_name
from spotrain.stacks.base import EnvironmentStack, resource_name
from spotrain.stacks.compute import fleet_group_name
from spotrain.stacks.config import EnvironmentConfig


def handler_name(config: EnvironmentConfig) -> str:
    return resource_name(config, "interruption-handler")


def capacity_groups(config: EnvironmentConfig) -> tuple[CapacityGroup, ...]:
    """The fleet's groups the handler may scale: spot first (started at the run's declared
    sizes), on-demand as the fallback (empty until needed). Both run in the primary region,
    which holds the run's data."""
    spot = fleet_group_name(config)
    return (
        CapacityGroup(
            name=spot,
            region=config.primary_region,
            lifecycle="spot",
            holds_data=True,
            min_size=config.fleet_min_size,
            desired=config.fleet_desired_size,
        ),
        CapacityGroup(
            name=on_demand_group_name(spot),
            region=config.primary_region,
            lifecycle="on-demand",
            holds_data=True,
        ),
    )


class InterruptionsStack(EnvironmentStack):
    def __init__(
        self,
        scope: Construct,
        *,
        config: EnvironmentConfig,
        primary_key_arn: str,
        events_table_arn: str,
        events_table_name: str,
        catalog_stream_arn: str,
        checkpoints_table_arn: str,
        checkpoints_table_name: str,
        checkpoint_bucket_name: str,
        checkpoint_bucket_arn: str,
    ) -> None:
        super().__init__(scope, "interruptions", config=config)
        self.handler = InterruptionHandler(
            self,
            "Handler",
            props=InterruptionHandlerProps(
                name=handler_name(config),
                events_table_arn=events_table_arn,
                events_table_name=events_table_name,
                kms_key_arn=primary_key_arn,
                account_id=self.account_id,
                run_name=config.run_name,
                capacity_groups=capacity_groups(config),
                alert_emails=config.alert_emails,
                log_retention_days=config.log_retention_days,
                catalog_stream_arn=catalog_stream_arn,
                run_deadline=config.run_deadline,
                max_spend_usd=config.max_spend_usd,
                checkpoints_table_arn=checkpoints_table_arn,
                checkpoints_table_name=checkpoints_table_name,
                config_bucket_name=checkpoint_bucket_name,
                config_bucket_arn=checkpoint_bucket_arn,
                emulator_drift_tolerance=config.is_local,
            ),
        )
        TerraformOutput(self, "handler_function", value=self.handler.function.function_name)
        TerraformOutput(self, "dead_letter_queue", value=self.handler.dead_letter_queue.url)
        TerraformOutput(self, "notice_topic", value=self.handler.topic.arn)
