"""Faults the local cloud can play, for rehearsals and runbook tests: a region that is down,
and S3 replication that has not caught up yet.

The running server re-reads `faults.json` in its state directory on every request it could
affect, so `spotrain local fault ...` takes effect at once without a restart.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FAULTS_FILE_VARIABLE = "SPOTRAIN_LOCALCLOUD_FAULTS"
# SigV4: Credential=<key id>/<date>/<region>/<service>/aws4_request
_CREDENTIAL_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/([a-z0-9-]+)/")


@dataclass
class Faults:
    regions_down: list[str] = field(default_factory=list)
    """Requests signed for these regions get 503 ServiceUnavailable."""
    replication_pending: list[str] = field(default_factory=list)
    """`bucket/key` patterns (fnmatch) of new objects whose replica does not arrive (their
    status stays PENDING, as while S3 replication lags); clearing a pattern affects only
    objects written after it."""

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


def served_file() -> Path | None:
    """The faults file of the server running in this process, if it was given one."""
    value = os.environ.get(FAULTS_FILE_VARIABLE)
    return Path(value) if value else None


def signed_region(authorization: str | None) -> str | None:
    match = _CREDENTIAL_SCOPE.search(authorization or "")
    return match.group(1) if match else None


_OUTAGE_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code>'
    b"<Message>The region is unavailable (local cloud fault: region down)</Message></Error>"
)


def region_outage(app: Callable[..., Iterable[bytes]], path: Path) -> Callable[..., Any]:
    """WSGI middleware: answer 503 to requests signed for a region that is down."""

    def middleware(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        region = signed_region(environ.get("HTTP_AUTHORIZATION"))
        if region is not None and region in read(path).regions_down:
            start_response(
                "503 Service Unavailable",
                [("Content-Type", "application/xml"), ("Content-Length", str(len(_OUTAGE_BODY)))],
            )
            return [_OUTAGE_BODY]
        return app(environ, start_response)

    return middleware
