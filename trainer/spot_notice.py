"""Watching the instance metadata service (IMDSv2) for spot notices, before SIGTERM comes.

EC2 announces a reclaim two minutes ahead at `spot/instance-action`, and earlier, sometimes,
a rebalance recommendation at `events/recommendations/rebalance`. One thread per machine polls
both (IMDSv2: a session token first, then reads that send it; 404 means no notice):
- an interruption notice asks the run to stop: every rank stops after the same step with a
  published emergency checkpoint, as on SIGTERM, but with two minutes to spare;
- a rebalance recommendation asks for a checkpoint now, and training goes on.
The endpoint is configurable so a local metadata service can play EC2
(`spotrain.localcloud.imds`).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable

TOKEN_TTL_SECONDS = 21600
INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
SPOT_NOTICE_REASON = "spot interruption notice"
"""How a stop asked by an interruption notice is named (the reason the ranks agree on)."""
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"


class SpotNoticeWatcher:
    def __init__(
        self,
        endpoint: str,
        *,
        on_interruption: Callable[[str], None],
        on_rebalance: Callable[[str], None],
        poll_seconds: float = 5.0,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.on_interruption, self.on_rebalance = on_interruption, on_rebalance
        self.poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spot-notice", daemon=True)
        self._token: str | None = None
        self._rebalance_seen = False
        self._failing = False

    def start(self) -> SpotNoticeWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.poll_seconds + 2)

    def _request(self, method: str, path: str, headers: dict[str, str]) -> bytes | None:
        request = urllib.request.Request(self.endpoint + path, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as error:
            error.close()
            if error.code == 401:  # token expired: take a new one next time
                self._token = None
            if error.code in (401, 404):
                return None
            raise

    def _read(self, path: str) -> dict[str, str] | None:
        if self._token is None:
            token = self._request(
                "PUT",
                "/latest/api/token",
                {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_SECONDS)},
            )
            self._token = token.decode() if token else None
        if self._token is None:
            return None
        body = self._request("GET", path, {"X-aws-ec2-metadata-token": self._token})
        return json.loads(body) if body else None

    def poll_once(self) -> bool:
        """Read both notices once; True once an interruption notice was seen."""
        action = self._read(INSTANCE_ACTION)
        if action:
            self.on_interruption(
                f"{SPOT_NOTICE_REASON}: {action.get('action', 'stop')} at "
                f"{action.get('time', 'an unknown time')}"
            )
            return True
        rebalance = self._read(REBALANCE)
        if rebalance and not self._rebalance_seen:
            self._rebalance_seen = True
            self.on_rebalance(
                f"rebalance recommendation at {rebalance.get('noticeTime', 'an unknown time')}"
            )
        return False

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.poll_once():
                    return
                self._failing = False
            except (OSError, ValueError) as error:
                # An unreachable metadata service must not stop training; SIGTERM still works.
                if not self._failing:
                    print(f"[spotrain] spot-notice poll failing: {error}", flush=True)
                self._failing = True
            self._stop.wait(self.poll_seconds)
