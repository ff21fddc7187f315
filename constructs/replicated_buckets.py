"""Checkpoint buckets in every region of an environment, each replicating to every other.

Why every way: a run trains in one region at a time but may move to any of them, and its
writer publishes into the bucket of the region it trains in; a later move (back home, or on)
must find that history in its own region's bucket. Each bucket therefore replicates what its
writers put there to every other bucket. S3 never replicates a replica again, so objects do not
loop, and the trainer's objects are write-once under `runs/`, so two sources never hold two
versions of one key. The cost: each byte written crosses the inter-region link once per other
region (docs/cost.md).

Objects are re-encrypted with the destination region's key on arrival. Real environments turn
on Replication Time Control (15-minute SLA with metrics) so a restore elsewhere knows how stale
it may be. Each source has its own role, which can read only that bucket's versions and write
only replicas into the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spotrain.cdk import Construct, TerraformResourceLifecycle, aws
from spotrain.constructs.encrypted_bucket import EncryptedBucket, EncryptedBucketProps
from spotrain.constructs.policy import assume_role_policy, policy_document, statement
from spotrain.core.errors import raise_if_problems


@dataclass(frozen=True, kw_only=True)
class RegionalBucket:
    label: str
    """Stem of this bucket's construct ids (`<label>Bucket`); keep it once deployed."""
    region: str
    """Region of the bucket (scopes the roles' use of its key)."""
    bucket: EncryptedBucketProps
    """The bucket; its kms_key_arn is its region's key, its provider its region's."""


@dataclass(frozen=True, kw_only=True)
class ReplicatedBucketsProps:
    buckets: tuple[RegionalBucket, ...]
    """Two or more buckets in different regions; the first is home."""
    role_name: str
    """Name of the role S3 assumes to replicate from home; another source's role adds its
    region (`<role_name>-<region>`)."""
    replication_time_control: bool = True
    """Turn on S3 Replication Time Control and replication metrics (15-minute SLA)."""
    emulator_drift_tolerance: bool = False
    """Local cloud only: ignore replication rule drift the emulator reports on every read."""

    def __post_init__(self) -> None:
        problems = []
        if len(self.buckets) < 2:
            problems.append("give two or more buckets: replication needs a destination")
        if any(b.bucket.kms_key_arn is None for b in self.buckets):
            problems.append("every bucket needs a kms_key_arn: checkpoints use SSE-KMS")
        for what, values in (
            ("regions", [b.region for b in self.buckets]),
            ("bucket names", [b.bucket.bucket_name for b in self.buckets]),
            ("labels", [b.label for b in self.buckets]),
        ):
            if len(set(values)) != len(values):
                problems.append(f"the buckets' {what} must differ: give each its own")
        raise_if_problems("ReplicatedBucketsProps", problems)


class ReplicatedBuckets(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: ReplicatedBucketsProps) -> None:
        super().__init__(scope, id_)
        self.buckets = {
            b.region: EncryptedBucket(self, f"{b.label}Bucket", props=b.bucket)
            for b in props.buckets
        }
        self.roles: dict[str, Any] = {}
        self.replications: dict[str, Any] = {}
        for index, source in enumerate(props.buckets):
            # Home's ids and role name are those of the environments deployed before regions
            # were a list, so their state keeps its addresses.
            stem = "" if index == 0 else source.label
            role_name = props.role_name if index == 0 else f"{props.role_name}-{source.region}"
            others = [b for b in props.buckets if b is not source]
            self.roles[source.region] = self._role(stem, role_name, source, others)
            self.replications[source.region] = self._replication(stem, source, others, props)

    @property
    def primary(self) -> EncryptedBucket:
        """Home's bucket."""
        return next(iter(self.buckets.values()))

    def _role(
        self, stem: str, role_name: str, source: RegionalBucket, others: list[RegionalBucket]
    ) -> Any:
        bucket = self.buckets[source.region]
        role = aws.iam_role.IamRole(
            self,
            f"{stem}ReplicationRole",
            name=role_name,
            assume_role_policy=assume_role_policy(
                self,
                f"{stem}ReplicationTrust",
                "s3.amazonaws.com",
                source_account=source.bucket.account_id,
            ),
            provider=source.bucket.provider,
        )
        aws.iam_role_policy.IamRolePolicy(
            self,
            f"{stem}ReplicationPolicy",
            role=role.id,
            name="replicate-checkpoints",
            policy=policy_document(
                self,
                f"{stem}ReplicationPolicyDocument",
                [
                    statement(
                        "ReadReplicationConfiguration",
                        actions=["s3:GetReplicationConfiguration", "s3:ListBucket"],
                        resources=[bucket.arn],
                    ),
                    statement(
                        "ReadSourceVersions",
                        actions=[
                            "s3:GetObjectVersionForReplication",
                            "s3:GetObjectVersionAcl",
                            "s3:GetObjectVersionTagging",
                        ],
                        resources=[f"{bucket.arn}/*"],
                    ),
                    statement(
                        "WriteReplicas",
                        actions=["s3:ReplicateObject", "s3:ReplicateDelete", "s3:ReplicateTags"],
                        resources=[f"{self.buckets[o.region].arn}/*" for o in others],
                    ),
                    statement(
                        "DecryptSourceObjects",
                        actions=["kms:Decrypt"],
                        resources=[str(source.bucket.kms_key_arn)],
                        conditions=[("StringEquals", "kms:ViaService", [_s3_in(source.region)])],
                    ),
                    statement(
                        "EncryptReplicas",
                        actions=["kms:Encrypt", "kms:GenerateDataKey"],
                        resources=[str(o.bucket.kms_key_arn) for o in others],
                        conditions=[
                            (
                                "StringEquals",
                                "kms:ViaService",
                                [_s3_in(o.region) for o in others],
                            )
                        ],
                    ),
                ],
            ),
            provider=source.bucket.provider,
        )
        return role

    def _replication(
        self,
        stem: str,
        source: RegionalBucket,
        others: list[RegionalBucket],
        props: ReplicatedBucketsProps,
    ) -> Any:
        replication = aws.s3_bucket_replication_configuration
        rules = []
        for priority, other in enumerate(others, start=1):
            destination: dict[str, Any] = {
                "bucket": self.buckets[other.region].arn,
                "storage_class": "STANDARD",
                "encryption_configuration": {"replica_kms_key_id": other.bucket.kms_key_arn},
            }
            if props.replication_time_control:
                destination["replication_time"] = {"status": "Enabled", "time": {"minutes": 15}}
                destination["metrics"] = {"status": "Enabled", "event_threshold": {"minutes": 15}}
            rules.append(
                replication.S3BucketReplicationConfigurationRule(
                    id=f"replicate-to-{other.region}",
                    status="Enabled",
                    priority=priority,
                    filter={"prefix": ""},
                    delete_marker_replication={"status": "Enabled"},
                    source_selection_criteria={"sse_kms_encrypted_objects": {"status": "Enabled"}},
                    destination=destination,
                )
            )
        return replication.S3BucketReplicationConfigurationA(
            self,
            f"{stem}Replication",
            bucket=self.buckets[source.region].bucket.id,
            role=self.roles[source.region].arn,
            rule=rules,
            # Replication needs versioning on both sides first.
            depends_on=[self.buckets[b.region].versioning for b in (source, *others)],
            lifecycle=(
                TerraformResourceLifecycle(ignore_changes=["rule"])
                if props.emulator_drift_tolerance
                else None
            ),
            provider=source.bucket.provider,
        )


def _s3_in(region: str) -> str:
    return f"s3.{region}.amazonaws.com"
