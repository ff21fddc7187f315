"""The spot-notice watcher against the local metadata service (IMDSv2 session tokens)."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from spotrain.localcloud.imds import LocalMetadataService
from spotrain.trainer.spot_notice import INSTANCE_ACTION, SpotNoticeWatcher


def watcher(endpoint: str, seen: list[tuple[str, str]]) -> SpotNoticeWatcher:
    return SpotNoticeWatcher(
        endpoint,
        on_interruption=lambda reason: seen.append(("stop", reason)),
        on_rebalance=lambda reason: seen.append(("checkpoint", reason)),
        poll_seconds=0.05,
    )


def test_no_notice_means_nothing_happens_then_each_notice_is_acted_on() -> None:
    seen: list[tuple[str, str]] = []
    with LocalMetadataService() as imds:
        spot = watcher(imds.endpoint, seen)
        assert spot.poll_once() is False and seen == []
        imds.recommend_rebalance()
        assert spot.poll_once() is False and spot.poll_once() is False
        assert [kind for kind, _ in seen] == ["checkpoint"]  # once, not at every poll
        imds.announce_interruption("terminate")
        assert spot.poll_once() is True
    assert seen[-1][0] == "stop" and seen[-1][1].startswith("spot interruption notice: terminate")


def test_metadata_service_refuses_reads_without_a_session_token() -> None:
    with LocalMetadataService() as imds:
        imds.announce_interruption()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(imds.endpoint + INSTANCE_ACTION, timeout=2)
        refused.value.close()
        assert refused.value.code == 401  # IMDSv1 is off, as the fleet's launch template sets


def test_watcher_thread_survives_an_unreachable_service_and_stops_when_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen: list[tuple[str, str]] = []
    with LocalMetadataService() as imds:
        endpoint = imds.endpoint
    spot = watcher(endpoint, seen).start()  # the service is gone: every poll fails
    import time

    time.sleep(0.3)
    spot.stop()
    assert seen == []
    assert capsys.readouterr().out.count("spot-notice poll failing") == 1  # said once, not spammed
