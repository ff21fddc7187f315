"""Named points where tests (and rehearsals) make a run fail the way machines do.

`SPOTRAIN_FAILPOINTS="after-shard-upload=sigkill@2,before-catalog-publish=sigterm"` makes the
process act at those points: `sigterm` sends SIGTERM to the launcher (torchrun forwards it to
every rank, as when a spot machine shuts down), `sigkill` kills the launcher's whole process
group at once (the machine vanished), `sleep:S` waits S seconds (a slow link). `@N` acts on the
N-th time the point is reached instead of the first. Unset, every point is a no-op.

Points: `after-local-save` (every rank wrote its shards, before any upload),
`after-shard-upload` (one shard stored), `before-catalog-publish` (manifest written, catalog
not yet updated).
"""

from __future__ import annotations

import os
import signal
import threading
import time

ENVIRONMENT_VARIABLE = "SPOTRAIN_FAILPOINTS"
_counts: dict[str, int] = {}
_lock = threading.Lock()


def _plan() -> dict[str, tuple[str, int]]:
    plan = {}
    for item in filter(None, os.environ.get(ENVIRONMENT_VARIABLE, "").split(",")):
        name, _, action = item.partition("=")
        action, _, count = action.partition("@")
        plan[name.strip()] = (action.strip(), int(count or 1))
    return plan


def hit(name: str) -> None:
    planned = _plan().get(name)
    if planned is None:
        return
    action, on_count = planned
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        if _counts[name] != on_count:
            return
    if action == "sigterm":
        os.kill(os.getppid(), signal.SIGTERM)
    elif action == "sigkill":
        os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)
    elif action.startswith("sleep:"):
        time.sleep(float(action.removeprefix("sleep:")))
    else:
        raise ValueError(f"{ENVIRONMENT_VARIABLE}: unknown action {action!r} for {name!r}")
