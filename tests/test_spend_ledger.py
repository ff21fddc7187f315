"""A run's spend ledger: machine time counted once at its pool's price, whatever order and
however often the checks come; and the handler's check keeps it on the local cloud."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from helpers import launch_template

from spotrain import cli
from spotrain.core import spend_ledger
from spotrain.core.spend_ledger import ON_DEMAND, SPOT, Ledger, Machine

T0 = 1_800_000_000.0


class FixedPrices:
    """g5.xlarge: $4/h on-demand, spot $1.20/h (us-east-1a); nothing for p5.48xlarge."""

    def on_demand(self, instance_type: str, region: str) -> float | None:
        return 4.0 if instance_type == "g5.xlarge" else None

    def spot(self, instance_type: str, zone: str, start: float, end: float) -> float | None:
        return 1.2 if instance_type == "g5.xlarge" else None


def machine(name: str, market: str, launched: float, ended: float | None = None,
            instance_type: str = "g5.xlarge") -> Machine:  # fmt: skip
    return Machine(name, instance_type, "us-east-1a", market, T0 + launched,
                   None if ended is None else T0 + ended)  # fmt: skip


def test_machine_time_is_counted_once_whatever_order_the_checks_come_in() -> None:
    # The coordinator (on-demand) from 0; a spot machine from 600 s, reclaimed at 1500 s; its
    # replacement from 1800 s. Checks at 300 s, 900 s, 900 s again, 600 s (late), 2100 s.
    coordinator = machine("i-coordinator", ON_DEMAND, 0)
    reclaimed = machine("i-reclaimed", SPOT, 600, ended=1500)
    replacement = machine("i-replacement", SPOT, 1800)
    seen_at = {
        300: [coordinator],
        900: [coordinator, machine("i-reclaimed", SPOT, 600)],
        600: [coordinator, machine("i-reclaimed", SPOT, 600)],
        2100: [coordinator, reclaimed, replacement],
    }
    ledger = Ledger()
    for at in (300, 900, 900, 600, 2100):
        ledger = spend_ledger.accrue(ledger, seen_at[at], FixedPrices(), T0 + at)
    # By hand: 2100 s on-demand at $4/h, 900 + 300 s of spot at $1.20/h.
    assert ledger.as_of == T0 + 2100
    assert ledger.spend_usd == pytest.approx(2100 * 4 / 3600 + 1200 * 1.2 / 3600)
    assert ledger.on_demand_usd == pytest.approx(3300 * 4 / 3600)
    assert ledger.per_pool["g5.xlarge#us-east-1a#spot"]["seconds"] == pytest.approx(1200)
    assert ledger.per_pool["g5.xlarge#us-east-1a#on-demand"]["seconds"] == pytest.approx(2100)


def test_time_of_a_pool_without_a_price_is_kept_apart() -> None:
    ledger = spend_ledger.accrue(
        Ledger(), [machine("i-big", SPOT, 0, instance_type="p5.48xlarge")], FixedPrices(), T0 + 60
    )
    assert (ledger.spend_usd, ledger.unpriced_seconds) == (0.0, 60.0)


def test_spot_prices_are_weighted_by_the_time_each_held() -> None:
    # $1 from before the window, $3 from 1/4 of the way in, $2 from 3/4 of the way in.
    history = [(T0 - 500, 1.0), (T0 + 100, 3.0), (T0 + 300, 2.0), (T0 + 900, 9.0)]
    assert spend_ledger.mean_price(history, T0, T0 + 400) == pytest.approx(
        (100 * 1 + 200 * 3 + 100 * 2) / 400
    )


def test_spot_history_is_asked_once_per_pool_per_check_however_many_machines() -> None:
    asked: list[dict[str, Any]] = []

    class Ec2:
        def describe_spot_price_history(self, **request: Any) -> dict[str, Any]:
            asked.append(request)
            at = datetime.fromtimestamp(T0 - 60, UTC)
            return {"SpotPriceHistory": [{"Timestamp": at, "SpotPrice": "1.5"}]}

    prices = spend_ledger.AwsPrices(lambda region: Ec2(), pricing=None, since=T0, now=T0 + 300)
    for begin in (T0, T0 + 100, T0 + 200):
        assert prices.spot("g5.xlarge", "us-east-1a", begin, T0 + 300) == 1.5
    assert len(asked) == 1 and asked[0]["StartTime"] == datetime.fromtimestamp(T0, UTC)


def test_machines_are_read_from_describe_instances_with_their_end() -> None:
    launched = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)
    reservations = [{"Instances": [
        {"InstanceId": "i-1", "InstanceType": "g5.xlarge", "InstanceLifecycle": "spot",
         "Placement": {"AvailabilityZone": "us-east-1b"}, "LaunchTime": launched,
         "State": {"Name": "terminated"},
         "StateTransitionReason": "Service initiated (2027-01-15 09:30:00 GMT)"},
        {"InstanceId": "i-2", "InstanceType": "g5.xlarge", "LaunchTime": launched,
         "Placement": {"AvailabilityZone": "us-east-1b"}, "State": {"Name": "running"}},
    ]}]  # fmt: skip
    spot, on_demand = spend_ledger.machines(reservations, now=T0)
    assert (spot.market, spot.region, spot.pool) == (SPOT, "us-east-1", "g5.xlarge#us-east-1b#spot")
    assert spot.ended_at - spot.launched_at == 5400
    assert (on_demand.market, on_demand.ended_at) == (ON_DEMAND, None)


def test_a_region_that_does_not_answer_is_counted_from_where_it_fell_behind() -> None:
    # A machine in each region from 0. us-west-2 does not answer the checks at 600 s and
    # 1200 s; at 1800 s it does: its machine is counted from 0, once, and nothing twice.
    east = machine("i-east", SPOT, 0)
    west = Machine("i-west", "g5.xlarge", "us-west-2a", ON_DEMAND, T0, None)
    ledger = Ledger(as_of=T0)
    ledger = spend_ledger.accrue(ledger, [east], FixedPrices(), T0 + 600, silent=["us-west-2"])
    assert ledger.behind == {"us-west-2": T0} and ledger.as_of == T0 + 600
    ledger = spend_ledger.accrue(ledger, [east], FixedPrices(), T0 + 1200, silent=["us-west-2"])
    assert ledger.behind == {"us-west-2": T0}  # still from where it fell behind
    ledger = spend_ledger.accrue(ledger, [east, west], FixedPrices(), T0 + 1800)
    assert ledger.behind == {}
    assert ledger.per_pool["g5.xlarge#us-west-2a#on-demand"]["seconds"] == pytest.approx(1800)
    assert ledger.per_pool["g5.xlarge#us-east-1a#spot"]["seconds"] == pytest.approx(1800)
    assert ledger.spend_usd == pytest.approx(1800 * (4 + 1.2) / 3600)


def test_the_count_goes_on_with_the_regions_that_answer_and_keeps_the_rest_behind(
    dynamo: Any,
) -> None:
    from botocore.exceptions import ClientError, EndpointConnectionError

    table = boto3.resource("dynamodb").Table("catalog")
    down = {"us-west-2": True}
    refused: set[str] = set()

    class Ec2:
        def __init__(self, region: str) -> None:
            self.region = region

        def get_paginator(self, _: str) -> Any:
            if down.get(self.region):
                raise EndpointConnectionError(endpoint_url=f"https://ec2.{self.region}")
            if self.region in refused:
                raise ClientError({"Error": {"Code": "UnauthorizedOperation"},
                                   "ResponseMetadata": {"HTTPStatusCode": 403}},
                                  "DescribeInstances")  # fmt: skip
            zone = f"{self.region}a"
            reservation = {"Instances": [{
                "InstanceId": f"i-{self.region}", "InstanceType": "g5.xlarge",
                "Placement": {"AvailabilityZone": zone}, "LaunchTime": T0,
                "State": {"Name": "running"},
            }]}  # fmt: skip
            return type(
                "Pages", (), {"paginate": lambda _, **__: [{"Reservations": [reservation]}]}
            )()

    def count(at: float) -> spend_ledger.Counted:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(spend_ledger, "AwsPrices", lambda *_, **__: FixedPrices())
            return spend_ledger.count(
                table,
                "demo",
                regions=["us-east-1", "us-west-2"],
                ec2_for=Ec2,
                pricing=None,
                now=at,
                retention_days=1,
            )

    first = count(T0 + 600)
    assert first.written and first.ledger.behind == {"us-west-2": 0.0}  # never counted yet
    assert spend_ledger.read(table, "demo").behind == {"us-west-2": 0.0}
    down["us-west-2"] = False
    second = count(T0 + 1200)
    assert second.written and second.ledger.behind == {}
    pools = second.ledger.per_pool
    assert pools["g5.xlarge#us-west-2a#on-demand"]["seconds"] == pytest.approx(1200)
    assert pools["g5.xlarge#us-east-1a#on-demand"]["seconds"] == pytest.approx(1200)
    # A region that answers no (a permission) is no outage: the count fails, and says why.
    refused.add("us-west-2")
    with pytest.raises(ClientError, match="UnauthorizedOperation"):
        count(T0 + 1800)


def test_a_check_that_lost_the_race_writes_nothing(dynamo: Any) -> None:
    table = boto3.resource("dynamodb").Table("catalog")
    first = spend_ledger.accrue(Ledger(), [machine("i-1", SPOT, 0)], FixedPrices(), T0 + 60)
    assert spend_ledger.write(table, "demo", first, Ledger()) is True
    again = spend_ledger.accrue(Ledger(), [machine("i-1", SPOT, 0)], FixedPrices(), T0 + 90)
    assert spend_ledger.write(table, "demo", again, Ledger()) is False  # read before the first
    later = spend_ledger.accrue(first, [machine("i-1", SPOT, 0)], FixedPrices(), T0 + 120)
    assert spend_ledger.write(table, "demo", later, first) is True
    stored = spend_ledger.read(table, "demo")
    assert stored.as_of == later.as_of
    assert stored.spend_usd == pytest.approx(later.spend_usd, abs=1e-6)
    assert stored.per_pool.keys() == later.per_pool.keys()


def test_a_runs_spend_this_month_is_its_ledger_less_the_last_point_before_the_month(
    dynamo: Any,
) -> None:
    """What a team's budget counts (the queue): each run's spend since the calendar month
    (UTC) began, from the spend points its checks left."""
    table = boto3.resource("dynamodb").Table("catalog")
    october_end = datetime(2026, 10, 31, 23, 55, tzinfo=UTC).timestamp()
    november = datetime(2026, 11, 1, 0, 5, tzinfo=UTC).timestamp()
    mid_november = datetime(2026, 11, 15, tzinfo=UTC).timestamp()
    for at, spent in ((october_end - 3600, 40.0), (october_end, 50.0), (november, 55.0)):
        spend_ledger.record_point(table, "demo", Ledger(as_of=at, spend_usd=spent), 90)
    now = Ledger(as_of=mid_november, spend_usd=80.0)
    assert spend_ledger.month_to_date(table, "demo", mid_november, now) == pytest.approx(30.0)
    # In the month it started: all of it; a ledger read when not given.
    assert spend_ledger.month_to_date(table, "new", mid_november, now) == pytest.approx(80.0)
    assert spend_ledger.month_to_date(table, "demo", mid_november) == 0.0  # nothing stored


@dataclass
class RunOnTheLocalCloud:
    run: str
    cloud: Any
    launched: list[dict[str, Any]]
    """The group's first machines, as DescribeInstances shows them."""

    def check_at(self, at: float) -> dict[str, Any]:
        """The handler's scheduled capacity check, with its clock at `at`."""
        from test_interruption_handler import event

        from spotrain.constructs.interruption_handler.runtime import entry, settings

        settings.now = lambda: at  # type: ignore[assignment]
        return entry.handle(event("scheduled-capacity-check"))["runs"][self.run]

    def declare(self, **settings: Any) -> None:
        """The run's declaration to the handler, as its stack writes it (cap, deadline)."""
        from test_interruption_handler import REGION, declare_run

        from spotrain.core.capacity import CapacityGroup

        group = CapacityGroup(name=self.run, region=REGION, lifecycle="spot", holds_data=True)
        declare_run([group], run=self.run, **settings)


@pytest.fixture
def run_on_the_local_cloud(
    local_cloud: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunOnTheLocalCloud]:
    """A run's group on the local cloud (an on-demand coordinator and two spot machines of
    g5.xlarge in us-east-1a), the handler's environment for it, and the cloud answering prices
    from the test book: g5.xlarge $20/h on-demand, $5/h spot there."""
    from test_interruption_handler import REGION, _handler_environment

    from spotrain.constructs.interruption_handler.runtime import settings
    from spotrain.localcloud import control

    for key, value in control.aws_environment(local_cloud.endpoint, REGION).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    monkeypatch.setattr(settings, "now", settings.now)  # restored after check_at's changes
    cloud = _handler_environment(boto3.resource("dynamodb"), monkeypatch)
    run = f"ledger-{int(time.time() * 1000) % 10**8}"
    ec2, autoscaling = boto3.client("ec2"), boto3.client("autoscaling")
    template = launch_template(ec2, run)
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=run, MinSize=0, MaxSize=4, DesiredCapacity=3,
        AvailabilityZones=["us-east-1a"],
        Tags=[{"Key": "spotrain:run", "Value": run, "PropagateAtLaunch": True},
              {"Key": "spotrain:environment", "Value": os.environ["ENVIRONMENT"],
               "PropagateAtLaunch": True}],
        MixedInstancesPolicy={
            "LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateId": template},
                               "Overrides": [{"InstanceType": "g5.xlarge"}]},
            "InstancesDistribution": {"OnDemandBaseCapacity": 1,
                                      "OnDemandPercentageAboveBaseCapacity": 0},
        },
    )  # fmt: skip
    launched = [
        i for r in ec2.describe_instances(
            Filters=[{"Name": "tag:spotrain:run", "Values": [run]}])["Reservations"]
        for i in r["Instances"]
    ]  # fmt: skip
    control.set_price_book(Path(__file__).parent / "fixtures" / "price_book.json")
    setting = RunOnTheLocalCloud(run, cloud, launched)
    setting.declare()
    try:
        yield setting
    finally:
        control.set_price_book(None)
        cloud.table.delete()


@pytest.mark.integration
def test_the_capacity_check_keeps_the_ledger_of_the_local_clouds_machines(
    run_on_the_local_cloud: RunOnTheLocalCloud, capsys: pytest.CaptureFixture[str]
) -> None:
    """The group's coordinator runs on-demand and its workers on spot (the local cloud's Auto
    Scaling markets); the handler's check prices them from the cloud's answers (spot history
    per zone, the Price List), writes the ledger and the metric; a repeated and a late check
    count nothing; `spotrain cost status` prints it."""
    setting = run_on_the_local_cloud
    assert sorted(i.get("InstanceLifecycle", "on-demand") for i in setting.launched) == [
        "on-demand", "spot", "spot"]  # fmt: skip
    hour_later = max(i["LaunchTime"].timestamp() for i in setting.launched) + 3600
    first, repeated, late = (
        setting.check_at(at)["ledger"] for at in (hour_later, hour_later, hour_later - 600)
    )
    assert first["counted"] and first["machines"] == 3, first
    hours = sum(hour_later - i["LaunchTime"].timestamp() for i in setting.launched) / 3600
    assert first["spend_usd"] == pytest.approx(hours / 3 * 20 + hours * 2 / 3 * 5, rel=1e-3)
    assert first["on_demand_usd"] == pytest.approx(hours * 20, rel=1e-3)
    assert not repeated["counted"] and not late["counted"]
    metrics = boto3.client("cloudwatch").list_metrics(Namespace="spotrain")["Metrics"]
    assert {"RunSpendUSD", "RunOnDemandEquivalentUSD"} <= {
        m["MetricName"] for m in metrics if {"Name": "Run", "Value": setting.run} in m["Dimensions"]
    }
    table = setting.cloud.table.name
    assert cli.main(["cost", "status", "--run", setting.run, "--events-table", table]) == 0
    out = capsys.readouterr().out
    assert f"run {setting.run}: ${first['spend_usd']:,.2f} spent" in out
    assert "g5.xlarge#us-east-1a#spot" in out and "(50% saved)" in out


@pytest.mark.integration
def test_a_run_at_its_cap_is_held_with_its_groups_at_0_until_released(
    run_on_the_local_cloud: RunOnTheLocalCloud,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """$30/h of machines against a $30 cap: notices at 50, 80 and 100%; at 100% the group goes
    to 0 (each machine gets SIGTERM and checkpoints) and the run may not start; a raised cap
    lets it start again and puts the group back."""
    from test_interruption_handler import REGION, _drain, desired

    setting = run_on_the_local_cloud
    setting.declare(max_spend_usd=30.0)
    start = max(i["LaunchTime"].timestamp() for i in setting.launched)
    for minutes in (20, 31, 49, 61):  # $10, $15.50, $24.50, $30.50
        result = setting.check_at(start + minutes * 60)
    assert result["decision"] == "hold" and "of its $30.00 cap" in result["reason"]
    assert desired(setting.run, REGION) == 0
    subjects = [json.loads(m["Body"])["Subject"] for m in _drain(setting.cloud.notices_url)]
    caps = [s for s in subjects if "of its cap" in s]
    assert caps == [f"spotrain: run {setting.run} spent {p}% of its cap" for p in (50, 80, 100)]
    fleet = ["fleet", "may-start", "--events-table", setting.cloud.table.name, "--run", setting.run]
    assert cli.main(fleet) == 3
    assert cli.main(["fleet", "release", "--events-table", setting.cloud.table.name, "--run",
                     setting.run, "--max-spend-usd", "60"]) == 0  # fmt: skip
    released = setting.check_at(start + 62 * 60)
    assert released["decision"] == "release" and desired(setting.run, REGION) == 3
    assert cli.main(fleet) == 0
    # The report draws what the checks kept: the ledger after each, and each notice's time.
    capsys.readouterr()
    table = setting.cloud.table.name
    assert cli.main(["cost", "report", "--run", setting.run, "--events-table", table,
                     "--json"]) == 0  # fmt: skip
    found = json.loads(capsys.readouterr().out)
    assert [round(p["at"] - start) for p in found["points"]] == [
        m * 60 for m in (20, 31, 49, 61, 62)]  # fmt: skip
    assert [p["spend_usd"] for p in found["points"]] == sorted(
        p["spend_usd"] for p in found["points"])  # fmt: skip
    assert [(n["percent"], n["cap_usd"], round(n["at"] - start)) for n in found["notices"]] == [
        (50, 30, 31 * 60), (80, 30, 49 * 60), (100, 30, 61 * 60),
        (50, 60, 62 * 60)]  # the raised cap's notices start afresh  # fmt: skip
    assert found["ledger"]["cap_usd"] == 60 and not found["ledger"]["held"]


def test_the_cap_is_announced_at_50_80_and_100_percent_once_each_and_afresh_when_raised() -> None:
    def spent(usd: float, previous: Ledger) -> Ledger:
        return Ledger(as_of=T0, spend_usd=usd, cap_usd=previous.cap_usd,
                      notified=previous.notified, held=previous.held)  # fmt: skip

    ledger, announced = Ledger(), []
    for usd, cap in ((4, 10), (5.5, 10), (6, 10), (8.5, 10), (10, 10), (11, 10), (11, 20),
                     (16.5, 20)):  # fmt: skip
        check = spend_ledger.judge(spent(usd, ledger), cap)
        ledger = check.ledger
        announced.append((check.crossed, ledger.held))
    assert announced == [
        ((), False),
        ((50,), False),
        ((), False),
        ((80,), False),
        ((100,), True),
        ((), True),
        ((50,), False),  # raised to $20: $11 is past half of it
        ((80,), False),
    ]
    assert spend_ledger.judge(ledger, None).ledger.held is False  # no cap, no hold


def test_release_refuses_a_cap_that_is_no_cap_and_names_the_spent_figure(
    dynamo: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    table = boto3.resource("dynamodb").Table("catalog")
    held = Ledger(as_of=T0, spend_usd=31.5, cap_usd=30.0, notified=(50, 80, 100), held=True)
    assert spend_ledger.write(table, "capped", held, Ledger())

    def release(*arguments: str) -> tuple[int, str]:
        code = cli.main(["fleet", "release", "--events-table", "catalog", *arguments])
        captured = capsys.readouterr()
        return code, captured.err + captured.out

    assert release("--run", "capped", "--max-spend-usd", "0")[1].count("positive amount") == 1
    assert "-5" in release("--run", "capped", "--max-spend-usd", "-5")[1]
    code, said = release("--run", "capped", "--max-spend-usd", "30")
    assert code == 2 and "has spent $31.50 already: give --max-spend-usd above that" in said
    code, said = release("--run", "nobody", "--max-spend-usd", "50")
    assert code == 2 and "run 'nobody' has no spend ledger" in said
    assert cli.main(["fleet", "may-start", "--events-table", "catalog", "--run", "capped"]) == 3
    assert "spent $31.50 of its $30.00 cap" in capsys.readouterr().out
    code, said = release("--run", "capped", "--max-spend-usd", "50")
    assert code == 0 and "cap raised to $50.00" in said and "start again" in said
    assert spend_ledger.current_cap(table, "capped", 30.0) == 50.0
