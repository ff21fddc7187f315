"""`spotrain fleet` and `spotrain budget`: what the runbooks and the boot script call, and the
errors an on-call engineer can hit (in-process moto; the runbook tests run them over HTTP)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import boto3
import pytest
from helpers import create_catalog_table
from moto import mock_aws

from spotrain import cli
from spotrain.core.fleet_state import DEFAULT_MAX_CRASHES
from spotrain.localcloud import control


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key, value in {"AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
                       "AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    with mock_aws():
        create_catalog_table(boto3.client("dynamodb"), "events")
        yield


def test_crashes_hold_the_run_until_reset(aws: None, capsys: pytest.CaptureFixture[str]) -> None:
    state = ["--events-table", "events", "--run", "r"]
    assert cli.main(["fleet", "may-start", *state]) == 0
    exits = [cli.main(["fleet", "exit", *state, "--instance", "i-1", "--code", "1"])
             for _ in range(DEFAULT_MAX_CRASHES)]  # fmt: skip
    assert exits == [5, 5, 3]  # crashes, then the crash that holds the run
    assert cli.main(["fleet", "may-start", *state]) == 3
    assert "held after repeated crashes" in capsys.readouterr().out
    assert cli.main(["fleet", "reset-crashes", *state]) == 0
    assert cli.main(["fleet", "may-start", *state]) == 0


def test_a_clean_exit_is_not_a_crash(aws: None, capsys: pytest.CaptureFixture[str]) -> None:
    state = ["--events-table", "events", "--run", "r"]
    assert cli.main(["fleet", "exit", *state, "--instance", "i-1", "--code", "0"]) == 0  # fmt: skip
    assert "finished; run r has 0 crash(es)" in capsys.readouterr().out


def test_a_machine_that_got_its_own_spot_notice_exits_preempted_not_crashed(
    aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The boot script passes the machine's IMDS notice: whatever the trainer's exit (its
    torchrun agent is stopped on purpose), the machine is marked interrupted and it is no
    crash, even if the handler's event never comes."""
    from spotrain.core import fleet_state

    state = ["--events-table", "events", "--run", "r"]
    notice = '{"action": "terminate", "time": "2026-11-23T16:33:31Z"}'
    assert cli.main(["fleet", "exit", *state, "--instance", "i-1", "--code", "1",
                     "--spot-notice", notice, "--pool", "g6.xlarge#us-east-1a"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "i-1 was reclaimed (terminate at 2026-11-23T16:33:31Z)" in out
    assert "trainer exit 1 on i-1: preempted; run r has 0 crash(es)" in out
    table = boto3.resource("dynamodb").Table("events")
    assert fleet_state.instance_status(table, "r", "i-1") == "INTERRUPTING"  # for reports
    [mark] = fleet_state.instances(table, "r")
    assert fleet_state.shown_status(mark) == "RECLAIMED"  # it has left: not interrupting still
    assert cli.main(["fleet", "exit", *state, "--instance", "i-2", "--code", "1",
                     "--spot-notice", "not json"]) == 2  # fmt: skip
    assert "spot/instance-action" in capsys.readouterr().err


def test_a_coordinator_that_never_answers_is_named_with_what_to_check(
    aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    state = ["--events-table", "events", "--run", "r"]
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        port = listening.getsockname()[1]
        claim = ["fleet", "coordinator", *state, "--claim", "--instance", "i-od",
                 "--address", "127.0.0.1", "--port", str(port)]  # fmt: skip
        assert cli.main(claim) == 0
        capsys.readouterr()
        assert cli.main(["fleet", "coordinator", *state, "--wait", "1"]) == 2  # not listening
        error = capsys.readouterr().err
        assert f"coordinator 127.0.0.1:{port} (i-od) claimed the role but does not answer" in error
        assert "security group" in error and "Traceback" not in error
        listening.listen()
        assert cli.main(["fleet", "coordinator", *state, "--wait", "1"]) == 0
        assert capsys.readouterr().out.strip() == f"127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["budget", "spotrain-nope-monthly"], "spotrain-<env>-monthly"),
        (["fleet", "scale", "--group", "no-such-group", "--desired", "1"], "no Auto Scaling group"),
        (["fleet", "status", "--group", "no-such-group"], "no Auto Scaling group named"),
        (
            ["fleet", "may-start", "--events-table", "no-such-table", "--run", "r"],
            "AWS_DEFAULT_REGION",
        ),
        (["fleet", "exit", "--events-table", "events", "--run", "r"], "--instance ID"),
    ],
)
def test_mistakes_get_one_line_that_names_the_fix(
    aws: None, capsys: pytest.CaptureFixture[str], argv: list[str], names: str
) -> None:
    assert cli.main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and names in error
    assert "Traceback" not in error


def test_one_on_demand_machine_coordinates_and_another_takes_over_when_it_is_gone(
    aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from spotrain.core import fleet_state

    state = ["--events-table", "events", "--run", "r"]
    assert cli.main(["fleet", "coordinator", *state]) == 2  # nobody yet, and no waiting
    assert "none has claimed the role" in capsys.readouterr().err

    def claim(instance: str, address: str) -> int:
        return cli.main(["fleet", "coordinator", *state, "--claim", "--instance", instance,
                         "--address", address, "--port", "29400"])  # fmt: skip

    assert claim("i-first", "10.0.1.5") == 0
    assert claim("i-second", "10.0.1.6") == 4  # the first still holds it
    assert claim("i-first", "10.0.1.5") == 0  # renewing is claiming again
    capsys.readouterr()
    assert cli.main(["fleet", "coordinator", *state, "--wait", "5"]) == 0
    assert capsys.readouterr().out.strip() == "10.0.1.5:29400"
    # The first machine is gone: its claim goes stale and the next on-demand machine takes it.
    table = boto3.resource("dynamodb").Table("events")
    later = fleet_state.coordinator(table, "r").heartbeat_at + fleet_state.COORDINATOR_STALE_S  # type: ignore[union-attr]
    assert not fleet_state.coordinator(table, "r").fresh(later)  # type: ignore[union-attr]
    assert fleet_state.claim_coordinator(table, "r", instance_id="i-second",
                                         address="10.0.1.6", port=29400, now=later + 1)  # fmt: skip
    assert fleet_state.coordinator(table, "r").endpoint == "10.0.1.6:29400"  # type: ignore[union-attr]
    # An item no machine wrote (by hand, or by another version) is named, with the fix.
    table.update_item(Key={"pk": "RUN#r", "sk": "COORDINATOR"}, UpdateExpression="REMOVE #p",
                      ExpressionAttributeNames={"#p": "port"})  # fmt: skip
    assert cli.main(["fleet", "coordinator", *state]) == 2
    said = capsys.readouterr().err
    assert "run r's coordinator item" in said and "needs instance_id, address, port" in said
    assert "delete the item" in said and "Traceback" not in said


def test_run_cancel_takes_the_groups_to_0_and_resume_puts_them_back(
    aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """`spotrain run` on the `local` environment's names: the run's groups found by their run
    tag, its lifecycle, fleet state and ledger in the environment's events table."""
    import json

    from spotrain.core import fleet_state, run_lifecycle

    create_catalog_table(boto3.client("dynamodb"), "spotrain-local-events")
    create_catalog_table(boto3.client("dynamodb"), "spotrain-local-checkpoints")
    ec2, autoscaling = boto3.client("ec2"), boto3.client("autoscaling")
    image = control.stock_image(ec2)
    ec2.create_launch_template(LaunchTemplateName="demo", LaunchTemplateData={"ImageId": image})
    for name, sizes in (("demo-fleet", (1, 2)), ("demo-fleet-on-demand", (0, 0))):
        autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=name, MinSize=sizes[0], DesiredCapacity=sizes[1], MaxSize=4,
            AvailabilityZones=["us-east-1a"], LaunchTemplate={"LaunchTemplateName": "demo"},
            Tags=[{"Key": "spotrain:run", "Value": "demo", "PropagateAtLaunch": True},
                  {"Key": "spotrain:environment", "Value": "local", "PropagateAtLaunch": True}],
        )  # fmt: skip
    # Another environment's group of a run with the same name is not this run's.
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="elsewhere-demo-fleet", MinSize=1, DesiredCapacity=1, MaxSize=4,
        AvailabilityZones=["us-east-1a"], LaunchTemplate={"LaunchTemplateName": "demo"},
        Tags=[{"Key": "spotrain:run", "Value": "demo", "PropagateAtLaunch": True},
              {"Key": "spotrain:environment", "Value": "dev", "PropagateAtLaunch": True}],
    )  # fmt: skip
    table = boto3.resource("dynamodb").Table("spotrain-local-events")
    run_lifecycle.mark_started(table, "demo", 1.0)

    def sizes() -> list[tuple[int, int]]:
        found = autoscaling.describe_auto_scaling_groups(
            AutoScalingGroupNames=["demo-fleet", "demo-fleet-on-demand", "elsewhere-demo-fleet"]
        )["AutoScalingGroups"]
        return [(g["MinSize"], g["DesiredCapacity"]) for g in found]

    assert cli.main(["run", "status", "local", "demo", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["phase"], status["step"], sum(status["machines"].values())) == (
        "starting", None, 2)  # fmt: skip
    assert cli.main(["run", "cancel", "local", "demo"]) == 0
    assert "cancelled: its groups are at 0; 2 machine(s) publish" in capsys.readouterr().out
    assert sizes() == [(0, 0), (0, 0), (1, 1)]  # the other environment's is left alone
    assert run_lifecycle.read(table, "demo").cancelled_at is not None
    assert cli.main(["run", "list", "local"]) == 0
    listed = capsys.readouterr().out
    assert listed.split()[:2] == ["demo", "cancelled"]
    # Declared in the repository, not deployed: listed with the command that deploys it.
    assert "second                   declared" in listed and "run submit local second" in listed
    # A machine leaving a cancelled run is no crash, and no machine of it may start.
    assert cli.main(["fleet", "exit", "--events-table", "spotrain-local-events", "--run", "demo",
                     "--instance", "i-1", "--code", "143"]) == 0  # fmt: skip
    assert cli.main(["fleet", "may-start", "--events-table", "spotrain-local-events",
                     "--run", "demo"]) == 3  # fmt: skip
    capsys.readouterr()
    assert cli.main(["run", "resume", "local", "demo"]) == 0
    assert "resumed: demo-fleet 1..2;" in capsys.readouterr().out  # what the cancel took
    assert sizes() == [(1, 2), (0, 0), (1, 1)]
    resumed = fleet_state.run_state(table, "demo")
    assert resumed.held_sizes is None
    assert resumed.gang_asked is not None  # raised from none: the handler checks its gang
    assert cli.main(["run", "status", "local", "ghost"]) == 2
    assert "no Auto Scaling group of run ghost" in capsys.readouterr().err


def test_a_coordinator_that_leaves_hands_its_role_to_the_next_machine_at_once(
    aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The boot script of a coordinator that stops (its run cancelled, its machine scaled in)
    gives the role up: the run's next on-demand machine takes it without waiting for the
    claim to go stale. Only the holder can give it up."""
    state = ["--events-table", "events", "--run", "r"]

    def claim(instance: str) -> int:
        return cli.main(["fleet", "coordinator", *state, "--claim", "--instance", instance,
                         "--address", "10.0.1.5", "--port", "29400"])  # fmt: skip

    assert claim("i-first") == 0
    capsys.readouterr()
    assert cli.main(["fleet", "coordinator", *state, "--release", "--instance", "i-second"]) == 0
    assert "i-second did not coordinate it" in capsys.readouterr().out
    assert claim("i-second") == 4  # still the first machine's
    assert cli.main(["fleet", "coordinator", *state, "--release", "--instance", "i-first"]) == 0
    assert "i-first no longer coordinates it" in capsys.readouterr().out
    assert claim("i-second") == 0


def test_a_machine_asked_to_stop_exits_stopped_not_crashed(
    aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM reached the boot script (the machine is being stopped, whoever asked): the
    trainer's status after its emergency checkpoint is no crash."""
    from spotrain.core import fleet_state

    state = ["--events-table", "events", "--run", "r"]
    assert cli.main(["fleet", "exit", *state, "--instance", "i-1", "--code", "1",
                     "--asked-to-stop"]) == 0  # fmt: skip
    assert "trainer exit 1 on i-1: stopped; run r has 0 crash(es)" in capsys.readouterr().out
    assert fleet_state.run_state(boto3.resource("dynamodb").Table("events"), "r").crashes == 0
    assert cli.main(["fleet", "exit", *state, "--instance", "i-1", "--code", "1"]) == 5


def _local_demo_run(*, machines: int = 1) -> None:
    """The `local` environment's tables, checkpoint bucket and demo groups, as deployed."""
    create_catalog_table(boto3.client("dynamodb"), "spotrain-local-events")
    create_catalog_table(boto3.client("dynamodb"), "spotrain-local-checkpoints")
    ec2, autoscaling = boto3.client("ec2"), boto3.client("autoscaling")
    image = control.stock_image(ec2)
    ec2.create_launch_template(LaunchTemplateName="demo", LaunchTemplateData={"ImageId": image})
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="demo-fleet", MinSize=machines, DesiredCapacity=machines,
        MaxSize=4, AvailabilityZones=["us-east-1a"],
        LaunchTemplate={"LaunchTemplateName": "demo"},
        Tags=[{"Key": "spotrain:run", "Value": "demo", "PropagateAtLaunch": True},
              {"Key": "spotrain:environment", "Value": "local", "PropagateAtLaunch": True}],
    )  # fmt: skip


def test_run_status_shows_progress_loss_pace_eta_deadline_and_head(
    aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Steps of the stored configuration's steps, the head's loss and manifest, the pace
    between checkpoints of one trainer start, the ETA at that pace against the declared
    deadline."""
    import datetime
    import json
    from decimal import Decimal

    from spotrain.core import catalog_schema as schema
    from spotrain.core import run_lifecycle
    from spotrain.trainer import run_config
    from spotrain.trainer.storage import open_storage

    _local_demo_run()
    run_lifecycle.mark_started(boto3.resource("dynamodb").Table("spotrain-local-events"),
                               "demo", 1.0)  # fmt: skip
    bucket = "spotrain-local-checkpoints-us-east-1"
    boto3.client("s3").create_bucket(Bucket=bucket)
    run_config.put(open_storage(f"s3://{bucket}"), {"run": "demo", "steps": 400})
    catalog = boto3.resource("dynamodb").Table("spotrain-local-checkpoints")
    now = datetime.datetime.now(datetime.UTC)
    for step, minutes_ago in ((100, 60), (200, 30)):  # 200 steps an hour
        catalog.put_item(Item={
            schema.PARTITION_KEY: "RUN#demo", schema.SORT_KEY: schema.checkpoint_sort_key(step),
            "step": step, "generation": 1, "manifest": f"runs/demo/step_{step}.json",
            "created_at": (now - datetime.timedelta(minutes=minutes_ago)).isoformat(),
            schema.LOSS_KEY: Decimal("2.5") if step == 200 else 3,
        })  # fmt: skip
    catalog.put_item(Item={schema.PARTITION_KEY: "RUN#demo", schema.SORT_KEY: "HEAD",
                           "step": 200, "latest": schema.checkpoint_sort_key(200)})  # fmt: skip
    # Declared to finish within half an hour: an hour of work is left at this pace.
    finish_by = (now + datetime.timedelta(minutes=30)).isoformat(timespec="seconds")
    deadline = {"started_at": (now - datetime.timedelta(hours=2)).isoformat(timespec="seconds"),
                "finish_by": finish_by, "total_steps": 400}  # fmt: skip
    boto3.client("ssm").put_parameter(
        Name="/spotrain/local/runs/demo", Type="SecureString",
        Value=json.dumps({"run": "demo", "groups": [], "max_spend_usd": None,
                          "run_deadline": deadline}),
    )  # fmt: skip

    assert cli.main(["run", "status", "local", "demo", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["phase"], status["step"], status["steps"], status["loss"]) == (
        "training", 200, 400, 2.5)  # fmt: skip
    assert status["steps_per_hour"] == pytest.approx(200, rel=0.01)
    eta = datetime.datetime.fromisoformat(status["eta"])
    assert abs((eta - now).total_seconds() - 3600) < 120
    assert status["finish_by"] == finish_by
    assert status["head_manifest"] == f"s3://{bucket}/runs/demo/step_200.json"
    assert cli.main(["run", "status", "local", "demo"]) == 0
    said = capsys.readouterr().out
    assert said.split()[:6] == ["demo", "training", "step", "200/400", "loss", "2.5000"], said
    assert "200 steps/h; ETA " in said and "(late at this pace)" in said, said
    assert "(late at this pace), decided by outage fill" in said, said
    assert f"head: step 200, loss 2.5000, published {status['head_at']}" in said
    # Given a plan solved for its deadline, its status says the plan decides it.
    from spotrain.core import deadline_plan
    from spotrain.core.deadline_policy import RunDeadline
    from spotrain.cost import markov_policy

    plan = markov_policy.Plan([markov_policy.RegionRates(3.0, 2.0)] * 2,
                              markov_policy.Prices(1.0, 3.0, 0.0), tick_h=0.5, ticks=6,
                              work=6, changeover=1)  # fmt: skip
    header = plan.header(("us-east-1", "us-west-2"), source="from 30 days of history")
    deadline_plan.store(boto3.resource("dynamodb").Table("spotrain-local-events"), "demo",
                        replace(header, plan_id="p1",
                                deadline=deadline_plan.solved_for(RunDeadline(**deadline))),
                        plan.slices())  # fmt: skip
    assert cli.main(["run", "status", "local", "demo", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decided_by"] == (
        "its plan (the means from 30 days of history)")  # fmt: skip
    # A spot notice's time is the stop, two minutes after the warning: the warning is shown.
    from spotrain.core import fleet_state

    events = boto3.resource("dynamodb").Table("spotrain-local-events")
    fleet_state.mark_instance(events, "demo", "i-spot", status="INTERRUPTING", pool="p",
                              event_id="notice", at="2026-01-01T12:02:00Z",
                              warned_at="2026-01-01T12:00:00Z")  # fmt: skip
    assert cli.main(["run", "status", "local", "demo", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["last_interruption"] == (
        "i-spot INTERRUPTING, warned at 2026-01-01T12:00:00.000000Z")  # fmt: skip


def test_run_status_gives_the_queues_place_only_when_nothing_else_holds_the_run(
    aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run the queue holds says its place and why, as its reason and as `queued`; once it is
    cancelled the cancel is the reason, and the queue's place is no longer shown as one."""
    import json

    from spotrain.core import fleet_state, run_lifecycle
    from spotrain.trainer import run_config
    from spotrain.trainer.storage import open_storage

    _local_demo_run(machines=0)
    bucket = "spotrain-local-checkpoints-us-east-1"
    boto3.client("s3").create_bucket(Bucket=bucket)
    run_config.put(open_storage(f"s3://{bucket}"), {"run": "demo", "steps": 400})
    events = boto3.resource("dynamodb").Table("spotrain-local-events")
    place = "2nd in the queue: team research is at its GPU quota"
    fleet_state.set_queued(events, "demo", place)

    def status() -> dict[str, object]:
        assert cli.main(["run", "status", "local", "demo", "--json"]) == 0
        return dict(json.loads(capsys.readouterr().out))

    assert (status()["why"], status()["queued"]) == (place, place)
    run_lifecycle.mark_cancelled(events, "demo", by="research@example.com", at=1.0)
    cancelled = status()
    assert cancelled["queued"] is None and "cancel" in str(cancelled["why"]), cancelled


def test_run_logs_shows_every_machine_or_one_gone_ones_included(
    aws: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from spotrain.cli import run_logs
    from spotrain.core import run_lifecycle

    _local_demo_run(machines=0)
    logs = boto3.client("logs")
    group = "/spotrain/spotrain-local-demo-fleet/machines"
    assert cli.main(["run", "logs", "local", "demo"]) == 2  # not deployed yet
    assert "its stack is not deployed" in capsys.readouterr().err
    logs.create_log_group(logGroupName=group)
    start_ms = int(time.time() * 1000) - 60_000
    for number, machine in enumerate(("i-gone", "i-here")):
        logs.create_log_stream(logGroupName=group, logStreamName=machine)
        logs.put_log_events(logGroupName=group, logStreamName=machine, logEvents=[
            {"timestamp": start_ms + number * 10 + line, "message": f"{machine} {text}"}
            for line, text in enumerate(("boots", "step 10/20"))])  # fmt: skip
    assert cli.main(["run", "logs", "local", "demo"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "i-gone  i-gone boots", "i-gone  i-gone step 10/20",
        "i-here  i-here boots", "i-here  i-here step 10/20"]  # fmt: skip
    assert cli.main(["run", "logs", "local", "demo", "--machine", "i-gone"]) == 0
    assert capsys.readouterr().out.splitlines() == ["i-gone boots", "i-gone step 10/20"]
    assert cli.main(["run", "logs", "local", "demo", "--machine", "i-never"]) == 2
    assert "machine i-never wrote nothing" in capsys.readouterr().err
    # Following a run that stopped with no machine left: what there is, then done.
    run_lifecycle.mark_cancelled(boto3.resource("dynamodb").Table("spotrain-local-events"),
                                 "demo", by="me", at=1.0)  # fmt: skip
    monkeypatch.setattr(run_logs, "FOLLOW_POLL_S", 0.0)
    monkeypatch.setattr(run_logs, "STOPPED_CHECK_S", 0.0)
    assert cli.main(["run", "logs", "local", "demo", "--machine", "i-here", "--follow"]) == 0
    assert capsys.readouterr().out.splitlines() == ["i-here boots", "i-here step 10/20"]


def test_resume_waits_for_the_machines_of_a_cancelled_run_to_leave(
    aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A machine of the cancelled run is still in its group (publishing its emergency
    checkpoint): a resumed run's new machines would start from an older head, so resume
    refuses and names it; once it is gone, resume puts the sizes back."""
    from spotrain.core import fleet_state, run_lifecycle

    _local_demo_run(machines=1)
    table = boto3.resource("dynamodb").Table("spotrain-local-events")
    autoscaling = boto3.client("autoscaling")
    fleet_state.set_held_sizes(table, "demo", {"demo-fleet": {"min_size": 1, "desired": 1}})
    run_lifecycle.mark_cancelled(table, "demo", by="me", at=1.0)
    [leaving] = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["demo-fleet"])[
        "AutoScalingGroups"][0]["Instances"]  # fmt: skip
    assert cli.main(["run", "resume", "local", "demo"]) == 2
    error = capsys.readouterr().err
    assert f"still leaving ({leaving['InstanceId']})" in error and "Traceback" not in error
    assert run_lifecycle.read(table, "demo").cancelled_at is not None  # still cancelled
    autoscaling.update_auto_scaling_group(AutoScalingGroupName="demo-fleet", MinSize=0,
                                          DesiredCapacity=0)  # fmt: skip
    assert cli.main(["run", "resume", "local", "demo"]) == 0
    assert "resumed: demo-fleet 1..1" in capsys.readouterr().out


def test_log_options_outside_run_logs_are_refused(
    aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", "status", "local", "demo", "--follow"]) == 2
    error = capsys.readouterr().err
    assert "--follow with logs: `spotrain run logs local RUN --follow`" in error
    assert cli.main(["run", "cancel", "local", "demo", "--machine", "i-1"]) == 2
    assert "--machine goes with `spotrain run logs` and `run reclaim`" in capsys.readouterr().err


def test_run_play_and_plot_are_refused_where_they_do_not_apply(
    aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", "play", "dev", "gpt-small"]) == 2
    assert "`spotrain run logs dev gpt-small --follow`" in capsys.readouterr().err
    assert cli.main(["run", "reclaim", "dev", "gpt-small"]) == 2
    assert "EC2 reclaims the others itself" in capsys.readouterr().err
    assert cli.main(["run", "list", "dev", "--plot", "x.png"]) == 2
    assert "--plot goes with `spotrain run status`" in capsys.readouterr().err


def test_run_reclaim_asks_a_running_play_for_one_of_its_spot_machines(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The reclaim itself (notice, warning, termination, replacement) is carried out by the
    `run play` that holds the machine: test_integration_local_apply's story."""
    from spotrain.localcloud import control
    from spotrain.tools.local_fleet import PLAYING

    monkeypatch.setenv("SPOTRAIN_HOME", str(tmp_path / "home"))
    assert cli.main(["run", "reclaim", "local", "demo"]) == 2
    assert "start `spotrain run play local demo` (another terminal)" in capsys.readouterr().err
    work = control.state_dir().parent / "machines" / "demo"
    work.mkdir(parents=True)
    (work / PLAYING).write_text('{"i-0coordinator": "on-demand"}')
    assert cli.main(["run", "reclaim", "local", "demo"]) == 2
    assert ("a spot machine is not among the machines run demo plays: i-0coordinator "
            "(on-demand); name one with --machine") in capsys.readouterr().err  # fmt: skip


def test_one_phase_for_a_run_whatever_happened_to_it(
    aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The contradictions a run's phase once had: submitted but said to have no
    configuration; scaled to 0 by hand but "starting"; cancelled while its last step
    published, then "cancelled (`run resume` starts it again)" while resume says finished."""
    import json

    from spotrain.core import run_lifecycle
    from spotrain.trainer import run_config
    from spotrain.trainer.storage import open_storage

    _local_demo_run(machines=0)
    events = boto3.resource("dynamodb").Table("spotrain-local-events")

    def status() -> dict[str, object]:
        capsys.readouterr()
        assert cli.main(["run", "status", "local", "demo", "--json"]) == 0
        return dict(json.loads(capsys.readouterr().out))

    assert (status()["phase"], status()["why"]) == ("waiting", "no training configuration "
        "stored (`spotrain run submit` or `spotrain config put`)")  # fmt: skip
    bucket = "spotrain-local-checkpoints-us-east-1"
    boto3.client("s3").create_bucket(Bucket=bucket)
    run_config.put(open_storage(f"s3://{bucket}"), {"run": "demo", "steps": 20})
    submitted = status()
    assert submitted["phase"] == "waiting" and submitted["why"].startswith("submitted: the "
        "handler's next capacity check")  # fmt: skip
    run_lifecycle.mark_started(events, "demo", 1.0)
    idle = status()  # started, its group at 0, nothing holding it
    assert idle["phase"] == "idle" and "`spotrain fleet scale --group GROUP --desired N`" in (
        idle["why"])  # fmt: skip
    run_lifecycle.mark_cancelled(events, "demo", by="me", at=2.0)
    assert status()["phase"] == "cancelled"
    run_lifecycle.mark_finished(events, "demo", 20, 3.0)  # its last step was publishing
    finished = status()
    assert finished["phase"] == "finished" and "its final step 20 is published" in (
        finished["why"])  # fmt: skip
    capsys.readouterr()
    assert cli.main(["run", "resume", "local", "demo"]) == 2
    assert "run demo finished (step 20 is final)" in capsys.readouterr().err


def test_run_play_plays_the_machines_of_the_region_the_run_trains_in(aws: None) -> None:
    """`run play` boots the groups of the region the run's epoch names (home until it moves),
    from the first copy of the catalog that answers: with home down, the other region's."""
    from spotrain.core import catalog_schema as schema
    from spotrain.core import run_epochs
    from spotrain.tools.local_fleet import trains_in

    regions = ("us-east-1", "us-west-2")
    for region in regions:
        create_catalog_table(boto3.client("dynamodb", region_name=region), "catalog")

    def copy(region: str) -> object:
        return boto3.resource("dynamodb", region_name=region).Table("catalog")

    assert trains_in(regions, "demo", copy) == "us-east-1"  # never moved: home
    moved = run_epochs.Epoch(run_epochs.EpochId(1, "us-west-2"),
                             run_epochs.EpochId(0, "us-east-1"), 20, "t", "test")  # fmt: skip
    boto3.client("dynamodb", region_name="us-west-2").put_item(TableName="catalog", Item={
        schema.PARTITION_KEY: {"S": schema.run_key("demo")},
        schema.SORT_KEY: {"S": run_epochs.epoch_sort_key(1)}, **moved.to_item()})  # fmt: skip

    def home_down(region: str) -> object:
        if region == "us-east-1":
            from botocore.exceptions import EndpointConnectionError

            raise EndpointConnectionError(endpoint_url="https://dynamodb.us-east-1")
        return copy(region)

    # The move was claimed in us-west-2's copy; home's has not heard of it yet, and answers.
    assert trains_in(regions, "demo", copy) == "us-east-1"
    assert trains_in(regions, "demo", home_down) == "us-west-2"

    def home_refuses(region: str) -> object:  # it answers: a fault to fix, not an outage
        from botocore.exceptions import ClientError

        if region == "us-east-1":
            raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"},
                               "ResponseMetadata": {"HTTPStatusCode": 400}}, "Query")  # fmt: skip
        return copy(region)

    with pytest.raises(Exception, match="AccessDeniedException"):
        trains_in(regions, "demo", home_refuses)


def test_destroy_refuses_while_a_run_trains_or_a_run_it_would_leave_is_deployed(
    aws: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`spotrain destroy` reads every region's groups before it synthesizes or changes
    anything: a run with machines in service (they would stop mid-step) and a run deployed but
    not among the run files it destroys (its fleet would stay, billed, and block the network's
    destroy halfway) are each named with the command that clears them, all at once."""
    from spotrain.stacks.runs import load_runs

    [declared] = [run.name for run in load_runs("dev")]
    ec2 = boto3.client("ec2", region_name="us-west-2")
    ec2.create_launch_template(LaunchTemplateName="fleet", LaunchTemplateData={
        "ImageId": control.stock_image(ec2)})  # fmt: skip
    autoscaling = boto3.client("autoscaling", region_name="us-west-2")

    def group(name: str, run: str, environment: str, machines: int) -> None:
        autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=name, MinSize=0, DesiredCapacity=machines, MaxSize=2,
            AvailabilityZones=["us-west-2a"], LaunchTemplate={"LaunchTemplateName": "fleet"},
            Tags=[{"Key": "spotrain:run", "Value": run, "PropagateAtLaunch": True},
                  {"Key": "spotrain:environment", "Value": environment,
                   "PropagateAtLaunch": True}],
        )  # fmt: skip

    group("training", declared, "dev", 1)  # in the environment's other region
    group("stray", "mine", "dev", 0)
    group("another-environments", "theirs", "local", 1)
    out = tmp_path / "cdktf.out"
    assert cli.main(["destroy", "dev", "--out", str(out)]) == 2
    said = capsys.readouterr().err
    assert "dev is not destroyed, nothing changed" in said and "Traceback" not in said, said
    assert f"run {declared} has 1 machine(s) in service: `spotrain run cancel dev {declared}`" in (
        said)  # fmt: skip
    assert "run mine is deployed but not declared in" in said
    assert "`spotrain run retire dev mine` from where it was submitted first" in said
    assert "theirs" not in said
    assert not out.exists()  # nothing synthesized, nothing applied
    autoscaling.update_auto_scaling_group(AutoScalingGroupName="training", DesiredCapacity=0)
    autoscaling.delete_auto_scaling_group(AutoScalingGroupName="stray", ForceDelete=True)
    from spotrain.cli.infra import _what_destroy_would_break

    assert _what_destroy_would_break("dev") == []
