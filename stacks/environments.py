"""The environments this blueprint deploys. Edit these objects to fit your organisation.

An environment is the shared ground its runs train on; the runs themselves are files,
`runs/<environment>/<run>.toml` (`spotrain.stacks.runs`). `local` points at the local cloud
(`spotrain local up`); `dev` and `prod` are real AWS accounts whose Terraform state lives in an
existing S3 bucket (see README: remote state).
"""

from __future__ import annotations

from spotrain.stacks.config import EnvironmentConfig, LocalCloud, StateBackend

DEFAULT_LOCAL_ENDPOINT = "https://127.0.0.1:4566"
LOCAL_STATE_BUCKET = "spotrain-local-terraform-state"
LOCAL_REGION = "us-east-1"


def local(endpoint: str = DEFAULT_LOCAL_ENDPOINT) -> EnvironmentConfig:
    return EnvironmentConfig(
        name="local",
        primary_region=LOCAL_REGION,
        replica_region="us-west-2",
        bucket_prefix="spotrain-local",
        availability_zones=("us-east-1a", "us-east-1b"),
        monthly_budget_usd=100.0,
        alert_emails=("oncall@example.com",),
        tags={"team": "ml-platform"},
        state=StateBackend(bucket=LOCAL_STATE_BUCKET, region=LOCAL_REGION),
        local=LocalCloud(endpoint=endpoint),
    )


def dev() -> EnvironmentConfig:
    return EnvironmentConfig(
        name="dev",
        primary_region="us-east-1",
        replica_region="us-west-2",
        bucket_prefix="example-spotrain-dev",
        availability_zones=("us-east-1a", "us-east-1b", "us-east-1c"),
        monthly_budget_usd=2_000.0,
        alert_emails=("ml-platform-oncall@example.com",),
        tags={"team": "ml-platform"},
        state=StateBackend(bucket="example-spotrain-terraform-state", region="us-east-1"),
    )


def prod() -> EnvironmentConfig:
    return EnvironmentConfig(
        name="prod",
        primary_region="us-east-1",
        replica_region="us-west-2",
        bucket_prefix="example-spotrain-prod",
        availability_zones=("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"),
        monthly_budget_usd=50_000.0,
        alert_emails=("ml-platform-oncall@example.com", "finops@example.com"),
        tags={"team": "ml-platform"},
        state=StateBackend(bucket="example-spotrain-terraform-state", region="us-east-1"),
    )


def all_environments(*, local_endpoint: str = DEFAULT_LOCAL_ENDPOINT) -> list[EnvironmentConfig]:
    return [local(local_endpoint), dev(), prod()]
