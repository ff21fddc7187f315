"""The environments this blueprint deploys. Edit these objects to fit your organisation.

`local` points at the local cloud (`spotrain local up`); `dev` and `prod` are real AWS
accounts whose Terraform state lives in an existing S3 bucket (see README: remote state).
"""

from __future__ import annotations

from spotrain.core.deadline_policy import RunDeadline
from spotrain.stacks.config import EnvironmentConfig, LocalCloud, PlannedRun, StateBackend

DEFAULT_LOCAL_ENDPOINT = "https://127.0.0.1:4566"
LOCAL_STATE_BUCKET = "spotrain-local-terraform-state"
LOCAL_REGION = "us-east-1"

GPU_INSTANCE_TYPES = ("g5.xlarge", "g6.xlarge", "g5.2xlarge", "g6.2xlarge")


def local(endpoint: str = DEFAULT_LOCAL_ENDPOINT) -> EnvironmentConfig:
    return EnvironmentConfig(
        name="local",
        primary_region=LOCAL_REGION,
        replica_region="us-west-2",
        bucket_prefix="spotrain-local",
        run_name="demo",
        instance_types=GPU_INSTANCE_TYPES,
        availability_zones=("us-east-1a", "us-east-1b"),
        fleet_min_size=1,
        fleet_desired_size=2,
        fleet_max_size=4,
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
        run_name="gpt-small",
        instance_types=GPU_INSTANCE_TYPES,
        availability_zones=("us-east-1a", "us-east-1b", "us-east-1c"),
        fleet_min_size=1,
        fleet_desired_size=2,
        fleet_max_size=8,
        monthly_budget_usd=2_000.0,
        alert_emails=("ml-platform-oncall@example.com",),
        max_spend_usd=1_500.0,  # the run's own cap, checked every 5 minutes
        # Priced in every pull request's plan comment; the rate is an assumption until the run
        # has its own history (`spotrain cost plan --events-table`).
        planned_run=PlannedRun(
            machine_hours=96, checkpoint_seconds=30, interruptions_per_hour=0.02
        ),
        tags={"team": "ml-platform", "cost-center": "research"},
        state=StateBackend(bucket="example-spotrain-terraform-state", region="us-east-1"),
    )


def prod() -> EnvironmentConfig:
    return EnvironmentConfig(
        name="prod",
        primary_region="us-east-1",
        replica_region="us-west-2",
        bucket_prefix="example-spotrain-prod",
        run_name="gpt-large",
        instance_types=("p4d.24xlarge", "p5.48xlarge", "g6e.48xlarge"),
        availability_zones=("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"),
        fleet_min_size=1,
        fleet_desired_size=4,
        fleet_max_size=16,
        monthly_budget_usd=50_000.0,
        alert_emails=("ml-platform-oncall@example.com", "finops@example.com"),
        # The run must be done by a date: spot or on-demand by its progress (Uniform Progress).
        run_deadline=RunDeadline(
            started_at="2027-01-04T09:00:00Z",
            finish_by="2027-01-25T09:00:00Z",
            total_steps=250_000,
            changeover_minutes=20,
        ),
        planned_run=PlannedRun(
            machine_hours=1_400, checkpoint_seconds=90, interruptions_per_hour=0.01
        ),
        tags={"team": "ml-platform", "cost-center": "production-training"},
        state=StateBackend(bucket="example-spotrain-terraform-state", region="us-east-1"),
    )


def all_environments(*, local_endpoint: str = DEFAULT_LOCAL_ENDPOINT) -> list[EnvironmentConfig]:
    return [local(local_endpoint), dev(), prod()]
