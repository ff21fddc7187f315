"""Whether a run may have machines, and where its lost capacity goes: pure decisions, no AWS
calls. The interruption handler acts on them, `spotrain run cancel|resume` hold and release a
run with them, and the cost simulator replays the deadline policy they follow.

First, whether the run may have machines at all (`hold_for`), in this order:
1. A finished or cancelled run has none (`run_lifecycle`).
2. A run whose training configuration is not stored waits with none; once it is stored, the
   scheduled check starts the run's groups at their declared sizes (`start`).
   a. Unless the environment's queue does not admit it yet (its teams' shares and budgets,
      its regions' vCPU ceilings: `admission`): it waits, queued, with its place and reason.
      A run the queue admitted keeps its machines unless a run of higher priority preempts
      it: then it is held the same way, its groups to 0 (each machine publishes its
      emergency checkpoint as it leaves) with their sizes remembered, and released when the
      queue admits it again.
3. A run that crashed too often is held: nothing is requeued (no restart loop), and the
   scheduled check scales every group to nothing (minimum and desired 0), so no machine is
   billed without training; once it is released, its groups get their sizes back (`release`).
4. A run at its spend cap is held the same way until an operator raises the cap.

A run trains in one region at a time (a gang cannot span regions, and one writer at a time
is the catalog's rule): the region its current epoch claimed (`run_epochs`; home until it
moves). Every region has its own handler, which scales its own region's groups only, so no
group ever has two handlers scaling it: a handler whose region the run does not train in
empties its groups there; the handler of the run's region, finding none of its groups asked
for while the run may train, starts them at their declared sizes, as the run has just moved in
(`follow_the_run`). The rules below look at that region's groups only (`groups_in`).

Then, for a run that may have machines, where lost capacity goes (`after_interruption`, on a
warning, and `reconcile`, the scheduled check):
5. A pool interrupted less than `hot_threshold` times in the window is healthy enough: the
   group's capacity rebalancing replaces the instance in place (no change here).
6. A hot pool moves one unit of capacity to another spot group of the run's region (its
   other pools) that has room and a pool that is not hot, preferring the fewest hot pools.
7. No spot group can take it: the run is short of spot capacity. After `on_demand_deadline_s`
   of that, the on-demand fallback group is raised by the shortfall; the scheduled check
   gives it back when spot returns.

And whatever the market, a run's gang starts whole or not at all (`whole_gang`):
8. A run that asks for machines from none (its start, a release, a move in) needs its gang,
   the machines its rendezvous waits for (its groups' minimum there), before any trains. If
   they have not all come `gang_timeout_s` after it asked, the ones that came are released
   (its groups to 0, their sizes remembered), not kept idle and billed, with what the wait
   cost. It then waits before asking again from none (`gang_retry_at`): the timeout after
   its first release, twice that after its second in a row, and so on, at most
   `GANG_RETRY_MAX_TIMEOUTS` timeouts; its gang coming whole starts the count again. While it
   waits the queue does not count it, so the runs behind it go first. While none has come it
   keeps asking (nothing is billed, and a run with a deadline waits for spot this way). A run
   that lost some machines while training is rule 7's; one that lost all of them asks from
   none.

A run with a deadline replaces rule 7's fixed wait, and the scheduled check's return to spot,
with the deadline policy (`deadline_choice`): its stored plan where it has one
(`spotrain.core.deadline_plan`, the Markov policy), else outage fill
(`spotrain.core.outage_fill`), each the one the cost simulator replays. Outage fill:
spot whenever it is there; on-demand covers an outage once the on-demand hours the run is
expected to need take a large enough share of the outages to come, and stays until spot
returns. Each scheduled check adds what it saw to the run's record of spot (`SpotRecord`, kept
with its fleet state), from which the policy expects those hours.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from spotrain.core import deadline_policy
from spotrain.core.capacity import ON_DEMAND, SPOT, CapacityGroup, Group
from spotrain.core.deadline_plan import AtCheck
from spotrain.core.deadline_policy import Progress
from spotrain.core.outage_fill import SpotRecord, outage_fill
from spotrain.core.run_lifecycle import Lifecycle

HeldSizes = dict[str, dict[str, int]]
"""Per group name, the `min_size` and `desired` it had when its run was held: what a release
puts back (kept in the run's fleet state)."""


@dataclass(frozen=True)
class Decision:
    action: str
    """hold | wait | preempt | start | release | gang-released | replace-in-place | shift |
    wait-for-spot | on-demand | spot-is-back | follow-the-run | none"""
    reason: str
    desired: dict[str, int] = field(default_factory=dict)
    """New desired capacity per group name (only groups that change)."""
    min_sizes: dict[str, int] = field(default_factory=dict)
    """New minimum size per group name (holding a run takes it to 0, releasing puts it back)."""
    short_since: float | None = None
    """When the run became short of spot capacity (None: it is not)."""
    spot_record: SpotRecord | None = None
    """A run with a deadline: its record of spot with this check's look added (to keep)."""


@dataclass(frozen=True)
class GangAsked:
    """A run asking for its gang (rule 8): since when, and its ledger's spend then (what the
    wait cost, should the gang not come, is the difference)."""

    since: float
    spend_usd: float = 0.0


ASKS_FROM_NONE = ("start", "release", "follow-the-run")
"""Decisions that raise a run's groups from nothing in the region they act in: the run asks
for its gang (rule 8)."""


@dataclass(frozen=True, kw_only=True)
class Standing:
    """What decides whether a run may have machines."""

    run: str
    lifecycle: Lifecycle
    configuration_stored: bool = True
    """Its training configuration is in its bucket (the instance-event path does not look:
    True)."""
    crashed: bool = False
    """Held after repeated crashes (the run's fleet state)."""
    spend_usd: float = 0.0
    cap_usd: float | None = None
    at_cap: bool = False
    """Its ledger reached its cap (the ledger's judgement)."""
    queued: str | None = None
    """Why the environment's queue does not admit it yet, with its place (`admission`); None:
    admitted, or an environment without teams or ceilings."""


STOPPED, WAITING, QUEUED, CRASHED, AT_CAP = "stopped", "waiting", "queued", "crashed", "at-cap"
"""Why a run may have no machines: rules 1-4 above, in their order (2a: queued)."""


@dataclass(frozen=True)
class Hold:
    """Why a run may have no machines, and how that ends."""

    kind: str
    """STOPPED, WAITING, QUEUED, CRASHED or AT_CAP."""
    why: str
    how_to_release: str
    not_requeued: str
    """What an interruption warning of such a run is told."""

    @property
    def remembers_sizes(self) -> bool:
        """Its groups get their sizes back when it is released (a stopped run's were
        remembered by whoever stopped it; a waiting run's come from its declaration, unless
        it was preempted, when its groups had sizes to remember)."""
        return self.kind in (CRASHED, AT_CAP, QUEUED)


def hold_for(standing: Standing) -> Hold | None:
    """Whether the run may have machines: the first of rules 1-4 that holds it, or None."""
    run, lifecycle = standing.run, standing.lifecycle
    if lifecycle.stopped:
        return Hold(STOPPED, lifecycle.why_stopped, "no machine runs for it",
                    f"not requeued: {lifecycle.why_stopped}")  # fmt: skip
    if lifecycle.started_at is None and not standing.configuration_stored:
        return Hold(WAITING, f"waiting: run {run} has no training configuration",
                    "until one is stored", "not requeued: the run has not started")  # fmt: skip
    if standing.queued is not None:  # not admitted yet, or preempted
        return Hold(QUEUED, f"queued: {standing.queued}", "when the queue admits it",
                    "not requeued: the run waits in the queue")  # fmt: skip
    if standing.crashed:
        return Hold(CRASHED, "the run crashed too often",
                    "fix the cause, then `spotrain fleet reset-crashes`",
                    "the run crashed too often: not requeued (fix it, then `spotrain fleet "
                    "reset-crashes`)")  # fmt: skip
    if standing.at_cap:
        return Hold(AT_CAP, f"the run spent ${standing.spend_usd:,.2f} of its "
                    f"${standing.cap_usd or 0:,.2f} cap",
                    f"`spotrain fleet release --run {run} --max-spend-usd N` raises it",
                    "the run reached its spend cap: not requeued (`spotrain fleet release` "
                    "raises the cap)")  # fmt: skip
    return None


def hot_pools(pool_interruptions: Mapping[str, int], threshold: int) -> set[str]:
    return {pool for pool, count in pool_interruptions.items() if count >= threshold}


def _spot_home(groups: Sequence[Group], exclude: str, hot: set[str]) -> Group | None:
    candidates = [
        g
        for g in groups
        if g.lifecycle == SPOT
        and g.name != exclude
        and g.desired < g.max_size
        and any(pool not in hot for pool in g.pools)
    ]
    candidates.sort(key=lambda g: (not g.holds_data, sum(p in hot for p in g.pools), g.name))
    return candidates[0] if candidates else None


def _on_demand(
    groups: Sequence[Group],
    shortfall: int,
    short_since: float,
    now: float,
    deadline_s: float,
    progress: Progress | None = None,
    record: SpotRecord | None = None,
    plan: AtCheck | None = None,
) -> Decision:
    waited = now - short_since
    fallback = next(
        (g for g in groups if g.lifecycle == ON_DEMAND and g.desired < g.max_size), None
    )
    if progress is not None and fallback is not None:
        # Short of spot and not on on-demand: the deadline policy says wait or go.
        choice = deadline_choice(progress, current=deadline_policy.IDLE, spot_available=False,
                                 record=record, plan=plan)  # fmt: skip
        if choice.mode == deadline_policy.IDLE:
            return Decision("wait-for-spot", f"short of spot capacity by {shortfall}; deadline "
                            f"policy: {choice.reason}", short_since=short_since)  # fmt: skip
        new = min(fallback.max_size, fallback.desired + shortfall)
        return Decision("on-demand", f"short of spot capacity by {shortfall}; deadline policy: "
                        f"{choice.reason}: {fallback.name} {fallback.desired} -> {new} on-demand",
                        {fallback.name: new}, short_since=short_since)  # fmt: skip
    if waited < deadline_s or fallback is None:
        why = (
            f"on-demand in {deadline_s - waited:.0f} s if still short"
            if fallback is not None
            else "no on-demand group has room: raise its max_size"
        )
        return Decision("wait-for-spot", f"short of spot capacity by {shortfall}; {why}",
                        short_since=short_since)  # fmt: skip
    new = min(fallback.max_size, fallback.desired + shortfall)
    return Decision(
        "on-demand",
        f"short of spot capacity for {waited:.0f} s (deadline {deadline_s:.0f} s): "
        f"{fallback.name} {fallback.desired} -> {new} on-demand",
        {fallback.name: new},
        short_since=short_since,
    )


def after_interruption(
    *,
    group: str | None,
    pool: str,
    groups: Sequence[Group],
    pool_interruptions: Mapping[str, int],
    hot_threshold: int,
    short_since: float | None,
    now: float,
    on_demand_deadline_s: float,
    progress: Progress | None = None,
    record: SpotRecord | None = None,
    plan: AtCheck | None = None,
) -> Decision:
    """What to do when an instance of `group` in `pool` of a run that may have machines gets
    an interruption warning. `progress`: the run against its deadline, for runs that have
    one, and `record` its record of spot as the scheduled checks kept it (or `plan`, its
    stored deadline plan, which decides instead)."""
    count = pool_interruptions.get(pool, 0)
    hot = hot_pools(pool_interruptions, hot_threshold)
    if pool not in hot:
        return Decision(
            "replace-in-place",
            f"pool {pool} interrupted {count}x in the window (< {hot_threshold}): capacity "
            "rebalancing replaces the instance in the group's pools",
            short_since=short_since,
        )
    source = next((g for g in groups if g.name == group), None)
    home = _spot_home(groups, exclude=group or "", hot=hot)
    if home is not None:
        desired = {home.name: home.desired + 1}
        if source is not None and source.desired - 1 >= source.min_size:
            desired[source.name] = source.desired - 1
        return Decision(
            "shift",
            f"pool {pool} is hot ({count} interruptions in the window): one instance moves "
            f"to {home.name} ({home.region}{', holds the data' if home.holds_data else ''})",
            desired,
            short_since=None,
        )
    return _on_demand(groups, 1, short_since if short_since is not None else now, now,
                      on_demand_deadline_s, progress, record, plan)  # fmt: skip


def reconcile(
    *,
    groups: Sequence[Group],
    short_since: float | None,
    now: float,
    on_demand_deadline_s: float,
    progress: Progress | None = None,
    record: SpotRecord | None = None,
    plan: AtCheck | None = None,
) -> Decision:
    """Scheduled check of a run that may have machines: spot groups that cannot fill their
    desired capacity make the run short; past the deadline the on-demand group covers the
    shortfall. A run with a deadline (`progress`) follows the deadline policy instead: its
    stored plan (`plan`), or outage fill with its record of spot (`record`, this check's look
    included: `looked`)."""
    shortfall = _spot_shortfall(groups)
    fallbacks = [g for g in groups if g.lifecycle == ON_DEMAND]
    covering = sum(g.desired for g in fallbacks)
    if progress is not None:
        return _by_deadline(groups, shortfall, covering, progress, short_since, now,
                            record or SpotRecord(), plan)  # fmt: skip
    if shortfall < covering:
        # Spot came back: give the on-demand capacity up again, it costs several times more.
        desired, excess = {}, covering - shortfall
        for g in fallbacks:
            cut = min(excess, g.desired - g.min_size)
            if cut > 0:
                desired[g.name], excess = g.desired - cut, excess - cut
        return Decision(
            "spot-is-back", f"spot capacity is back: on-demand lowered by {covering - shortfall}",
            desired, short_since=None if shortfall == 0 else short_since,
        )  # fmt: skip
    if shortfall == 0:
        return Decision("none", "every spot group runs its desired capacity")
    if shortfall == covering:
        return Decision("none", f"on-demand covers the spot shortfall of {shortfall}",
                        short_since=short_since)  # fmt: skip
    return _on_demand(
        groups, shortfall - covering, short_since if short_since is not None else now, now,
        on_demand_deadline_s,
    )  # fmt: skip


def _spot_shortfall(groups: Sequence[Group]) -> int:
    return sum(max(0, g.desired - g.in_service) for g in groups if g.lifecycle == SPOT)


def looked(
    record: SpotRecord | None, groups: Sequence[Group], now: float, *, interval_h: float
) -> SpotRecord:
    """The run's record of spot with this check's look added: spot there for the gang when
    every spot group runs its desired capacity. Every scheduled check of a run with a
    deadline that may train adds one, from its first (before its pace is known too)."""
    return (record or SpotRecord()).seen(now, _spot_shortfall(groups) == 0,
                                         longest_gap_s=longest_gap_s(interval_h))  # fmt: skip


def longest_gap_s(interval_h: float) -> float:
    """Time between two checks that counts as what the earlier saw: two check intervals (a
    check that did not happen is no evidence); without an interval, all of it."""
    return 2 * interval_h * 3600 if interval_h else math.inf


def _lower_on_demand(fallbacks: Sequence[Group], excess: int) -> dict[str, int]:
    desired = {}
    for g in fallbacks:
        cut = min(excess, g.desired - g.min_size)
        if cut > 0:
            desired[g.name], excess = g.desired - cut, excess - cut
    return desired


def _by_deadline(
    groups: Sequence[Group],
    shortfall: int,
    covering: int,
    progress: Progress,
    short_since: float | None,
    now: float,
    record: SpotRecord,
    plan: AtCheck | None = None,
) -> Decision:
    """The scheduled check of a run with a deadline, acting on the policy's choice as the
    simulator plays it. What the run is on: on-demand while the fallback covers part of it;
    idle while spot lacks machines, or lacked them at the last check (the spot machines in
    service now are just starting: in the simulator the gang was idle and takes spot, or the
    deadline sends it to on-demand); else spot, whose machines in service count as training (a
    restore is not visible from here). Spot is there for the gang when every spot group runs
    its desired capacity (a gang runs on all its machines or none)."""
    if covering:
        current = deadline_policy.ON_DEMAND
    elif shortfall or short_since is not None:
        current = deadline_policy.IDLE
    else:
        current = deadline_policy.SPOT
    choice = deadline_choice(replace(progress, changeover_left_h=0.0), current=current,
                             spot_available=shortfall == 0, record=record, plan=plan)  # fmt: skip
    why = f"deadline policy: {choice.reason}"
    since = None if shortfall == 0 else (short_since if short_since is not None else now)
    fallbacks = [g for g in groups if g.lifecycle == ON_DEMAND]
    if choice.mode == deadline_policy.SPOT:
        if covering:
            return Decision("spot-is-back", f"{why}: on-demand lowered by {covering}",
                            _lower_on_demand(fallbacks, covering), short_since=None)  # fmt: skip
        return Decision("none", why, short_since=None)
    if choice.mode == deadline_policy.IDLE:
        return Decision("wait-for-spot", f"short of spot capacity by {shortfall}; {why}",
                        short_since=since)  # fmt: skip
    if covering and shortfall <= covering:
        return Decision("none", f"{why}; on-demand covers the spot shortfall of {shortfall}",
                        short_since=since)  # fmt: skip
    fallback = next((g for g in fallbacks if g.desired < g.max_size), None)
    if fallback is None:
        return Decision("wait-for-spot", f"{why}; but no on-demand group has room: raise its "
                        "max_size", short_since=since)  # fmt: skip
    if shortfall == 0:
        return _gang_to_on_demand(groups, fallback, why)
    new = min(fallback.max_size, fallback.desired + shortfall - covering)
    return Decision("on-demand", f"{why}: {fallback.name} {fallback.desired} -> {new} on-demand",
                    {fallback.name: new}, short_since=since)  # fmt: skip


def deadline_choice(
    progress: Progress, *, current: str, spot_available: bool, record: SpotRecord | None,
    plan: AtCheck | None,
) -> deadline_policy.Choice:  # fmt: skip
    """The deadline policy's choice for a run in its region: its stored plan's
    (`deadline_plan`), or else outage fill's by its record of spot."""
    if plan is not None:
        return plan.choose(progress, current=current, spot_here=spot_available)
    return outage_fill(progress, current=current, spot_available=spot_available,
                       record=record or SpotRecord())  # fmt: skip


def _gang_to_on_demand(groups: Sequence[Group], fallback: Group, why: str) -> Decision:
    """Spot came back to a gang the deadline sends to on-demand to the end: its spot machines
    go (down to each group's minimum, which keeps the coordinator) and the fallback takes
    their places."""
    spot = [g for g in groups if g.lifecycle == SPOT and g.desired > g.min_size]
    moved = min(sum(g.desired - g.min_size for g in spot), fallback.max_size - fallback.desired)
    if moved == 0:
        return Decision("none", f"{why}; but every spot group is at its minimum: nothing moves")
    desired, left = {fallback.name: fallback.desired + moved}, moved
    for g in spot:
        cut = min(left, g.desired - g.min_size)
        desired[g.name], left = g.desired - cut, left - cut
    return Decision(
        "on-demand",
        f"{why}: {moved} machine(s) move from spot to {fallback.name} "
        f"({fallback.desired} -> {fallback.desired + moved} on-demand)",
        desired,
        short_since=None,
    )


def gang_minimum(declared: Sequence[CapacityGroup]) -> int:
    """The machines a run's rendezvous waits for in a region: its groups' minimum there (at
    least one: torchrun's --nnodes, `spot_fleet.nnodes`)."""
    return max(1, sum(g.min_size for g in declared))


def gang_whole(groups: Sequence[Group], minimum: int) -> bool:
    """The run's gang is in service: as many machines as its rendezvous needs."""
    return sum(g.in_service for g in groups) >= minimum


def whole_gang(
    groups: Sequence[Group], *, minimum: int, asked: GangAsked | None, now: float,
    timeout_s: float, spend_usd: float, releases: int = 0,
) -> tuple[GangAsked | None, Decision | None]:  # fmt: skip
    """Rule 8 at a scheduled check of a run that may have machines, on its groups in the region
    it trains in: whether it still asks for its gang (to keep), and the release of a gang that
    did not come in time (None: nothing to do). `releases`: its gang's releases in a row
    before this check (how long it then waits to ask again)."""
    wanted, came = sum(g.desired for g in groups), sum(g.in_service for g in groups)
    if wanted == 0 or gang_whole(groups, minimum):
        return None, None  # nothing asked for, or the gang is whole
    if asked is None:  # short while training (rule 7's), or every machine lost: asks anew
        return (GangAsked(now, spend_usd) if came == 0 else None), None
    waited = now - asked.since
    if waited < timeout_s or came == 0:
        return asked, None  # none came: nothing is billed, and it keeps its place in the pools
    sized = [g for g in groups if g.desired or g.min_size]
    cost = max(0.0, spend_usd - asked.spend_usd)
    return None, Decision(
        "gang-released",
        f"whole-gang start: {came} of the {minimum} machines its rendezvous needs came in "
        f"{_span(waited)} (limit {_span(timeout_s)}): released rather than kept idle (the "
        f"wait cost ${cost:,.2f}); {gang_waiting(now, releases + 1, timeout_s, now=now)}",
        {g.name: 0 for g in sized},
        min_sizes={g.name: 0 for g in sized},
    )


GANG_RETRY_MAX_TIMEOUTS = 4
"""The longest a run whose gang was released waits before asking again, in gang timeouts
(an hour at the default 15 minutes). Asking again at the next check instead would bill the
part of the gang that comes for three quarters of a long outage (15 minutes of every 20);
waiting doubles from one timeout, so a pool that stays dry bills it a fifth of the time at
most, and a deadline run's policy is back within the hour."""


def gang_retry_at(released_at: float | None, releases: int, timeout_s: float) -> float | None:
    """When a run whose gang was released `releases` times in a row, the last at
    `released_at`, may ask for it again (None: it was not released since it last came)."""
    if released_at is None or releases < 1:
        return None
    return released_at + timeout_s * min(2 ** (releases - 1), GANG_RETRY_MAX_TIMEOUTS)


def gang_waiting(
    released_at: float | None, releases: int, timeout_s: float, *, now: float
) -> str | None:
    """Why a run whose gang was released `releases` times in a row, the last at
    `released_at`, still waits at `now` before asking for it again, as it is told (`run
    list`, the release's notice); None: it need not wait."""
    retry_at = gang_retry_at(released_at, releases, timeout_s)
    if retry_at is None or now >= retry_at:
        return None
    at = datetime.fromtimestamp(retry_at, UTC).strftime("%H:%M:%S UTC")
    times = "once" if releases == 1 else f"{releases} times in a row"
    return (f"its gang did not come whole in time ({times}): it asks again at {at}, in "
            f"{_span(retry_at - now)}, then waits its turn behind the runs queued before "
            "its release")  # fmt: skip


def _span(seconds: float) -> str:
    """A wait as people read it: whole minutes, or seconds under two minutes."""
    seconds = max(0.0, seconds)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


class Sized(Protocol):
    """A group's name and current sizes (a `Group`, or one the CLI described)."""

    @property
    def name(self) -> str: ...
    @property
    def min_size(self) -> int: ...
    @property
    def desired(self) -> int: ...


def hold(groups: Sequence[Sized], held: Hold) -> Decision:
    """A held run's groups go to nothing (minimum and desired 0): each machine gets SIGTERM and
    publishes its emergency checkpoint before it goes."""
    running = [g for g in groups if g.desired or g.min_size]
    if held.kind == QUEUED and running:  # a started run, preempted
        return Decision("preempt", f"{held.why}: its groups go to 0, each machine publishing "
                        "its emergency checkpoint as it leaves, until the queue admits it again",
                        {g.name: 0 for g in running},
                        min_sizes={g.name: 0 for g in running})  # fmt: skip
    if held.kind in (WAITING, QUEUED):
        return Decision("wait", f"{held.why}: its groups are at 0 {held.how_to_release}",
                        {g.name: 0 for g in running},
                        min_sizes={g.name: 0 for g in running})  # fmt: skip
    if not running:
        return Decision("hold", f"{held.why}: its groups are at 0")
    return Decision(
        "hold",
        f"{held.why}: its groups are scaled to 0 until it is released ({held.how_to_release})",
        {g.name: 0 for g in running},
        min_sizes={g.name: 0 for g in running},
    )


def sizes_to_remember(groups: Sequence[Sized], decision: Decision) -> HeldSizes:
    """What a hold takes away from each group it scales, for `release` to put back."""
    return {g.name: {"min_size": g.min_size, "desired": g.desired}
            for g in groups if g.name in decision.min_sizes}  # fmt: skip


_InRegion = TypeVar("_InRegion", Group, CapacityGroup)


def groups_in(region: str, groups: Sequence[_InRegion]) -> list[_InRegion]:
    """The groups in `region` (where the run trains): the only ones the rules scale up."""
    return [g for g in groups if g.region == region]


def follow_the_run(
    trains_in: str, here: str, groups: Sequence[Group], declared: Sequence[CapacityGroup]
) -> Decision | None:
    """The run trains in `trains_in`; the handler of region `here` decides for its own groups
    there (`groups`). Elsewhere than the run's region, its groups that have sizes go to nothing
    (each machine publishes its emergency checkpoint, refused if the move already fenced it).
    In the run's region, when none of its groups is asked for anything, the run has just moved
    in: they start at their declared sizes. None when there is nothing to do."""
    own = groups_in(here, groups)
    if trains_in != here:
        away = [g for g in own if g.desired or g.min_size]
        if not away:
            return None
        names = ", ".join(sorted(g.name for g in away))
        return Decision(
            "follow-the-run",
            f"the run trains in {trains_in} (its epoch's region): {names} go to 0",
            {g.name: 0 for g in away},
            min_sizes={g.name: 0 for g in away},
        )
    if any(g.desired or g.min_size for g in own):
        return None
    started = start(own, groups_in(here, declared))
    if not started.desired:
        return None
    there = ", ".join(f"{n} {started.min_sizes[n]}..{started.desired[n]}"
                      for n in sorted(started.desired))  # fmt: skip
    return replace(started, action="follow-the-run", reason=(
        f"the run trains in {here} (its epoch's region) and has no machine asked for here: "
        f"it has just moved in; {there} start"))  # fmt: skip


def start(
    groups: Sequence[Sized], declared: Sequence[CapacityGroup],
    remembered: Mapping[str, Mapping[str, int]] | None = None,
) -> Decision:  # fmt: skip
    """A run that may now train (its configuration is stored): each group is raised to the
    sizes the run declares, or to those a hold before its start remembered when larger; a
    group already larger keeps its size."""
    wanted = {g.name: {"min_size": g.min_size, "desired": g.desired} for g in declared}
    for name, sizes in (remembered or {}).items():
        if name in wanted:
            wanted[name] = {key: max(wanted[name][key], int(sizes[key])) for key in wanted[name]}
    desired, min_sizes = {}, {}
    for group in groups:
        sizes = wanted.get(group.name)
        if sizes is None:
            continue
        want_min = max(group.min_size, sizes["min_size"])
        want = max(group.desired, sizes["desired"], want_min)
        if (want_min, want) != (group.min_size, group.desired):
            desired[group.name], min_sizes[group.name] = want, want_min
    summary = ", ".join(f"{name} {min_sizes[name]}..{desired[name]}" for name in sorted(desired))
    return Decision("start", f"the run's configuration is stored: its groups start ({summary})"
                    if desired else "the run's configuration is stored: its groups already run",
                    desired, min_sizes=min_sizes)  # fmt: skip


def release(groups: Sequence[Sized], held: Mapping[str, Mapping[str, int]]) -> Decision:
    """A held run was released: each group gets back the sizes it had when it was held."""
    known = {g.name for g in groups}
    back = {name: sizes for name, sizes in held.items() if name in known}
    return Decision(
        "release",
        "the run was released: its groups are back to "
        + ", ".join(f"{name} {s['min_size']}..{s['desired']}" for name, s in sorted(back.items())),
        {name: int(s["desired"]) for name, s in back.items()},
        min_sizes={name: int(s["min_size"]) for name, s in back.items()},
    )
