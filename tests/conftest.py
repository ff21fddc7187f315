"""Shared fixtures: one synthesis of every environment, a training corpus, and a local cloud
per session."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cpu_report
import deployment
import pytest

from spotrain.localcloud import control

ROOT = Path(__file__).resolve().parents[1]

# One thread a process for the ranks and models the tests start (they inherit it): the suite's
# two workers fill both cores, and a rank alone on its machine would otherwise run as many
# OpenMP threads as there are cores, which then spin waiting on one another (torchrun sets
# the same for several ranks a machine). Losses agree with the goldens within their tolerance.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-snapshots", action="store_true",
        help="write the synthesized stacks' snapshots (tests/fixtures/synth) anew",
    )  # fmt: skip
    cpu_report.pytest_addoption(parser)


def pytest_configure(config: pytest.Config) -> None:
    cpu_report.pytest_configure(config)


# How `make test` shares the suite between its workers (pytest-xdist): the tests of one group
# run on one worker in file order, every other test goes wherever a worker is free. Each of
# the shared deployment's modules is a group (its stories in order; tests/deployment.py says
# how the two workers share one deployment); so is each module whose module-scoped fixture is
# dear, so that it is built once.
MODULES_KEPT_TOGETHER = (*deployment.MODULES, "test_bad_input.py", "test_checkov.py",
                         "test_datasets.py", "test_trainer_preemption.py",
                         "test_user_scripts.py")  # fmt: skip


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduler with the groups above as its scopes: a test of a module kept
    together is scheduled with its module, any other test on its own. A worker takes the next
    unit that is not held back for it (`held_back`), or the next if all are."""
    from xdist.scheduler import LoadScopeScheduling

    first, users, last = deployment.MODULES
    stories = set(deployment.MODULES[:-1])

    class Grouped(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if Path(module).name in MODULES_KEPT_TOGETHER else nodeid

        def held_back(self, scope: str, node: Any) -> bool:
            """Whether `node` should take another unit before this one, if there is one:
            - the user's-repository story waits for the story that takes a region down
              (`deployment.USERS_STORY_AFTER`), so it is handed out when that one is over, not
              before (its worker would sit waiting) nor long after (it is on the way to the
              deployment's end: handed out at a fixed place in the queue, it started 270 s
              after the rehearsal in a clean-clone run); and it is not queued behind the
              deployment's own stories on the worker that applies it (a worker takes more work
              while two of its tests are still pending), but runs beside them on the other;
            - the deployment's end (its schedule check and destroy) waits for every story, so it
              is not taken while one is still to run: its worker would sit idle beside that
              story instead of running quick tests (it once waited 117 s)."""
            name = Path(scope).name
            if name == users:
                return not self.over(deployment.USERS_STORY_AFTER) or any(
                    Path(s).name == first for s in self.assigned_work.get(node, {}))  # fmt: skip
            if name == last:
                running = (not all(done.values()) for work in self.assigned_work.values()
                           for s, done in work.items() if Path(s).name in stories)  # fmt: skip
                return any(Path(s).name in stories for s in self.workqueue) or any(running)
            return False

        def over(self, test: str) -> bool:
            """Whether the test named `test` has finished (or was not selected)."""
            named = f"::{test}"
            done = [finished for work in self.assigned_work.values() for tests in work.values()
                    for nodeid, finished in tests.items() if nodeid.endswith(named)]  # fmt: skip
            return all(done) if done else not any(n.endswith(named) for n in self.collection)

        def _assign_work_unit(self, node: Any) -> None:
            queue = self.workqueue
            ready = next((s for s in queue if not self.held_back(s, node)), None)
            if ready is not None:
                queue.move_to_end(ready, last=False)
            super()._assign_work_unit(node)

    return Grouped(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest work first: the deployment's apply and its stories on the environment's
    runs (on one worker), a user's own run on the same deployment (on the other worker, handed
    out once the story it waits for is over: `held_back`), then the integration and slow
    tests, those that step CPU Adam last of them; then the deployment's schedule check and
    destroy, which wait for every story (handed out once none is left to run: `held_back`);
    then the quick tests that fill the gaps. Workers take work in this order
    (--no-loadscope-reorder)."""
    first, users, last = deployment.MODULES

    def rank(item: pytest.Item) -> int:
        if item.path.name in (first, users):
            return 0
        if item.get_closest_marker("cpu_adam"):
            return 2  # after the other slow ones: its compile runs meanwhile (below)
        if item.path.name == last:
            return 3
        if item.get_closest_marker("integration") or item.get_closest_marker("slow"):
            return 1  # in file order
        return 4

    items.sort(key=lambda item: (rank(item), item.path.name == users))  # stable otherwise


def pytest_collection_finish(session: pytest.Session) -> None:
    """DeepSpeed's CPU Adam is compiled on first use (about 140 s of CPU, once per checkout):
    when tests that step it are selected, one worker starts that build at once, at the lowest
    priority, so it takes only what the workers leave idle and the tests find it built instead
    of their worker compiling it while the other waits on nothing. Detached: a session that
    stops early leaves it to finish and release its lock, never a half-built extension."""
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    if not any(item.get_closest_marker("cpu_adam") for item in session.items):
        return
    build = "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()"
    # Started by a shell that returns at once: no child of this process is left to reap.
    subprocess.run(["sh", "-c", 'nice -n 19 "$0" -c "$1" </dev/null >/dev/null 2>&1 &',
                    sys.executable, build], check=True, start_new_session=True)  # fmt: skip


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every environment synthesized once, as `spotrain synth` does, into a folder whose parent
    does not exist yet (`spotrain synth --out build/cdktf.out` makes it)."""
    from spotrain.tools import deploy

    return deploy.synth(tmp_path_factory.mktemp("synth") / "build" / "cdktf.out")


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


@pytest.fixture(scope="session")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[deployment.Local]:
    """The `local` environment, deployed once for the suite's workers (tests/deployment.py)."""
    try:
        yield deployment.attach(tmp_path_factory)
    finally:  # a failed apply too: the cloud it started is stopped
        deployment.leave(tmp_path_factory)


@pytest.fixture(autouse=True)
def _on_the_deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[None]:  # fmt: skip
    """A deployment test talks to the deployment's cloud (its commands find it by
    SPOTRAIN_HOME), and says when it is over, for stories on the other worker that wait."""
    if request.node.path.name not in deployment.MODULES:
        yield
        return
    monkeypatch.setenv("SPOTRAIN_HOME", str(deployment.home(tmp_path_factory)))
    try:
        yield
    finally:
        deployment.finished(tmp_path_factory, request.node.nodeid)


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
    clients = sys.modules.get("spotrain.constructs.interruption_handler.runtime.clients")
    if clients is not None:  # nor its clients, made for an earlier test's cloud
        clients.forget()
