"""Named points where tests (and rehearsals) make a run fail the way machines do.

`SPOTRAIN_FAILPOINTS="after-shard-upload=sigkill@6,before-catalog-publish=sigterm"` makes the
process act at those points: `sigterm` sends SIGTERM to the launcher (torchrun forwards it to
every rank, as when a spot machine shuts down), `sigkill` kills the launcher and every worker
it started at once (the machine vanished), `sleep:S` waits S seconds (a slow link). `@N` acts
only while the checkpoint of step N is being saved; each point acts once. Unset, every point
is a no-op.

Points: `after-snapshot` (every rank copied its state to memory, before anything is written),
`after-shard-upload` (one shard stored), `before-catalog-publish` (manifest written, catalog
not yet updated), `after-light-seal` (a light checkpoint was sealed on the work disk).

`SPOTRAIN_HOLD_WHILE=<file>` holds a run instead (`hold`): while the file exists, each rank
waits at the end of its step until it is asked to stop (then it goes on to the stop's
agreement, which the other ranks join once they are asked too or the file goes). A rehearsal
holds its run while the machines it waits for boot, so that how many steps it takes does not
depend on how fast this host boots them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

ENVIRONMENT_VARIABLE = "SPOTRAIN_FAILPOINTS"
HOLD_VARIABLE = "SPOTRAIN_HOLD_WHILE"
HOLD_POLL_S = 0.05
_fired: set[str] = set()
_lock = threading.Lock()
_saving_step: int | None = None


def _plan() -> dict[str, tuple[str, int | None]]:
    plan = {}
    for item in filter(None, os.environ.get(ENVIRONMENT_VARIABLE, "").split(",")):
        name, _, action = item.partition("=")
        action, _, step = action.partition("@")
        plan[name.strip()] = (action.strip(), int(step) if step else None)
    return plan


def saving(step: int) -> None:
    """The checkpoint of `step` is being saved (until the next call)."""
    global _saving_step
    _saving_step = step


def hit(name: str, *, step: int | None = None) -> None:
    """Act if `name` is planned; `step` is the checkpoint's step when the caller knows it
    better than `saving` (background work may lag behind the training loop)."""
    planned = _plan().get(name)
    if planned is None:
        return
    action, planned_step = planned
    current = _saving_step if step is None else step
    with _lock:
        if name in _fired or (planned_step is not None and planned_step != current):
            return
        _fired.add(name)
    if action == "sigterm":
        os.kill(os.getppid(), signal.SIGTERM)
    elif action == "sigkill":
        kill_launcher_and_workers(os.getppid())
    elif action.startswith("sleep:"):
        time.sleep(float(action.removeprefix("sleep:")))
    else:
        raise ValueError(f"{ENVIRONMENT_VARIABLE}: unknown action {action!r} for {name!r}")


def hold(asked_to_stop: Callable[[], bool]) -> float | None:
    """Wait while the file HOLD_VARIABLE names exists, unless `asked_to_stop` (a signal or a
    notice arrived: the stop goes on as it would have). The seconds held, or None when the
    file was not there (or the setting is unset)."""
    path = os.environ.get(HOLD_VARIABLE)
    if not path or not os.path.exists(path):
        return None
    began = time.monotonic()
    while os.path.exists(path) and not asked_to_stop():
        time.sleep(HOLD_POLL_S)
    return time.monotonic() - began


def kill_launcher_and_workers(launcher: int) -> None:
    """SIGKILL torchrun and its workers (each runs in its own session, so a process group kill
    would miss them). The launcher goes first so it cannot react."""
    workers = []
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == launcher:
            workers.append(int(status.parent.name))
    os.kill(launcher, signal.SIGKILL)
    for pid in sorted(workers, key=lambda p: p == os.getpid()):  # this process last
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
