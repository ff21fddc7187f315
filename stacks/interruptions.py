"""Interruptions: EventBridge rules for spot warnings and rebalance recommendations -> Lambda."""

from __future__ import annotations

from spotrain.cdk import Construct, TerraformOutput
from spotrain.constructs.interruption_handler.construct import (
    InterruptionHandler,
    InterruptionHandlerProps,
)
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
    ) -> None:
        super().__init__(scope, "interruptions", config=config)
        self.handler = InterruptionHandler(
            self,
            "Handler",
            props=InterruptionHandlerProps(
                name=self.resource_name("interruption-handler"),
                events_table_arn=events_table_arn,
                events_table_name=events_table_name,
                kms_key_arn=primary_key_arn,
                account_id=self.account_id,
                log_retention_days=config.log_retention_days,
                emulator_drift_tolerance=config.is_local,
            ),
        )
        TerraformOutput(self, "handler_function", value=self.handler.function.function_name)
        TerraformOutput(self, "dead_letter_queue", value=self.handler.dead_letter_queue.url)
