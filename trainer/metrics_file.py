"""A run's metrics file: one JSON line per step and per checkpoint event, appended by rank 0
and line-buffered, so a killed run leaves every line it finished. The trainer writes one
(`metrics_file` of its configuration), and so does the `Checkpointer` in a user's own loop when
given `metrics_file`. `spotrain cost plan --metrics` reads it (`spotrain.cost.planner.measured`):
each step's end (`at`) and whether a publish was in flight as it began (`publishing`), from
which a checkpoint's whole cost to training follows, and each published checkpoint's stall and
bytes."""

from __future__ import annotations

import json
import time
from typing import Any


class MetricsFile:
    """The lines one process writes; with no path, nothing (another rank, or none asked)."""

    def __init__(self, path: str | None) -> None:
        self._file = open(path, "a", buffering=1) if path else None  # noqa: SIM115 (the run's)

    def event(self, kind: str, **fields: Any) -> None:
        """A checkpoint's or a start's event: "started" (one per (re)formed group), "restored",
        "published", "light", "held", "stopped"."""
        if self._file is not None:
            self._write({"event": kind, "at": time.time(), **fields})

    def step(self, done: int, *, step_s: float, publishing: bool, **more: Any) -> None:
        """Step `done` has just ended: it took `step_s` seconds from the previous one's end (or
        the start), and a publish was in flight as it began or not; `more`: the loss and the
        like."""
        if self._file is not None:  # called at every step: nothing made without a file
            self._write({"step": done, **more, "step_s": step_s, "publishing": publishing,
                         "at": time.time()})  # fmt: skip

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, fields: dict[str, Any]) -> None:
        assert self._file is not None
        self._file.write(json.dumps(fields) + "\n")
