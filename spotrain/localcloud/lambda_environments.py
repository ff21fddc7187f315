"""Lambda's execution environments, kept warm as Lambda keeps them: a function's environment
(its zip unpacked, its configuration, a Python process that has imported its handler) serves
one invocation at a time and then waits for the next, so only a cold start pays for the
interpreter, boto3 and the handler's imports (about a CPU-second; a warm invocation, a few
milliseconds). As on AWS, what a handler keeps at module level outlives an invocation (the
interruption handler's declarations, reused for `settings.DECLARATIONS_TTL_S`), invocations at
once each get an environment of their own, and an environment whose invocation failed or
timed out is not used again.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import io
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import zipfile
from typing import Any

KEPT_IDLE = 4
"""Idle environments kept per function (its code and configuration): a burst of invocations
starts as many as it needs, and the rest are ended when they come back."""

_RUNNER = r"""
import importlib, io, json, sys, traceback
class Switch(io.TextIOBase):
    target = io.StringIO()
    def write(self, text):
        return self.target.write(text)
replies, sys.stdout, sys.stderr = sys.stdout, Switch(), Switch()
sys.path.insert(0, sys.argv[1])
module, _, function = sys.argv[2].rpartition(".")
handle = None
for line in sys.stdin:
    sys.stdout.target, sys.stderr.target = io.StringIO(), io.StringIO()
    code = 0
    try:
        handle = handle or getattr(importlib.import_module(module), function)
        print(json.dumps(handle(json.loads(line), None), default=str))
    except BaseException:
        traceback.print_exc()
        code = 1
    replies.write(json.dumps({"code": code, "stdout": sys.stdout.target.getvalue(),
                              "stderr": sys.stderr.target.getvalue()}) + "\n")
    replies.flush()
    if code:
        break
"""
"""An environment's process: it imports the handler at its first invocation, then answers one
line of JSON (the event) with one line (the exit code, what the invocation printed, its log)."""

_idle: dict[tuple[Any, ...], list[_Environment]] = {}
_lock = threading.Lock()


class _Environment:
    def __init__(self, code: bytes, handler: str, environment: dict[str, str]) -> None:
        self.folder = tempfile.TemporaryDirectory(prefix="spotrain-lambda-")
        with zipfile.ZipFile(io.BytesIO(code)) as archive:
            archive.extractall(self.folder.name)
        self.errors = open(os.path.join(self.folder.name, ".runtime.log"), "w+")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-c", _RUNNER, self.folder.name, handler], env=environment,
            cwd=self.folder.name, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.errors, text=True,
        )  # fmt: skip

    def invoke(self, event: dict[str, Any], timeout_s: float) -> subprocess.CompletedProcess[str]:
        """One invocation; TimeoutExpired (the environment ended) if it outlasts `timeout_s`."""
        assert self.process.stdin is not None and self.process.stdout is not None
        args = self.process.args
        try:
            self.process.stdin.write(json.dumps(event, default=str) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            return self._died()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        if not ready:
            self.close()
            raise subprocess.TimeoutExpired(args, timeout_s)
        line = self.process.stdout.readline()
        if not line:
            return self._died()
        reply = json.loads(line)
        return subprocess.CompletedProcess(args, reply["code"], reply["stdout"], reply["stderr"])

    def _died(self) -> subprocess.CompletedProcess[str]:
        """The process ended without answering (it exited, or was killed): its exit and log."""
        code = self.process.wait()
        self.errors.seek(0)
        log = self.errors.read()
        self.close()
        return subprocess.CompletedProcess(self.process.args, code or 1, "", log)

    def close(self) -> None:
        """End the process (again, harmlessly, if it has ended) and remove its folder."""
        with contextlib.suppress(OSError):
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.errors):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        self.folder.cleanup()


def invoke(
    code: bytes, handler: str, environment: dict[str, str], event: dict[str, Any],
    timeout_s: float,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run `handler` (`module.function`) of the function whose zip is `code`, with the process
    environment `environment`, on `event`: in an idle environment of the same function, or a
    new one. Like a process run: its exit code, what it printed (the result's JSON last), its
    log."""
    key = (hashlib.sha256(code).hexdigest(), handler, tuple(sorted(environment.items())))
    with _lock:
        kept = _idle.get(key)
        warm = kept.pop() if kept else None
    environment_ = warm or _Environment(code, handler, environment)
    try:
        done = environment_.invoke(event, timeout_s)
    except BaseException:  # a reply it could not read: the environment is not used again
        environment_.close()
        raise
    if done.returncode != 0:
        environment_.close()
        return done
    with _lock:
        kept = _idle.setdefault(key, [])
        if len(kept) < KEPT_IDLE:
            kept.append(environment_)
            return done
    environment_.close()
    return done


@atexit.register
def _end_all() -> None:
    with _lock:
        ended = [e for kept in _idle.values() for e in kept]
        _idle.clear()
    for environment in ended:
        environment.close()
