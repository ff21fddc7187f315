"""The README's main command, `make local` (`spotrain rehearse`): its story runs on the
deployment the apply tests share (tests/test_integration_local_apply.py); here, the part around
it: the rehearsal starts a local cloud when none runs and stops it afterwards unless told to
keep it (then with its schedules running, which the rehearsal had stopped to deliver each check
itself)."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest

from spotrain.localcloud import control, schedules
from spotrain.tools.rehearsal import local_cloud

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("keep", [False, True])
def test_the_rehearsal_stops_the_cloud_it_started_unless_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: bool
) -> None:
    monkeypatch.setenv("SPOTRAIN_HOME", str(tmp_path / "home"))
    said: list[str] = []
    with mock.patch.dict(os.environ):  # the rehearsal points this process's AWS settings at it
        with local_cloud(port=0, keep_cloud=keep, say=said.append) as cloud:
            assert (running := control.status()) is not None and running.endpoint == cloud.endpoint
            assert os.environ["AWS_ENDPOINT_URL"] == cloud.endpoint
        try:
            assert (control.status() is not None) == keep
            assert said == [
                "local cloud kept running; its schedules run at AWS's pace (`spotrain local up "
                "--schedule-speedup N` changes it)" if keep else
                "local cloud stopped (pass --keep-cloud to leave it running)"]  # fmt: skip
            if keep:  # the rehearsal's own checks are over: the deployed schedule runs again
                clock = control.faults_file().with_name(schedules.CLOCK_NAME)
                assert schedules.read_speedup(clock) == 1.0
        finally:
            control.down()
