"""What every environment stack shares: providers, remote state, account identity, tags."""

from __future__ import annotations

from typing import Any

from spotrain.cdk import (
    Construct,
    S3Backend,
    TerraformDataSource,
    TerraformResource,
    TerraformStack,
    aws,
)
from spotrain.core import resource_names as names
from spotrain.stacks.config import EnvironmentConfig

# Attempts per call to the local cloud: enough to ride out a reply cut off on a machine short of
# CPU (one such failure twice in a row failed a whole apply), few enough that an API the
# emulator lacks fails in seconds rather than after the provider's minutes of backoff.
LOCAL_MAX_RETRIES = 5


def provider_settings(
    config: EnvironmentConfig, region: str, run_tags: dict[str, str] | None = None
) -> dict[str, Any]:
    """AwsProvider arguments for a region of this environment (a run's stack adds the run's
    tags: every resource of the run carries the run and its owner)."""
    settings: dict[str, Any] = {
        "region": region,
        "default_tags": [{"tags": {**config.all_tags, **(run_tags or {})}}],
    }
    if config.local is not None:
        # No `endpoints` block: the provider finds the local cloud by AWS_ENDPOINT_URL, which
        # `spotrain deploy` and `spotrain local env` set. The block costs every start of the
        # provider seconds of CPU validating its 300-odd services (the plugin framework's
        # provider configuration check, even for an empty block: 10 CPU-seconds for
        # `terraform validate` of one data source with it, 5 without), and a plan starts the
        # provider twice for each region. Without that environment the provider would reach
        # AWS itself: it refuses any account but the local cloud's.
        settings |= {
            "allowed_account_ids": [config.local.account],
            "s3_use_path_style": True,
            "skip_credentials_validation": True,
            "skip_metadata_api_check": "true",
            "skip_region_validation": True,
            "max_retries": LOCAL_MAX_RETRIES,
        }
    return settings


def state_backend_settings(config: EnvironmentConfig, stack_name: str) -> dict[str, Any]:
    """S3Backend arguments: one encrypted state object per stack."""
    assert config.state is not None
    settings: dict[str, Any] = {
        "bucket": config.state.bucket,
        "key": f"spotrain/{stack_name}.tfstate",
        "region": config.state.region,
        "encrypt": True,
    }
    if config.local is not None:
        settings |= {
            "endpoints": {"s3": config.local.endpoint, "sts": config.local.endpoint},
            "use_path_style": True,
            "skip_credentials_validation": True,
            "skip_metadata_api_check": True,
            "skip_region_validation": True,
            "skip_requesting_account_id": True,
        }
    return settings


def region_label(config: EnvironmentConfig, region: str) -> str:
    """The stem of a region's construct ids and provider alias: `Primary` for home and
    `Replica` for the second region (the ids environments had when they had two regions, so
    their state keeps its addresses), the region's name in capitals (`EuWest1`) for others."""
    index = config.region_names.index(region)
    if index < 2:
        return ("Primary", "Replica")[index]
    return "".join(part.capitalize() for part in region.split("-"))


def regional_part(config: EnvironmentConfig, part: str, region: str) -> str:
    """The stack part of `part` in `region`: the name alone at home (the name the stack had
    when environments had one region, so its state keeps its key), `<part>-<region>`
    elsewhere."""
    return part if region == config.primary_region else f"{part}-{region}"


def place_in(scope: Construct, provider: Any) -> None:
    """Every resource and data source under `scope` is created by `provider` (another
    region's): a construct built for a stack's default region, placed in another."""
    for node in scope.node.find_all():
        if isinstance(node, TerraformResource | TerraformDataSource):
            node.provider = provider


def resource_name(config: EnvironmentConfig, suffix: str) -> str:
    """Name for a regional resource of the environment, e.g. `spotrain-dev-events`."""
    return names.environment_resource(config.name, suffix)


class EnvironmentStack(TerraformStack):
    """A stack named `<environment>-<part>` whose default provider is `region`'s (home's
    unless given); `run_tags` tag every resource of a run's stack with the run."""

    def __init__(
        self,
        scope: Construct,
        part: str,
        *,
        config: EnvironmentConfig,
        run_tags: dict[str, str] | None = None,
        region: str | None = None,
    ) -> None:
        name = config.stack_name(part)
        super().__init__(scope, name)
        self.config = config
        self.run_tags = dict(run_tags or {})
        self.region = region or config.primary_region
        default_provider = aws.provider.AwsProvider(
            self,
            region_label(config, self.region),
            **provider_settings(config, self.region, self.run_tags),
        )
        if config.state is not None:
            S3Backend(self, **state_backend_settings(config, name))
            # S3-native locking (conditional writes); this cdktf release has no typed field.
            self.add_override("terraform.backend.s3.use_lockfile", True)
        self.account_id = str(
            aws.data_aws_caller_identity.DataAwsCallerIdentity(self, "Caller").account_id
        )
        self._providers: dict[str, Any] = {self.region: default_provider}

    def provider(self, region: str) -> Any:
        """The provider of one of the environment's regions (home's is the default one),
        created on first use."""
        if region not in self._providers:
            label = region_label(self.config, region)
            self._providers[region] = aws.provider.AwsProvider(
                self,
                label,
                alias=label.lower(),
                **provider_settings(self.config, region, self.run_tags),
            )
        return self._providers[region]

    def arn_in(self, region: str, service: str, resource: str) -> str:
        """The ARN of `resource` of `service` in `region` of this stack's account (a global
        table's copy there, a repository there)."""
        return f"arn:aws:{service}:{region}:{self.account_id}:{resource}"

    def resource_name(self, suffix: str) -> str:
        """Name for a regional resource of this environment, e.g. `spotrain-dev-events`."""
        return resource_name(self.config, suffix)
