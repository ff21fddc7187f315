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

# One thread a process for the ranks and models the tests start (they inherit it): the suite's
# two workers fill both cores, and a rank alone on its machine would otherwise run as many
# OpenMP threads as there are cores, which then spin waiting on one another (torchrun sets
# the same for several ranks a machine). Losses agree with the goldens within their tolerance.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Terraform's AWS provider spends most of each start building its schemas, much of it collecting
# garbage, and every terraform command starts it anew, two or three times: Go collecting at four
# times the live heap instead of twice takes more than a quarter off (`terraform validate` of
# one stack: 9.5 s of CPU here, 6.7 s with it), for about 120 MB more a process.
os.environ.setdefault("GOGC", "400")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-snapshots", action="store_true",
        help="write the synthesized stacks' snapshots (tests/fixtures/synth) anew",
    )  # fmt: skip


# How `make test` shares the suite between its workers (pytest-xdist): the tests of one group
# run on one worker in file order, every other test goes wherever a worker is free. The shared
# deployment's tests are one group (one apply, its stories in order, destroy last); so is each
# module whose module-scoped fixture is dear, so that it is built once.
DEPLOYMENT_MODULE = "test_integration_local_apply.py"
MODULES_KEPT_TOGETHER = (DEPLOYMENT_MODULE, "test_bad_input.py", "test_datasets.py",
                         "test_trainer_preemption.py", "test_user_scripts.py")  # fmt: skip


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduler with the groups above as its scopes: a test of a module kept
    together is scheduled with its module, any other test on its own."""
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if Path(module).name in MODULES_KEPT_TOGETHER else nodeid

    return Grouped(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest work first: the deployment (a third of the suite, on one worker), then the
    integration and slow tests, then the quick ones that fill the gaps at the end. Workers take
    work in this order (--no-loadscope-reorder)."""

    def rank(item: pytest.Item) -> int:
        if item.path.name == DEPLOYMENT_MODULE:
            return 0
        return 1 if item.get_closest_marker("integration") or item.get_closest_marker("slow") else 2

    items.sort(key=rank)  # stable: each module's tests stay in file order


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
