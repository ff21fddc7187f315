"""Interruptions: EventBridge rules for spot warnings, rebalance recommendations and a capacity
check -> the handler Lambda, which records, marks, requeues and notifies for every run of the
environment (each run's stack declares itself to it); and the checkpoint catalog's stream ->
the same Lambda, which alarms when a run's published history is rewritten and stops a run that
published its final step."""

from __future__ import annotations

from spotrain.cdk import Construct, TerraformOutput
from spotrain.constructs.interruption_handler.construct import (
    InterruptionHandler,
    InterruptionHandlerProps,
)
from spotrain.core import resource_names as names
from spotrain.stacks.base import EnvironmentStack
from spotrain.stacks.config import EnvironmentConfig


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
                name=names.interruption_handler(config.name),
                events_table_arn=events_table_arn,
                events_table_name=events_table_name,
                kms_key_arn=primary_key_arn,
                account_id=self.account_id,
                region=config.primary_region,
                environment=config.name,
                group_name_prefix=names.fleet_name_prefix(config.name),
                alert_emails=config.alert_emails,
                log_retention_days=config.log_retention_days,
                catalog_stream_arn=catalog_stream_arn,
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
