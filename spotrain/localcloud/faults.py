"""Faults the local cloud can play, for rehearsals and tests: a region that is down, a region
cut off from the others (it serves its own clients, replicates nothing), S3 and DynamoDB
replication that has not caught up yet, S3 objects that fail their next requests, and spot
pools without capacity; and where callers stand (inside a VPC, through its endpoints, or outside).

The running server re-reads `faults.json` in its state directory on every request it could
affect, so `spotrain local fault ...` takes effect at once without a restart.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FAULTS_FILE_VARIABLE = "SPOTRAIN_LOCALCLOUD_FAULTS"
# SigV4: Credential=<key id>/<date>/<region>/<service>/aws4_request
_CREDENTIAL_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/([a-z0-9-]+)/([a-z0-9-]+)/")


@dataclass
class Faults:
    regions_down: list[str] = field(default_factory=list)
    """Requests signed for these regions get 503 ServiceUnavailable."""
    regions_partitioned: list[str] = field(default_factory=list)
    """Regions cut off from the others: they serve their own clients and accept writes, but
    no global-table change leaves or reaches them until they are joined again."""
    table_replication_lag_seconds: float = 0.0
    """How long a global-table write takes to reach the other regions (after its answer)."""
    replication_pending: list[str] = field(default_factory=list)
    """`bucket/key` patterns (fnmatch) of new objects whose replica does not arrive (their
    status stays PENDING, as while S3 replication lags); clearing a pattern affects only
    objects written after it."""

    unavailable: list[dict[str, Any]] = field(default_factory=list)
    """`{"id", "pattern", "requests"}`: the next `requests` S3 requests for objects matching
    `pattern` (`bucket/key`, fnmatch) get 503 SlowDown, as S3 answers under load; later ones
    are served."""

    spot_capacity_gone: list[str] = field(default_factory=list)
    """`REGION/INSTANCE-TYPE` patterns (fnmatch) of spot pools with no capacity: a group's
    spot machines of such a pool do not launch (its desired capacity stays unmet, as AWS's
    `InsufficientInstanceCapacity` leaves it) until the pattern is cleared, when the group
    fills at its next look, as Auto Scaling keeps trying."""

    vcpu_quotas: dict[str, int] = field(default_factory=dict)
    """`REGION/QUOTA-KEY` ("us-east-1/spot/P5") -> the account's quota in vCPUs, as Service
    Quotas answers it (`account_quotas`; unset: its default)."""

    through_vpc_endpoints: dict[str, str] = field(default_factory=dict)
    """Service (`s3`, `dynamodb`) -> VPC endpoint id: requests to the service carry
    `aws:SourceVpce` with that id, as from a machine inside the VPC. Empty: callers are
    outside any VPC, as a laptop (or a stolen credential) is."""

    def spot_gone(self, region: str, instance_type: str) -> bool:
        return any(fnmatch.fnmatchcase(f"{region}/{instance_type}", p)
                   for p in self.spot_capacity_gone)  # fmt: skip

    def replication_held(self, bucket: str, key: str) -> bool:
        return any(fnmatch.fnmatchcase(f"{bucket}/{key}", p) for p in self.replication_pending)


def read(path: Path | None) -> Faults:
    if path is None or not path.exists():
        return Faults()
    return Faults(**json.loads(path.read_text()))


def write(path: Path, faults: Faults) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps(asdict(faults)))
    staging.replace(path)  # the server never reads half a file


_request = threading.local()


def current() -> Faults:
    """What the server plays for the request being served: read once per request by the
    middleware (`injected`), or from the served file outside a request."""
    return getattr(_request, "faults", None) or read(served_file())


def served_file() -> Path | None:
    """The faults file of the server running in this process, if it was given one."""
    value = os.environ.get(FAULTS_FILE_VARIABLE)
    return Path(value) if value else None


def signed_scope(authorization: str | None) -> tuple[str, str] | None:
    """(region, service) a SigV4 request is signed for."""
    match = _CREDENTIAL_SCOPE.search(authorization or "")
    return (match.group(1), match.group(2)) if match else None


def _error_body(code: str, message: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>{message} (local cloud fault)</Message></Error>"
    ).encode()


def injected(app: Callable[..., Iterable[bytes]], path: Path) -> Callable[..., Any]:
    """WSGI middleware: answer 503 to requests signed for a region that is down, and to the
    next requests for objects made unavailable."""
    served: dict[str, int] = {}  # requests failed so far, per `unavailable` entry
    lock = threading.Lock()

    def refuse(start_response: Callable[..., Any], body: bytes) -> list[bytes]:
        start_response(
            "503 Service Unavailable",
            [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
        )
        return [body]

    def middleware(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        scope = signed_scope(environ.get("HTTP_AUTHORIZATION"))
        if scope is None:
            return app(environ, start_response)
        current = _request.faults = read(path)  # once per request: the extensions reuse it
        try:
            if scope[0] in current.regions_down:
                return refuse(start_response, _error_body("ServiceUnavailable", "region down"))
            if scope[1] == "s3" and current.unavailable:
                target = environ.get("PATH_INFO", "").lstrip("/")
                for entry in current.unavailable:
                    if not fnmatch.fnmatchcase(target, entry["pattern"]):
                        continue
                    with lock:
                        failed = served.get(entry["id"], 0)
                        if failed < int(entry["requests"]):
                            served[entry["id"]] = failed + 1
                            return refuse(start_response, _error_body("SlowDown", "unavailable"))
            return app(environ, start_response)
        finally:
            _request.faults = None

    return middleware
