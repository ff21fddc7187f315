"""Run files: each run of an environment is `runs/<env>/<run>.toml`, read and checked as a whole
before anything is synthesized; every problem of every file is listed with its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spotrain import cli
from spotrain.core.errors import ConfigError
from spotrain.stacks.runs import RunConfig, load_runs, read_run

GOOD = """
owner = "ml@example.com"
instance_types = ["g5.xlarge", "g6.xlarge"]
min_size = 1
desired_size = 2
max_size = 4
max_spend_usd = 100

[training]
data = "dataset:corpus-v1"
steps = 40
"""


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
    assert run.instance_types == ("g5.xlarge", "g6.xlarge")
    assert run.training_document() == {"data": "dataset:corpus-v1", "steps": 40, "run": "sweep-a"}
    assert run.run_tags == {"spotrain:run": "sweep-a", "spotrain:owner": "ml@example.com"}


def test_the_training_configuration_may_be_a_json_file_beside_the_run_file(tmp_path: Path) -> None:
    folder = tmp_path / "dev"
    folder.mkdir()
    (folder / "sweep.json").write_text(json.dumps({"data": "dataset:x", "steps": 5}))
    text = 'training = "sweep.json"\n' + GOOD.split("[training]")[0]
    run = read_run(write(folder, "sweep", text), "dev")
    assert run.training_document() == {"data": "dataset:x", "steps": 5, "run": "sweep"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace('owner = "ml@example.com"\n', ""), "owner is missing"),
        (GOOD.replace('["g5.xlarge", "g6.xlarge"]', '["g5.xlarge"]'), "list at least two"),
        (GOOD.replace('"g6.xlarge"]', '"g5xlarge"]'), "write it as family.size"),
        (GOOD.replace('"g6.xlarge"]', '"g5.xlarge"]'), "list each type once"),
        (GOOD.replace("min_size = 1", "min_size = 3"), "need 0 <= min <= desired <= max"),
        (GOOD.replace("min_size = 1", "min_size = 0"), "raise min_size"),
        (GOOD.replace("max_size = 4", "max_size = 4.5"), "max_size is 4.5: it must be an integer"),
        (GOOD.replace("max_spend_usd = 100", "max_spend_usd = 0"), "max_spend_usd is 0"),
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
