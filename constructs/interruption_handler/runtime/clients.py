"""The handler's AWS clients, made once for its execution environment and reused by every
invocation it serves, as AWS advises for Lambda: making a client (loading its service model,
resolving its endpoint and credentials) cost more CPU than the calls a check makes with it.

An environment serves one invocation at a time, so no lock is needed; its settings (region,
credentials, endpoint) do not change while it lives. Tests that change them between
invocations in one process call `forget` first.

They retry in botocore's standard mode, as every other spotrain client does
(`aws_clients.retry_config`), but try a request 5 times, not 6: standard mode's backoff before
a sixth could reach 31 s, past the function's 30 s timeout, and before a fifth at most 15 s.
boto3's default (legacy mode: 10 tries for DynamoDB, up to 25.6 s of backoff) left a check
that met one failing call no time for the rest. An invocation that fails all the same is
retried by Lambda and then lands in the dead-letter queue."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import boto3

from spotrain.core import aws_clients

ATTEMPTS = 5
"""Tries of each of the handler's requests: standard mode's backoff before the last stays within
15 s, half the function's timeout."""


@functools.cache
def client(service: str, region: str | None = None) -> Any:
    """`service`'s client in `region` (None: the function's own region)."""
    return aws_clients.client(service, region, attempts=ATTEMPTS)


def by_region(service: str) -> Callable[[str], Any]:
    """`service`'s client for whichever region is asked (a run's groups may be in any)."""
    return functools.partial(client, service)


@functools.cache
def probe(service: str, region: str) -> Any:
    """`service`'s client in `region` for asking whether the region answers: short timeouts,
    no retries (`aws_clients.probe`)."""
    return aws_clients.probe(service, region)


@functools.cache
def dynamodb() -> Any:
    """DynamoDB's resource in the function's region (its tables: events and catalog)."""
    return aws_clients.resource("dynamodb", attempts=ATTEMPTS)


@functools.cache
def own_region() -> str:
    """The region this handler runs in (the function's)."""
    return str(boto3.session.Session().region_name)


def forget() -> None:
    """Make every client afresh at its next use (another cloud, region or credentials)."""
    for made in (client, probe, dynamodb, own_region):
        made.cache_clear()
