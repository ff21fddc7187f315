"""Retention: the lifecycle rules of every bucket of the storage stack (unfinished uploads
removed, superseded versions expired), in each bucket's region.

Apart from storage because of time, not meaning: the AWS provider reads new rules back until
ten reads five seconds apart agree, about a minute, and every other stack of the environment
waits for storage's. Nothing waits for these rules, so this stack is applied beside the
others once storage is."""

from __future__ import annotations

from spotrain.cdk import Construct
from spotrain.constructs.encrypted_bucket import BucketRetention
from spotrain.stacks.base import EnvironmentStack, region_label
from spotrain.stacks.config import EnvironmentConfig
from spotrain.stacks.storage import StorageStack


class RetentionStack(EnvironmentStack):
    def __init__(
        self, scope: Construct, *, config: EnvironmentConfig, storage: StorageStack
    ) -> None:
        super().__init__(scope, "retention", config=config)
        for region in config.region_names:
            label, provider = region_label(config, region), self.provider(region)
            BucketRetention(
                self,
                f"{label}Checkpoints",
                bucket=storage.checkpoints.buckets[region],
                provider=provider,
            )
            BucketRetention(
                self, f"{label}AccessLogs", bucket=storage.log_buckets[region], provider=provider
            )
