"""A retried request is answered as its first attempt was, when that attempt already succeeded.

AWS's SDKs mark every attempt of one call with the same `amz-sdk-invocation-id` header. A
client that loses a reply, or gives up waiting for one (Terraform's AWS provider and boto3 under
a full test run on two busy cores), sends the call again, and moto would do it again: a second
"remove the role from the instance profile" failed with a 500 and the whole destroy after five
tries; a second flow-log create answered "already exists". AWS makes such calls safe with its
own means (idempotency tokens, "not found" answers the clients accept), which moto does not
copy; the local cloud answers the repeated attempt with the reply the first one got instead,
for every service at once. A retry that arrives while the first attempt is still being
answered waits for it. Reads are never held back: repeating one changes nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

INVOCATION_HEADER = "HTTP_AMZ_SDK_INVOCATION_ID"
ATTEMPT_HEADER = "HTTP_AMZ_SDK_REQUEST"  # "attempt=2; max=5"

REPLIES_KEPT = 2000
"""Successful replies remembered for their retries, newest kept: far more than the calls in
flight at once, whose retries come within seconds."""

LARGEST_REPLY_KEPT = 256 << 10
"""A larger reply is not kept, and its retry is done again (no call that changes something
answers with one here: the largest are functions' results)."""

READS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass
class _Call:
    """One invocation: its first attempt's reply, once that attempt is answered."""

    done: threading.Event = field(default_factory=threading.Event)
    reply: tuple[str, list[tuple[str, str]], bytes] | None = None


def attempt_of(environ: dict[str, Any]) -> int:
    """The attempt number the SDK sent (1 when it sent none)."""
    for part in environ.get(ATTEMPT_HEADER, "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == "attempt" and value.isdigit():
            return int(value)
    return 1


def answered_once(app: Callable[..., Iterable[bytes]]) -> Callable[..., Any]:
    """WSGI middleware: a repeated attempt of a call that changes something gets the first
    attempt's successful reply; after an attempt that failed, the next is done, and any retry
    beside it waits for that one."""
    calls: OrderedDict[tuple[str, str, str], _Call] = OrderedDict()
    lock = threading.Lock()

    def middleware(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        invocation = environ.get(INVOCATION_HEADER)
        method = environ.get("REQUEST_METHOD", "GET")
        if not invocation or method in READS:
            return app(environ, start_response)
        key = (invocation, method, environ.get("PATH_INFO", ""))
        while True:
            with lock:
                earlier = calls.get(key)
                if earlier is None or (earlier.done.is_set() and earlier.reply is None):
                    calls[key] = call = _Call()  # this attempt is the one that does the call
                    while len(calls) > REPLIES_KEPT:
                        calls.popitem(last=False)
                    break
            earlier.done.wait()
            if earlier.reply is not None:
                status, headers, body = earlier.reply
                environ["spotrain.replayed"] = True
                start_response(status, headers)
                return [body]
        try:
            return _answer_and_keep(app, environ, start_response, call)
        finally:
            call.done.set()

    return middleware


def _answer_and_keep(
    app: Callable[..., Iterable[bytes]],
    environ: dict[str, Any],
    start_response: Callable[..., Any],
    call: _Call,
) -> list[bytes]:
    started: list[tuple[str, list[tuple[str, str]]]] = []

    def start(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
        started.append((status, list(headers)))
        return start_response(status, headers, *exc_info)

    answer = app(environ, start)
    try:
        body = b"".join(answer)
    finally:
        close = getattr(answer, "close", None)
        if close is not None:
            close()
    status, headers = started[-1]
    if status.startswith("2") and len(body) <= LARGEST_REPLY_KEPT:
        call.reply = (status, headers, body)
    return [body]
