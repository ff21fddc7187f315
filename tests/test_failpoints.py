"""The run-side hooks tests and rehearsals steer a run with (trainer/failpoints.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from spotrain.trainer import failpoints


def test_a_held_rank_waits_while_the_file_exists_and_a_stop_ends_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hold = tmp_path / "hold"
    monkeypatch.setenv(failpoints.HOLD_VARIABLE, str(hold))
    assert failpoints.hold(lambda: False) is None  # no file: no wait

    hold.touch()
    threading.Timer(0.5, hold.unlink).start()
    started = time.monotonic()
    held = failpoints.hold(lambda: False)
    assert held is not None and 0.45 < held <= time.monotonic() - started < 5  # until it went

    hold.touch()
    asked = threading.Event()
    threading.Timer(0.5, asked.set).start()
    # Should the stop be ignored, the file goes at 4 s: the test fails instead of hanging.
    threading.Timer(4, lambda: hold.unlink(missing_ok=True)).start()
    started = time.monotonic()
    failpoints.hold(asked.is_set)  # a signal or a notice ends the hold, the file still there
    assert 0.45 < time.monotonic() - started < 2 and hold.exists()


def test_without_the_setting_a_rank_never_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(failpoints.HOLD_VARIABLE, raising=False)
    started = time.monotonic()
    assert failpoints.hold(lambda: False) is None
    assert time.monotonic() - started < 0.05
