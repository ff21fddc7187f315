"""Shared fixtures: one synthesis of every environment, a training corpus, and a local cloud
per session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotrain.localcloud import control

ROOT = Path(__file__).resolve().parents[1]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-snapshots", action="store_true",
        help="write the synthesized stacks' snapshots (tests/fixtures/synth) anew",
    )  # fmt: skip


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every environment synthesized once, as `spotrain synth` does."""
    from spotrain.tools import deploy

    return deploy.synth(tmp_path_factory.mktemp("synth") / "cdktf.out")


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A small token file (the synthetic arithmetic text) for training tests."""
    from spotrain.trainer.data import synthetic_corpus, write_token_file

    folder = tmp_path_factory.mktemp("data")
    return str(write_token_file(folder / "corpus", synthetic_corpus(100_000)))


@pytest.fixture(scope="session")
def local_cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[control.RunningCloud]:
    """A local cloud on a free loopback port for the whole session, stopped at the end."""
    home = tmp_path_factory.mktemp("spotrain-home")
    previous = os.environ.get("SPOTRAIN_HOME")
    os.environ["SPOTRAIN_HOME"] = str(home)
    # Stories deliver the handler's checks when they mean to; a test that needs the clock
    # starts it (control.set_schedule_speedup).
    cloud = control.up(port=0, schedule_speedup=0)
    try:
        yield cloud
    finally:
        control.down()
        if previous is None:
            os.environ.pop("SPOTRAIN_HOME", None)
        else:
            os.environ["SPOTRAIN_HOME"] = previous


@pytest.fixture
def dynamo(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """In-process moto (fast unit tests) with a checkpoint catalog table named `catalog`."""
    import boto3
    from helpers import create_catalog_table
    from moto import mock_aws

    for key, value in {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = boto3.client("dynamodb")
        create_catalog_table(client, "catalog")
        yield client


@pytest.fixture(autouse=True)
def _a_cold_interruption_handler() -> None:
    """Each test's cloud is a new one: a warm handler's run declarations from an earlier test
    (it reuses them for a while) do not belong to it."""
    handler = sys.modules.get("spotrain.constructs.interruption_handler.runtime.settings")
    if handler is not None:
        handler._declarations.clear()
