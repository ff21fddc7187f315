"""A run of the user's own training script: declared by its entry point, stored as the run's
configuration, started by `spotrain train` with the run's coordinates in the environment, each
rank's process run as `python SCRIPT ARGS` would and ended as the run's stop requires. The
fleet story (reclaimed, resumed with the same losses) is in test_integration_local_apply."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spotrain import cli
from spotrain.core.entry_point import COORDINATES, EntryPoint
from spotrain.core.errors import ConfigError
from spotrain.stacks.runs import read_run
from spotrain.trainer import entry_point, membership
from spotrain.trainer.checkpointer import Checkpointer

RUN_FILE = """owner = "research@example.com"
instance_types = ["g6.xlarge", "g5.xlarge"]
mixed_gpus = true
[entry_point]
script = "examples/train_llama.py"
args = ["--steps", "200"]
steps = 200
"""


def test_a_run_file_with_an_entry_point_stores_the_script_and_its_arguments(
    tmp_path: Path,
) -> None:
    """In the user's own repository: the script is found from its root (above runs/)."""
    path = tmp_path / "runs" / "dev" / "llama.toml"
    path.parent.mkdir(parents=True)
    path.write_text(RUN_FILE)
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "train_llama.py").write_text("print('my own model')\n")
    run = read_run(path, "dev")
    assert run.code_root == tmp_path.resolve()
    assert run.entry_point == EntryPoint(script="examples/train_llama.py",
                                         args=("--steps", "200"), steps=200)  # fmt: skip
    assert run.training_document() == {"run": "llama", "entry_point": {
        "script": "examples/train_llama.py", "args": ["--steps", "200"], "steps": 200}}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('script = "examples/train_llama.py"', 'script = "examples/train_lama.py"'),
         "entry_point.script examples/train_lama.py is not in the repository that declares"),
        (('script = "examples/train_llama.py"', 'module = "x"\nscript = "examples/a.py"'),
         "give exactly one"),
        (('script = "examples/train_llama.py"', 'script = "/abs/train.py"'),
         "relative to the repository's root (the folder above runs/)"),
        (('args = ["--steps", "200"]', "args = [1, 2]"), "entry_point.args is [1, 2]"),
        (('[entry_point]', '[training]\nsteps = 3\n[entry_point]'), "exactly one of them"),
        (('steps = 200', 'steps = 0'), "entry_point.steps is 0"),
    ],
)  # fmt: skip
def test_a_bad_entry_point_is_reported_with_its_fix(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    path = tmp_path / "dev" / "llama.toml"
    path.parent.mkdir()
    path.write_text(RUN_FILE.replace(*change))
    with pytest.raises(ConfigError) as caught:
        read_run(path, "dev")
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems


def test_the_checkpointer_finds_the_runs_coordinates_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(COORDINATES["run"], "from-env")
    monkeypatch.setenv(COORDINATES["store"], f"file://{tmp_path / 'store'}")
    monkeypatch.setenv(COORDINATES["work_dir"], str(tmp_path / "work"))
    found = Checkpointer()
    assert (found.run, found.storage.uri, found.work_dir) == (
        "from-env", f"file://{tmp_path / 'store'}", tmp_path / "work")  # fmt: skip
    assert Checkpointer(run="given").run == "given"  # what the loop passes wins


def test_a_checkpointer_with_no_run_anywhere_says_how_to_give_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in COORDINATES.values():
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(ConfigError) as caught:
        Checkpointer()
    assert caught.value.problems == [
        "run is not given and SPOTRAIN_RUN is not set: pass run=..., or start the script with "
        "`spotrain train` (on the fleet, the run's machines do), which sets it",
        "store is not given and SPOTRAIN_STORE is not set: pass store=..., or start the script "
        "with `spotrain train` (on the fleet, the run's machines do), which sets it",
    ]


def test_a_stored_entry_point_is_checked_as_a_whole_and_gives_the_coordinates(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"run": "llama", "entry_point": {
        "script": "train.py", "args": ["--x"], "colour": 1}, "learning_rate": 3}))  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        entry_point.load(path)
    assert caught.value.problems == [
        "unknown field 'learning_rate': a run with an entry point takes catalog_table, "
        "entry_point, kms_key_id, run, spot_notice_endpoint, store, work_dir (its script's own "
        "settings go in entry_point.args)",
        "unknown field entry_point.'colour': use args, code, module, script, steps",
    ]
    path.write_text(json.dumps({"run": "llama", "entry_point": {"script": "train.py"}}))
    loaded = entry_point.load(path, ["store=s3://bucket", "work_dir=/mnt/spotrain/work"])
    assert loaded.environment() == {
        "SPOTRAIN_RUN": "llama", "SPOTRAIN_STORE": "s3://bucket",
        "SPOTRAIN_CHECKPOINT_WORK_DIR": "/mnt/spotrain/work"}  # fmt: skip


def test_spotrain_train_refuses_an_entry_point_that_is_not_in_the_code_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"run": "llama", "store": f"file://{tmp_path}/store",
                                "entry_point": {"script": "missing.py"}}))  # fmt: skip
    assert cli.main(["train", str(path)]) == 2
    error = capsys.readouterr().err
    assert f"entry_point.script missing.py is not in the code folder {tmp_path}" in error
    assert "Traceback" not in error


def test_each_rank_runs_the_script_with_its_arguments_and_exits_with_its_status(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, helper\n"  # beside the script: importable, as under `python SCRIPT`
        "print(__name__, sys.argv)\n"
        "sys.exit(int(sys.argv[-1]))\n"
    )
    (tmp_path / "helper.py").write_text("")

    def rank(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "spotrain.trainer.entry_point", "--script",
                               str(script), "--", *args], capture_output=True, text=True,
                              timeout=60)  # fmt: skip

    finished = rank("--steps", "0")
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout == f"__main__ ['{script}', '--steps', '0']\n"
    assert rank("3").returncode == 3  # a failing script fails its rank (torchrun sees it)


def test_a_stopped_machine_exits_to_rejoin_or_leave_as_the_run_decided() -> None:
    assert membership.exit_status(None) == 0  # trained to the end
    assert membership.exit_status(membership.Stop(rejoin=True, leave=False)) == (
        membership.REJOIN_EXIT)  # fmt: skip
    assert membership.exit_status(membership.Stop(rejoin=False, leave=False)) == 0


def test_the_users_repository_is_stored_once_by_its_content_and_machines_run_that_code(
    tmp_path: Path,
) -> None:
    """`run submit` packs the repository that declares the run (what git tracks) and stores it
    under the run's prefix by its digest; `spotrain train` on a machine fetches it, checks it,
    and runs the script in it, wherever it was started."""
    import gzip
    import io
    import os
    import tarfile

    from spotrain.core import code_bundle
    from spotrain.core.errors import SpotrainError
    from spotrain.trainer.storage import LocalStorage

    repo = tmp_path / "ml-repo"
    (repo / "runs" / "dev").mkdir(parents=True)
    (repo / "runs" / "dev" / "mine.toml").write_text(RUN_FILE.replace(
        "examples/train_llama.py", "train.py"))  # fmt: skip
    (repo / "train.py").write_text(
        "import os, pathlib\npathlib.Path(os.environ['MARK']).write_text(os.getcwd())\n"
    )
    (repo / ".gitignore").write_text(".venv/\n")
    (repo / ".venv").mkdir()
    (repo / ".venv" / "big.bin").write_bytes(b"\0" * 1000)  # ignored: not code
    git = ["git", "-c", "user.name=ml", "-c", "user.email=ml@example.com"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "my model"]):
        subprocess.run([*git, *command], cwd=repo, check=True)
    storage = LocalStorage(tmp_path / "store")
    packed, digest = code_bundle.pack(repo)
    assert code_bundle.pack(repo) == (packed, digest)  # the same code, the same bytes
    entry_point.store_code(storage, "mine", packed, digest)
    entry_point.store_code(storage, "mine", packed, digest)  # stored once
    key = code_bundle.bundle_key("mine", digest)
    assert storage.list("runs/mine/code/") == [key]
    bundle = storage.get_bytes(key)
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        assert tar.getnames() == [".gitignore", "runs/dev/mine.toml", "train.py"]
    with pytest.raises(SpotrainError, match="the run's code bundle is damaged"):
        code_bundle.unpack(bundle + b"\0", digest, tmp_path / "damaged")
    escaping = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=escaping, mode="wb") as zipped,
        tarfile.open(fileobj=zipped, mode="w") as tar,
    ):
        tar.addfile(tarfile.TarInfo("../outside.py"), io.BytesIO(b""))
    crafted = escaping.getvalue()
    import hashlib

    with pytest.raises(SpotrainError, match="not a file inside it"):
        code_bundle.unpack(crafted, f"sha256:{hashlib.sha256(crafted).hexdigest()}",
                           tmp_path / "escaping")  # fmt: skip

    config = tmp_path / "run.json"
    config.write_text(
        json.dumps(
            {
                "run": "mine",
                "store": f"file://{tmp_path}/store",
                "work_dir": str(tmp_path / "work"),
                "entry_point": {"script": "train.py", "code": digest},
            }
        )
    )
    mark = tmp_path / "ran-in"
    started = [sys.executable, "-m", "spotrain.cli", "train", str(config), "--nproc-per-node", "1"]
    done = subprocess.run(started, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MARK": str(mark)})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert mark.read_text() == str(tmp_path / "work" / "code" / digest.removeprefix("sha256:"))
