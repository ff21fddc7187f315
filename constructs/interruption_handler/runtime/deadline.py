"""A run with a deadline at a scheduled check: its progress against the deadline, read from the
checkpoint catalog, and, where its environment has several regions, where it should train
(`outage_fill.across`): the handler of the region it trains in asks EC2's spot placement
scores for its other regions, keeps what every check saw of spot in each (`spot_records`), and
when the policy sends the run to spot elsewhere, wishes the move (a `MoveOrder` in its own
region's failover item) and takes its groups here to 0 (each machine publishes its emergency
checkpoint as it leaves). The destination's handler reads the wish at its next check, orders
the move there and starts the run's groups, whose machines claim the run from its newest
checkpoint whose every piece replicated (`elsewhere`, as a failover). Until they claim it, a
check that finds the move no longer pays (spot back here) withdraws the wish and starts the
groups here again. A run given a plan (`stored_plan`, `spotrain.core.deadline_plan`) is
decided by it, its moves too; else by outage fill."""

from __future__ import annotations

import functools
import logging
from dataclasses import replace
from typing import Any

from spotrain.constructs.interruption_handler.runtime import aws, clients
from spotrain.constructs.interruption_handler.runtime.settings import Settings
from spotrain.core import (
    capacity_policy,
    deadline_plan,
    deadline_policy,
    fleet_state,
    outage_fill,
    prices,
)
from spotrain.core.capacity import Group
from spotrain.core.capacity_policy import Decision
from spotrain.core.deadline_policy import Progress, RunDeadline
from spotrain.core.errors import SpotrainError
from spotrain.core.failover import MoveOrder
from spotrain.core.outage_fill import SpotRecord

log = logging.getLogger()

MOVE_FOR_SPOT = "move-for-spot"


def run_progress(
    table: Any, run: str, deadline: RunDeadline, now: float, check_every_h: float = 0.0
) -> tuple[Progress | None, str]:
    """The run against its deadline, in hours of its gang's compute: its progress is the
    catalog head's step, its throughput the steps per hour between checkpoints published by
    one trainer start (a restart's downtime is not throughput); a decision holds for
    `check_every_h`, until the next scheduled check. None (and why) until two checkpoints of
    one start are published."""
    pace = deadline_policy.read_pace(table, run)
    if pace.steps_per_hour is None:
        return None, ("throughput unknown until two checkpoints of one trainer start are "
                      "published: the fixed on-demand deadline applies")  # fmt: skip
    per_hour, done = pace.steps_per_hour, pace.step
    progress = Progress(
        elapsed_h=max(0.0, now - deadline.start_s) / 3600, deadline_h=deadline.deadline_h,
        work_h=deadline.total_steps / per_hour, done_h=done / per_hour,
        changeover_h=deadline.changeover_minutes / 60, decision_interval_h=check_every_h,
    )  # fmt: skip
    left_h = deadline.deadline_h - progress.elapsed_h
    return progress, (
        f"step {done} of {deadline.total_steps} at {per_hour:,.0f} steps/h, {left_h:.1f} h "
        "to the deadline"
    )


def deadline_progress(run_settings: Settings, now: float) -> tuple[Progress | None, str]:
    """The progress of the checked run when it has a deadline (else None, '')."""
    declaration = run_settings.declaration
    if declaration is None or declaration.run_deadline is None:
        return None, ""
    table = clients.dynamodb().Table(run_settings.handler.checkpoints_table)
    return run_progress(table, declaration.run, declaration.run_deadline, now,
                        run_settings.handler.capacity_check_minutes / 60)  # fmt: skip


_parts: dict[tuple[str, str, int], deadline_plan.StoredPart] = {}
"""The parts of stored plans a warm handler has read, by run, plan and first tick."""


def stored_plan(run_settings: Settings, table: Any, progress: Progress | None,
                spot_available: tuple[bool, ...] = (),
                records: tuple[SpotRecord, ...] = ()) -> deadline_plan.AtCheck | None:  # fmt: skip
    """The run's deadline plan as this check sees it (`deadline_plan`, stored by `spotrain run
    deadline-plan`), with a note where the run's `records` of spot (per region) moved away
    from it; or None: no progress yet, no plan, a plan of other regions or another deadline
    than the run's, or one replaced while it was read (outage fill decides)."""
    declaration = run_settings.declaration
    if progress is None or declaration is None or declaration.run_deadline is None:
        return None
    run = declaration.run
    header = deadline_plan.read_header(table, run)
    if header is None:
        return None
    declared = deadline_plan.solved_for(declaration.run_deadline)
    if (header.regions, header.deadline) != (tuple(declaration.regions), declared):
        log.warning("run %s: its deadline plan is for %s (%s), not %s (%s): outage fill decides "
                    "until `spotrain run deadline-plan` solves it again", run, header.regions,
                    header.deadline, declaration.regions, declared)  # fmt: skip
        return None
    first = deadline_plan.part_holding(header, progress)
    part = _parts.get((run, header.plan_id, first))
    if part is None:
        part = deadline_plan.read_part(table, run, header, first)
        if part is None:
            log.warning("run %s: its deadline plan was replaced as it was read", run)
            return None
        if len(_parts) >= 16:
            _parts.clear()
        _parts[(run, header.plan_id, first)] = part
    regions = declaration.regions
    here = regions.index(region) if (region := aws.own_region()) in regions else 0
    note = deadline_plan.moved_note(header, records, run_settings.handler.environment, run)
    return deadline_plan.AtCheck(header, part, here, spot_available, note)


def kept_record(run_settings: Settings, state: fleet_state.RunState) -> SpotRecord | None:
    """The record of spot an interruption warning decides a run with a deadline's on-demand
    by, as its checks do: spot anywhere for a run of several regions, else spot here."""
    assert run_settings.declaration is not None
    regions = len(run_settings.declaration.regions)
    if regions > 1 and state.spot_records:
        return outage_fill.RegionRecords.from_item(state.spot_records, regions).anywhere
    return state.spot_record


def for_spot(
    run_settings: Settings, table: Any, groups: list[Group], state: fleet_state.RunState,
    progress: Progress | None, epoch: int, now: float,
) -> tuple[Decision | None, SpotRecord | None, deadline_plan.AtCheck | None]:  # fmt: skip
    """Where a run with a deadline and several regions should train, decided by the handler
    of the region it trains in (`here`): a move for spot (its groups here to 0, the wish
    kept), a wish withdrawn (its groups here start again), or None (it stays: the deadline
    policy here decides). With it, what the deadline policy here decides a staying run by:
    the record of spot anywhere this check's look included, as `outage_fill.across` does
    (None: one region, or spot elsewhere not known: its record here), and its stored plan as
    this check sees it (`stored_plan`; None: none, and outage fill decides). A stored plan
    decides the move too."""
    declaration = run_settings.declaration
    assert declaration is not None
    regions, here, run = declaration.regions, aws.own_region(), run_settings.run
    kept = state.region_records(len(regions))
    if progress is None or len(regions) < 2 or not declaration.instance_types:
        return None, None, stored_plan(run_settings, table, progress, records=kept)
    own = capacity_policy.groups_in(here, groups)
    try:
        available = spot_seen(declaration.instance_types, regions, here, own)
    except Exception as error:  # the deadline policy here decides, as if alone
        log.warning("run %s: spot in its other regions is not known: %s", run, error)
        return None, None, stored_plan(run_settings, table, progress, records=kept)
    every_h = run_settings.handler.capacity_check_minutes / 60
    records = outage_fill.RegionRecords.from_item(state.spot_records, len(regions)).seen(
        now, available, longest_gap_s=capacity_policy.longest_gap_s(every_h))  # fmt: skip
    fleet_state.set_spot_records(table, run, records.to_item())
    wish = fleet_state.failover_state(table, run, here)
    standing = wish.move_order
    if standing is not None and (standing.from_epoch, standing.from_region) != (epoch, here):
        standing = None  # an earlier epoch's order (a failover to here), carried out long ago
    plan = stored_plan(run_settings, table, progress, tuple(available), records.regions)
    if plan is not None:
        placement = deadline_plan.decide(plan.header, plan.slices, progress,
                                         region=regions.index(here),
                                         current=_mode(own, standing),
                                         spot_available=available)  # fmt: skip
        placement = replace(placement, reason=placement.reason + plan.note)
    else:
        placement = outage_fill.across(
            progress, region=regions.index(here), current=_mode(own, standing),
            spot_available=available, records=records, move_usd=0.0,
            prices=_gang_prices(declaration.instance_types, own, regions), names=regions,
        )  # fmt: skip
    to = regions[placement.region]
    if to == here:
        if standing is None:
            return None, records.anywhere, plan
        fleet_state.set_failover_state(table, run, here, fleet_state.FailoverState(wish.silent))
        declared = capacity_policy.groups_in(here, declaration.groups)
        started = capacity_policy.start(own, declared)
        stay = Decision("stay", f"{placement.reason}: the move to {standing.to_region} is "
                        "withdrawn and the run's groups here start again", started.desired,
                        min_sizes=started.min_sizes)  # fmt: skip
        return stay, records.anywhere, plan
    order = MoveOrder(from_epoch=epoch, from_region=here, to_region=to, ordered_at=now,
                      reason=placement.reason)  # fmt: skip
    if standing is None or (standing.to_region, standing.from_epoch) != (to, epoch):
        fleet_state.set_failover_state(table, run, here,
                                       fleet_state.FailoverState(wish.silent, order))  # fmt: skip
        log.warning("run %s: %s", run, placement.reason)
    away = [g for g in own if g.desired or g.min_size]
    return Decision(
        MOVE_FOR_SPOT,
        f"{placement.reason}: {to}'s handler starts the run's groups there at its next check, "
        f"whose machines claim it from its newest checkpoint that replicated; here "
        + (", ".join(sorted(g.name for g in away)) + " go to 0" if away else "none runs"),
        {g.name: 0 for g in away}, min_sizes={g.name: 0 for g in away},
    ), records.anywhere, plan  # fmt: skip


def spot_seen(instance_types: tuple[str, ...], regions: list[str], here: str,
              own: list[Group]) -> list[bool]:  # fmt: skip
    """Whether spot is there for the run's gang in each of its regions: here, as its groups
    find it (when they ask for spot); elsewhere, and here while they ask for none, as EC2's
    spot placement scores put it (`outage_fill.SPOT_LIKELY_SCORE`). A region the scores leave
    out counts as without."""
    spot = [g for g in own if g.lifecycle == capacity_policy.SPOT]
    wanted = sum(g.desired for g in spot)
    answer = clients.client("ec2").get_spot_placement_scores(
        InstanceTypes=list(instance_types), TargetCapacity=max(1, wanted),
        SingleAvailabilityZone=False, RegionNames=regions,
    )  # fmt: skip
    scores = {s["Region"]: int(s["Score"]) for s in answer.get("SpotPlacementScores", [])}
    seen = [scores.get(r, 0) >= outage_fill.SPOT_LIKELY_SCORE for r in regions]
    if wanted:
        seen[regions.index(here)] = all(g.in_service >= g.desired for g in spot)
    return seen


def _mode(own: list[Group], wish: MoveOrder | None) -> str:
    """What the run is on here: on-demand machines in service, spot ones, or none (a run
    whose move is wished has none here)."""
    if wish is None and any(g.in_service for g in own if g.lifecycle == capacity_policy.ON_DEMAND):
        return deadline_policy.ON_DEMAND
    if wish is None and any(g.in_service for g in own):
        return deadline_policy.SPOT
    return deadline_policy.IDLE


def _gang_prices(instance_types: tuple[str, ...], own: list[Group],
                 regions: list[str]) -> list[tuple[float, float]]:  # fmt: skip
    """Each region's spot and on-demand price an hour for the run's gang, from the checked-in
    price book (the first type's): none when the book cannot price a region, so that no move
    is made on a guess."""
    machines = max(1, sum(g.declared.desired for g in own))
    try:
        pools = [_checked_in_book().pool(instance_types[0], r) for r in regions]
    except (SpotrainError, ValueError) as error:
        log.warning("a move cannot be priced: %s", error)
        return []
    return [(p.spot_price * machines, (p.on_demand.usd_per_hour or 0.0) * machines)
            for p in pools]  # fmt: skip


@functools.cache
def _checked_in_book() -> prices.PriceBook:
    """The price book the zip carries, read once per warm handler (it never changes there)."""
    return prices.load()
