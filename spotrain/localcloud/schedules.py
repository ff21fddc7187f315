"""The local cloud keeps time as EventBridge does: every enabled rule with a `rate(...)`
schedule runs its Lambda targets once a period, from the deployed function's zip and
configuration (as stream mappings do), so the interruption handler's capacity check moves the
spend ledger, notices finished runs and applies the deadline policy with nobody delivering it.

A speed-up divides every period: 1 is AWS's own time, 60 runs a 5-minute check every 5 seconds
(demos, tests), 0 stops the clock. It is read from `clock.json` beside the faults file (set
with `spotrain local up --schedule-speedup N` or `control.set_schedule_speedup`), so a running
cloud changes pace at once. `cron(...)` schedules are not played (spotrain deploys none).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any

CLOCK_NAME = "clock.json"
TICK_S = 0.5
_UNITS_S = {"minute": 60, "minutes": 60, "hour": 3600, "hours": 3600, "day": 86400, "days": 86400}
_RATE = re.compile(r"^rate\((\d+) (minutes?|hours?|days?)\)$")


def rate_seconds(expression: str | None) -> float | None:
    """The period of a `rate(N unit)` schedule in seconds; None for anything else."""
    match = _RATE.match((expression or "").strip())
    return int(match[1]) * _UNITS_S[match[2]] if match else None


def read_speedup(clock: Path) -> float:
    """The speed-up in `clock` (0, the clock stopped, when there is none or it is unreadable)."""
    try:
        return max(0.0, float(json.loads(clock.read_text())["speedup"]))
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def write_speedup(clock: Path, speedup: float) -> None:
    staging = clock.with_name(clock.name + ".partial")
    staging.write_text(json.dumps({"speedup": speedup}))
    staging.replace(clock)


def scheduled_event(rule: Any) -> dict[str, Any]:
    """What EventBridge hands a target of a schedule rule."""
    return {
        "version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event",
        "source": "aws.events", "account": rule.account_id,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "region": rule.region_name, "resources": [rule.arn], "detail": {},
    }  # fmt: skip


def start(clock: Path) -> None:
    """Keep time in this (the server's) process from now on."""
    threading.Thread(target=_keep_time, args=(clock,), daemon=True, name="schedules").start()


def _rules() -> list[Any]:
    from moto.events.models import events_backends

    found = []
    for by_region in list(events_backends.values()):
        for backend in list(by_region.values()):
            for bus in list(backend.event_buses.values()):
                found.extend(r for r in list(bus.rules.values()) if r.state == "ENABLED")
    return found


def _keep_time(clock: Path) -> None:
    last: dict[str, float] = {}  # rule ARN -> when its period last began
    running: set[str] = set()  # a rule whose targets still run is not started again
    while True:
        time.sleep(TICK_S)
        speedup, now = read_speedup(clock), time.monotonic()
        if speedup <= 0:
            last.clear()  # a restarted clock waits a whole period, as a new rule does
            continue
        for rule in _rules():
            period = rate_seconds(rule.scheduled_expression)
            if period is None:
                continue
            began = last.setdefault(rule.arn, now)
            if now - began < period / speedup or rule.arn in running:
                continue
            last[rule.arn] = now
            running.add(rule.arn)
            threading.Thread(target=_fire, args=(rule, running), daemon=True).start()


def _fire(rule: Any, running: set[str]) -> None:
    from moto.awslambda.utils import get_backend

    from spotrain.localcloud.extensions import run_python_function

    try:
        for target in list(rule.targets):
            arn = str(target.get("Arn", ""))
            if ":lambda:" not in arn:
                continue
            region = arn.split(":")[3]
            function = get_backend(rule.account_id, region).get_function(arn)
            event = json.loads(target["Input"]) if target.get("Input") else scheduled_event(rule)
            try:
                done = run_python_function(
                    function.code_bytes, function.handler, dict(function.environment_vars),
                    region, event, float(function.timeout), function.role,
                )  # fmt: skip
                outcome = (
                    f"exit {done.returncode}: {done.stdout.strip()[-1000:]} {done.stderr[-1000:]}"
                )
            except (subprocess.TimeoutExpired, OSError, zipfile.BadZipFile) as error:
                outcome = f"failed: {error}"
            print(f"local cloud: schedule {rule.name} ran {arn}: {outcome}", flush=True)
    except Exception as error:  # a rule or function deleted meanwhile: the next period tries
        print(f"local cloud: schedule {rule.name} did not run: {error}", flush=True)
    finally:
        running.discard(rule.arn)
