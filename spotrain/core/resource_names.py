"""The names of an environment's and a run's AWS resources, in one place: the stacks create
them by these names and every command finds them by the same, without CDK for Terraform, so an
install without the infrastructure extra watches and steers runs."""

from __future__ import annotations


def environment_resource(environment: str, suffix: str) -> str:
    """A regional resource of the environment, e.g. `spotrain-dev-events`."""
    return f"spotrain-{environment}-{suffix}"


def checkpoint_bucket(bucket_prefix: str, region: str) -> str:
    """The environment's checkpoint bucket in `region` (its runs' prefixes, its datasets)."""
    return f"{bucket_prefix}-checkpoints-{region}"


def data_key_alias(environment: str, region: str) -> str:
    """The alias (without `alias/`) of the environment's data key in `region`."""
    return environment_resource(environment, f"data-{region}")


BUDGET_SUFFIX = "budget"


def monthly_budget(name: str) -> str:
    """The AWS budget that budget alerts named `name` create."""
    return f"{name}-monthly"


def environment_budget(environment: str) -> str:
    """The environment's monthly budget (`spotrain budget NAME`, the runbooks' BUDGET)."""
    return monthly_budget(environment_resource(environment, BUDGET_SUFFIX))


def interruption_handler(environment: str) -> str:
    """The environment's interruption handler (its Lambda function, its rules' prefix)."""
    return environment_resource(environment, "interruption-handler")


def image_parameter(environment: str) -> str:
    """The SSM parameter the image build writes the image id to."""
    return f"/spotrain/{environment}/image-id"


def fleet_name_prefix(environment: str) -> str:
    """What every fleet of the environment is named with: the handler may scale, and the
    shared endpoints serve, only what is named so."""
    return environment_resource(environment, "")


def fleet_group(environment: str, run: str, region: str | None = None) -> str:
    """The run's spot group (and fleet, role, launch template) name: in its home region
    (`region` None), and in each other region of its environment (the region's name added:
    roles are global)."""
    home = f"{fleet_name_prefix(environment)}{run}-fleet"
    return home if region is None else f"{home}-{region}"


def on_demand_group(fleet_name: str) -> str:
    """The run's on-demand group (its warm coordinator, its fallback) beside its spot group."""
    return f"{fleet_name}-on-demand"


def machine_log_group(fleet_name: str) -> str:
    """Where the fleet's machines send their boot and training output (one stream each)."""
    return f"/spotrain/{fleet_name}/machines"


def run_stack_part(run: str) -> str:
    """The part of `<env>-run-<run>`: one stack per run."""
    return f"run-{run}"


METRIC_NAMESPACE = "spotrain"
"""CloudWatch namespace of the runs' spend, which the handler publishes (its role may publish
to no other)."""
