"""Environment configuration: valid environments build; every bad value is reported with its
fix, all problems at once, before any synthesis."""

from __future__ import annotations

import dataclasses

import pytest

from spotrain.core.errors import ConfigError
from spotrain.stacks import environments
from spotrain.stacks.config import EnvironmentConfig, LocalCloud


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
        ({"alert_emails": ()}, "give at least one address"),
        ({"alert_emails": ("oncall-at-example.com",)}, "use name@example.com"),
        ({"name": "Dev"}, "not a valid environment name"),
        ({"bucket_prefix": "Bad_Prefix"}, "not a valid S3 name prefix"),
        ({"availability_zones": ()}, "name at least one zone"),
        ({"availability_zones": ("us-west-2a",)}, "is not a zone of primary_region"),
        ({"vpc_cidr": "10.0.0.0/24"}, "is not an IPv4 /16"),
        ({"vpc_cidr": "10.40.0.1/16"}, "host bits set"),
        ({"vpc_cidr": "ten-forty"}, "is not a network address"),
        ({"vpc_cidr": "8.8.0.0/16"}, "is not a private range"),
        ({"tags": {"aws:owner": "x"}}, "do not start with 'aws:'"),
        ({"log_retention_days": 0}, "CloudWatch Logs keeps logs for one of"),
        ({"log_retention_days": 10}, "CloudWatch Logs keeps logs for one of"),
        ({"monthly_budget_usd": float("inf")}, "monthly_budget_usd is inf: it must be a finite"),
        ({"monthly_budget_usd": "100"}, "monthly_budget_usd is '100': it must be a finite number"),
        ({"availability_zones": "us-east-1a"}, "it must be a list of strings"),
        ({"alert_emails": "a@example.com"}, "it must be a list of strings"),
        ({"tags": ["owner"]}, "it must be a mapping of strings to strings"),
        ({"availability_zones": ("us-east-1a", "us-east-1a")}, "list each zone once"),
        ({"state": None}, "give a StateBackend"),
        ({"local": LocalCloud(endpoint="https://10.0.0.5:4566")}, "not a loopback HTTPS URL"),
        ({"local": LocalCloud(endpoint="http://127.0.0.1:4566")}, "not a loopback HTTPS URL"),
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
            bucket_prefix="Bad_Prefix",
            alert_emails=("nobody",),
        )
    message = str(caught.value)
    # 4 named problems, plus the three zones that no longer belong to primary_region.
    assert "environment 'dev' has 7 problem(s)" in message
    for fragment in ("us-nowhere-1", "positive amount", "Bad_Prefix", "nobody"):
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
