"""Checkpoint buckets in two regions with replication from primary to replica.

Objects are re-encrypted with the replica region's key on arrival. Real environments turn on
Replication Time Control (15-minute SLA with metrics) so a restore from the replica region knows
how stale it may be. The replication role can read only the primary bucket's versions and
write only replicas into the replica bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spotrain.cdk import Construct, TerraformResourceLifecycle, aws
from spotrain.constructs.encrypted_bucket import EncryptedBucket, EncryptedBucketProps
from spotrain.constructs.policy import assume_role_policy, policy_document, statement
from spotrain.core.errors import raise_if_problems


@dataclass(frozen=True, kw_only=True)
class ReplicatedBucketPairProps:
    primary: EncryptedBucketProps
    """The bucket the trainer writes to; its kms_key_arn is the primary region's key."""
    replica: EncryptedBucketProps
    """The bucket in the replica region; its kms_key_arn is the replica region's key."""
    primary_region: str
    """Region of the primary bucket (scopes the role's use of the primary key)."""
    replica_region: str
    """Region of the replica bucket (scopes the role's use of the replica key)."""
    role_name: str
    """Name of the IAM role S3 assumes to replicate."""
    replication_time_control: bool = True
    """Turn on S3 Replication Time Control and replication metrics (15-minute SLA)."""
    emulator_drift_tolerance: bool = False
    """Local cloud only: ignore replication rule drift the emulator reports on every read."""

    def __post_init__(self) -> None:
        problems = []
        if self.primary.kms_key_arn is None or self.replica.kms_key_arn is None:
            problems.append("both buckets of a pair need a kms_key_arn: checkpoints use SSE-KMS")
        if self.primary_region == self.replica_region:
            problems.append("primary_region and replica_region must differ")
        if self.primary.bucket_name == self.replica.bucket_name:
            problems.append("primary and replica bucket names must differ")
        raise_if_problems("ReplicatedBucketPairProps", problems)


class ReplicatedBucketPair(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: ReplicatedBucketPairProps) -> None:
        super().__init__(scope, id_)
        self.primary = EncryptedBucket(self, "PrimaryBucket", props=props.primary)
        self.replica = EncryptedBucket(self, "ReplicaBucket", props=props.replica)
        primary_key, replica_key = props.primary.kms_key_arn, props.replica.kms_key_arn
        assert primary_key is not None and replica_key is not None  # checked in props
        account = props.primary.account_id

        self.role = aws.iam_role.IamRole(
            self,
            "ReplicationRole",
            name=props.role_name,
            assume_role_policy=assume_role_policy(
                self, "ReplicationTrust", "s3.amazonaws.com", source_account=account
            ),
            provider=props.primary.provider,
        )
        aws.iam_role_policy.IamRolePolicy(
            self,
            "ReplicationPolicy",
            role=self.role.id,
            name="replicate-checkpoints",
            policy=policy_document(
                self,
                "ReplicationPolicyDocument",
                [
                    statement(
                        "ReadReplicationConfiguration",
                        actions=["s3:GetReplicationConfiguration", "s3:ListBucket"],
                        resources=[self.primary.arn],
                    ),
                    statement(
                        "ReadSourceVersions",
                        actions=[
                            "s3:GetObjectVersionForReplication",
                            "s3:GetObjectVersionAcl",
                            "s3:GetObjectVersionTagging",
                        ],
                        resources=[f"{self.primary.arn}/*"],
                    ),
                    statement(
                        "WriteReplicas",
                        actions=["s3:ReplicateObject", "s3:ReplicateDelete", "s3:ReplicateTags"],
                        resources=[f"{self.replica.arn}/*"],
                    ),
                    statement(
                        "DecryptSourceObjects",
                        actions=["kms:Decrypt"],
                        resources=[primary_key],
                        conditions=[
                            (
                                "StringEquals",
                                "kms:ViaService",
                                [f"s3.{props.primary_region}.amazonaws.com"],
                            )
                        ],
                    ),
                    statement(
                        "EncryptReplicas",
                        actions=["kms:Encrypt", "kms:GenerateDataKey"],
                        resources=[replica_key],
                        conditions=[
                            (
                                "StringEquals",
                                "kms:ViaService",
                                [f"s3.{props.replica_region}.amazonaws.com"],
                            )
                        ],
                    ),
                ],
            ),
            provider=props.primary.provider,
        )

        destination: dict[str, Any] = {
            "bucket": self.replica.arn,
            "storage_class": "STANDARD",
            "encryption_configuration": {"replica_kms_key_id": replica_key},
        }
        if props.replication_time_control:
            destination["replication_time"] = {"status": "Enabled", "time": {"minutes": 15}}
            destination["metrics"] = {"status": "Enabled", "event_threshold": {"minutes": 15}}
        replication = aws.s3_bucket_replication_configuration
        self.replication = replication.S3BucketReplicationConfigurationA(
            self,
            "Replication",
            bucket=self.primary.bucket.id,
            role=self.role.arn,
            rule=[
                replication.S3BucketReplicationConfigurationRule(
                    id="replicate-all-checkpoints",
                    status="Enabled",
                    priority=1,
                    filter={"prefix": ""},
                    delete_marker_replication={"status": "Enabled"},
                    source_selection_criteria={"sse_kms_encrypted_objects": {"status": "Enabled"}},
                    destination=destination,
                )
            ],
            # Replication needs versioning on both sides first.
            depends_on=[self.primary.versioning, self.replica.versioning],
            lifecycle=(
                TerraformResourceLifecycle(ignore_changes=["rule"])
                if props.emulator_drift_tolerance
                else None
            ),
            provider=props.primary.provider,
        )
