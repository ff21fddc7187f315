"""The scheduled capacity check: every run of the environment, each on its own (one run's
failure is reported in its result and logged, and the others are checked).

Every region of the environment has its handler, and each scales its own region's groups
only. A run is checked in full by the handler of the region it trains in (its epoch's, as that
region's copy of the catalog says): it moves the spend ledger, makes sure a finished run is
marked so, asks the capacity policy whether the run may have machines (hold, wait, start or
release), starts its groups there when the run has just moved in, and reconciles them
(on-demand covers a spot shortfall, and goes when spot returns; a run with a deadline follows
the deadline policy, on its progress read from the checkpoint catalog). Every other region's
handler only empties the run's groups in its region, or takes the run when its region stops
answering and this one is the run's next (`elsewhere`). A run with a deadline in several
regions may move for spot first (`deadline.for_spot`)."""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from typing import Any

from spotrain.constructs.interruption_handler.runtime import (
    aws,
    clients,
    deadline,
    elsewhere,
    run_queue,
    settings,
    spend,
)
from spotrain.constructs.interruption_handler.runtime.settings import Settings
from spotrain.core import (
    admission,
    capacity_policy,
    fleet_state,
    run_lifecycle,
    spend_ledger,
)

log = logging.getLogger()


def on_capacity_check(environment: Settings) -> dict[str, Any]:
    results: dict[str, Any] = {}
    asked: dict[str, bool] = {}  # whether each region answered, asked once a check
    runs = settings.declared_runs(environment, fresh=True)
    try:
        queue = run_queue.verdicts(environment, runs)
    except Exception as error:  # no run starts on a queue it could not judge; the next retries
        log.exception("the queue could not be judged")
        said = (f"the queue could not be judged ({error}): the next check tries again; the "
                "handler's log has the cause")  # fmt: skip
        queue = {run: admission.Verdict(False, said) for run in runs}
    for run, run_settings in sorted(runs.items()):
        verdict = queue.get(run)
        preempted_by = verdict.preempted_by if verdict else None
        try:
            results[run] = check_run(run_settings, asked, queued=run_queue.said(verdict),
                                     preempted_by=preempted_by)  # fmt: skip
        except Exception as error:  # the other runs' checks go on; the next check retries
            log.exception("the capacity check of run %s failed", run)
            results[run] = {"decision": "error", "reason": f"{type(error).__name__}: {error}"}
    return {"runs": results}


def check_run(
    run_settings: Settings,
    asked: dict[str, bool] | None = None,
    *,
    queued: str | None = None,
    preempted_by: str | None = None,
) -> dict[str, Any]:
    """One run's check. `queued`: why the queue does not admit it (None: it does), which
    holds a run not started yet, one it preempts (for run `preempted_by`), or one waiting
    since it was; a run that holds its machines keeps them whatever else the queue says (a
    queue that could not be judged stops no training)."""
    now = settings.now()
    run, topic = run_settings.run, run_settings.handler.alert_topic_arn
    table = aws.events_table(run_settings)
    autoscaling = clients.by_region("autoscaling")
    chain = aws.epoch_chain(run_settings, run)  # read once: the epoch, then the final head
    here, epoch = aws.own_region(), aws.current_epoch(run_settings, chain)
    region = epoch.region
    groups = aws.capacity_groups(run_settings, autoscaling, region=here)
    assert run_settings.declaration is not None
    if region != here:
        return elsewhere.check_elsewhere(
            run_settings, table, groups, epoch, autoscaling, {} if asked is None else asked
        )
    state = fleet_state.run_state(table, run)
    try:
        counted, ledger = spend.update_ledger(run_settings, table, now)
    except Exception as error:  # the capacity decision goes on; the next check counts the time
        log.exception("the spend ledger was not updated")
        counted = {"error": f"{type(error).__name__}: {error}"}
        ledger = spend_ledger.read(table, run)
    if ledger is not None:
        ledger = spend.judge_spend(run_settings, table, ledger, now)
    lifecycle = run_lifecycle.read(table, run)
    if (
        lifecycle.finished_step is None
        and (step := aws.final_step(run_settings, chain)) is not None
    ):
        # The stream's notice was missed (or is still on its way): the check makes sure.
        lifecycle = finish(run_settings, table, step, now, ledger, stop=False)
    stored = lifecycle.started_at is not None or aws.configuration_stored(run_settings)
    if lifecycle.started_at is not None and not preempted_by and state.queued is None:
        queued = None  # it holds its machines: only a preemption takes them
    queued = queued or state.gang_waiting(run_settings.gang_timeout_s, now)  # rule 8's wait
    held = capacity_policy.hold_for(capacity_policy.Standing(
        run=run, lifecycle=lifecycle, configuration_stored=stored, crashed=state.failed,
        spend_usd=ledger.spend_usd if ledger else 0.0,
        cap_usd=ledger.cap_usd if ledger else None, at_cap=bool(ledger and ledger.held),
        queued=queued,
    ))  # fmt: skip
    if queued != state.queued or preempted_by:
        fleet_state.set_queued(table, run, queued, preempted_by=preempted_by, at=now)
    decision = None
    if held is not None:
        decision = capacity_policy.hold(groups, held)
        if held.kind == capacity_policy.WAITING:
            bucket = f"s3://{run_settings.handler.config_bucket}"
            decision = replace(decision, reason=f"{decision.reason}; `spotrain config put "
                               f"CONFIG --store {bucket}` stores one, and the next check "
                               "starts the run")  # fmt: skip
        if held.remembers_sizes and decision.min_sizes:  # remember what to put back first
            fleet_state.set_held_sizes(
                table, run, capacity_policy.sizes_to_remember(groups, decision)
            )
    elif lifecycle.started_at is None:
        run_lifecycle.mark_started(table, run, now)
        decision = capacity_policy.start(
            groups,
            capacity_policy.groups_in(here, run_settings.declaration.groups),
            state.held_sizes,
        )
        fleet_state.set_held_sizes(table, run, None)  # the start put them back
        decision = decision if decision.desired else None
    elif state.held_sizes:
        decision = capacity_policy.release(groups, state.held_sizes)
        fleet_state.set_held_sizes(table, run, None)
    progress, measured = None, ""  # read only for a run no hold, start or release decided
    anywhere = plan = None  # a run of several regions: its record of spot in any of them
    if decision is None:  # where a run with a deadline should train: it may move for spot
        progress, measured = deadline.deadline_progress(run_settings, now)
        decision, anywhere, plan = deadline.for_spot(run_settings, table, groups, state,
                                                     progress, epoch.number, now)  # fmt: skip
    if decision is None:
        decision = capacity_policy.follow_the_run(region, here, groups,
                                                  run_settings.declaration.groups)  # fmt: skip
    decision = whole_gang(run_settings, table, groups, state, decision, now,
                          ledger.spend_usd if ledger else 0.0)  # fmt: skip
    if decision is None:
        record = kept = None
        if anywhere is not None:  # it stays: on-demand by spot anywhere (`outage_fill.across`)
            record = anywhere
        elif run_settings.declaration.run_deadline is not None:
            every_h = run_settings.handler.capacity_check_minutes / 60
            record = kept = capacity_policy.looked(state.spot_record, groups, now,
                                                   interval_h=every_h)  # fmt: skip
        decision = capacity_policy.reconcile(
            groups=groups, short_since=state.short_since, now=now,
            on_demand_deadline_s=60 * run_settings.handler.on_demand_deadline_minutes,
            progress=progress, record=record, plan=plan,
        )  # fmt: skip
        decision = replace(decision, spot_record=kept)
        if measured:
            decision = replace(decision, reason=f"{decision.reason} ({measured})")
    aws.apply(decision, groups, table, run, autoscaling)
    if decision.desired:
        aws.notify(topic, f"spotrain: {decision.action} (run {run})", asdict(decision))
    return {"decision": decision.action, "reason": decision.reason, "desired": decision.desired,
            "ledger": counted}  # fmt: skip


def whole_gang(
    run_settings: Settings, table: Any, groups: list[Any], state: fleet_state.RunState,
    decision: capacity_policy.Decision | None, now: float, spend_usd: float,
) -> capacity_policy.Decision | None:  # fmt: skip
    """Rule 8 of the capacity policy: a decision that raises the run's groups from none asks
    for its gang; with no such decision, a gang that did not come in time is released (its
    sizes remembered, the run back in the queue: the next check asks again, or the queue's
    next run first). Keeps when it asked; `decision`, or the release, or None."""
    assert run_settings.declaration is not None
    asked, run = state.gang_asked, run_settings.run
    if decision is not None:
        raises = decision.action in capacity_policy.ASKS_FROM_NONE and decision.desired
        asked = capacity_policy.GangAsked(now, spend_usd) if raises else None
    else:
        declared = capacity_policy.groups_in(aws.own_region(), run_settings.declaration.groups)
        minimum, timeout_s = capacity_policy.gang_minimum(declared), run_settings.gang_timeout_s
        asked, decision = capacity_policy.whole_gang(
            groups, minimum=minimum, asked=asked, now=now, timeout_s=timeout_s,
            spend_usd=spend_usd, releases=state.gang_releases,
        )  # fmt: skip
        if decision is not None:  # it waits, then goes back in the queue behind those before it
            sizes = capacity_policy.sizes_to_remember(groups, decision)
            said = capacity_policy.gang_waiting(now, state.gang_releases + 1, timeout_s, now=now)
            fleet_state.release_gang(table, run, sizes, now, said or "")
        elif state.gang_asked is not None and capacity_policy.gang_whole(groups, minimum):
            fleet_state.gang_came_whole(table, run)
            return decision
    if asked != state.gang_asked:
        fleet_state.set_gang_asked(table, run, asked)
    return decision


def finish(
    run_settings: Settings, table: Any, step: int, now: float,
    ledger: spend_ledger.Ledger | None = None, *, stop: bool = True,
) -> run_lifecycle.Lifecycle:  # fmt: skip
    """The run published its final step: mark it finished, take its groups to 0 (unless the
    caller does: `stop`) and, the first time, send the topic the run's cost summary."""
    run = run_settings.run
    first = run_lifecycle.mark_finished(table, run, step, now)
    lifecycle = run_lifecycle.read(table, run)
    held = capacity_policy.hold_for(capacity_policy.Standing(run=run, lifecycle=lifecycle))
    if stop and held is not None:
        autoscaling = clients.by_region("autoscaling")
        groups = aws.capacity_groups(run_settings, autoscaling, region=aws.own_region())
        aws.apply(capacity_policy.hold(groups, held), groups, table, run, autoscaling)
    if first:
        ledger = ledger or spend_ledger.read(table, run)
        aws.notify(run_settings.handler.alert_topic_arn, f"spotrain: run {run} finished at "
                   f"step {step}", {
            "run": run, "kind": "finished", "step": step,
            "decision": f"{lifecycle.why_stopped}: its groups go to 0",
            "spend_usd": round(ledger.spend_usd, 2),
            "on_demand_usd": round(ledger.on_demand_usd, 2),
            "machine_hours": round(sum(p["seconds"] for p in ledger.per_pool.values()) / 3600, 3),
            "report": f"spotrain cost report --run {run} --events-table "
                      f"{run_settings.handler.events_table}",
        })  # fmt: skip
        log.info("run %s finished at step %d", run, step)
    return lifecycle
