"""A run's spend ledger: machine time counted once at its pool's price, whatever order and
however often the checks come; and the handler's check keeps it on the local cloud."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest

from spotrain import cli, spend_ledger
from spotrain.spend_ledger import ON_DEMAND, SPOT, Ledger, Machine

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


@pytest.mark.integration
def test_the_capacity_check_keeps_the_ledger_of_the_local_clouds_machines(
    local_cloud: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The run's group launches an on-demand coordinator and spot machines (the local cloud's
    Auto Scaling markets); the handler's check prices them from the book the cloud answers
    with (spot history per zone, the Price List), writes the ledger and the metric; a repeated
    and a late check count nothing; `spotrain cost status` prints it."""
    from pathlib import Path

    from test_interruption_handler import REGION, _handler_environment, event

    from spotrain.constructs.interruption_handler import handler
    from spotrain.localcloud import control

    for key, value in control.aws_environment(local_cloud.endpoint, REGION).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(handler.boto3, "DEFAULT_SESSION", None)
    cloud = _handler_environment(boto3.resource("dynamodb"), monkeypatch)
    run = f"ledger-{int(time.time() * 1000) % 10**8}"
    monkeypatch.setenv("RUN_NAME", run)
    ec2, autoscaling = boto3.client("ec2"), boto3.client("autoscaling")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    template = ec2.create_launch_template(
        LaunchTemplateName=run, LaunchTemplateData={"ImageId": image}
    )["LaunchTemplate"]["LaunchTemplateId"]
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=run, MinSize=0, MaxSize=4, DesiredCapacity=3,
        AvailabilityZones=["us-east-1a"],
        Tags=[{"Key": "spotrain:run", "Value": run, "PropagateAtLaunch": True}],
        MixedInstancesPolicy={
            "LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateId": template},
                               "Overrides": [{"InstanceType": "g5.xlarge"}]},
            "InstancesDistribution": {"OnDemandBaseCapacity": 1,
                                      "OnDemandPercentageAboveBaseCapacity": 0},
        },
    )  # fmt: skip
    monkeypatch.setenv("CAPACITY_GROUPS", f'[{{"name": "{run}", "region": "{REGION}", '
                       '"lifecycle": "spot", "holds_data": true}]')  # fmt: skip
    launched = [
        i for r in ec2.describe_instances(
            Filters=[{"Name": "tag:spotrain:run", "Values": [run]}])["Reservations"]
        for i in r["Instances"]
    ]  # fmt: skip
    assert sorted(i.get("InstanceLifecycle", "on-demand") for i in launched) == [
        "on-demand",
        "spot",
        "spot",
    ]
    control.set_price_book(Path(__file__).parent / "fixtures" / "price_book.json")
    try:
        hour_later = max(i["LaunchTime"].timestamp() for i in launched) + 3600
        checks = []
        for at in (hour_later, hour_later, hour_later - 600):
            monkeypatch.setattr(handler, "_now", lambda at=at: at)
            checks.append(handler.handle(event("scheduled-capacity-check"))["ledger"])
    finally:
        control.set_price_book(None)
    first, repeated, late = checks
    assert first["counted"] and first["machines"] == 3, first
    hours = sum(hour_later - i["LaunchTime"].timestamp() for i in launched) / 3600
    # The book: g5.xlarge $20/h on-demand, spot $5/h in us-east-1a.
    spot_hours = hours * 2 / 3
    assert first["spend_usd"] == pytest.approx(hours / 3 * 20 + spot_hours * 5, rel=1e-3)
    assert first["on_demand_usd"] == pytest.approx(hours * 20, rel=1e-3)
    assert not repeated["counted"] and not late["counted"]
    metrics = boto3.client("cloudwatch").list_metrics(Namespace="spotrain")["Metrics"]
    assert {"RunSpendUSD", "RunOnDemandEquivalentUSD"} <= {
        m["MetricName"] for m in metrics if {"Name": "Run", "Value": run} in m["Dimensions"]
    }
    assert cli.main(["cost", "status", "--run", run, "--events-table", cloud.table.name]) == 0
    out = capsys.readouterr().out
    assert f"run {run}: ${first['spend_usd']:,.2f} spent" in out
    assert "g5.xlarge#us-east-1a#spot" in out and "(50% saved)" in out
    cloud.table.delete()
