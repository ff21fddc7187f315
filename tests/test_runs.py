"""Run files: each run of an environment is `runs/<env>/<run>.toml`, read and checked as a whole
before anything is synthesized; every problem of every file is listed with its fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spotrain import cli
from spotrain.core.capacity import RunDeclaration
from spotrain.core.errors import ConfigError
from spotrain.stacks.runs import RunConfig, load_runs, read_run

GOOD = """
owner = "ml@example.com"
instance_types = ["g5.xlarge", "g5.2xlarge"]
min_size = 1
desired_size = 2
max_size = 4
max_spend_usd = 100

[training]
data = "dataset:corpus-v1"
steps = 40
global_batch = 96
"""

PINNED = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/spotrain-dev/trainer@sha256:{'a' * 64}"
"""An image of environment dev's registry, pinned by digest."""

BACKWARDS = """
[deadline]
started_at = 2027-01-02T00:00:00Z
finish_by = 2027-01-01T00:00:00Z
total_steps = 5
"""
NO_ZONE = """
[deadline]
started_at = 2027-01-02T09:00:00
finish_by = 2027-02-01T00:00:00Z
total_steps = 5
"""


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def test_the_repository_declares_an_environment_and_its_runs_for_each_example() -> None:
    declared = {env: [r.name for r in load_runs(env)] for env in ("local", "dev", "prod")}
    assert declared == {"local": ["demo", "second"], "dev": ["gpt-small"], "prod": ["gpt-large"]}
    prod = load_runs("prod")[0]
    assert prod.deadline is not None and prod.deadline.total_steps == 250_000
    assert prod.planned is not None and prod.planned.machine_hours == 1400
    assert prod.training_document()["run"] == "gpt-large"
    assert prod.run_tags["spotrain:owner"] == "ml-platform@example.com"


def test_a_good_file_reads_into_a_run_named_for_the_file(tmp_path: Path) -> None:
    run = read_run(write(tmp_path / "dev", "sweep-a", GOOD), "dev")
    assert isinstance(run, RunConfig)
    assert (run.name, run.environment, run.max_spend_usd) == ("sweep-a", "dev", 100)
    assert run.instance_types == ("g5.xlarge", "g5.2xlarge")
    assert run.training_document() == {"data": "dataset:corpus-v1", "steps": 40,
                                       "global_batch": 96, "run": "sweep-a"}  # fmt: skip
    assert run.run_tags == {"spotrain:run": "sweep-a", "spotrain:owner": "ml@example.com"}


def test_the_training_configuration_may_be_a_json_file_beside_the_run_file(tmp_path: Path) -> None:
    folder = tmp_path / "dev"
    folder.mkdir()
    (folder / "sweep.json").write_text(json.dumps({"data": "dataset:x", "steps": 5,
                                                   "global_batch": 12}))  # fmt: skip
    text = 'training = "sweep.json"\n' + GOOD.split("[training]")[0]
    run = read_run(write(folder, "sweep", text), "dev")
    assert run.training_document() == {"data": "dataset:x", "steps": 5, "global_batch": 12,
                                       "run": "sweep"}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace('owner = "ml@example.com"\n', ""), "owner is missing"),
        (GOOD.replace('["g5.xlarge", "g5.2xlarge"]', '["g5.xlarge"]'), "list at least two"),
        (GOOD.replace('"g5.2xlarge"]', '"g5xlarge"]'), "write it as family.size"),
        (GOOD.replace('"g5.2xlarge"]', '"g5.xlarge"]'), "list each type once"),
        (
            GOOD.replace('"g5.2xlarge"]', '"g6.xlarge"]'),
            "mix GPU models: g5.xlarge (1 x A10G 24 GiB), g6.xlarge (1 x L4 24 GiB); keep one",
        ),
        (
            GOOD.replace('"g5.2xlarge"]', '"g6e.xlarge"]').replace(
                "min_size", "mixed_gpus = true\nmin_size"
            ),
            "mix GPUs per machine or GPU memory: g5.xlarge (1 x A10G 24 GiB), g6e.xlarge",
        ),
        (GOOD.replace('"g5.2xlarge"]', '"g5.12xlarge"]'), "g5.12xlarge (4 x A10G 24 GiB)"),
        (
            GOOD.replace('"g5.2xlarge"]', '"x9.large"]'),
            "'x9.large' is not a GPU type spotrain knows: use one of spotrain/core/gpu_types.py",
        ),
        (GOOD.replace("min_size = 1", "min_size = 3"), "need 0 <= min <= desired <= max"),
        (GOOD.replace("min_size = 1", "min_size = 0"), "raise min_size"),
        (GOOD.replace("max_size = 4", "max_size = 4.5"), "max_size is 4.5: it must be an integer"),
        (GOOD.replace("max_spend_usd = 100", "max_spend_usd = 0"), "max_spend_usd is 0"),
        ("gang_timeout_minutes = 0\n" + GOOD, "gang_timeout_minutes is 0: give minutes above 0"),
        (
            'gang_timeout_minutes = "15"\n' + GOOD,
            "gang_timeout_minutes is '15': it must be a finite number",
        ),
        (GOOD.replace("max_spend_usd = 100", 'max_spend_usd = "100"'), "it must be a finite"),
        ("colour = 'red'\n" + GOOD, "colour is not a field of a run: use owner, instance_types"),
        (GOOD.replace("[training]", "[trainig]"), "training is missing"),
        (GOOD + '\n[tags]\n"spotrain:run" = "x"\n', "do not start with 'aws:' or 'spotrain:'"),
        (GOOD + "\n[planned]\nmachine_hours = 0\n", "planned.machine_hours is 0: give a positive"),
        (GOOD + "\n[planned]\nhours = 9\n", "planned.hours is not a field of [planned]"),
        (GOOD + BACKWARDS, "deadline.finish_by is not after started_at"),
        (GOOD + NO_ZONE, "is not an ISO 8601 time with its zone"),
        (GOOD + "\n[deadline]\nfinish_by = 2027-02-01T00:00:00Z\n", "started_at is missing"),
        (GOOD.replace("steps = 40", 'steps = 40\nrun = "other"'), "leave `run` out of"),
        (GOOD.replace("[training]", 'training = "missing.json"\n[unused]'), "cannot be read"),
        ("owner = \n", "it is not TOML"),
        (
            GOOD.replace("global_batch = 96", "micro_batch = 4"),
            "training.global_batch is not set, so the run keeps micro_batch x the GPUs it starts "
            "on (started on 1 machine(s): 4), which does not split evenly over 3 machine(s) of 1 "
            "GPU(s): set global_batch to a multiple of 12 (e.g. 12), or sizes whose machine "
            "counts divide one another",
        ),
        (
            GOOD.replace("global_batch = 96", "global_batch = 20"),
            "training.global_batch 20 does not split evenly over 3 machine(s) of 1 GPU(s) "
            "(min_size 1 to max_size 4)",
        ),
        ('network = "efa"\n' + GOOD, "network is 'efa' but g5.xlarge, g5.2xlarge take(s) no EFA"),
        ('network = "infiniband"\n' + GOOD, "use one of cluster, efa, tcp"),
        ('zone = "us-east-1a"\n' + GOOD, "zone is set but the run trains on tcp in every zone"),
        ('image = "spotrain:latest"\n' + GOOD, "image 'spotrain:latest' is not pinned by digest"),
        (
            f'image = "{PINNED.replace("spotrain-dev", "spotrain-prod")}"\n' + GOOD,
            "is not in environment dev's registry",
        ),
        (
            f'image = "{PINNED.replace("dkr.ecr", "registry")}"\n' + GOOD,
            "pull only from ACCOUNT.dkr.ecr.REGION.amazonaws.com/spotrain-dev/trainer",
        ),
    ],
)
def test_a_bad_run_file_is_reported_with_its_fix(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        read_run(write(tmp_path / "dev", "sweep", text), "dev")
    assert any(expected in p for p in caught.value.problems), caught.value.problems


def test_every_problem_of_every_run_file_is_listed_at_once(tmp_path: Path) -> None:
    write(tmp_path / "dev", "good", GOOD)
    write(tmp_path / "dev", "Bad_Name", GOOD)
    write(tmp_path / "dev", "bad", "x = 1\n" + GOOD.replace("min_size = 1", "min_size = 9"))
    long_name = "a" * 50
    write(tmp_path / "dev", long_name, GOOD)
    with pytest.raises(ConfigError) as caught:
        load_runs("dev", tmp_path)
    problems = caught.value.problems
    assert any(p.startswith("Bad_Name.toml: the file's name:") for p in problems), problems
    assert any(p.startswith("bad.toml: x is not a field") for p in problems), problems
    assert any(p.startswith(f"{long_name}.toml: the run's name is too long") for p in problems)
    assert not any(p.startswith("good.toml") for p in problems)


def test_the_app_refuses_bad_run_files_in_one_message_before_synthesis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "runs" / "dev", "gpt-small", GOOD.replace("min_size = 1", "min_size = 9"))
    monkeypatch.setenv("SPOTRAIN_RUNS_DIR", str(tmp_path / "runs"))
    assert cli.main(["synth", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "gpt-small.toml: sizes min_size=9" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_pull_requests_synth_lists_every_problem_of_every_run_file_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `run submit` would refuse after merging is refused by the pull request's synth, all
    at once: a mistyped field no longer hides the values that are wrong, the training
    configuration is checked as the trainer checks it, and what a run names of its environment
    (a team, a zone) is judged beside the rest, in every environment."""
    mistyped = (GOOD.replace("min_size = 1", "min_size = 3\npriority = \"high\"")
                .replace("max_size = 4", 'max_size = 1\nteam = "nobody"')
                .replace("steps = 40", "steps = 40\ncheckpoint_every = 0"))  # fmt: skip
    write(tmp_path / "runs" / "local", "mistyped", mistyped)
    no_owner = GOOD.replace('owner = "ml@example.com"', "").replace(
        "max_spend_usd = 100", "max_spend_usd = 0"
    )
    write(tmp_path / "runs" / "local", "no-owner", no_owner)
    efa = GOOD.replace('["g5.xlarge", "g5.2xlarge"]', '["p5en.48xlarge", "p5e.48xlarge"]')
    write(
        tmp_path / "runs" / "prod",
        "far",
        'zone = "us-east-1z"\n'
        + efa.replace("global_batch = 96", "global_batch = 96\nlog_every = 0"),
    )
    late = '\n[deadline]\nfinish_by = "yesterday"\nchangeover_minutes = -3\n'
    write(tmp_path / "runs" / "local", "late", GOOD + late)  # a table missing fields
    monkeypatch.setenv("SPOTRAIN_RUNS_DIR", str(tmp_path / "runs"))
    assert cli.main(["synth", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
    for said in (
        "late.toml: deadline.started_at is missing",
        "late.toml: deadline.finish_by 'yesterday' is not an ISO 8601 time",
        "late.toml: deadline.changeover_minutes is -3",
        "mistyped.toml: priority is 'high': it must be an integer",
        "mistyped.toml: sizes min_size=3 desired_size=2 max_size=1 are not ordered",
        "mistyped.toml: team 'nobody' is not one of environment local's teams",
        "mistyped.toml: training.checkpoint_every is 0: use 1 or more",
        "no-owner.toml: owner is missing",
        "no-owner.toml: max_spend_usd is 0",
        "far.toml: zone 'us-east-1z' is not one of environment prod's",
        "far.toml: training.log_every is 0",
    ):
        assert said in err, (said, err)
    # What is said of the owner's stand-in, or through it, is not said.
    assert "stand-in" not in err and "owner 'stand-in'" not in err


def test_run_submit_refuses_what_synth_refuses_before_it_reaches_the_cloud(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run submit` reads its file as synth does (its training configuration and its team
    judged too), before it asks the environment anything: no cloud is needed to be refused."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    bad = GOOD.replace("steps = 40", "steps = 40\ncheckpoint_every = 0")
    write(tmp_path / "runs" / "local", "bad", 'team = "nobody"\n' + bad)
    monkeypatch.setenv("SPOTRAIN_RUNS_DIR", str(tmp_path / "runs"))
    assert cli.main(["run", "submit", "local", "bad"]) == 2
    err = capsys.readouterr().err
    assert "training.checkpoint_every is 0" in err and "team 'nobody' is not one of" in err


def test_a_run_that_pins_its_image_boots_and_may_pull_that_image_only(tmp_path: Path) -> None:
    """The image is part of the run's definition: its launch template writes it for the boot
    script (a changed image is a changed template, shown in the run's plan), and its machines
    may pull from the environment's registry through its endpoints, which a run on the baked
    image may not at all."""
    from helpers import load_stack, resources

    from spotrain.cdk import App
    from spotrain.core.image_reference import REGISTRY_PULL_ACTIONS, image_in_region
    from spotrain.stacks.app import add_environment
    from spotrain.stacks.environments import all_environments

    pinned = read_run(write(tmp_path / "dev", "pinned", f'image = "{PINNED}"\n' + GOOD), "dev")
    baked = read_run(write(tmp_path / "dev", "baked", GOOD), "dev")
    assert (pinned.image, baked.image) == (PINNED, None)
    [dev] = [c for c in all_environments() if c.name == "dev"]
    app = App(outdir=str(tmp_path / "out"))
    add_environment(app, dev, runs=(pinned, baked))
    app.synth()

    def fleet(run: str, provider: str) -> tuple[str, dict[str, Any]]:
        stack = load_stack(tmp_path / "out", f"dev-run-{run}")
        [template] = [t for t in resources(stack, "aws_launch_template").values()
                      if t.get("provider", "aws") == provider]  # fmt: skip
        [policy] = [p for n, p in resources(stack, "aws_iam_role_policy").items()
                    if "RunScoped" in n and p.get("provider", "aws") == provider]  # fmt: skip
        document = stack["data"]["aws_iam_policy_document"]
        key = policy["policy"].split(".")[2]
        return template["user_data"], {s["sid"]: s for s in document[key]["statement"]}

    # Each region's machines pull the pinned image from their own region's repository.
    for region, provider in (("us-east-1", "aws"), ("us-west-2", "aws.replica")):
        user_data, grants = fleet("pinned", provider)
        here = image_in_region(PINNED, region)
        assert "SPOTRAIN_IMAGE=%s" in user_data and f'"{here}"' in user_data
        pull = grants["PullRunImage"]
        assert pull["actions"] == list(REGISTRY_PULL_ACTIONS)
        [repository] = pull["resources"]
        assert repository.startswith(f"arn:aws:ecr:{region}:")
        assert repository.endswith(":repository/spotrain-dev/trainer")
        for sid in ("PullRunImage", "RegistryLogin"):
            [through] = grants[sid]["condition"]
            assert through["variable"] == "aws:SourceVpce" and len(through["values"]) == 2
            assert all("EcrApiEndpoint" in v or "EcrDkrEndpoint" in v for v in through["values"])
        user_data, grants = fleet("baked", provider)
        assert f'"{here}"' not in user_data and '""' in user_data  # the baked image
        assert not any(a.startswith("ecr:") for g in grants.values() for a in g["actions"])


def test_an_efa_run_trains_in_one_of_its_environments_zones(tmp_path: Path) -> None:
    from spotrain.cdk import App
    from spotrain.stacks.app import add_environment
    from spotrain.stacks.environments import all_environments

    efa = GOOD.replace('["g5.xlarge", "g5.2xlarge"]', '["p5en.48xlarge", "p5e.48xlarge"]')
    run = read_run(write(tmp_path / "prod", "far", 'zone = "us-east-1z"\n' + efa), "prod")
    assert (run.network_mode, run.zone) == ("cluster", "us-east-1z")
    [prod] = [c for c in all_environments() if c.name == "prod"]
    with pytest.raises(ConfigError) as caught:
        add_environment(App(outdir=str(tmp_path / "out")), prod, runs=(run,))
    assert "zone 'us-east-1z' is not one of environment prod's: use one of us-east-1a" in str(
        caught.value
    )


def test_a_run_declares_its_team_priority_and_machines_and_must_name_a_team_of_its_environment(
    tmp_path: Path,
) -> None:
    import dataclasses

    from spotrain.core.admission import Team
    from spotrain.stacks import environments
    from spotrain.stacks.run import run_declaration

    run = read_run(write(tmp_path / "dev", "sweep-a", 'team = "vision"\npriority = 5\n'
                         "gang_timeout_minutes = 0.5\n" + GOOD), "dev")  # fmt: skip
    dev = dataclasses.replace(environments.dev(), teams=(Team(name="vision", gpus=8),))
    declared = run_declaration(dev, run)
    assert declared.gang_timeout_minutes == 0.5
    assert RunDeclaration.from_json(declared.to_json(), run="sweep-a") == declared
    # Two machines: the on-demand coordinator and one spot, g5.2xlarge's 8 vCPUs the most.
    assert (declared.team, declared.priority, declared.gpus) == ("vision", 5, 2)
    assert declared.vcpus == {"spot/G and VT": 8, "on-demand/G and VT": 8}
    nlp = dataclasses.replace(run, team="nlp")
    with pytest.raises(ConfigError, match="team 'nlp' is not one of environment dev's teams: "
                       "set team to one of vision"):  # fmt: skip
        run_declaration(dev, nlp)
    assert run_declaration(environments.dev(), nlp).team == "nlp"  # no teams: not judged
