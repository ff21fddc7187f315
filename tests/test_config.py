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


def with_home(**changes: object) -> dict[str, object]:
    """The dev environment's regions with its home region changed."""
    home, *others = environments.dev().regions
    return {"regions": (dataclasses.replace(home, **changes), *others)}  # type: ignore[arg-type]


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
        (with_home(name="us-nowhere-1"), "is not a known AWS region"),
        ({"regions": environments.dev().regions[:1]}, "name two or more"),
        ({"regions": environments.dev().regions * 2}, "lists 'us-east-1' twice"),
        ({"regions": ("us-east-1", "us-west-2")}, "it must be a list of RegionConfigs"),
        ({"monthly_budget_usd": 0.0}, "set a positive amount"),
        ({"monthly_budget_usd": -5.0}, "set a positive amount"),
        ({"alert_emails": ()}, "give at least one address"),
        ({"alert_emails": ("oncall-at-example.com",)}, "use name@example.com"),
        ({"name": "Dev"}, "not a valid environment name"),
        ({"bucket_prefix": "Bad_Prefix"}, "not a valid S3 name prefix"),
        (with_home(availability_zones=()), "name at least one zone"),
        (with_home(availability_zones=("us-west-2a",)), "'us-west-2a' is not a zone of us-east-1"),
        (with_home(vpc_cidr="10.0.0.0/24"), "is not an IPv4 /16"),
        (with_home(vpc_cidr="10.40.0.1/16"), "host bits set"),
        (with_home(vpc_cidr="ten-forty"), "is not a network address"),
        (with_home(vpc_cidr="8.8.0.0/16"), "is not a private range"),
        ({"tags": {"aws:owner": "x"}}, "do not start with 'aws:'"),
        ({"log_retention_days": 0}, "CloudWatch Logs keeps logs for one of"),
        ({"log_retention_days": 10}, "CloudWatch Logs keeps logs for one of"),
        ({"monthly_budget_usd": float("inf")}, "monthly_budget_usd is inf: it must be a finite"),
        ({"monthly_budget_usd": "100"}, "monthly_budget_usd is '100': it must be a finite number"),
        (with_home(availability_zones="us-east-1a"), "availability_zones is 'us-east-1a': it must"),
        ({"alert_emails": "a@example.com"}, "it must be a list of strings"),
        ({"tags": ["owner"]}, "it must be a mapping of strings to strings"),
        (with_home(availability_zones=("us-east-1a", "us-east-1a")), "list each zone once"),
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
            **with_home(name="us-nowhere-1"),
            monthly_budget_usd=0.0,
            bucket_prefix="Bad_Prefix",
            alert_emails=("nobody",),
        )
    message = str(caught.value)
    # 4 named problems (a region unknown, its zones are not judged).
    assert "environment 'dev' has 4 problem(s)" in message
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


def test_teams_and_ceilings_are_judged_with_the_rest_and_reach_the_handler_as_one_policy() -> None:
    from spotrain.core.admission import QueuePolicy, Team

    with pytest.raises(ConfigError) as caught:
        with_changes(**with_home(vcpu_ceilings={"spot/X": 96, "spot/P5": -1}),
                     teams=(Team(name="vision", gpus=-8), Team(name="vision", gpus=8,
                                                              monthly_budget_usd=0.0)))  # fmt: skip
    message = str(caught.value)
    assert "has 5 problem(s)" in message
    for fragment in ("vcpu_ceilings names 'spot/X', not an AWS quota spotrain counts: use one "
                     "of spot/G and VT, spot/P, spot/P5", "vcpu_ceilings gives 'spot/P5' -1",
                     "teams lists 'vision' twice", "team 'vision' has gpus = -8",
                     "monthly_budget_usd = 0.0: give a positive amount"):  # fmt: skip
        assert fragment in message
    # Without teams or ceilings the queue limits nothing (the handler is given no policy).
    assert environments.dev().queue_policy.limits_nothing
    vision = Team(name="vision", gpus=16, monthly_budget_usd=5000.0)
    shared = with_changes(**with_home(vcpu_ceilings={"spot/P5": 384}), teams=(vision,))
    policy = shared.queue_policy
    assert QueuePolicy.from_json(policy.to_json()) == policy and not policy.limits_nothing
    assert policy.ceilings == {"us-east-1": {"spot/P5": 384}}


def test_mistyped_fields_and_wrong_values_are_listed_together() -> None:
    """A field of the wrong type is said once; every well-typed field's value is still judged:
    one round of fixes, not two."""
    problems = problems_of(
        monthly_budget_usd="100",
        alert_emails="oncall@example.com",
        bucket_prefix="Bad_Prefix",
        log_retention_days=10,
        **with_home(vpc_cidr=42, availability_zones=("us-west-2a",)),
    )
    for fragment in (
        "monthly_budget_usd is '100': it must be",
        "alert_emails is 'oncall@example.com': it must be",
        "region 'us-east-1': vpc_cidr is 42: it must be",
        "'Bad_Prefix' is not a valid S3 name prefix",
        "log_retention_days is 10",
        "'us-west-2a' is not a zone of us-east-1",
    ):
        assert sum(fragment in p for p in problems) == 1, (fragment, problems)
    assert len(problems) == 6, problems
