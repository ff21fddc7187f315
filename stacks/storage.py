"""Storage: a KMS key per region, access-log buckets, the replicated checkpoint buckets, and the
container registry of the trainer image."""

from __future__ import annotations

from spotrain.cdk import Construct, TerraformOutput
from spotrain.constructs.container_registry import ContainerRegistry, ContainerRegistryProps
from spotrain.constructs.encrypted_bucket import EncryptedBucket, EncryptedBucketProps
from spotrain.constructs.encryption_key import EncryptionKey, EncryptionKeyProps
from spotrain.constructs.interruption_handler.construct import rule_arns
from spotrain.constructs.replicated_bucket_pair import (
    ReplicatedBucketPair,
    ReplicatedBucketPairProps,
)
from spotrain.core import catalog_schema
from spotrain.core import resource_names as names
from spotrain.core.image_reference import image_repository_name
from spotrain.stacks.base import EnvironmentStack
from spotrain.stacks.config import EnvironmentConfig


class StorageStack(EnvironmentStack):
    def __init__(self, scope: Construct, *, config: EnvironmentConfig) -> None:
        super().__init__(scope, "storage", config=config)
        regions = {
            "Primary": (config.primary_region, self.primary_provider),
            "Replica": (config.replica_region, self.replica_provider),
        }
        keys: dict[str, EncryptionKey] = {}
        log_buckets: dict[str, EncryptedBucket] = {}
        for label, (region, provider) in regions.items():
            keys[label] = EncryptionKey(
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
                        if label == "Primary"
                        else ()
                    ),
                    deletion_window_days=7 if config.is_local else 30,
                    provider=provider,
                ),
            )
            log_buckets[label] = EncryptedBucket(
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

        def checkpoint_bucket(label: str) -> EncryptedBucketProps:
            region, provider = regions[label]
            return EncryptedBucketProps(
                bucket_name=names.checkpoint_bucket(config.bucket_prefix, region),
                account_id=self.account_id,
                kms_key_arn=keys[label].arn,
                access_log_bucket=log_buckets[label].log_target_name,
                write_once_prefixes=(f"{catalog_schema.RUNS_PREFIX}/",),
                noncurrent_version_expiration_days=config.noncurrent_version_expiration_days,
                force_destroy=config.is_local,
                provider=provider,
            )

        self.keys = keys
        self.checkpoints = ReplicatedBucketPair(
            self,
            "Checkpoints",
            props=ReplicatedBucketPairProps(
                primary=checkpoint_bucket("Primary"),
                replica=checkpoint_bucket("Replica"),
                primary_region=config.primary_region,
                replica_region=config.replica_region,
                role_name=f"spotrain-{config.name}-replication",
                replication_time_control=not config.is_local,
                emulator_drift_tolerance=config.is_local,
            ),
        )
        # The trainer image and the user's code layered on it (`spotrain image build`), in the
        # primary region beside the fleets that run them, under the environment's data key.
        self.registry = ContainerRegistry(
            self,
            "Images",
            props=ContainerRegistryProps(
                name=image_repository_name(config.name),
                kms_key_arn=keys["Primary"].arn,
                force_delete=config.is_local,
                provider=self.primary_provider,
            ),
        )
        TerraformOutput(self, "checkpoint_bucket", value=self.checkpoints.primary.name)
        TerraformOutput(self, "image_repository", value=self.registry.url)
        TerraformOutput(self, "replica_bucket", value=self.checkpoints.replica.name)
        TerraformOutput(self, "primary_key_alias", value=keys["Primary"].alias.name)
        TerraformOutput(self, "replica_key_alias", value=keys["Replica"].alias.name)
