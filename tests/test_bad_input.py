"""Bad input on every surface of `spotrain` ends with one message that names the fix and a
non-zero exit: never a traceback, never silent acceptance. (The environment configuration's
own battery is in test_config.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotrain import cli
from spotrain.cli import infra
from spotrain.cli import train as train_command
from spotrain.trainer import checkpoint_store
from spotrain.trainer.catalog import StoreCatalog
from spotrain.trainer.data import synthetic_corpus, write_token_file
from spotrain.trainer.storage import LocalStorage

RUN = "bad-input"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("data")
    return str(write_token_file(folder / "corpus", synthetic_corpus(5_000)))


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case must stop before torchrun would take over the process."""

    def launched(*args: Any) -> None:
        raise AssertionError(f"torchrun was started: {args}")

    monkeypatch.setattr(train_command.os, "execv", launched)


def fails_clearly(capsys: pytest.CaptureFixture[str], argv: list[str], *expected: str) -> str:
    """Run `spotrain ARGV`: it must exit non-zero with one error message (no traceback) that
    holds every `expected` fragment."""
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse's own usage errors
        code = int(exit_.code or 0)
    out = capsys.readouterr()
    assert code != 0, out.out
    assert "Traceback" not in out.err and out.err.count("error:") == 1, out.err
    for fragment in expected:
        assert fragment in out.err, out.err
    return out.err


def good_config(tmp_path: Path, data: str, **changes: Any) -> dict[str, Any]:
    return {"run": RUN, "store": f"file://{tmp_path / 'store'}", "data": data, "steps": 4,
            "work_dir": str(tmp_path / "work"),
            "model": {"context": 16, "layers": 1, "heads": 1, "width": 16}, **changes}  # fmt: skip


TRAIN_CASES = [
    ("array", [1, 2], [], ["holds a JSON array, not an object"]),
    ("heads-zero", {"model": {"heads": 0}}, [], ["model.heads is 0: use 1 or more"]),
    ("width-not-multiple", {"model": {"width": 30, "heads": 4}}, [],
     ["model.width 30 is not a multiple of model.heads 4"]),
    ("model-string", {"model": "small"}, [], ["model is 'small': it must be an object"]),
    ("set-model-number", {}, ["--set", "model=5"], ["model is 5: it must be an object"]),
    ("layers-negative", {"model": {"layers": -1}}, [], ["model.layers is -1: use 1 or more"]),
    ("run-empty", {"run": ""}, [], ["run name '' is not valid"]),
    ("run-with-slash", {"run": "a/b"}, [], ["run name 'a/b' is not valid"]),
    ("steps-float", {"steps": 2.5}, [], ["steps is 2.5: it must be an integer"]),
    ("steps-bool", {"steps": True}, [], ["steps is True: it must be an integer"]),
    # A mistyped value hides no other: each value that is wrong is named beside it.
    ("mistyped-and-wrong",
     {"steps": "4", "checkpoint_every": 0, "model": {"layers": "2", "heads": 0}},
     [], ["steps is '4': it must be an integer", "checkpoint_every is 0: use 1 or more",
          "model.layers is '2'", "model.heads is 0: use 1 or more"]),
    ("learning-rate-inf", {"learning_rate": 1e999}, [], ["learning_rate is inf"]),
    ("seed-negative", {"seed": -1}, [], ["seed is -1: use 0 or more"]),
    ("store-scheme", {"store": "gs://bucket/x"}, [], ["not gs://"]),
    ("store-relative-file-url", {"store": "file://rel/dir"}, [],
     ["names the host 'rel', not a folder"]),
    ("store-bucket-name", {"store": "s3://Bad_Bucket"}, [], ["is not an S3 bucket name"]),
    ("data-missing", {"data": "/no/such/corpus.bin"}, [], ["token file /no/such/corpus.bin"]),
    ("dataset-missing", {"data": "dataset:nope"}, [], ["dataset 'nope' is not in file://"]),
    ("dataset-uri-names-none", {"data": "s3://bucket/corpus"}, [], ["names no dataset"]),
    ("vocab-too-small", {"model": {"vocab_size": 100}}, [],
     ["the data has 256 token ids but model.vocab_size is 100"]),
    ("context-too-long", {"model": {"context": 100_000, "heads": 1, "width": 16}}, [],
     ["too few for context 100000"]),
    ("unknown-model-field", {"model": {"depth": 3}}, [], ["unknown field model.'depth'"]),
    ("nproc-zero", {}, ["--nproc-per-node", "0"], ["give a whole number of at least 1"]),
    ("nnodes-backwards", {}, ["--nnodes", "4:2"], ["1 <= MIN <= MAX"]),
    ("rendezvous-without-port", {}, ["--nnodes", "2", "--rdzv-endpoint", "host"],
     ["write HOST:PORT"]),
    ("shutdown-timeout-zero", {}, ["--shutdown-timeout", "0"], ["at least 1"]),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "flags", "expected"),
                         [pytest.param(*c[1:], id=c[0]) for c in TRAIN_CASES])  # fmt: skip
@pytest.mark.usefixtures("no_launch")
def test_spotrain_train_refuses_bad_input_before_anything_starts(
    changes: Any, flags: list[str], expected: list[str], tmp_path: Path, data: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    document: Any = changes
    if isinstance(changes, dict):
        base = good_config(tmp_path, data)
        model = changes.get("model", {})
        merged = {**base["model"], **model} if isinstance(model, dict) else model
        document = {**base, **changes, "model": merged}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(document))
    fails_clearly(capsys, ["train", str(path), *flags], *expected)
    assert not (tmp_path / "store").exists()  # nothing touched the run


def test_the_good_configuration_of_those_cases_would_start(
    tmp_path: Path, data: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The battery above changes one thing at a time from a configuration that passes."""
    started: list[list[str]] = []
    monkeypatch.setattr(train_command.os, "execv", lambda _, command: started.append(command))
    path = tmp_path / "run.json"
    path.write_text(json.dumps(good_config(tmp_path, data)))
    assert cli.main(["train", str(path), "--nproc-per-node", "1"]) == 0
    assert started and started[0][-2:] == ["spotrain.trainer.train", str(path)]


def test_a_rank_that_cannot_start_takes_no_lease(tmp_path: Path) -> None:
    """A rank started by hand (or an older launcher) with a missing data file stops before it
    reaches the catalog: the catalog here is unreachable, and the error is about the data."""
    path = tmp_path / "run.json"
    config = good_config(tmp_path, "/no/such/data.bin", catalog_table="catalog")
    path.write_text(json.dumps(config))
    unreachable = {"AWS_ENDPOINT_URL": "https://127.0.0.1:9", "AWS_DEFAULT_REGION": "us-east-1",
                   "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
                   "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "spotrain.trainer.train", str(path)], capture_output=True,
        text=True, env={**os.environ, **unreachable}, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "token file /no/such/data.bin" in result.stderr
    assert "catalog" not in result.stderr and "Traceback" not in result.stderr


# --- spotrain checkpoints -------------------------------------------------------------------
@pytest.fixture
def folder_run(tmp_path: Path) -> list[str]:
    storage = LocalStorage(tmp_path / "store")
    folder = tmp_path / "ckpt"
    (folder / "step_000000010").mkdir(parents=True)
    (folder / "step_000000010" / "model.pt").write_bytes(b"weights" * 100)
    checkpoint_store.publish(folder, storage=storage, catalog=StoreCatalog(storage, RUN),
                       generation=0, run=RUN, step=10, world_size=1, zero_stage=2,
                       config_hash="x", code_version="test")  # fmt: skip
    return ["--store", f"file://{tmp_path / 'store'}", "--run", RUN]


def test_checkpoint_commands_name_the_fix_for_bad_arguments(
    folder_run: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = folder_run
    for argv, expected in [
        (["quarantine", *store, "--step", "11", "--reason", "x"], "no checkpoint at step 11"),
        (["rollback", *store, "--step", "11", "--reason", "x"], "step 11 is not a complete"),
        (["quarantine", *store, "--step", "10"], "needs --step N and --reason TEXT"),
        (["show", *store, "--step", "-1"], "at least 0"),
        (["verify", *store, "--step", "99"], "no checkpoint at step 99"),
        (["gc", *store, "--keep", "1"], "at least 2"),
        (["restore", *store], "restore needs --to DIR"),
        (["restore", *store, "--to", str(Path(store[1].removeprefix("file://")))],
         "not empty and holds no earlier restore"),
        (["list", "--store", "file://rel/dir", "--run", RUN], "file:///absolute/path"),
        (["list", "--store", "gs://b", "--run", RUN], "file:// paths or s3:// buckets"),
        (["list", *store[:2], "--run", "Bad Run"], "run name 'Bad Run' is not valid"),
    ]:  # fmt: skip
        fails_clearly(capsys, ["checkpoints", *argv], expected)
    # A manifest that is not one (written by hand, damaged): one message, not a traceback.
    catalog = StoreCatalog(LocalStorage(tmp_path / "store"), RUN)
    manifest = tmp_path / "store" / catalog.head().manifest_key  # type: ignore[union-attr]
    manifest.write_text("[1, 2")
    fails_clearly(capsys, ["checkpoints", "show", *store], "is damaged")
    fails_clearly(capsys, ["checkpoints", "verify", *store], "is damaged")


def test_no_region_names_the_variable_boto3_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """boto3 reads AWS_DEFAULT_REGION (or the config file), never AWS_REGION: a shell that set
    only AWS_REGION is told the one line that works."""
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    fails_clearly(
        capsys,
        ["fleet", "status", "--group", "g"],
        "export AWS_DEFAULT_REGION=$AWS_REGION: boto3 does not read AWS_REGION",
    )
    monkeypatch.delenv("AWS_REGION")
    fails_clearly(capsys, ["fleet", "status", "--group", "g"],
                  "no AWS region: export AWS_DEFAULT_REGION=<region>")  # fmt: skip


def test_a_region_that_does_not_answer_is_told_apart_from_a_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """During a region outage an operator's command (`checkpoints list`, `cost status`, read
    from the home region as the shell points) is told to work from another region, as the
    region-down runbook does; a refusal keeps its own fix (credentials, the table's name). The
    region named is the one the failed call went to, which for a store may not be the shell's."""
    import boto3
    from botocore.exceptions import ClientError

    from spotrain.core.errors import SpotrainError, aws_errors
    from spotrain.trainer.catalog import DynamoCatalog

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")

    def answer(status: int, code: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": code},
                            "ResponseMetadata": {"HTTPStatusCode": status}}, "Query")  # fmt: skip

    down, refused = answer(503, "ServiceUnavailable"), answer(400, "AccessDeniedException")
    outage = "us-east-1 does not answer: during a region outage point the command at another region"
    for error, said, unsaid in (
        (down, outage, "check the table"),
        (refused, "check the table", outage),
    ):
        with (
            pytest.raises(SpotrainError) as caught,
            aws_errors("the events table", "check the table"),
        ):
            raise error
        assert said in str(caught.value) and unsaid not in str(caught.value)
    catalog = DynamoCatalog("catalog", "demo", storage=None,  # type: ignore[arg-type]
                            client=boto3.client("dynamodb", region_name="us-east-1"))  # fmt: skip
    assert outage in str(catalog._error("query", down))
    assert "permissions on the table" in str(catalog._error("query", refused))
    assert outage not in str(catalog._error("query", refused))
    # The store's own requests alike, naming its bucket's region (the replica's bucket, read
    # from a shell still pointed at home); S3's throttling (a 503 from a region that answers)
    # is not an outage.
    from spotrain.trainer.storage import S3Storage

    storage = S3Storage("bucket", "", client=boto3.client("s3", region_name="eu-west-1"))

    def said(error: ClientError) -> str:
        return str(storage._error("listing of", "runs/", error, writing=False))

    bucket_down = outage.replace("us-east-1", "eu-west-1")
    throttled = said(answer(503, "SlowDown"))
    assert bucket_down in said(down) and outage not in said(down)
    assert bucket_down not in said(answer(403, "AccessDenied"))
    assert "slow down" in throttled and bucket_down not in throttled


def test_an_operators_read_in_an_outage_gives_up_after_the_machines_tries_and_names_the_region(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`spotrain cost status` (and every command's AWS client) retries as the store and catalog
    do (botocore's standard mode, 6 tries), not boto3's default (10 tries for DynamoDB, about
    25 s of waiting), then names the region that did not answer."""
    import time

    import boto3
    from botocore.awsrequest import AWSResponse

    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    for variable in ("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # the backoff between tries
    boto3.setup_default_session()
    sent: list[str] = []

    class NoBody:
        def stream(self, **_: Any) -> Iterator[bytes]:
            yield b""

    def region_down(request: Any, **_: Any) -> AWSResponse:
        sent.append(request.url)
        return AWSResponse(request.url, 503, {}, NoBody())

    boto3.DEFAULT_SESSION.events.register("before-send.dynamodb", region_down)
    fails_clearly(capsys, ["cost", "status", "--events-table", "events", "--run", "demo"],
                  "the events table events cannot be read",
                  "eu-west-1 does not answer: during a region outage")  # fmt: skip
    assert len(sent) == 6 and all("eu-west-1" in url for url in sent), sent


def test_the_local_environment_from_a_shell_not_pointed_at_the_local_cloud_says_how_to_point_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run list local` from a fresh shell: not "check your credentials" but the one line that
    points the shell at the local cloud; another environment is told to check its deployment."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                 "AWS_SESSION_TOKEN", "AWS_PROFILE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    import boto3

    from spotrain.cli import run_status

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # no keys another test left
    for action in (["list", "local"], ["submit", "local", "demo"]):
        fails_clearly(capsys, ["run", *action], 'eval "$(spotrain local env)"')
    fails_clearly(capsys, ["run", "list", "dev"], "`spotrain deploy dev`", "credentials")
    # With keys, AWS's regions do not hold the local environment's tables (or do not answer).
    monkeypatch.setattr(run_status, "region_answers", lambda *_: False)
    fails_clearly(capsys, ["run", "list", "local"], "no region of environment local answers",
                  'eval "$(spotrain local env)"')  # fmt: skip


def test_checkpoint_commands_name_the_fix_for_missing_aws_resources(
    dynamo: Any, folder_run: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    missing_bucket = ["--store", "s3://no-such-bucket", "--run", RUN]
    fails_clearly(capsys, ["checkpoints", "list", *missing_bucket],
                  "bucket 'no-such-bucket' does not exist")  # fmt: skip
    fails_clearly(capsys, ["checkpoints", "list", *folder_run, "--catalog-table", "nope"],
                  "catalog table 'nope' does not exist")  # fmt: skip
    with_table = [*folder_run, "--catalog-table", "catalog"]
    fails_clearly(capsys, ["checkpoints", "quarantine", *with_table, "--step", "5",
                           "--reason", "x"], "no checkpoint at step 5")  # fmt: skip
    fails_clearly(capsys, ["checkpoints", "rollback", *with_table, "--step", "5",
                           "--reason", "x"], "step 5 is not a complete checkpoint")  # fmt: skip


# --- spotrain local, and the entry point itself ---------------------------------------------
def test_local_cloud_commands_refuse_bad_ports_regions_and_patterns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fails_clearly(capsys, ["local", "up", "--port", "70000"], "at most 65535")
    fails_clearly(capsys, ["local", "up", "--port", "-1"], "at least 0")
    fails_clearly(capsys, ["rehearse", "--port", "http"], "give a whole number")
    fails_clearly(capsys, ["local", "fault", "region-down", "not-a-region"],
                  "'not-a-region' is not an AWS region")  # fmt: skip
    fails_clearly(capsys, ["local", "fault", "replication-pending", "bucket-only"],
                  "write BUCKET/KEY-PATTERN")  # fmt: skip
    fails_clearly(capsys, ["local", "fault", "unavailable", "b/k", "none"],
                  "REQUESTS is 'none'")  # fmt: skip
    fails_clearly(capsys, ["local", "fault", "sideways"], "name a fault")
    fails_clearly(capsys, ["deploy", "staging"], "choose one of local, dev, prod")
    fails_clearly(capsys, ["fleet", "scale", "--group", "g", "--desired", "-2"], "at least 0")


def test_an_unexpected_error_says_it_is_a_bug_and_shows_the_trace_only_under_debug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(args: Any) -> int:
        raise KeyError("surprise")

    monkeypatch.setattr(infra, "cmd_synth", broken)
    assert cli.main(["synth"]) == 70
    err = capsys.readouterr().err
    assert "This is a bug in spotrain" in err and "--debug" in err and "Traceback" not in err
    assert cli.main(["--debug", "synth"]) == 70
    assert "Traceback" in capsys.readouterr().err


def test_an_upload_aws_refused_is_said_as_aws_refusing_it_not_as_a_bug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """s3transfer wraps a refused upload (a bucket policy's 403) in its own exception."""
    from boto3.exceptions import S3UploadFailedError

    def refused(args: Any) -> int:
        raise S3UploadFailedError("Failed to upload x to b/k: An error occurred (403) when "
                                  "calling the PutObject operation: Forbidden")  # fmt: skip

    monkeypatch.setattr(infra, "cmd_synth", refused)
    assert cli.main(["synth"]) == 2
    err = capsys.readouterr().err
    assert "AWS refused or could not be reached" in err and "Forbidden" in err
    assert "This is a bug" not in err


def test_a_missing_library_names_its_extra_and_any_other_is_a_bug_not_a_trace(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def lacking(name: str) -> Any:
        def synth(args: Any) -> int:
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)

        return synth

    monkeypatch.setattr(infra, "cmd_synth", lacking("cdktf"))
    assert cli.main(["synth"]) == 2
    err = capsys.readouterr().err
    assert "needs the infrastructure extra" in err and "Traceback" not in err
    monkeypatch.setattr(infra, "cmd_synth", lacking("nowhere"))
    assert cli.main(["synth"]) == 70
    err = capsys.readouterr().err
    assert "This is a bug in spotrain" in err and "Traceback" not in err


def test_a_checkpointer_with_bad_settings_lists_every_problem_at_once(tmp_path: Path) -> None:
    from spotrain.core.errors import ConfigError
    from spotrain.trainer.checkpointer import Checkpointer

    with pytest.raises(ConfigError) as refused:
        Checkpointer(run="no spaces please", store=f"file://{tmp_path}", every=0, light_every=0,
                     keep_last=1)  # fmt: skip
    message = str(refused.value)
    assert "checkpointer" in message and "run:" in message
    assert "every is 0: checkpoint every 1 or more steps" in message
    assert "light_every is 0" in message and "keep_last is 1: keep at least 2" in message
    with pytest.raises(Exception, match="file:// paths or s3:// buckets"):
        Checkpointer(run="fine", store="gs://elsewhere")


def test_a_loader_that_keeps_no_position_is_refused_with_the_one_that_does(tmp_path: Path) -> None:
    """Public scripts hand over torch's DataLoader, or the one deepspeed.initialize(
    training_data=...) returns: neither can resume mid-epoch, and each is told what to use."""
    import torch
    from deepspeed.runtime.dataloader import DeepSpeedDataLoader

    from spotrain.core.errors import ConfigError
    from spotrain.trainer.checkpointer import Checkpointer

    dataset = torch.utils.data.TensorDataset(torch.zeros(8, 2))
    state = {
        "loader": torch.utils.data.DataLoader(dataset, batch_size=2),
        "ds_loader": DeepSpeedDataLoader(dataset, 2, False, -1, None),
        "step": 3,
    }
    with pytest.raises(ConfigError) as refused:
        Checkpointer(run="fine", store=f"file://{tmp_path}").restore(None, state=state)
    message = str(refused.value)
    assert (
        "state['loader'] is a DataLoader: torch's DataLoader keeps no position: make it" in message
    )
    assert (
        "state['ds_loader'] is a DeepSpeedDataLoader: the loader deepspeed.initialize(" in message
    )
    assert "state['step'] is a int: give an object with state_dict()" in message


# --- the surfaces added since: cost, prices, config, fleet -------------------------------------
FIXTURES = Path(__file__).parent / "fixtures"
SIMULATE = ["cost", "simulate", "--on-demand-price", "3", "--spot-price", "1"]
TRACE = str(FIXTURES / "traces" / "one-node.json")
PLAN = ["cost", "plan", "--price-book", str(FIXTURES / "price_book.json"),
        "--checkpoint-seconds", "60"]  # fmt: skip


def _trace(tmp_path: Path, text: str) -> str:
    path = tmp_path / "trace.json"
    path.write_text(text)
    return str(path)


def _book(tmp_path: Path, price: Any) -> str:
    book = json.loads((FIXTURES / "price_book.json").read_text())
    book["on_demand"][0]["usd_per_hour"] = price
    path = tmp_path / "book.json"
    path.write_text(json.dumps(book))
    return str(path)


NUMBER_CASES = [
    ("simulate-work-inf", [*SIMULATE, "--trace", TRACE, "--work-hours", "inf"],
     ["the work is inf hours"]),
    ("simulate-work-huge", [*SIMULATE, "--trace", TRACE, "--work-hours", "1e12"],
     ["plan runs of up to 10,000 h"]),
    ("simulate-changeover-nan", [*SIMULATE, "--trace", TRACE, "--work-hours", "4",
                                 "--changeover-minutes", "nan"], ["the changeover is nan"]),
    ("simulate-price-inf", ["cost", "simulate", "--trace", TRACE, "--work-hours", "4",
                            "--on-demand-price", "inf", "--spot-price", "1"],
     ["not a finite number"]),
    ("simulate-rate-nan", [*SIMULATE, "--work-hours", "4", "--interruptions-per-hour", "nan"],
     ["interruptions_per_hour is nan"]),
    ("simulate-gap-inf", [*SIMULATE, "--work-hours", "4", "--interruptions-per-hour", "0.1",
                          "--gap-seconds", "inf"], ["not a finite number"]),
    ("simulate-gap-tiny", [*SIMULATE, "--work-hours", "4", "--interruptions-per-hour", "0.1",
                           "--gap-seconds", "0.001"], ["gap_s is 0.001"]),
    ("simulate-tick-nan", [*SIMULATE, "--trace", TRACE, "--work-hours", "4", "--tick", "nan"],
     ["not a finite number"]),
    ("plan-work-inf", [*PLAN, "--work-hours", "inf"], ["the work is inf hours"]),
    ("plan-work-nan", [*PLAN, "--work-hours", "nan"], ["the work is nan hours"]),
    ("plan-deadline-inf", [*PLAN, "--work-hours", "4", "--deadline-hours", "inf"],
     ["--deadline-hours is inf"]),
    ("plan-restart-negative", [*PLAN, "--work-hours", "4", "--restart-minutes", "-10"],
     ["--restart-minutes is -10.0: give a number of minutes, 0 or more"]),
    ("plan-rate-nan", [*PLAN, "--work-hours", "4", "--interruptions-per-hour", "nan"],
     ["--interruptions-per-hour is nan"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "expected"), [pytest.param(*c[1:], id=c[0]) for c in NUMBER_CASES]
)
def test_numbers_that_are_not_finite_or_in_range_are_refused(
    argv: list[str], expected: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    fails_clearly(capsys, argv, *expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"metadata": {"gap_seconds": Infinity}, "data": [1]}', "gap_seconds is inf"),
        ('{"metadata": {"gap_seconds": 60}, "data": [1, NaN]}', "data[1] is nan"),
        ('{"metadata": {"gap_seconds": 60}, "data": [1e400]}', "data[0] is inf"),
        ('{"metadata": {"gap_seconds": 60}, "data": [true]}', "data[0] is True"),
        ("[" * 100_000, "nested too deeply"),
    ],
)
def test_a_trace_with_numbers_that_are_not_counts_is_refused(
    text: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fails_clearly(capsys, [*SIMULATE, "--trace", _trace(tmp_path, text), "--work-hours", "4"],
                  expected)  # fmt: skip


def test_files_that_are_not_what_they_should_be_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = [*SIMULATE, "--trace", TRACE, "--work-hours", "4", "--starts", "1"]
    fails_clearly(capsys, [*run, "--plot", str(tmp_path / "missing" / "f.png")], "does not exist")
    fails_clearly(capsys, [*run, "--plot", str(tmp_path / "f.xyz")], "name a .png file")
    fails_clearly(capsys, [*run, "--plot", str(tmp_path)], "has no file type")
    config = tmp_path / "config.json"
    config.write_text("[1, 2]")
    fails_clearly(capsys, [*PLAN, "--config", str(config)], "holds an array, not an object")
    config.write_text('{"steps": "ten"}')
    fails_clearly(capsys, [*PLAN, "--config", str(config)], "steps is 'ten'")
    config.write_text('{"steps": 100, "metrics_file": 7}')
    fails_clearly(capsys, [*PLAN, "--config", str(config)], "metrics_file is 7")
    config.write_bytes(b"\xff\xfe binary")
    fails_clearly(capsys, [*PLAN, "--config", str(config)], "is not text")
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("[1, 2]\n[3]\n")
    fails_clearly(capsys, [*PLAN, "--metrics", str(metrics), "--steps", "10"], "no amount of work")
    fails_clearly(capsys, [*PLAN, "--work-hours", "4", "--plot", str(tmp_path / "no" / "p.png")],
                  "does not exist")  # fmt: skip


def test_config_get_refuses_a_folder_and_a_stored_configuration_that_is_no_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spotrain.core.manifest import config_key

    store = LocalStorage(tmp_path / "store")
    store.put_bytes(config_key(RUN, "20270101T000000000000Z", b"[1]"), b"[1, 2]")
    where = ["--store", f"file://{tmp_path / 'store'}", "--run", RUN]
    fails_clearly(capsys, ["config", "get", *where, "--to", str(tmp_path)], "is a folder")
    fails_clearly(capsys, ["config", "get", *where, "--to", str(tmp_path / "c.json")],
                  "holds an array, not a training configuration")  # fmt: skip
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("price", ["cheap", True, None, -1, 1e400])
def test_a_price_book_whose_prices_are_not_prices_is_refused_everywhere(
    price: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    book = _book(tmp_path, price)
    for argv in (
        [*PLAN[:2], "--price-book", book, "--checkpoint-seconds", "60", "--work-hours", "4",
         "--interruptions-per-hour", "0.1"],
        ["prices", "show", "--price-book", book, "--environment", "local"],
        ["cost", "estimate", "dev", "--price-book", book],
    ):  # fmt: skip
        fails_clearly(capsys, argv, "on_demand[0].usd_per_hour is", "USD per hour")


def test_price_book_paths_that_lead_nowhere_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fails_clearly(capsys, ["prices", "show", "--price-book", str(tmp_path / "typo.json")],
                  "cannot be read")  # fmt: skip
    fails_clearly(capsys, ["prices", "refresh", "--price-book",
                           str(tmp_path / "missing" / "book.json")], "does not exist")  # fmt: skip


def test_names_are_checked_where_they_are_written(
    dynamo: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import boto3

    table = ["--events-table", "catalog"]
    fails_clearly(capsys, ["fleet", "reset-crashes", *table, "--run", "Bad Run!"],
                  "run name 'Bad Run!' is not valid")  # fmt: skip
    fails_clearly(capsys, ["cost", "status", *table, "--run", "Bad Run!"],
                  "run name 'Bad Run!' is not valid")  # fmt: skip
    fails_clearly(capsys, ["cost", "report", *table, "--run", "Bad Run!"],
                  "run name 'Bad Run!' is not valid")  # fmt: skip
    # An unknown environment is refused before any table is read (this one does not exist).
    fails_clearly(capsys, ["cost", "report", "--events-table", "no-such-table", "--run", "r",
                           "--environment", "mars"],
                  "environment 'mars' is unknown: use one of local, dev, prod")  # fmt: skip
    fails_clearly(capsys, ["fleet", "exit", *table, "--run", "r", "--instance", "i-1", "--code",
                           "143", "--spot-notice", '{"time": "soon"}'],
                  "is not the metadata service's")  # fmt: skip
    # A run that never crashed (a typo, or one that never existed) has nothing to release.
    fails_clearly(capsys, ["fleet", "reset-crashes", *table, "--run", "no-such-run"],
                  "run no-such-run has no crash since its last release",
                  "spotrain run list")  # fmt: skip
    items = boto3.resource("dynamodb").Table("catalog").scan()["Items"]
    assert items == []  # nothing was written for any of them


def test_a_region_that_does_not_exist_is_refused_with_every_such_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fails_clearly(capsys, ["prices", "show", "--region", "mars-north-1", "--region", "us-east-1",
                           "--region", "venus-1"],
                  "--region mars-north-1, venus-1: no such AWS region")  # fmt: skip


def test_a_deadline_with_changeover_minutes_that_are_not_minutes_lists_the_problem() -> None:
    from spotrain.core.deadline_policy import RunDeadline

    for minutes in ("20", float("inf"), float("nan"), True):
        deadline = RunDeadline(
            started_at="2027-01-01T00:00:00Z",
            finish_by="2027-01-02T00:00:00Z",
            total_steps=10,
            changeover_minutes=minutes,
        )  # type: ignore[arg-type]
        assert deadline.problems() == [
            f"run_deadline.changeover_minutes is {minutes!r}: give a number of minutes, 0 or more"
        ]


def test_a_plan_lacking_several_inputs_names_them_all_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    said = fails_clearly(capsys, ["cost", "plan", "--environment", "dev"],
                         "the plan has 3 problem(s)", "no amount of work: give --work-hours",
                         "no checkpoint cost: give --checkpoint-seconds",
                         "no interruption rate for g5.xlarge in us-east-1, g6.xlarge in "
                         "us-east-1")  # fmt: skip
    assert "give --interruptions-per-hour" in said


def test_a_missing_program_is_named_with_how_to_get_it(tmp_path: Path) -> None:
    """Synthesis runs Node.js (CDK for Terraform): without it, one line says what to install
    and that watching runs needs neither, not jsii's traceback."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "spotrain.cli", "synth", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PATH": str(tmp_path)},  # no program at all
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("error:") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "runs `node`, which is not installed here: install Node.js 20" in done.stderr


def test_words_after_options_are_the_commands_own_not_unrecognized(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`spotrain data prepare --store S --name N FILE` (the order people type) prepares FILE,
    as `data prepare FILE --store S --name N` does; a word no command takes is still refused."""
    text = tmp_path / "corpus.txt"
    text.write_text("words after options\n" * 50)
    store = f"file://{tmp_path / 'store'}"
    assert cli.main(["data", "prepare", "--store", store, "--name", "late", str(text)]) == 0
    assert cli.main(["data", "show", "--store", store, "--name", "late"]) == 0
    assert "late" in capsys.readouterr().out
    put = cli.parse(["config", "put", "--store", store, "--run", "r", "cfg.json"])
    assert (put.command, put.action, put.config) == ("config", "put", Path("cfg.json"))
    status = cli.parse(["--debug", "run", "status", "local", "--json", "demo"])
    assert (status.debug, status.environment, status.run) == (True, "local", "demo")
    assert status.json
    fails_clearly(capsys, ["checkpoints", "list", "--run", "r", "--store", store, "extra"],
                  "unrecognized arguments: extra")  # fmt: skip
    simulate = ["cost", "simulate", "--work-hours", "1", "--on-demand-price", "3", "--spot-price",
                "1"]  # fmt: skip
    fails_clearly(capsys, [*simulate, "stray"], "unrecognized arguments: stray")
