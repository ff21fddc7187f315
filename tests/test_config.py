"""Environment configuration: valid environments build; every bad value is reported with its
fix, all problems at once, before any synthesis."""

from __future__ import annotations

import dataclasses

import pytest

from spotrain.core.deadline_policy import RunDeadline
from spotrain.core.errors import ConfigError
from spotrain.stacks import environments
from spotrain.stacks.config import EnvironmentConfig, LocalCloud, PlannedRun


def with_changes(**changes: object) -> EnvironmentConfig:
    return dataclasses.replace(environments.dev(), **changes)  # type: ignore[arg-type]


def problems_of(**changes: object) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        with_changes(**changes)
    return caught.value.problems


def test_shipped_environments_are_valid() -> None:
    names = [c.name for c in environments.all_environments()]
    assert names == ["local", "dev", "prod"]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"primary_region": "us-nowhere-1"}, "is not a known AWS region"),
        ({"replica_region": "mars-1"}, "is not a known AWS region"),
        ({"replica_region": "us-east-1"}, "choose a different replica_region"),
        ({"monthly_budget_usd": 0.0}, "set a positive amount"),
        ({"monthly_budget_usd": -5.0}, "set a positive amount"),
        ({"instance_types": ()}, "list at least two GPU instance types"),
        ({"instance_types": ("g5.xlarge",)}, "list at least two GPU instance types"),
        ({"instance_types": ("g5.xlarge", "g5xlarge")}, "write it as family.size"),
        ({"instance_types": ("g5.xlarge", "g5.xlarge")}, "list each type once"),
        ({"alert_emails": ()}, "give at least one address"),
        ({"alert_emails": ("oncall-at-example.com",)}, "use name@example.com"),
        ({"name": "Dev"}, "not a valid environment name"),
        ({"bucket_prefix": "Bad_Prefix"}, "not a valid S3 name prefix"),
        ({"run_name": "My Run"}, "run_name"),
        ({"availability_zones": ()}, "name at least one zone"),
        ({"availability_zones": ("us-west-2a",)}, "is not a zone of primary_region"),
        ({"on_demand_base_capacity": 0}, "keep at least 1"),
        ({"fleet_min_size": 3, "fleet_desired_size": 2}, "need 0 <= min <= desired <= max"),
        ({"fleet_min_size": 0, "on_demand_base_capacity": 1}, "raise fleet_min_size"),
        ({"vpc_cidr": "10.0.0.0/24"}, "is not an IPv4 /16"),
        ({"vpc_cidr": "10.40.0.1/16"}, "host bits set"),
        ({"vpc_cidr": "ten-forty"}, "is not a network address"),
        ({"vpc_cidr": "8.8.0.0/16"}, "is not a private range"),
        ({"tags": {"aws:owner": "x"}}, "do not start with 'aws:'"),
        ({"log_retention_days": 0}, "CloudWatch Logs keeps logs for one of"),
        ({"log_retention_days": 10}, "CloudWatch Logs keeps logs for one of"),
        ({"monthly_budget_usd": float("inf")}, "monthly_budget_usd is inf: it must be a finite"),
        ({"monthly_budget_usd": "100"}, "monthly_budget_usd is '100': it must be a finite number"),
        ({"instance_types": "g5.xlarge"}, "instance_types is 'g5.xlarge': it must be a list of"),
        ({"availability_zones": "us-east-1a"}, "it must be a list of strings"),
        ({"alert_emails": "a@example.com"}, "it must be a list of strings"),
        ({"fleet_max_size": 4.5}, "fleet_max_size is 4.5: it must be an integer"),
        ({"tags": ["owner"]}, "it must be a mapping of strings to strings"),
        ({"availability_zones": ("us-east-1a", "us-east-1a")}, "list each zone once"),
        ({"state": None}, "give a StateBackend"),
        ({"local": LocalCloud(endpoint="https://10.0.0.5:4566")}, "not a loopback HTTPS URL"),
        ({"local": LocalCloud(endpoint="http://127.0.0.1:4566")}, "not a loopback HTTPS URL"),
        ({"max_spend_usd": 0.0}, "max_spend_usd is 0.0: give the run's cap as a positive"),
        ({"max_spend_usd": -10}, "max_spend_usd is -10"),
        ({"max_spend_usd": "500"}, "max_spend_usd is '500'"),
        ({"planned_run": PlannedRun(machine_hours=0)}, "planned_run.machine_hours is 0: give a"),
        (
            {"planned_run": PlannedRun(machine_hours=9, checkpoint_seconds=-1)},
            "planned_run.checkpoint_seconds is -1",
        ),
        (
            {"planned_run": PlannedRun(machine_hours=9, interruptions_per_hour=-0.1)},
            "planned_run.interruptions_per_hour is -0.1: give 0 or more per instance",
        ),
        (
            {
                "run_deadline": RunDeadline(
                    started_at="2027-01-02T00:00:00Z",
                    finish_by="2027-01-01T00:00:00Z",
                    total_steps=5,
                )
            },
            "run_deadline.finish_by is not after started_at",
        ),
        (
            {
                "run_deadline": RunDeadline(
                    started_at="2027-01-02 09:00", finish_by="2027-02-01", total_steps=5
                )
            },
            "is not an ISO 8601 time with its zone",
        ),
    ],
)
def test_bad_value_is_reported_with_its_fix(changes: dict[str, object], expected: str) -> None:
    problems = problems_of(**changes)
    assert any(expected in p for p in problems), problems


def test_every_problem_is_listed_in_one_error() -> None:
    with pytest.raises(ConfigError) as caught:
        with_changes(
            primary_region="us-nowhere-1",
            monthly_budget_usd=0.0,
            instance_types=(),
            alert_emails=("nobody",),
        )
    message = str(caught.value)
    # 4 named problems, plus the three zones that no longer belong to primary_region.
    assert "environment 'dev' has 7 problem(s)" in message
    for fragment in ("us-nowhere-1", "positive amount", "at least two", "nobody"):
        assert fragment in message


def test_bad_configuration_stops_the_app_before_synthesis(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from spotrain import cli

    code = cli.main(["deploy", "staging", "--out", str(tmp_path / "out")])
    assert code == 2
    assert "choose one of local, dev, prod" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_tags_are_frozen_and_carry_the_cost_allocation_keys() -> None:
    config = environments.dev()
    with pytest.raises(TypeError):
        config.tags["team"] = "other"  # type: ignore[index]
    assert config.all_tags["spotrain:environment"] == "dev"
    assert config.all_tags["team"] == "ml-platform"
