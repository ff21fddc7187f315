"""One S3 bucket with secure defaults: versioned, encrypted, private, TLS-only, logged,
lifecycle-managed.

Checkpoint buckets use SSE-KMS with a bucket key and refuse any put that is not SSE-KMS with
their own key, and any write that could overwrite an object under their write-once prefixes.
Access-log buckets (`receives_access_logs`) use SSE-S3, the only encryption S3 server access
log delivery writes to, and grant the log delivery service.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spotrain.cdk import Construct, aws
from spotrain.constructs.policy import deny_insecure_transport, policy_document, statement
from spotrain.core.errors import raise_if_problems


@dataclass(frozen=True, kw_only=True)
class EncryptedBucketProps:
    bucket_name: str
    """Globally unique bucket name."""
    account_id: str
    """Account that owns the bucket (scopes the log delivery grant)."""
    kms_key_arn: str | None
    """Key for SSE-KMS; None only for an access-log bucket (SSE-S3)."""
    access_log_bucket: str | None = None
    """Bucket that receives this bucket's server access logs; None only for a log bucket."""
    receives_access_logs: bool = False
    """This bucket is the target of other buckets' server access logs."""
    noncurrent_version_expiration_days: int = 30
    """Days a superseded object version is kept."""
    abort_incomplete_multipart_days: int = 2
    """Days after which unfinished multipart uploads are removed."""
    write_once_prefixes: tuple[str, ...] = ()
    """Key prefixes (e.g. `runs/`) whose objects are written once: a request that creates an
    object there (PutObject, the completion of a multipart upload) is refused without
    `If-None-Match: *`, so no credential, however broad, overwrites published history."""
    force_destroy: bool = False
    """Allow `terraform destroy` to delete a bucket that still holds objects (local cloud)."""
    provider: Any = None
    """AwsProvider of the bucket's region; None uses the stack's default provider."""

    def __post_init__(self) -> None:
        problems = []
        if self.kms_key_arn is None and not self.receives_access_logs:
            problems.append(
                f"bucket {self.bucket_name!r} has no kms_key_arn: give the key for SSE-KMS "
                "(only an access-log bucket may use SSE-S3)"
            )
        if self.kms_key_arn is not None and self.receives_access_logs:
            problems.append(
                f"bucket {self.bucket_name!r} receives access logs but has a kms_key_arn: "
                "S3 log delivery writes only SSE-S3, so leave kms_key_arn None"
            )
        if self.access_log_bucket is None and not self.receives_access_logs:
            problems.append(
                f"bucket {self.bucket_name!r} has no access_log_bucket: name the log bucket"
            )
        if not 3 <= len(self.bucket_name) <= 63:
            problems.append(f"bucket name {self.bucket_name!r} must be 3-63 characters long")
        if self.noncurrent_version_expiration_days < 1:
            problems.append("noncurrent_version_expiration_days must be 1 or more")
        for prefix in self.write_once_prefixes:
            if not prefix.endswith("/") or prefix.startswith("/") or "*" in prefix:
                problems.append(
                    f"write_once_prefixes entry {prefix!r} must be a key prefix ending in '/' "
                    "without wildcards, e.g. 'runs/'"
                )
        if self.abort_incomplete_multipart_days < 1:
            problems.append("abort_incomplete_multipart_days must be 1 or more")
        raise_if_problems("EncryptedBucketProps", problems)


def kms_only_puts(objects_arn: str, kms_key_arn: str) -> list[dict[str, Any]]:
    """Refuse an object written without SSE-KMS, or with another key than the bucket's."""
    return [
        statement(
            "DenyPutWithoutSseKms",
            effect="Deny",
            actions=["s3:PutObject"],
            resources=[objects_arn],
            principals={"AWS": ["*"]},
            conditions=[("StringNotEquals", "s3:x-amz-server-side-encryption", ["aws:kms"])],
        ),
        statement(
            "DenyPutWithOtherKey",
            effect="Deny",
            actions=["s3:PutObject"],
            resources=[objects_arn],
            principals={"AWS": ["*"]},
            conditions=[
                (
                    "StringNotEqualsIfExists",
                    "s3:x-amz-server-side-encryption-aws-kms-key-id",
                    [kms_key_arn],
                )
            ],
        ),
    ]


class EncryptedBucket(Construct):
    """The bucket and its settings; `bucket` and `versioning` are exposed for wiring."""

    def __init__(self, scope: Construct, id_: str, *, props: EncryptedBucketProps) -> None:
        super().__init__(scope, id_)
        p = props.provider
        self.bucket = aws.s3_bucket.S3Bucket(
            self, "Bucket", bucket=props.bucket_name, force_destroy=props.force_destroy, provider=p
        )
        bucket_id = self.bucket.id
        self.versioning = aws.s3_bucket_versioning.S3BucketVersioningA(
            self,
            "Versioning",
            bucket=bucket_id,
            versioning_configuration={"status": "Enabled"},
            provider=p,
        )
        if props.kms_key_arn is not None:
            default_encryption = {
                "sse_algorithm": "aws:kms",
                "kms_master_key_id": props.kms_key_arn,
            }
        else:
            default_encryption = {"sse_algorithm": "AES256"}
        sse = aws.s3_bucket_server_side_encryption_configuration
        sse.S3BucketServerSideEncryptionConfigurationA(
            self,
            "Encryption",
            bucket=bucket_id,
            rule=[
                sse.S3BucketServerSideEncryptionConfigurationRuleA(
                    apply_server_side_encryption_by_default=default_encryption,
                    bucket_key_enabled=props.kms_key_arn is not None,
                )
            ],
            provider=p,
        )
        self.public_access_block = aws.s3_bucket_public_access_block.S3BucketPublicAccessBlock(
            self,
            "PublicAccessBlock",
            bucket=bucket_id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            provider=p,
        )
        aws.s3_bucket_ownership_controls.S3BucketOwnershipControls(
            self,
            "OwnershipControls",
            bucket=bucket_id,
            rule={"object_ownership": "BucketOwnerEnforced"},
            provider=p,
        )
        self.policy = aws.s3_bucket_policy.S3BucketPolicy(
            self,
            "Policy",
            bucket=bucket_id,
            policy=policy_document(self, "PolicyDocument", self._statements(props)),
            # S3 rejects a policy while the public access block is being changed.
            depends_on=[self.public_access_block],
            provider=p,
        )
        lifecycle = aws.s3_bucket_lifecycle_configuration
        lifecycle.S3BucketLifecycleConfiguration(
            self,
            "Lifecycle",
            bucket=bucket_id,
            rule=[
                lifecycle.S3BucketLifecycleConfigurationRule(
                    id="abort-incomplete-multipart-uploads",
                    status="Enabled",
                    filter=[lifecycle.S3BucketLifecycleConfigurationRuleFilter(prefix="")],
                    abort_incomplete_multipart_upload=[
                        lifecycle.S3BucketLifecycleConfigurationRuleAbortIncompleteMultipartUpload(
                            days_after_initiation=props.abort_incomplete_multipart_days
                        )
                    ],
                ),
                lifecycle.S3BucketLifecycleConfigurationRule(
                    id="expire-noncurrent-versions",
                    status="Enabled",
                    filter=[lifecycle.S3BucketLifecycleConfigurationRuleFilter(prefix="")],
                    noncurrent_version_expiration=[
                        lifecycle.S3BucketLifecycleConfigurationRuleNoncurrentVersionExpiration(
                            noncurrent_days=props.noncurrent_version_expiration_days
                        )
                    ],
                ),
            ],
            depends_on=[self.versioning],
            provider=p,
        )
        if props.access_log_bucket is not None:
            aws.s3_bucket_logging.S3BucketLoggingA(
                self,
                "AccessLogging",
                bucket=bucket_id,
                target_bucket=props.access_log_bucket,
                target_prefix=f"s3/{props.bucket_name}/",
                provider=p,
            )

    @property
    def arn(self) -> str:
        return str(self.bucket.arn)

    @property
    def name(self) -> str:
        return str(self.bucket.bucket)

    @property
    def log_target_name(self) -> str:
        """The name, read from the bucket policy: a bucket that logs here is configured only
        after the log-delivery grant exists (S3 refuses the logging setting before)."""
        return str(self.policy.bucket)

    def _statements(self, props: EncryptedBucketProps) -> list[dict[str, Any]]:
        bucket_arn, objects_arn = self.arn, f"{self.arn}/*"
        statements = [deny_insecure_transport(["s3:*"], [bucket_arn, objects_arn])]
        if props.kms_key_arn is not None:
            statements += kms_only_puts(objects_arn, props.kms_key_arn)
        if props.write_once_prefixes:
            statements.append(
                statement(
                    # S3's documented way to require conditional writes; the steps of a
                    # multipart upload take no conditional header, its completion does.
                    "DenyOverwritableWrites",
                    effect="Deny",
                    actions=["s3:PutObject"],
                    resources=[f"{bucket_arn}/{prefix}*" for prefix in props.write_once_prefixes],
                    principals={"AWS": ["*"]},
                    conditions=[
                        ("Null", "s3:if-none-match", ["true"]),
                        ("Bool", "s3:ObjectCreationOperation", ["true"]),
                    ],
                )
            )
        if props.receives_access_logs:
            statements.append(
                statement(
                    "AllowServerAccessLogDelivery",
                    actions=["s3:PutObject"],
                    resources=[f"{objects_arn}"],
                    principals={"Service": ["logging.s3.amazonaws.com"]},
                    conditions=[("StringEquals", "aws:SourceAccount", [props.account_id])],
                )
            )
        return statements
