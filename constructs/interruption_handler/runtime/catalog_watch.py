"""What a change to the checkpoint catalog says about a run's history, read from the catalog
table's stream (new and old images).

Published history only grows: a run's head moves forward, a complete checkpoint's record
keeps what it says (only its status may change: rolled back, quarantined, collected) and is
never removed. The trainer's roll back is the one legitimate move backwards, and it says so
(`rolled_back`, with a new `updated_at`). Anything else is an alarm: a machine's credentials
or a bug moved the head back, or rewrote or removed a record, and on-call should look.

A record that is published marked final says the run is done (`final_publishes`): the
handler then takes the run's machines away (`on_catalog_changes`). Just before, the trainer
announces that it is publishing its final checkpoint (`finishing_announcements`): the queue
then starts the next runs on its machines meanwhile (a warm start, `admission` rule 5). A
record published by a writer of an epoch the run has moved on from (`fenced_publishes`: a
region cut off from the others went on training) is an alarm too: it is fenced, never
restored, and that region's machines should be stopped. So is a refusal such a writer left
(`refused_writers`): once its region rejoined, it tried to start or publish and the run's
epoch refused it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from spotrain.constructs.interruption_handler.runtime import aws, capacity_check, settings
from spotrain.constructs.interruption_handler.runtime.settings import Settings
from spotrain.core import run_epochs, run_lifecycle
from spotrain.core.catalog_schema import (
    FINAL_KEY,
    FINISHING_SORT_KEY,
    HEAD_SORT_KEY,
    PARTITION_KEY,
    SORT_KEY,
    STATUS_COMPLETE,
    checkpoint_sort_key,
    run_key,
)

ALARM, NOTICE = "alarm", "notice"
MAY_CHANGE_ON_A_COMPLETE_RECORD = frozenset({"status", "status_reason"})
"""What a roll back, a quarantine or a collection sets; every other attribute is the record."""
_CHECKPOINT_PREFIX = checkpoint_sort_key(0).rstrip("0")


def _plain(image: dict[str, Any] | None) -> dict[str, str]:
    """A stream image (DynamoDB JSON) as attribute -> value text."""
    return {name: str(next(iter(value.values()))) for name, value in (image or {}).items()}


def finding(record: dict[str, Any]) -> dict[str, Any] | None:
    """What one stream record shows, or None when history only grew."""
    change = record.get("dynamodb", {})
    keys = _plain(change.get("Keys"))
    old, new = _plain(change.get("OldImage")), _plain(change.get("NewImage"))
    sort_key, event = keys.get(SORT_KEY, ""), record.get("eventName")

    def say(severity: str, kind: str, **details: Any) -> dict[str, Any]:
        run = keys.get(PARTITION_KEY, "").removeprefix(run_key(""))
        return {"severity": severity, "run": run, "kind": kind, **details}

    if (
        sort_key.startswith(HEAD_SORT_KEY)
        and event == "MODIFY"
        and old.get("step")
        and new.get("step")
    ):
        before, after = int(old["step"]), int(new["step"])
        if after >= before:
            return None
        moved = {"from_step": before, "to_step": after}
        if new.get("rolled_back") and new.get("updated_at") != old.get("updated_at"):
            return say(NOTICE, "head-rolled-back", **moved, reason=new["rolled_back"])
        return say(ALARM, "head-moved-back", **moved,
                   detail="the head moved to an earlier step without a roll back")  # fmt: skip
    if not sort_key.startswith(_CHECKPOINT_PREFIX) or old.get("status") != STATUS_COMPLETE:
        return None
    step = int(old.get("step") or sort_key.removeprefix(_CHECKPOINT_PREFIX))
    if event == "REMOVE":
        return say(ALARM, "record-removed", step=step, manifest=old.get("manifest"),
                   detail="a complete checkpoint's record was deleted")  # fmt: skip
    changed = sorted(
        name for name in (set(old) | set(new)) - MAY_CHANGE_ON_A_COMPLETE_RECORD
        if old.get(name) != new.get(name)
    )  # fmt: skip
    if event == "MODIFY" and changed:
        return say(ALARM, "record-rewritten", step=step, changed=changed,
                   manifest_before=old.get("manifest"), manifest_after=new.get("manifest"),
                   detail="a complete checkpoint's record was rewritten")  # fmt: skip
    return None


def findings(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in (finding(r) for r in records) if f is not None]


def fenced_publishes(
    records: list[dict[str, Any]], chain_of: Callable[[str], list[run_epochs.Epoch]]
) -> list[dict[str, Any]]:
    """An alarm for each checkpoint record that appeared but is not part of its run's history
    (`run_epochs`): its writer's epoch was moved on from, or its claim lost. `chain_of(run)`:
    the run's claims, read once per run."""
    found, chains, counted = [], {}, {}
    for record in records:
        change = record.get("dynamodb", {})
        keys, new = _plain(change.get("Keys")), _plain(change.get("NewImage"))
        sort_key = keys.get(SORT_KEY, "")
        if record.get("eventName") != "INSERT" or not sort_key.startswith(_CHECKPOINT_PREFIX):
            continue
        run = keys.get(PARTITION_KEY, "").removeprefix(run_key(""))
        if run not in chains:
            chains[run] = chain_of(run)
            counted[run] = run_epochs.in_history(chains[run])
        chain, step = chains[run], int(new.get("step") or 0)
        if counted[run](sort_key, step):
            continue
        latest = run_epochs.current(chain)
        assert latest is not None  # a run with no claims counts every checkpoint
        writer = run_epochs.written_by(sort_key, step, chain)
        found.append({
            "severity": ALARM, "run": run, "kind": "stale-writer", "step": step,
            "epoch": writer.number, "region": writer.region, "manifest": new.get("manifest"),
            "detail": f"a writer of epoch {writer.number} in {writer.region} published step "
                      f"{step} after the run moved to {latest.id.region} (epoch "
                      f"{latest.id.number}): fenced, never restored; stop the run's machines "
                      f"in {writer.region}",
        })  # fmt: skip
    return found


def refused_writers(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An alarm for each refusal a stale writer left (`run_epochs.refusal_item`): a machine of
    a region the run moved away from tried to start or publish, and was refused."""
    found = []
    for record in records:
        change = record.get("dynamodb", {})
        keys, new = _plain(change.get("Keys")), _plain(change.get("NewImage"))
        if record.get("eventName") != "INSERT" or not keys.get(SORT_KEY, "").startswith(
            run_epochs.REFUSAL_PREFIX
        ):
            continue
        run = keys.get(PARTITION_KEY, "").removeprefix(run_key(""))
        moved = (f"the run moved to {new['run_region']} (epoch {new['run_epoch']})"
                 if "run_region" in new else "the run moved on")  # fmt: skip
        found.append({
            "severity": ALARM, "run": run, "kind": "stale-writer", "refused": new.get("action"),
            "epoch": int(new.get("epoch") or 0), "region": new.get("region"), "at": new.get("at"),
            "detail": f"a writer of epoch {new.get('epoch')} in {new.get('region')} tried to "
                      f"{new.get('action')} after {moved}: refused, nothing published; stop "
                      f"the run's machines in {new.get('region')}",
        })  # fmt: skip
    return found


def final_publishes(records: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(run, step) of each complete checkpoint record that appeared marked final."""
    done = []
    for record in records:
        change = record.get("dynamodb", {})
        keys, new = _plain(change.get("Keys")), _plain(change.get("NewImage"))
        if (
            record.get("eventName") == "INSERT"
            and keys.get(SORT_KEY, "").startswith(_CHECKPOINT_PREFIX)
            and new.get(FINAL_KEY) == "True"
            and new.get("status") == STATUS_COMPLETE
        ):
            run = keys.get(PARTITION_KEY, "").removeprefix(run_key(""))
            done.append(
                (run, int(new.get("step") or keys[SORT_KEY].removeprefix(_CHECKPOINT_PREFIX)))
            )
    return done


def finishing_announcements(records: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(run, step) of each announcement that a run is publishing its final checkpoint."""
    said = []
    for record in records:
        change = record.get("dynamodb", {})
        keys, new = _plain(change.get("Keys")), _plain(change.get("NewImage"))
        if record.get("eventName") in ("INSERT", "MODIFY") and (
                keys.get(SORT_KEY) == FINISHING_SORT_KEY and new.get("step")):  # fmt: skip
            said.append((keys.get(PARTITION_KEY, "").removeprefix(run_key("")), int(new["step"])))
    return said


def on_catalog_changes(environment: Settings, records: list[Any]) -> dict[str, Any]:
    """A batch of the catalog's stream: each finding to the alert topic (and the log), and
    each run that published its final step finished (where the environment has a queue, a
    capacity check follows at once: the next runs start on the GPUs it freed)."""
    found = (
        findings(records)
        + fenced_publishes(records, lambda run: aws.epoch_chain(environment, run))
        + refused_writers(records)
    )
    for item in found:
        severity = "ALARM" if item["severity"] == ALARM else "notice"
        aws.notify(environment.handler.alert_topic_arn,
                   f"spotrain {severity}: {item['kind']} (run {item['run']})", item)  # fmt: skip
        logging.getLogger().warning("%s", json.dumps(item, default=str))
    final: dict[str, int] = {}
    for run, step in final_publishes(records):
        final[run] = max(step, final.get(run, step))
    announced = dict(finishing_announcements(records))
    finished, finishing = {}, {}
    if final or announced:
        runs = settings.declared_runs(environment)
        if (set(final) | set(announced)) - set(runs):  # a run declared since the last read?
            runs = settings.declared_runs(environment, fresh=True)
        table = aws.events_table(environment)
        for run, step in sorted(announced.items()):
            if run in runs and run not in final:  # its machines are the next runs' (warm start)
                run_lifecycle.mark_finishing(table, run, step, settings.now())
                finishing[run] = step
        for run, step in sorted(final.items()):
            if run in runs:  # a run of the environment: its groups go to 0
                capacity_check.finish(runs[run], table, step, settings.now())
                finished[run] = step
    result = {"catalog_changes": len(records), "findings": found, "finished": finished,
              "finishing": finishing}  # fmt: skip
    if (finished or finishing) and environment.handler.queue_policy:
        # GPUs freed, or about to be: the queue's next runs start now, not at the next
        # scheduled check.
        result["queue"] = capacity_check.on_capacity_check(environment)["runs"]
    return result
