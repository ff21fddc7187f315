"""Storage: per region of the environment a KMS key, an access-log bucket and a checkpoint
bucket (each replicating to every other), and at home the container registry of the trainer
image."""

from __future__ import annotations

from spotrain.cdk import Construct, TerraformOutput
from spotrain.constructs.container_registry import ContainerRegistry, ContainerRegistryProps
from spotrain.constructs.encrypted_bucket import EncryptedBucket, EncryptedBucketProps
from spotrain.constructs.encryption_key import EncryptionKey, EncryptionKeyProps
from spotrain.constructs.interruption_handler.construct import rule_arns
from spotrain.constructs.replicated_buckets import (
    RegionalBucket,
    ReplicatedBuckets,
    ReplicatedBucketsProps,
)
from spotrain.core import catalog_schema
from spotrain.core import resource_names as names
from spotrain.core.image_reference import image_repository_name
from spotrain.stacks.base import EnvironmentStack, region_label
from spotrain.stacks.config import EnvironmentConfig


class StorageStack(EnvironmentStack):
    def __init__(self, scope: Construct, *, config: EnvironmentConfig) -> None:
        super().__init__(scope, "storage", config=config)
        keys: dict[str, EncryptionKey] = {}
        log_buckets: dict[str, EncryptedBucket] = {}
        for region in config.region_names:
            label, provider = region_label(config, region), self.provider(region)
            keys[region] = EncryptionKey(
                self,
                f"{label}Key",
                props=EncryptionKeyProps(
                    alias=names.data_key_alias(config.name, region),
                    description=f"spotrain {config.name}: checkpoints, catalog, logs in {region}",
                    account_id=self.account_id,
                    region=region,
                    service_principals=(f"logs.{region}.amazonaws.com",),
                    # The interruption handler's rules dead-letter into a queue under the
                    # primary key (the handler runs in the primary region).
                    dead_letter_rules=(
                        (
                            rule_arns(
                                names.interruption_handler(config.name), region, self.account_id
                            ),
                        )
                        if region == config.primary_region
                        else ()
                    ),
                    deletion_window_days=7 if config.is_local else 30,
                    provider=provider,
                ),
            )
            log_buckets[region] = EncryptedBucket(
                self,
                f"{label}AccessLogBucket",
                props=EncryptedBucketProps(
                    bucket_name=f"{config.bucket_prefix}-access-logs-{region}",
                    account_id=self.account_id,
                    kms_key_arn=None,
                    receives_access_logs=True,
                    noncurrent_version_expiration_days=config.noncurrent_version_expiration_days,
                    force_destroy=config.is_local,
                    provider=provider,
                ),
            )

        def checkpoint_bucket(region: str) -> RegionalBucket:
            return RegionalBucket(
                label=region_label(config, region),
                region=region,
                bucket=EncryptedBucketProps(
                    bucket_name=names.checkpoint_bucket(config.bucket_prefix, region),
                    account_id=self.account_id,
                    kms_key_arn=keys[region].arn,
                    access_log_bucket=log_buckets[region].log_target_name,
                    write_once_prefixes=(f"{catalog_schema.RUNS_PREFIX}/",),
                    noncurrent_version_expiration_days=config.noncurrent_version_expiration_days,
                    force_destroy=config.is_local,
                    provider=self.provider(region),
                ),
            )

        self.keys = keys
        """Each region's data key, by region."""
        self.checkpoints = ReplicatedBuckets(
            self,
            "Checkpoints",
            props=ReplicatedBucketsProps(
                buckets=tuple(checkpoint_bucket(region) for region in config.region_names),
                role_name=f"spotrain-{config.name}-replication",
                replication_time_control=not config.is_local,
                emulator_drift_tolerance=config.is_local,
            ),
        )
        # The trainer image and the user's code layered on it (`spotrain image build` pushes
        # to every region's), beside the fleets that run them, under each region's data key.
        # A repository per region, not registry replication: ECR's replication configuration
        # is one per account and region, which two environments in one account would fight
        # over; a push per region costs the image's bytes once per other region.
        self.registries = {
            region: ContainerRegistry(
                self,
                "Images"
                if region == config.primary_region
                else f"Images{region_label(config, region)}",
                props=ContainerRegistryProps(
                    name=image_repository_name(config.name),
                    kms_key_arn=keys[region].arn,
                    force_delete=config.is_local,
                    provider=self.provider(region),
                ),
            )
            for region in config.region_names
        }
        self.registry = self.registries[config.primary_region]
        TerraformOutput(self, "checkpoint_bucket", value=self.checkpoints.primary.name)
        TerraformOutput(self, "image_repository", value=self.registry.url)
        TerraformOutput(
            self,
            "checkpoint_buckets",
            value={region: b.name for region, b in self.checkpoints.buckets.items()},
        )
        TerraformOutput(
            self, "key_aliases", value={region: k.alias.name for region, k in keys.items()}
        )
