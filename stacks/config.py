"""Per-environment configuration: one validated, frozen object per environment.

`EnvironmentConfig` is checked as a whole when it is built: every problem is collected and
raised once, as a `spotrain.core.errors.ConfigError` whose message lists each problem with its fix,
before any construct is created.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from spotrain.core.admission import QueuePolicy, Team
from spotrain.core.catalog_schema import ENVIRONMENT_TAG
from spotrain.core.errors import raise_if_problems
from spotrain.core.gpu_types import INSTANCE_QUOTAS
from spotrain.core.validation import field_values, instance_type_problems, mistyped_fields

# Commercial regions that offer GPU instances and the services the blueprint uses.
KNOWN_REGIONS = frozenset(
    {
        "us-east-1",
        "us-east-2",
        "us-west-1",
        "us-west-2",
        "ca-central-1",
        "sa-east-1",
        "eu-west-1",
        "eu-west-2",
        "eu-west-3",
        "eu-central-1",
        "eu-central-2",
        "eu-north-1",
        "eu-south-1",
        "eu-south-2",
        "ap-northeast-1",
        "ap-northeast-2",
        "ap-northeast-3",
        "ap-southeast-1",
        "ap-southeast-2",
        "ap-south-1",
        "me-central-1",
        "il-central-1",
    }
)

# The retention periods CloudWatch Logs accepts (PutRetentionPolicy).
LOG_RETENTION_DAYS = frozenset(
    {1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557,
     2922, 3288, 3653}
)  # fmt: skip

_ENV_NAME = re.compile(r"^[a-z][a-z0-9-]{1,14}$")
_BUCKET_PREFIX = re.compile(r"^[a-z0-9][a-z0-9-]{2,38}[a-z0-9]$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$")
_TAG_KEY = re.compile(r"^[\w.:/=+\-@ ]{1,128}$")
_LOOPBACK_ENDPOINT = re.compile(r"^https://(127\.\d+\.\d+\.\d+|localhost):\d{1,5}$")


@dataclass(frozen=True, kw_only=True)
class LocalCloud:
    """Marks an environment as the local cloud: every AWS client points at `endpoint`."""

    endpoint: str
    """Loopback HTTPS URL of the local AWS emulator, e.g. https://127.0.0.1:4566."""
    account: str = "123456789012"
    """The account the local cloud serves (moto's): the only one the local stacks' provider
    accepts, so a local stack run without the local cloud's environment stops before it
    changes a real account."""


@dataclass(frozen=True, kw_only=True)
class StateBackend:
    """Where Terraform keeps state: an S3 bucket with native S3 locking (use_lockfile)."""

    bucket: str
    """Existing, versioned, encrypted bucket that holds every stack's state."""
    region: str
    """Region of the state bucket."""


@dataclass(frozen=True, kw_only=True)
class RegionConfig:
    """One region of an environment: where its network, bucket, key and a fleet of each run
    live. Judged with the environment (`EnvironmentConfig` lists its problems with the rest)."""

    name: str
    """AWS region, e.g. `us-east-1`."""
    availability_zones: tuple[str, ...]
    """Zones of this region for the fleets' private subnets (one /20 each)."""
    vpc_cidr: str = "10.40.0.0/16"
    """Address range of this region's VPC. Give each region its own /16 so the networks can
    be peered later; the runs need no peering (they meet through S3 and DynamoDB)."""
    vcpu_ceilings: Mapping[str, int] = field(default_factory=dict)
    """The most vCPUs the environment's runs may hold here at once, per AWS quota (a key of
    `gpu_types.INSTANCE_QUOTAS`: "spot/P5", "on-demand/P", ...): at or under the account's
    quota, less what else the account runs. A run that would go over waits in the queue
    (`core.admission`). A quota not named has no ceiling."""

    def __post_init__(self) -> None:
        if isinstance(self.availability_zones, list):
            object.__setattr__(self, "availability_zones", tuple(self.availability_zones))
        if isinstance(self.vcpu_ceilings, Mapping):  # else its type is the problem said
            object.__setattr__(self, "vcpu_ceilings", MappingProxyType(dict(self.vcpu_ceilings)))

    def problems(self) -> list[str]:
        where = f"region {self.name!r}"
        problems = instance_type_problems(self, prefix=f"{where}: ")
        mistyped = mistyped_fields(type(self), field_values(self))
        if mistyped & {"name", "availability_zones"}:  # the checks below read both
            return problems
        if self.name not in KNOWN_REGIONS:
            return [
                f"{where} is not a known AWS region: use one of {', '.join(sorted(KNOWN_REGIONS))}"
            ]
        if not self.availability_zones:
            problems.append(
                f"{where}: availability_zones is empty: name at least one zone of it "
                f"(e.g. '{self.name}a')"
            )
        if len(set(self.availability_zones)) != len(self.availability_zones):
            problems.append(f"{where}: availability_zones lists a zone twice: list each zone once")
        for zone in self.availability_zones:
            if not (zone.startswith(self.name) and len(zone) == len(self.name) + 1):
                problems.append(
                    f"{where}: availability zone {zone!r} is not a zone of {self.name}: use "
                    f"e.g. '{self.name}a'"
                )
        if len(self.availability_zones) > 16:
            problems.append(
                f"{where}: availability_zones names more than 16 zones: the VPC has 16 /20 slices"
            )
        for quota, ceiling in () if "vcpu_ceilings" in mistyped else self.vcpu_ceilings.items():
            if quota not in INSTANCE_QUOTAS:
                known = ", ".join(INSTANCE_QUOTAS)
                problems.append(f"{where}: vcpu_ceilings names {quota!r}, not an AWS quota "
                                f"spotrain counts: use one of {known}")  # fmt: skip
            if isinstance(ceiling, int) and ceiling < 0:  # its type is judged with the others
                problems.append(f"{where}: vcpu_ceilings gives {quota!r} {ceiling}: give 0 "
                                "or more vCPUs")  # fmt: skip
        if "vpc_cidr" not in mistyped:
            problems += [f"{where}: {p}" for p in _vpc_cidr_problems(self.vpc_cidr)]
        return problems


@dataclass(frozen=True, kw_only=True)
class EnvironmentConfig:
    """Everything that differs between environments (local, dev, prod, ...)."""

    name: str
    """Environment name; stacks are named `<name>-<part>` (its runs' `<name>-run-<run>`) so
    `cdktf deploy '<name>-*'` deploys it whole."""
    regions: tuple[RegionConfig, ...]
    """The regions a run of this environment may train in, two or more; the first is home
    (the budget, the image registry, the handler that watches the catalog). Every region holds
    a checkpoint bucket (each replicating to every other), a replica of the catalog and events
    tables, its network and endpoints, and a fleet of each run (at 0 where it does not train)."""
    bucket_prefix: str
    """Globally unique prefix for bucket names, e.g. `acme-spotrain-dev`."""
    monthly_budget_usd: float
    """Monthly cost budget; alerts fire at 50/80/100% actual and 100% forecast."""
    alert_emails: tuple[str, ...]
    """Addresses that receive budget alerts (at least one)."""
    tags: Mapping[str, str] = field(default_factory=dict)
    """Cost allocation tags added to every resource (environment and project are added)."""
    log_retention_days: int = 365
    """Retention of the Lambda, VPC flow and other log groups."""
    noncurrent_version_expiration_days: int = 30
    """Days a superseded object version is kept before it expires."""
    teams: tuple[Team, ...] = ()
    """The teams whose runs share the environment's GPUs, each with its share of GPUs and a
    monthly budget in dollars (`core.admission.Team`): a run names its team, and waits in the
    queue when it would take its team over either. Empty: runs are not grouped in teams."""
    account_quotas: bool = False
    """The queue also holds runs under what each region's AWS quotas leave free (the handler
    reads Service Quotas and their usage in CloudWatch's AWS/Usage at every check; its role
    may read the five GPU quotas only). Off: only `vcpu_ceilings` (and teams) limit runs."""
    state: StateBackend | None = None
    """Remote state; None keeps state beside the synthesized stack (tests only)."""
    local: LocalCloud | None = None
    """Set for the local cloud; None for real AWS environments."""

    def __post_init__(self) -> None:
        # Every problem at once: each field's type, and the values of the fields whose type is
        # right (a budget given as a string, or regions given as one string, would be misread
        # by the value checks: theirs wait until the type is fixed).
        mistyped = mistyped_fields(type(self), field_values(self))
        for name in ("regions", "alert_emails", "teams"):
            if name not in mistyped:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if "tags" not in mistyped:
            object.__setattr__(self, "tags", MappingProxyType(dict(self.tags)))
        raise_if_problems(f"environment {self.name!r}",
                          instance_type_problems(self) + self._problems(mistyped))  # fmt: skip

    @property
    def is_local(self) -> bool:
        return self.local is not None

    @property
    def all_tags(self) -> dict[str, str]:
        """Tags on every resource; the two spotrain tags are the cost allocation keys."""
        return {**self.tags, ENVIRONMENT_TAG: self.name, "spotrain:project": "spotrain"}

    @property
    def primary_region(self) -> str:
        """The home region: the first of `regions`."""
        return self.regions[0].name

    @property
    def replica_regions(self) -> tuple[str, ...]:
        """Every region but home: each holds replicas of the catalog and the checkpoints, and
        is where a run moves when home cannot hold it."""
        return tuple(region.name for region in self.regions[1:])

    @property
    def region_names(self) -> tuple[str, ...]:
        return tuple(region.name for region in self.regions)

    @property
    def queue_policy(self) -> QueuePolicy:
        """What the queue judges the environment's runs by: its teams and every region's vCPU
        ceilings (handed to each region's handler)."""
        ceilings = {r.name: r.vcpu_ceilings for r in self.regions if r.vcpu_ceilings}
        return QueuePolicy(teams=self.teams, ceilings=ceilings,
                           account_quotas=self.account_quotas)  # fmt: skip

    def region(self, name: str) -> RegionConfig:
        """The region called `name` (one of `region_names`)."""
        return next(region for region in self.regions if region.name == name)

    def stack_name(self, part: str) -> str:
        return f"{self.name}-{part}"

    def _problems(self, mistyped: frozenset[str] = frozenset()) -> list[str]:
        """The values' problems, those of the `mistyped` fields left out."""
        problems: list[str] = []
        if "name" not in mistyped and not _ENV_NAME.match(self.name):
            problems.append(
                f"name {self.name!r} is not a valid environment name: use 2-15 lowercase "
                "letters, digits or '-', starting with a letter (e.g. 'dev')"
            )
        if "regions" not in mistyped:
            problems += self._region_problems()
        if "teams" not in mistyped:
            team_names = [team.name for team in self.teams]
            for name in sorted({n for n in team_names if team_names.count(n) > 1}):
                problems.append(f"teams lists {name!r} twice: name each team once")
            for team in self.teams:
                problems += team.problems()
        if "bucket_prefix" not in mistyped and not _BUCKET_PREFIX.match(self.bucket_prefix):
            problems.append(
                f"bucket_prefix {self.bucket_prefix!r} is not a valid S3 name prefix: use 4-40 "
                "lowercase letters, digits or '-', starting and ending with a letter or digit"
            )
        if "monthly_budget_usd" not in mistyped and not self.monthly_budget_usd > 0:
            problems.append(
                f"monthly_budget_usd is {self.monthly_budget_usd}: set a positive amount in USD"
            )
        if "alert_emails" not in mistyped:
            if not self.alert_emails:
                problems.append(
                    "alert_emails is empty: give at least one address for budget alerts"
                )
            for email in self.alert_emails:
                if not _EMAIL.match(email):
                    problems.append(f"alert e-mail {email!r} is malformed: use name@example.com")
        for key, value in () if "tags" in mistyped else self.tags.items():
            if not _TAG_KEY.match(key) or key.lower().startswith("aws:"):
                problems.append(
                    f"tag key {key!r} is not allowed: use 1-128 letters, digits, spaces or "
                    "_.:/=+-@ and do not start with 'aws:'"
                )
            if len(value) > 256:
                problems.append(f"tag {key!r} has a value over 256 characters: shorten it")
        if "log_retention_days" not in mistyped and (
            self.log_retention_days not in LOG_RETENTION_DAYS
        ):
            problems.append(
                f"log_retention_days is {self.log_retention_days}: CloudWatch Logs keeps logs for "
                f"one of {', '.join(map(str, sorted(LOG_RETENTION_DAYS)))} days; pick one"
            )
        expiration = self.noncurrent_version_expiration_days
        if "noncurrent_version_expiration_days" not in mistyped and expiration < 1:
            problems.append(f"noncurrent_version_expiration_days is {expiration}: use 1 or more")
        if (
            "local" not in mistyped
            and self.local is not None
            and not _LOOPBACK_ENDPOINT.match(self.local.endpoint)
        ):
            problems.append(
                f"local endpoint {self.local.endpoint!r} is not a loopback HTTPS URL: use "
                "https://127.0.0.1:<port> (the address `spotrain local up` prints)"
            )
        if self.local is None and self.state is None:
            problems.append(
                "state is not set for a real environment: give a StateBackend(bucket=..., "
                "region=...) so state is shared and locked"
            )
        return problems

    def _region_problems(self) -> list[str]:
        problems = []
        names = [region.name for region in self.regions]
        if len(names) < 2:
            problems.append(
                f"regions names {len(names)} region(s): name two or more (the first is home) so "
                "checkpoints and runs survive the loss of a region, e.g. us-east-1 and us-west-2"
            )
        for name in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"regions lists {name!r} twice: list each region once")
        for region in self.regions:
            problems += region.problems()
        return problems


def _vpc_cidr_problems(cidr: str) -> list[str]:
    example = "use a private /16 such as '10.40.0.0/16'"
    try:
        network = ipaddress.ip_network(cidr, strict=True)
    except ValueError as error:
        return [f"vpc_cidr {cidr!r} is not a network address ({error}): {example}"]
    if network.version != 4 or network.prefixlen != 16:
        return [f"vpc_cidr {cidr!r} is not an IPv4 /16: {example}"]
    if not network.is_private:
        return [f"vpc_cidr {cidr!r} is not a private range: {example}"]
    return []
