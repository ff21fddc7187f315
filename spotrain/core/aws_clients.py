"""The AWS clients spotrain's commands and machines make, with one retry policy: botocore's
standard mode (5xx, throttling and connection errors retried with jittered backoff), 6 tries
unless AWS_MAX_ATTEMPTS says. An operator's command and a training machine ride out a
transient error alike, and in a region outage both give up after the same 17-20 s and say
which region did not answer (`errors.outage_fix`), where boto3's default (legacy mode: 10
tries for DynamoDB, 5 for the rest) kept an operator's DynamoDB read waiting about 25 s.

A probe, the call that asks whether a region answers at all, has its own: short timeouts and
one retry (`probe_config`)."""

from __future__ import annotations

import os
from typing import Any

DEFAULT_MAX_ATTEMPTS = 6
"""Tries of each AWS request (botocore standard retry mode) unless AWS_MAX_ATTEMPTS says."""


def retry_config(connections: int | None = None, attempts: int = DEFAULT_MAX_ATTEMPTS) -> Any:
    """The botocore configuration every client here is made with (AWS_RETRY_MODE and
    AWS_MAX_ATTEMPTS, where set, as botocore reads them); `connections`: its pool's size, for
    a client that has more requests in flight than botocore's default 10; `attempts`: the tries
    of a request, for a caller with a deadline of its own (the interruption handler's)."""
    from botocore.config import Config

    retries: dict[str, Any] = {"mode": os.environ.get("AWS_RETRY_MODE", "standard")}
    if "AWS_MAX_ATTEMPTS" not in os.environ:
        retries["total_max_attempts"] = attempts
    pool = {"max_pool_connections": connections} if connections else {}
    return Config(retries=retries, **pool)


def client(
    service: str,
    region: str | None = None,
    *,
    connections: int | None = None,
    attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> Any:
    """`service`'s boto3 client in `region` (None: the environment's), with a pool of
    `connections` (None: botocore's 10), trying each request `attempts` times."""
    import boto3

    return boto3.client(service, region_name=region, config=retry_config(connections, attempts))


def resource(
    service: str, region: str | None = None, *, attempts: int = DEFAULT_MAX_ATTEMPTS
) -> Any:
    """`service`'s boto3 resource (DynamoDB's tables) in `region` (None: the environment's),
    trying each request `attempts` times."""
    import boto3

    return boto3.resource(service, region_name=region, config=retry_config(attempts=attempts))


def probe(service: str, region: str) -> Any:
    """`service`'s client in `region` for asking whether the region answers (`probe_config`)."""
    import boto3

    return boto3.client(service, region_name=region, config=probe_config())


def region_of(client: Any) -> str | None:
    """The region `client` calls (None: no client yet): what an outage message names."""
    return None if client is None else client.meta.region_name


def probe_config() -> Any:
    """The botocore configuration of a call that asks whether a region answers (the failover
    check, on-call's commands in an outage): a region cut off never answers, and whoever asks
    waits on it, so short timeouts and one retry (the failover rule's checks in a row are the
    rest)."""
    from botocore.config import Config

    return Config(connect_timeout=5, read_timeout=10,
                  retries={"mode": "standard", "max_attempts": 2})  # fmt: skip
