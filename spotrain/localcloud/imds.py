"""A local instance metadata service (IMDSv2) that plays one EC2 spot instance.

It serves what the trainer and the image's bootstrap read (instance id, type, placement,
spot notices) with EC2's session-token rules: `PUT /latest/api/token` with a TTL header gives a
token; every read must send it (401 otherwise); a notice not given yet is a 404. Tests and the
rehearsal call `announce_interruption` / `recommend_rebalance` to play EC2's warnings.
"""

from __future__ import annotations

import datetime
import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LocalMetadataService:
    def __init__(
        self,
        *,
        instance_id: str = "i-0123456789abcdef0",
        instance_type: str = "g5.xlarge",
        availability_zone: str = "us-east-1a",
        lifecycle: str = "spot",
        private_address: str = "127.0.0.1",
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self._tokens: set[str] = set()
        self._values = {
            "/latest/meta-data/instance-id": instance_id,
            "/latest/meta-data/instance-type": instance_type,
            "/latest/meta-data/placement/availability-zone": availability_zone,
            "/latest/meta-data/placement/region": availability_zone[:-1],
            "/latest/meta-data/instance-life-cycle": lifecycle,
            "/latest/meta-data/local-ipv4": private_address,
        }
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> LocalMetadataService:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> LocalMetadataService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def announce_interruption(self, action: str = "terminate", seconds_ahead: int = 120) -> None:
        """The two-minute warning: `spot/instance-action` starts answering."""
        when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds_ahead)
        self._values["/latest/meta-data/spot/instance-action"] = json.dumps(
            {"action": action, "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
        )

    def recommend_rebalance(self) -> None:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._values["/latest/meta-data/events/recommendations/rebalance"] = json.dumps(
            {"noticeTime": now}
        )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # quiet
                pass

            def _answer(self, status: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                if self.path != "/latest/api/token":
                    return self._answer(404)
                if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._answer(400)
                token = secrets.token_urlsafe(24)
                service._tokens.add(token)
                return self._answer(200, token)

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") not in service._tokens:
                    return self._answer(401)  # IMDSv1 (no token) is refused
                value = service._values.get(self.path)
                return self._answer(200, value) if value is not None else self._answer(404)

        return Handler
