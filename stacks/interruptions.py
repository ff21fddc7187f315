"""Interruptions: one stack per region of the environment (`<env>-interruptions` at home,
`<env>-interruptions-<region>` elsewhere), each with its own handler Lambda, fed by EventBridge
rules for that region's spot warnings, rebalance recommendations and a capacity check. A
region's handler records, marks and requeues for the machines of its region, and checks every
run of the environment: a run is checked in full by the handler of the region it trains in,
and every other region's handler empties the run's groups there (each run's stack declares
itself to every region's handler). EventBridge delivers an instance's warnings in its own
region only, and a handler of a region that is down cannot act: so each region has its own.

Home's handler also watches the checkpoint catalog's stream (every region's writes reach it by
replication): it alarms when a run's published history is rewritten or a fenced writer
publishes, and stops a run that published its final step. One watcher, so one alarm per
change; while home is down, the stream keeps its records for 24 hours and the capacity check
of the run's region notices a final step itself.
"""

from __future__ import annotations

from spotrain.cdk import Construct, TerraformOutput
from spotrain.constructs.interruption_handler.construct import (
    InterruptionHandler,
    InterruptionHandlerProps,
)
from spotrain.core import resource_names as names
from spotrain.stacks.base import EnvironmentStack, regional_part
from spotrain.stacks.config import EnvironmentConfig


def interruptions_part(config: EnvironmentConfig, region: str) -> str:
    """The stack part of `region`'s interruption handler."""
    return regional_part(config, "interruptions", region)


class InterruptionsStack(EnvironmentStack):
    def __init__(
        self,
        scope: Construct,
        *,
        config: EnvironmentConfig,
        region: str,
        key_arn: str,
        events_table_name: str,
        checkpoints_table_name: str,
        checkpoint_bucket_name: str,
        checkpoint_bucket_arn: str,
        catalog_stream_arn: str | None,
    ) -> None:
        super().__init__(scope, interruptions_part(config, region), config=config, region=region)
        queue = config.queue_policy

        def table_arn(table: str) -> str:  # the global table's copy in this region
            return self.arn_in(region, "dynamodb", f"table/{table}")

        name = names.interruption_handler(config.name)
        self.handler = InterruptionHandler(
            self,
            "Handler",
            props=InterruptionHandlerProps(
                # The function, its queue, topic and rules have the same names in every
                # region (their names are regional); its role's name is global.
                name=name,
                role_name=name if region == config.primary_region else f"{name}-{region}",
                events_table_arn=table_arn(events_table_name),
                events_table_name=events_table_name,
                kms_key_arn=key_arn,
                account_id=self.account_id,
                region=region,
                environment=config.name,
                group_name_prefix=names.fleet_name_prefix(config.name),
                alert_emails=config.alert_emails,
                log_retention_days=config.log_retention_days,
                catalog_stream_arn=catalog_stream_arn,
                checkpoints_table_arn=table_arn(checkpoints_table_name),
                checkpoints_table_name=checkpoints_table_name,
                config_bucket_name=checkpoint_bucket_name,
                config_bucket_arn=checkpoint_bucket_arn,
                queue_policy=None if queue.limits_nothing else queue.to_json(),
                emulator_drift_tolerance=config.is_local,
            ),
        )
        TerraformOutput(self, "handler_function", value=self.handler.function.function_name)
        TerraformOutput(self, "dead_letter_queue", value=self.handler.dead_letter_queue.url)
        TerraformOutput(self, "notice_topic", value=self.handler.topic.arn)
