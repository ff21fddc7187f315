"""A run of an ML engineer's own repository on the shared deployment (tests/deployment.py),
beside the stories on the environment's runs (test_integration_local_apply.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from deployment import ACCOUNT, TRAINING_MACHINES, USERS_STORY_AFTER, Local, after, alone

from spotrain.localcloud import control

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def test_a_run_from_the_users_own_repository_is_reclaimed_and_loses_no_step(
    local: Local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    """An ML engineer's own git repository declares a run (runs/local/mine.toml) of its own
    script, written as public DeepSpeed examples are (an epoch loop over a shuffled DataLoader
    with worker processes: examples/epoch_loop.py); nothing is copied into the
    blueprint's checkout. From that repository: `run submit` stores its code as a bundle named
    by its digest, deploys the run's stack (its image pinned) and stores the entry point; `run
    play` boots both machines from the deployed launch template, each fetching the bundle;
    `run reclaim` reclaims the spot one as EC2 does (its notice, the handler's warning, the
    termination, the group's replacement, which `run play` boots). The run publishes its
    emergency checkpoint, resumes from it (0 steps lost) and counts no crash. `run cancel`
    mid-epoch: `run play` stops both machines as a scale-in does (their emergency checkpoint)
    and ends; `run resume` and `run play` again: the run ends with the losses and the script's
    own state of a run nothing interrupted, each step's loss on the catalog, its spend counted
    to the end; `spotrain destroy local` from the blueprint's checkout refuses while it is
    deployed; `run retire` removes its stack. Beside the stories on the environment's runs
    (on the other worker), after the one that takes a region down."""
    import shlex
    import shutil as shell_tools
    import signal
    import subprocess
    import sys
    import time

    from base_install import run_base_install
    from training import EPOCH_LOOP_LOSSES, EPOCH_LOOP_RUNNING, script_steps

    from spotrain import cli
    from spotrain.core import code_bundle, fleet_state, run_lifecycle
    from spotrain.cost import run_report
    from spotrain.localcloud.machines import process_tree, signal_all
    from spotrain.trainer import run_config
    from spotrain.trainer.storage import open_storage

    after(local, request, USERS_STORY_AFTER)
    alone(local, request, TRAINING_MACHINES)
    steps = len(EPOCH_LOOP_LOSSES)
    for name, value in control.aws_environment(local.cloud.endpoint, "us-east-1").items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SPOTRAIN_RUNS_DIR", raising=False)
    outputs = local.outputs
    events = control.resource("dynamodb", local.cloud.endpoint, "us-east-1").Table(
        outputs["events_table"])  # fmt: skip
    catalog = control.resource("dynamodb", local.cloud.endpoint, "us-east-1").Table(
        outputs["checkpoint_catalog_table"])  # fmt: skip

    def head() -> int:
        found = run_lifecycle.published_head(catalog, "mine")
        return found.step if found else 0

    # The run pins the image it trains in, as `spotrain image build` pushed it (a manifest here:
    # no engine builds images on this host).
    [registry] = local.client("ecr").describe_repositories(
        repositoryNames=["spotrain-local/trainer"])["repositories"]  # fmt: skip
    manifest = {"schemaVersion": 2,
                "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                           "size": 2, "digest": f"sha256:{'1' * 64}"}, "layers": []}  # fmt: skip
    for region in local.config.region_names:  # `image build` pushes to every region's
        pushed = local.client("ecr", region).put_image(
            repositoryName=registry["repositoryName"], imageManifest=json.dumps(manifest),
            imageTag="code-mine")["image"]["imageId"]["imageDigest"]  # fmt: skip
    image = f"{registry['repositoryUri']}@{pushed}"
    repo = tmp_path / "ml-repo"
    (repo / "runs" / "local").mkdir(parents=True)
    shell_tools.copy(ROOT / "examples" / "epoch_loop.py", repo / "train.py")
    git = ["git", "-c", "user.name=ml", "-c", "user.email=ml@example.com"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "my model"]):
        subprocess.run([*git, *command], cwd=repo, check=True)
    monkeypatch.chdir(repo)

    def declare(pinned: str) -> None:
        (repo / "runs" / "local" / "mine.toml").write_text("\n".join([
            'owner = "research@example.com"', 'team = "research"',
            'instance_types = ["g6.xlarge", "g5.xlarge"]',
            "mixed_gpus = true", "min_size = 2", "desired_size = 2", "max_size = 2",
            f'image = "{pinned}"',
            "[entry_point]", 'script = "train.py"', 'args = ["--step-seconds", "1"]',
            f"steps = {steps}", "",
        ]))  # fmt: skip

    group = "spotrain-local-mine-fleet"
    play: subprocess.Popen[str] | None = None
    played = tmp_path / "play.log"
    try:
        # An image the registry does not hold is refused before anything is deployed.
        declare(f"{registry['repositoryUri']}@sha256:{'0' * 64}")
        capsys.readouterr()
        assert cli.main(["run", "submit", "local", "mine"]) == 2
        refused = capsys.readouterr().err
        assert ("is not in the registry in us-east-1, us-west-2: push it with `spotrain image "
                "build local` (it pushes to every region)") in refused  # fmt: skip
        assert "Traceback" not in refused
        # So is a dataset nobody prepared, with the command that prepares it.
        (repo / "runs" / "local" / "unprepared.toml").write_text("\n".join([
            'owner = "research@example.com"', 'team = "research"',
            'instance_types = ["g6.xlarge", "g5.xlarge"]',
            "mixed_gpus = true", "min_size = 1", "desired_size = 1", "max_size = 1",
            "[training]", 'data = "dataset:never-prepared"', "steps = 5",
            "model = { context = 32, layers = 2, heads = 2, width = 64 }", "",
        ]))  # fmt: skip
        assert cli.main(["run", "submit", "local", "unprepared"]) == 2
        refused = capsys.readouterr().err
        assert (f"prepare it with `spotrain data prepare --store s3://{local.primary_bucket} "
                "--name never-prepared") in refused, refused  # fmt: skip
        nothing_deployed = local.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=["spotrain-local-unprepared-fleet"])  # fmt: skip
        assert nothing_deployed["AutoScalingGroups"] == []
        (repo / "runs" / "local" / "unprepared.toml").unlink()
        declare(image)
        assert cli.main(["run", "submit", "local", "mine"]) == 0
        # Its code, by content, under the run's prefix: what the machines fetch.
        capsys.readouterr()
        stored = run_config.newest(open_storage(f"s3://{local.primary_bucket}"), "mine")
        digest = stored.document["entry_point"]["code"]
        local.client("s3").head_object(Bucket=local.primary_bucket,
                                       Key=code_bundle.bundle_key("mine", digest))  # fmt: skip
        # Its machines may pull that image from the environment's registry.
        policy = local.client("iam").get_role_policy(
            RoleName=group, PolicyName="run-scoped-checkpoint-access"
        )["PolicyDocument"]
        grants = {g["Sid"]: g for g in policy["Statement"]}
        assert grants["PullRunImage"]["Resource"] in (registry["repositoryArn"],
                                                      [registry["repositoryArn"]])  # fmt: skip
        # The runbooks' starting point: every name it exports is a deployed resource.
        assert cli.main(["run", "env", "local", "mine"]) == 0
        exported = dict(w.split("=", 1) for w in shlex.split(capsys.readouterr().out)[1:])
        replica = exported["REPLICA_REGION"]
        local.client("s3").head_bucket(Bucket=exported["STORE"].removeprefix("s3://"))
        local.client("s3", replica).head_bucket(
            Bucket=exported["REPLICA_STORE"].removeprefix("s3://"))  # fmt: skip
        local.client("dynamodb").describe_table(TableName=exported["CATALOG"])
        local.client("dynamodb").describe_table(TableName=exported["EVENTS"])
        local.client("kms").describe_key(KeyId=exported["KMS_KEY"])
        local.client("kms", replica).describe_key(KeyId=exported["REPLICA_KMS_KEY"])
        assert len(local.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[exported["FLEET_GROUP"], exported["ON_DEMAND_GROUP"]])[
            "AutoScalingGroups"]) == 2  # fmt: skip
        local.client("budgets").describe_budget(AccountId=ACCOUNT, BudgetName=exported["BUDGET"])
        assert exported["RUN"] == "mine" and exported["AWS_DEFAULT_REGION"] == "us-east-1"

        with played.open("w") as log:  # as the engineer runs it, in a terminal of their own
            play = subprocess.Popen([sys.executable, "-m", "spotrain.cli", "run", "play",
                                     "local", "mine"], stdout=log, stderr=subprocess.STDOUT,
                                    text=True, cwd=repo)  # fmt: skip
        deadline = time.monotonic() + 600  # two boots and a reclaim, on a busy 2-core machine
        while head() < 5:  # past its first checkpoint
            assert play.poll() is None and time.monotonic() < deadline, played.read_text()[-4000:]
            time.sleep(0.2)
        assert cli.main(["run", "reclaim", "local", "mine"]) == 0
        said = capsys.readouterr().out
        assert "reclaimed" in said and "(spot)" in said, said
        # Resumed on the replacement, past its next checkpoint (however late the reclaim came).
        while not (resumed := re.search(r"resumed mine at step (\d+)", played.read_text())) or (
                head() <= int(resumed[1])):  # fmt: skip
            assert play.poll() is None and time.monotonic() < deadline, played.read_text()[-4000:]
            time.sleep(0.2)
        # Cancelled mid-epoch, from a laptop with the base install (no CDKTF, no Node): its
        # machines leave as a scale-in stops them; resumed later. They are paused (as slow
        # machines are) from before the cancel until `run play` has stopped both, so that the
        # time a busy host takes to cancel cannot let the run finish all its steps first.
        machines = [pid for pid in process_tree(play.pid) if pid != play.pid]
        signal_all(machines, signal.SIGSTOP)
        try:
            [cancelled] = run_base_install([["run", "cancel", "local", "mine"]], cwd=repo,
                                           env=dict(os.environ))  # fmt: skip
            assert cancelled.code == 0, cancelled
            while "left service (a scale-in)" not in played.read_text():
                assert play.poll() is None and time.monotonic() < deadline + 300, (
                    played.read_text()[-4000:])  # fmt: skip
                time.sleep(0.2)
            time.sleep(2)  # it stops every machine that left in the same turn, each at once
        finally:
            signal_all(machines, signal.SIGCONT)
        assert play.wait(timeout=300) == 0, played.read_text()[-4000:]
        output = played.read_text()
        assert "Traceback" not in output and "DataLoader worker" not in output, output[-4000:]
        assert "the group launched" in output, output[-4000:]  # the replacement, booted
        assert "left service (a scale-in)" in output, output[-4000:]
        stops = [int(s) for s in re.findall(r"stopped after step (\d+) \(", output)]
        assert len(set(stops)) == 2, output[-4000:]  # the reclaim's stop, then the cancel's
        reclaimed_at, cancelled_at = sorted(set(stops))
        assert 5 <= reclaimed_at < cancelled_at < steps, stops
        assert f"resumed mine at step {reclaimed_at}" in output  # 0 steps lost
        assert ": preempted; run mine has 0 crash(es)" in output, output[-4000:]
        assert ": stopped; run mine has 0 crash(es)" in output, output[-4000:]
        assert head() == cancelled_at  # its emergency checkpoint
        [resumed_run] = run_base_install([["run", "resume", "local", "mine"]], cwd=repo,
                                         env=dict(os.environ))  # fmt: skip
        assert resumed_run.code == 0, resumed_run
        with (tmp_path / "play-resumed.log").open("w") as log:
            play = subprocess.Popen([sys.executable, "-m", "spotrain.cli", "run", "play",
                                     "local", "mine"], stdout=log, stderr=subprocess.STDOUT,
                                    text=True, cwd=repo)  # fmt: skip
        assert play.wait(timeout=600) == 0, (tmp_path / "play-resumed.log").read_text()[-4000:]
        resumed = (tmp_path / "play-resumed.log").read_text()
        assert f"resumed mine at step {cancelled_at}" in resumed, resumed[-4000:]
        trained = script_steps(output + resumed)  # a step trained again: the later line
        assert sorted(trained) == list(range(1, steps + 1)), sorted(trained)
        # Up to float rounding (the goldens' docstring says why): a wrong batch or a lost
        # optimizer state is off by far more.
        assert [trained[s]["loss"] for s in range(1, steps + 1)] == pytest.approx(
            EPOCH_LOOP_LOSSES, rel=1e-4)  # fmt: skip
        assert [trained[s]["running"] for s in range(1, steps + 1)] == pytest.approx(
            EPOCH_LOOP_RUNNING, rel=1e-4)  # fmt: skip
        # Each step's loss is on the catalog's records (what `run status --plot` draws).
        checkpoints, _ = run_report.read_checkpoints(catalog, "mine")
        each_step = {step: loss for c in sorted(checkpoints, key=lambda c: (c.generation, c.step))
                     for step, loss in c.step_losses}  # fmt: skip
        assert each_step == {s: trained[s]["loss"] for s in range(1, steps + 1)}
        assert fleet_state.run_state(events, "mine").crashes == 0
        deadline = time.monotonic() + 60
        while run_lifecycle.read(events, "mine").finished_step is None:
            assert time.monotonic() < deadline, "the finish did not reach the handler"
            time.sleep(0.5)
        assert cli.main(["run", "status", "local", "mine", "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert (status["phase"], status["step"], status["steps"]) == ("finished", steps, steps)
        # Its progress, as people would rather look at it: the preemption and the restart.
        assert cli.main(["run", "status", "local", "mine", "--plot",
                         str(tmp_path / "mine.png")]) == 0  # fmt: skip
        assert (tmp_path / "mine.png").stat().st_size > 0
        # `run play` delivered a capacity check after the end: its spend is counted through it.
        assert (
            cli.main(
                [
                    "cost",
                    "report",
                    "--run",
                    "mine",
                    "--events-table",
                    outputs["events_table"],
                    "--catalog-table",
                    outputs["checkpoint_catalog_table"],
                ]
            )
            == 0
        )
        report = capsys.readouterr().out
        assert "not in these figures yet" not in report, report
        paid = re.search(r"paid machine time +([\d.]+) h", report)
        assert paid and float(paid[1]) > 0, report
        # Watched from the base install: every command answers; the plot names its extra.
        tables = ["--events-table", outputs["events_table"]]
        watched = run_base_install([
            ["run", "list", "local"], ["run", "status", "local", "mine", "--json"],
            ["run", "logs", "local", "mine"], ["run", "env", "local", "mine"],
            ["cost", "status", "--run", "mine", *tables],
            ["cost", "report", "--run", "mine", *tables,
             "--catalog-table", outputs["checkpoint_catalog_table"]],
            ["fleet", "status", "--group", group, "--run", "mine", *tables],
            ["checkpoints", "list", "--store", f"s3://{local.primary_bucket}", "--run", "mine",
             "--catalog-table", outputs["checkpoint_catalog_table"]],
            ["run", "status", "local", "mine", "--plot", str(tmp_path / "light.png")],
        ], cwd=repo, env=dict(os.environ))  # fmt: skip
        *answered, plot = watched
        for ran in answered:
            assert ran.code == 0 and "Traceback" not in ran.err, ran
        assert re.search(rf"mine +finished +step {steps}/{steps} \(final\)", answered[0].out), (
            answered[0])  # fmt: skip
        assert json.loads(answered[1].out)["phase"] == "finished"
        assert f"FLEET_GROUP={group}" in answered[3].out, answered[3]
        assert f"{steps}" in answered[7].out, answered[7]
        assert plot.code == 2 and "needs the plots extra" in plot.err, plot
        # Nobody destroys the environment from under it: from the blueprint's checkout, whose
        # run files do not declare it, destroy refuses before it synthesizes or changes anything.
        monkeypatch.chdir(ROOT)
        capsys.readouterr()
        assert cli.main(["destroy", "local", "--out", str(tmp_path / "cdktf.out")]) == 2
        refused = capsys.readouterr().err
        assert "local is not destroyed, nothing changed" in refused, refused
        assert "run mine is deployed but not declared in" in refused, refused
        assert "`spotrain run retire local mine` from where it was submitted first" in refused
        assert not (tmp_path / "cdktf.out").exists()
        assert local.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[group])["AutoScalingGroups"]  # fmt: skip
        monkeypatch.chdir(repo)
        assert cli.main(["run", "retire", "local", "mine"]) == 0
        retired = capsys.readouterr().out
        assert "run mine retired" in retired and "is counted to its machines' end" in retired
        assert cli.main(["run", "status", "local", "mine", "--json"]) == 0
        final = json.loads(capsys.readouterr().out)
        assert final["phase"] == "retired" and final["spend_usd"] > 0, final
    finally:
        if play is not None and play.poll() is None:
            play.send_signal(signal.SIGINT)  # Ctrl-C: its machines stop
            play.wait(timeout=200)
