"""The `local` environment deployed once for the whole suite, its stories shared out between
the suite's workers (tests/conftest.py says how the suite is shared).

The first worker that needs the deployment starts a local cloud of its own for it (not a
worker's: the faults and clocks its stories set must reach no other test) and applies the
environment; the other attaches to it. Its modules run in this order of hand-out:
`test_integration_local_apply.py` (the apply's checks, then the stories on the environment's
own runs, then the second plan), `test_integration_local_users_repository.py` (a user's own
run, beside them) and, after every other slow test, `test_integration_local_destroy.py`.

Two stories on two workers run at once, so a story that needs others finished first says so
with `after` (a region taken down reaches every caller; a run listing counts every run). A
story only ever waits for tests of modules handed out before its own, which are running on
the other worker or done: no wait can be circular. The last worker to leave stops the cloud.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

from spotrain.core import resource_names as names
from spotrain.localcloud import control
from spotrain.stacks.config import EnvironmentConfig
from spotrain.stacks.runs import RunConfig
from spotrain.tools import deploy

MODULES = ("test_integration_local_apply.py", "test_integration_local_users_repository.py",
           "test_integration_local_destroy.py")  # fmt: skip
"""The deployment's modules, in the order they are handed out."""

USERS_STORY_AFTER = "test_rehearsal_loses_no_work_and_ends_on_the_uninterrupted_loss"
"""The story the user's-repository story waits for (it takes a region down, which reaches
every caller of the cloud): the suite hands the user's story out as soon as it is over."""

ACCOUNT = "123456789012"
"""The local cloud's account, which the deployment is applied to."""

WAIT_LIMIT_S = 1800
"""How long a story waits for another worker's (a whole suite's deployment stories, twice)."""


class Local:
    """The deployed environment, as the tests see it."""

    def __init__(self, cloud: control.RunningCloud, config: EnvironmentConfig, outdir: Path,
                 results: list[deploy.StackResult], shared: Path) -> None:  # fmt: skip
        self.cloud, self.config, self.outdir, self.results = cloud, config, outdir, results
        self.shared = shared
        """The folder the workers share it through."""

    @cached_property
    def deployment(self) -> deploy.Deployment:
        return deploy.Deployment(config=self.config, outdir=self.outdir, log=lambda _: None)

    def client(self, service: str, region: str | None = None) -> Any:
        return control.client(service, self.cloud.endpoint, region or self.config.primary_region)

    @property
    def outputs(self) -> dict[str, Any]:
        """The stacks' outputs, the rehearsal run's (demo) at the top, each run's under "runs"."""
        return deploy.outputs_of(self.config, self.results)

    @property
    def run(self) -> RunConfig:
        return self.outputs["run"]

    @property
    def primary_bucket(self) -> str:
        return f"{self.config.bucket_prefix}-checkpoints-{self.config.primary_region}"

    @property
    def primary_key_alias(self) -> str:
        return f"alias/{names.data_key_alias(self.config.name, self.config.primary_region)}"

    @property
    def replica_bucket(self) -> str:
        return f"{self.config.bucket_prefix}-checkpoints-{self.config.replica_regions[0]}"


def folder(factory: pytest.TempPathFactory) -> Path:
    """Where the workers meet: beside their own temporary folders."""
    base = factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    (shared / "deployment").mkdir(exist_ok=True)
    return shared / "deployment"


def home(factory: pytest.TempPathFactory) -> Path:
    """SPOTRAIN_HOME of the deployment's cloud (its state, certificates, faults and clock)."""
    return folder(factory) / "home"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _home(path: Path) -> Iterator[None]:
    previous = os.environ.get("SPOTRAIN_HOME")
    os.environ["SPOTRAIN_HOME"] = str(path)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("SPOTRAIN_HOME", None)
        else:
            os.environ["SPOTRAIN_HOME"] = previous


def attach(factory: pytest.TempPathFactory) -> Local:
    """The deployment, applied by this worker if no worker has (or its cloud has gone)."""
    where = folder(factory)
    record = where / "deployment.json"
    with _locked(where / "lock"), _home(home(factory)):
        (where / "users").mkdir(exist_ok=True)
        (where / "users" / str(os.getpid())).touch()
        if record.exists():
            found = json.loads(record.read_text())
            if "failed" in found:
                pytest.fail(f"the shared deployment failed on another worker: {found['failed']}")
            cloud = control.status()
            if cloud is not None:
                config = deploy.environment("local", local_endpoint=cloud.endpoint)
                results = [deploy.StackResult(**r) for r in found["results"]]
                return Local(cloud, config, Path(found["outdir"]), results, where)
        try:
            cloud = control.up(port=0, schedule_speedup=0)
            config = deploy.local_environment_ready(cloud.endpoint)
            outdir = deploy.synth(where / "cdktf.out", local_endpoint=cloud.endpoint, only="local")
            local = Local(cloud, config, outdir, [], where)
            local.results = local.deployment.apply()
        except BaseException as error:
            record.write_text(json.dumps({"failed": f"{type(error).__name__}: {error}"}))
            raise
        record.write_text(json.dumps({"outdir": str(outdir),
                                      "results": [asdict(r) for r in local.results]}))  # fmt: skip
        return local


def leave(factory: pytest.TempPathFactory) -> None:
    """This worker is done with the deployment: the last to leave stops its cloud."""
    where = folder(factory)
    with _locked(where / "lock"), _home(home(factory)):
        (where / "users" / str(os.getpid())).unlink(missing_ok=True)
        if not any((where / "users").iterdir()):
            control.down()


def finished(factory: pytest.TempPathFactory, nodeid: str) -> None:
    """Record that a deployment test is over (passed, failed or skipped)."""
    with (folder(factory) / "finished").open("a") as log:
        log.write(nodeid + "\n")


TRAINING_MACHINES = "training-machines"
"""The stories that boot machines of the deployment and train on them (the two-runs story,
the user's-repository story) run one at a time: beside each other on two cores, a stopped
machine once left its run no record of its stop."""


def alone(local: Local, request: pytest.FixtureRequest, what: str) -> None:
    """Until this test ends, no other test that asks for `what` runs (on either worker). Ask
    after any `after`: a story that holds this never waits for the other worker's."""
    handle = (local.shared / f"{what}.lock").open("a+")
    fcntl.flock(handle, fcntl.LOCK_EX)

    def release() -> None:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()

    request.addfinalizer(release)


def after(local: Local, request: pytest.FixtureRequest, *names: str,
          modules: tuple[str, ...] = ()) -> None:  # fmt: skip
    """Wait until the tests named, and every test of `modules`, are over on whichever worker
    runs them (those this session did not select count as over)."""
    wanted = {item.nodeid for item in request.session.items
              if item.name in names or item.path.name in modules}  # fmt: skip
    log = local.shared / "finished"
    deadline = time.monotonic() + WAIT_LIMIT_S
    while wanted - set(log.read_text().splitlines() if log.exists() else ()):
        if time.monotonic() > deadline:
            pytest.fail(f"waited {WAIT_LIMIT_S} s for {sorted(wanted)} on the other worker")
        time.sleep(1)
