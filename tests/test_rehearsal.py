"""The README's main command: the rehearsal tells the whole story on a local cloud of its own
and reports no lost work and the uninterrupted run's loss."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


def test_rehearsal_loses_no_work_and_ends_on_the_uninterrupted_loss(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run = subprocess.run(
        [sys.executable, "-m", "spotrain.cli", "rehearse", "--port", "0"],
        cwd=ROOT, env={**os.environ, "SPOTRAIN_HOME": str(home)},
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-5000:]
    for stage in range(1, 7):
        assert f"[{stage}/6]" in output
    assert re.search(r"steps lost to preemption\s+0 ", output), output
    assert re.search(r"committed work lost\s+0 steps", output), output
    assert "identical at every step" in output
    assert "handler: recorded=True (redelivery recorded=False)" in output
    assert re.search(r"restored step 20 from s3://\S+-us-west-2", output), output
    assert "rehearsal passed" in output
    # it cleans up: the local cloud it started is stopped
    assert not (home / "local" / "state.json").exists()
