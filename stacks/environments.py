"""The environments this blueprint deploys. Edit these objects to fit your organisation.

An environment is the shared ground its runs train on; the runs themselves are files,
`runs/<environment>/<run>.toml` (`spotrain.stacks.runs`). `local` points at the local cloud
(`spotrain local up`); `dev` and `prod` are real AWS accounts whose Terraform state lives in an
existing S3 bucket (see README: remote state).
"""

from __future__ import annotations

from spotrain.core.admission import Team
from spotrain.stacks.config import EnvironmentConfig, LocalCloud, RegionConfig, StateBackend

DEFAULT_LOCAL_ENDPOINT = "https://127.0.0.1:4566"
LOCAL_STATE_BUCKET = "spotrain-local-terraform-state"
LOCAL_REGION = "us-east-1"


def local(endpoint: str = DEFAULT_LOCAL_ENDPOINT) -> EnvironmentConfig:
    return EnvironmentConfig(
        name="local",
        regions=(
            # P machines (p4d, 96 vCPUs each) are held to two at once, so the queue shows
            # runs waiting; the runs here on G machines have no ceiling.
            RegionConfig(
                name=LOCAL_REGION,
                availability_zones=("us-east-1a", "us-east-1b"),
                vcpu_ceilings={"spot/P": 192},
            ),
            RegionConfig(
                name="us-west-2",
                availability_zones=("us-west-2a", "us-west-2b"),
                vpc_cidr="10.41.0.0/16",
            ),
        ),
        bucket_prefix="spotrain-local",
        monthly_budget_usd=100.0,
        alert_emails=("oncall@example.com",),
        tags={"team": "ml-platform"},
        # Every run names one of these. Speech's budget is one the local cloud's few
        # machine-seconds reach, so a team at its budget can be seen waiting.
        teams=(
            Team(name="platform", gpus=16),
            Team(name="research", gpus=16),
            Team(name="vision", gpus=16),
            Team(name="speech", gpus=16, monthly_budget_usd=0.02),
        ),
        state=StateBackend(bucket=LOCAL_STATE_BUCKET, region=LOCAL_REGION),
        local=LocalCloud(endpoint=endpoint),
    )


def dev() -> EnvironmentConfig:
    return EnvironmentConfig(
        name="dev",
        regions=(
            RegionConfig(
                name="us-east-1", availability_zones=("us-east-1a", "us-east-1b", "us-east-1c")
            ),
            RegionConfig(
                name="us-west-2",
                availability_zones=("us-west-2a", "us-west-2b", "us-west-2c"),
                vpc_cidr="10.41.0.0/16",
            ),
        ),
        bucket_prefix="example-spotrain-dev",
        monthly_budget_usd=2_000.0,
        alert_emails=("ml-platform-oncall@example.com",),
        tags={"team": "ml-platform"},
        state=StateBackend(bucket="example-spotrain-terraform-state", region="us-east-1"),
    )


def prod() -> EnvironmentConfig:
    return EnvironmentConfig(
        name="prod",
        regions=(
            RegionConfig(
                name="us-east-1",
                availability_zones=("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"),
            ),
            RegionConfig(
                name="us-west-2",
                availability_zones=("us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"),
                vpc_cidr="10.41.0.0/16",
            ),
        ),
        bucket_prefix="example-spotrain-prod",
        monthly_budget_usd=50_000.0,
        alert_emails=("ml-platform-oncall@example.com", "finops@example.com"),
        tags={"team": "ml-platform"},
        # Its runs wait rather than fail to launch past the account's GPU quotas.
        account_quotas=True,
        state=StateBackend(bucket="example-spotrain-terraform-state", region="us-east-1"),
    )


def all_environments(*, local_endpoint: str = DEFAULT_LOCAL_ENDPOINT) -> list[EnvironmentConfig]:
    return [local(local_endpoint), dev(), prod()]
