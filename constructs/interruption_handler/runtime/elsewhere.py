"""The check of a run that trains in another region than this handler's: its handler there
keeps its ledger, holds and starts it; this one empties the run's groups here, which the run
has left (they may not train: one writer at a time), unless that region stops answering and
this one is the run's next (`spotrain.core.failover`), or that region's handler wishes the run
moved here for spot (`deadline.for_spot`): then this handler orders the move here and starts
the run's groups, whose machines claim the run as they boot."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from spotrain.constructs.interruption_handler.runtime import aws, clients, settings
from spotrain.constructs.interruption_handler.runtime.settings import Settings
from spotrain.core import capacity_policy, failover, fleet_state, run_epochs
from spotrain.core.capacity import Group
from spotrain.core.capacity_policy import Decision
from spotrain.core.errors import does_not_answer

log = logging.getLogger()


def check_elsewhere(
    run_settings: Settings, table: Any, groups: list[Group], epoch: run_epochs.EpochId,
    autoscaling: Callable[[str], Any], asked: dict[str, bool],
) -> dict[str, Any]:  # fmt: skip
    """The run trains in another region, in `epoch` (this region's copy of the catalog says
    so); `asked`: the regions this check has asked already, and whether they answered."""
    region = epoch.region
    declaration, run, here = run_settings.declaration, run_settings.run, aws.own_region()
    assert declaration is not None
    state = fleet_state.failover_state(table, run, here)
    silent, verdict = _heard(run_settings, state, epoch, here, asked)
    order, standing = verdict.order, state.move_order
    if order is None and region not in silent:  # its region's handler may send it here
        order = wished_here(table, run, epoch, here)
    if order is not None and standing is not None and _same_move(order, standing):
        order = standing  # the first order of this move stands (None: withdrawn, if any)
    kept = fleet_state.FailoverState(silent, order)
    if kept != state:
        fleet_state.set_failover_state(table, run, here, kept)
    if order is not None:
        decision = _fail_over(run_settings, groups, order, first=order is not standing)
    else:
        decision = capacity_policy.follow_the_run(region, here, groups, declaration.groups)
    if decision is None:
        decision = Decision(
            "none",
            f"the run trains in {region}, whose handler checks it; none "
            f"of its groups here is asked for a machine ({verdict.reason})",
        )
    elif order is None and verdict.reason:
        decision = replace(decision, reason=f"{decision.reason} ({verdict.reason})")
    if decision.desired:
        aws.apply(decision, groups, table, "", autoscaling)  # the run's state is its region's
        aws.notify(run_settings.handler.alert_topic_arn,
                   f"spotrain: {decision.action} (run {run})", asdict(decision))  # fmt: skip
    return {"decision": decision.action, "reason": decision.reason, "desired": decision.desired,
            "ledger": {"counted": False, "why": f"the run trains in {region}: its handler "
                       "there keeps the ledger"}}  # fmt: skip


def wished_here(table: Any, run: str, epoch: run_epochs.EpochId, here: str
                ) -> failover.MoveOrder | None:  # fmt: skip
    """The move here that the handler of the region the run trains in wishes (for spot:
    `deadline.for_spot`), read from its failover item (its own writes alone), when it is a
    move of the run's current epoch to this region."""
    wish = fleet_state.failover_state(table, run, epoch.region).move_order
    if wish is None or (wish.to_region, wish.from_epoch, wish.from_region) != (
            here, epoch.number, epoch.region):  # fmt: skip
        return None
    return wish


def answers(settings: Settings, region: str, asked: dict[str, bool]) -> bool:
    """Whether `region` answers this handler: its Auto Scaling API, asked about the run's groups
    there, once a check (`asked`, shared by the check's runs). False when it does not
    (`errors.does_not_answer`); a refusal is raised."""
    if region not in asked:
        names = [g.name for g in settings.declaration.groups if g.region == region] if (
            settings.declaration) else []  # fmt: skip
        client = clients.probe("autoscaling", region)
        try:
            client.describe_auto_scaling_groups(AutoScalingGroupNames=names, MaxRecords=1)
            asked[region] = True
        except Exception as error:
            if not does_not_answer(error):
                raise
            log.warning("%s does not answer: %s", region, error)
            asked[region] = False
    return asked[region]


def _same_move(one: failover.MoveOrder, other: failover.MoveOrder) -> bool:
    return (one.from_epoch, one.from_region, one.to_region) == (
        other.from_epoch, other.from_region, other.to_region)  # fmt: skip


Silences = dict[str, failover.Silence]


def _heard(run_settings: Settings, state: fleet_state.FailoverState, epoch: run_epochs.EpochId,
           here: str, asked: dict[str, bool]) -> tuple[Silences, failover.Verdict]:  # fmt: skip
    """Ask the run's region whether it answers (and, when it does not, the run's other
    regions, one of which may be its next before this one): the silences after this check,
    and the failover rule's verdict."""
    assert run_settings.declaration is not None
    regions, region, now = run_settings.declaration.regions, epoch.region, settings.now()
    answered = {region: answers(run_settings, region, asked)}
    if not answered[region]:
        answered |= {other: answers(run_settings, other, asked)
                     for other in regions if other not in (region, here)}  # fmt: skip
    silent = failover.heard(state.silent, answered, now)
    return silent, failover.failover(
        here=here, trains_in=region, epoch=epoch.number, regions=regions, silent=silent,
        now=now, after_checks=run_settings.handler.failover_after_checks,
    )  # fmt: skip


def _fail_over(run_settings: Settings, groups: list[Group], order: failover.MoveOrder, *,
               first: bool) -> Decision:  # fmt: skip
    """The move here is ordered (and kept for the machines to read): the run's groups here
    start at their declared sizes."""
    assert run_settings.declaration is not None
    if first:
        log.warning("run %s: %s", run_settings.run, order.reason)
    started = capacity_policy.start(
        groups, capacity_policy.groups_in(order.to_region, run_settings.declaration.groups)
    )
    claims = ("its machines claim the run here from its newest checkpoint whose every piece "
              "replicated here, as they boot")  # fmt: skip
    if not started.desired:
        return Decision("none", f"{order.reason}; ordered, and its groups here run: {claims}")
    there = ", ".join(f"{n} {started.min_sizes[n]}..{started.desired[n]}"
                      for n in sorted(started.desired))  # fmt: skip
    return replace(started, action="fail-over", reason=f"{order.reason}; {there} start: {claims}")
