"""The environment's queue, as one scheduled check sees it: every declared run's demand, judged
once by `admission.admit` before the runs are checked one by one (`capacity_check`), so that
every region's handler reaches the same verdicts from the same global tables.

In the queue: every run that is submitted (its training configuration stored: the time of
its first is its submission), not finished or cancelled, and not held after crashes or at its
spend cap. A run holds its machines once the handler started it, until it is preempted (then
it waits like the others until admitted again) or its gang is released for not coming whole
(then it is out of the queue until it may ask again, `capacity_policy` rule 8, and then waits
behind the runs queued before the release); one that announced its final
checkpoint is finishing, and the next runs start on its machines. A team's spend is its runs'
this calendar month (their ledgers). Where the environment asks, each region's ceilings are
also what its AWS quotas leave free (`account_quotas`). An environment without teams, ceilings
or quotas to read has no queue: nothing is read."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime

from spotrain.constructs.interruption_handler.runtime import account_quotas, aws, settings
from spotrain.constructs.interruption_handler.runtime.settings import Settings
from spotrain.core import admission, fleet_state, run_lifecycle, spend_ledger


def verdicts(environment: Settings, runs: Mapping[str, Settings]) -> dict[str, admission.Verdict]:
    """Each queued run's verdict (empty where the environment limits nothing)."""
    text = environment.handler.queue_policy
    policy = admission.QueuePolicy.from_json(text) if text else admission.QueuePolicy()
    if policy.limits_nothing:
        return {}
    now = settings.now()
    table = aws.events_table(environment)
    demands, team_spend = [], defaultdict(float)
    for run, run_settings in sorted(runs.items()):
        declared = run_settings.declaration
        assert declared is not None
        ledger = spend_ledger.read(table, run)  # once: the team's spend and the cap's hold
        if declared.team:
            team_spend[declared.team] += spend_ledger.month_to_date(table, run, now, ledger)
        lifecycle = run_lifecycle.read(table, run)
        if lifecycle.stopped:
            continue
        submitted = lifecycle.started_at
        if submitted is None and (submitted := aws.submitted_at(run_settings)) is None:
            continue  # not submitted: it waits for its configuration, not in the queue
        state = fleet_state.run_state(table, run)
        if state.failed or ledger.held:
            continue  # held with its groups at 0 until an operator releases it
        if state.gang_waiting(run_settings.gang_timeout_s, now):
            continue  # its gang was released: it waits to ask again, taking no one's turn
        submitted = max(submitted, state.gang_released_at or submitted)  # behind those before
        holding = lifecycle.started_at is not None and state.queued is None
        demands.append(admission.Demand(
            run=run, region=aws.current_epoch(run_settings).region, team=declared.team,
            priority=declared.priority, submitted_at=submitted, gpus=declared.gpus,
            vcpus=declared.vcpus, preemptible=declared.run_deadline is None,
            holding=holding, finishing=holding and lifecycle.finishing(now),
        ))  # fmt: skip
    ceilings: admission.Ceilings = policy.ceilings
    if policy.account_quotas:  # and under what the account's quotas leave free
        free = account_quotas.free_of_quotas(demands, datetime.fromtimestamp(now, UTC))
        ceilings = admission.tightest(policy.ceilings, free)
    return admission.admit(demands, ceilings=ceilings, teams=policy.teams_by_name,
                           team_spend_usd=team_spend)  # fmt: skip


def said(verdict: admission.Verdict | None) -> str | None:
    """What a run the queue keeps waiting is told, its place first (None: not kept)."""
    if verdict is None or verdict.admitted:
        return None
    return f"#{verdict.place} in the queue: {verdict.reason}" if verdict.place else verdict.reason
