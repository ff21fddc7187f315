"""The capacity policy, decision by decision: whether a run may have machines (one order of
holds), and where its lost capacity goes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from spotrain.core import capacity_policy as policy
from spotrain.core.capacity import CapacityGroup, Group
from spotrain.core.capacity_policy import Standing, hold_for
from spotrain.core.deadline_policy import Progress
from spotrain.core.outage_fill import SpotRecord
from spotrain.core.run_lifecycle import Lifecycle

PRIMARY = Group(declared=CapacityGroup(name="east-spot", region="us-east-1", lifecycle="spot",
                                     holds_data=True),
                pools=("g5.xlarge#us-east-1a", "g6.xlarge#us-east-1a"), desired=2, min_size=1,
                max_size=4, in_service=2)  # fmt: skip
OTHER_POOLS = Group(declared=CapacityGroup(name="east-spot-c", region="us-east-1",
                                         lifecycle="spot", holds_data=True),
                    pools=("g5.xlarge#us-east-1c",), desired=0, min_size=0,
                    max_size=4)  # fmt: skip
WEST = Group(declared=CapacityGroup(name="west-spot", region="us-west-2", lifecycle="spot",
                                  holds_data=False),
             pools=("g5.xlarge#us-west-2a",), desired=0, min_size=0, max_size=4)  # fmt: skip
WEST_ON_DEMAND = Group(declared=CapacityGroup(name="west-on-demand", region="us-west-2",
                                            lifecycle="on-demand", holds_data=False),
                       pools=("g5.xlarge#us-west-2a",), desired=0, min_size=0,
                       max_size=4)  # fmt: skip
SECOND_EAST = Group(declared=CapacityGroup(name="east-spot-b", region="us-east-1",
                                         lifecycle="spot", holds_data=True),
                    pools=("g6.2xlarge#us-east-1b",), desired=0, min_size=0,
                    max_size=2)  # fmt: skip
ON_DEMAND = Group(declared=CapacityGroup(name="east-on-demand", region="us-east-1",
                                       lifecycle="on-demand", holds_data=True),
                  pools=("g5.xlarge#us-east-1a",), desired=0, min_size=0,
                  max_size=4)  # fmt: skip


def decide(**changes: Any) -> policy.Decision:
    arguments: dict[str, Any] = {
        "group": "east-spot", "pool": "g5.xlarge#us-east-1a",
        "groups": [PRIMARY, OTHER_POOLS, ON_DEMAND], "pool_interruptions": {},
        "hot_threshold": 2, "short_since": None, "now": 1000.0,
        "on_demand_deadline_s": 600.0,
    }  # fmt: skip
    return policy.after_interruption(**{**arguments, **changes})


def test_a_quiet_pool_is_replaced_in_place() -> None:
    decision = decide(pool_interruptions={"g5.xlarge#us-east-1a": 1})
    assert decision.action == "replace-in-place"
    assert decision.desired == {}


def test_a_hot_pool_moves_one_instance_to_another_group() -> None:
    decision = decide(pool_interruptions={"g5.xlarge#us-east-1a": 2})
    assert decision.action == "shift"
    assert decision.desired == {"east-spot-c": 1, "east-spot": 1}


def test_capacity_never_shifts_to_a_region_the_run_does_not_train_in() -> None:
    """A gang cannot span regions: the handler decides on the groups of the run's region."""
    hot = {"g5.xlarge#us-east-1a": 3, "g5.xlarge#us-east-1c": 3, "g6.2xlarge#us-east-1b": 3}
    groups = [PRIMARY, WEST, OTHER_POOLS, SECOND_EAST, ON_DEMAND, WEST_ON_DEMAND]
    decision = decide(groups=policy.groups_in("us-east-1", groups), pool_interruptions=hot)
    assert (decision.action, decision.desired) == ("wait-for-spot", {})
    assert policy.groups_in("us-west-2", groups) == [WEST, WEST_ON_DEMAND]


def test_a_run_that_moved_has_its_machines_follow_it_and_none_left_behind() -> None:
    """The run's epoch names us-west-2. Each region's handler decides for its own groups:
    home's go to 0 (minimum too); us-west-2's, none asked for, start at their declared sizes
    (the run has just moved in); once nothing is left behind neither has anything to do. A
    handler never scales another region's groups."""
    declared = [
        CapacityGroup(name="east-spot", region="us-east-1", lifecycle="spot", holds_data=True,
                      min_size=1, desired=2),
        ON_DEMAND.declared,
        CapacityGroup(name="west-spot", region="us-west-2", lifecycle="spot", holds_data=False,
                      min_size=1, desired=2),
        WEST_ON_DEMAND.declared]  # fmt: skip
    covering = Group(**{**ON_DEMAND.__dict__, "desired": 1})
    before = [PRIMARY, covering, WEST, WEST_ON_DEMAND]
    left = policy.follow_the_run("us-west-2", "us-east-1", before, declared)
    assert left is not None and left.action == "follow-the-run"
    assert left.desired == {"east-spot": 0, "east-on-demand": 0} == left.min_sizes
    assert "trains in us-west-2" in left.reason
    arrived = policy.follow_the_run("us-west-2", "us-west-2", before, declared)
    assert arrived is not None and arrived.action == "follow-the-run"
    assert (arrived.desired, arrived.min_sizes) == ({"west-spot": 2}, {"west-spot": 1})
    assert "has just moved in" in arrived.reason and "west-spot 1..2 start" in arrived.reason
    there = Group(**{**WEST.__dict__, "desired": 2, "min_size": 1, "in_service": 2})
    home = Group(**{**PRIMARY.__dict__, "desired": 0, "min_size": 0, "in_service": 0})
    after = [home, ON_DEMAND, there, WEST_ON_DEMAND]
    for region in ("us-east-1", "us-west-2"):
        assert policy.follow_the_run("us-west-2", region, after, declared) is None
    # Moved back home: the same rule the other way.
    back = policy.follow_the_run("us-east-1", "us-west-2", after, declared)
    assert back is not None and (back.desired, back.min_sizes) == ({"west-spot": 0},) * 2
    home_again = policy.follow_the_run("us-east-1", "us-east-1", after, declared)
    assert home_again is not None and home_again.desired == {"east-spot": 2}
    assert home_again.min_sizes == {"east-spot": 1}


def test_a_group_whose_pools_are_all_hot_is_no_home() -> None:
    decision = decide(
        groups=[PRIMARY, SECOND_EAST, OTHER_POOLS, ON_DEMAND],
        pool_interruptions={"g5.xlarge#us-east-1a": 2, "g6.2xlarge#us-east-1b": 2},
    )
    assert decision.desired == {"east-spot-c": 1, "east-spot": 1}


def test_the_source_group_never_drops_below_its_minimum() -> None:
    at_minimum = Group(**{**PRIMARY.__dict__, "desired": 1})
    decision = decide(groups=[at_minimum, OTHER_POOLS],
                      pool_interruptions={"g5.xlarge#us-east-1a": 2})  # fmt: skip
    assert decision.desired == {"east-spot-c": 1}


def test_no_spot_home_waits_then_falls_back_to_on_demand_after_the_deadline() -> None:
    full = Group(**{**OTHER_POOLS.__dict__, "desired": 4})
    hot = {"g5.xlarge#us-east-1a": 2}
    waiting = decide(groups=[PRIMARY, full, ON_DEMAND], pool_interruptions=hot, now=1000.0)
    assert (waiting.action, waiting.desired, waiting.short_since) == ("wait-for-spot", {}, 1000.0)
    still = decide(groups=[PRIMARY, full, ON_DEMAND], pool_interruptions=hot, now=1500.0,
                   short_since=1000.0)  # fmt: skip
    assert still.action == "wait-for-spot"
    fallback = decide(groups=[PRIMARY, full, ON_DEMAND], pool_interruptions=hot, now=1600.0,
                      short_since=1000.0)  # fmt: skip
    assert (fallback.action, fallback.desired) == ("on-demand", {"east-on-demand": 1})


STARTED = Lifecycle(started_at=1.0)


@pytest.mark.parametrize(
    ("standing", "kind"),
    [(Standing(run="r", lifecycle=Lifecycle(started_at=1.0, cancelled_at=2.0), crashed=True,
               at_cap=True), policy.STOPPED),
     (Standing(run="r", lifecycle=Lifecycle(), configuration_stored=False, crashed=True),
      policy.WAITING),
     (Standing(run="r", lifecycle=STARTED, crashed=True, at_cap=True), policy.CRASHED),
     (Standing(run="r", lifecycle=STARTED, spend_usd=10.0, cap_usd=10.0, at_cap=True),
      policy.AT_CAP),
     (Standing(run="r", lifecycle=Lifecycle(), configuration_stored=True), None),
     (Standing(run="r", lifecycle=STARTED), None)],
    ids=["stopped-first", "then-waiting", "then-crashes", "then-spend", "stored-may-start",
         "training"],
)  # fmt: skip
def test_whether_a_run_may_have_machines_is_decided_in_one_order(
    standing: Standing, kind: str | None
) -> None:
    held = hold_for(standing)
    assert (held.kind if held else None) == kind


def test_a_run_that_crashed_too_often_is_held_and_remembers_its_sizes() -> None:
    held = hold_for(Standing(run="r", lifecycle=STARTED, crashed=True))
    assert held is not None and held.remembers_sizes
    assert "reset-crashes" in held.not_requeued
    stopped = hold_for(Standing(run="r", lifecycle=Lifecycle(started_at=1.0, cancelled_at=2.0)))
    assert stopped is not None and not stopped.remembers_sizes


def test_capacity_check_covers_a_shortfall_only_after_the_deadline() -> None:
    short = Group(**{**PRIMARY.__dict__, "in_service": 0})
    early = policy.reconcile(groups=[short, ON_DEMAND], short_since=None,
                              now=50.0, on_demand_deadline_s=600.0)  # fmt: skip
    assert (early.action, early.short_since) == ("wait-for-spot", 50.0)
    late = policy.reconcile(groups=[short, ON_DEMAND], short_since=50.0,
                             now=700.0, on_demand_deadline_s=600.0)  # fmt: skip
    assert (late.action, late.desired) == ("on-demand", {"east-on-demand": 2})


def test_capacity_check_does_not_raise_on_demand_twice_for_one_shortfall() -> None:
    short = Group(**{**PRIMARY.__dict__, "in_service": 0})
    covering = Group(**{**ON_DEMAND.__dict__, "desired": 2})
    decision = policy.reconcile(groups=[short, covering], short_since=50.0,
                                 now=9000.0, on_demand_deadline_s=600.0)  # fmt: skip
    assert (decision.action, decision.desired) == ("none", {})


def test_capacity_check_gives_on_demand_back_when_spot_returns() -> None:
    covering = Group(**{**ON_DEMAND.__dict__, "desired": 2})
    decision = policy.reconcile(groups=[PRIMARY, covering], short_since=50.0,
                                 now=9000.0, on_demand_deadline_s=600.0)  # fmt: skip
    assert decision.action == "spot-is-back"
    assert decision.desired == {"east-on-demand": 0}
    assert decision.short_since is None


def test_a_held_run_is_scaled_to_nothing_and_released_to_its_sizes() -> None:
    crashed = hold_for(Standing(run="r", lifecycle=STARTED, crashed=True))
    assert crashed is not None
    held = policy.hold([PRIMARY, WEST, ON_DEMAND], crashed)
    assert (held.action, held.desired, held.min_sizes) == (
        "hold", {"east-spot": 0}, {"east-spot": 0}
    )  # fmt: skip
    remembered = policy.sizes_to_remember([PRIMARY, WEST, ON_DEMAND], held)
    assert remembered == {"east-spot": {"min_size": 1, "desired": 2}}
    at_zero = Group(**{**PRIMARY.__dict__, "desired": 0, "min_size": 0})
    again = policy.hold([at_zero, WEST], crashed)
    assert (again.action, again.desired) == ("hold", {})
    back = policy.release([at_zero, WEST], remembered)
    assert (back.desired, back.min_sizes) == ({"east-spot": 2}, {"east-spot": 1})


def test_a_start_raises_each_group_to_its_declared_sizes_and_never_lowers_one() -> None:
    declared = [CapacityGroup(name="east-spot", region="us-east-1", lifecycle="spot",
                              holds_data=True, min_size=1, desired=3),
                CapacityGroup(name="west-spot", region="us-west-2", lifecycle="spot",
                              holds_data=False)]  # fmt: skip
    started = policy.start([PRIMARY, WEST], declared)
    assert (started.desired, started.min_sizes) == ({"east-spot": 3}, {"east-spot": 1})
    larger = Group(**{**PRIMARY.__dict__, "desired": 4})
    assert policy.start([larger, WEST], declared).desired == {}


# --- runs with a deadline: the deadline policy replaces the fixed wait -------------------------
def progress(done_h: float, elapsed_h: float = 4.0) -> Progress:
    return Progress(elapsed_h=elapsed_h, deadline_h=20.0, work_h=10.0, done_h=done_h,
                    changeover_h=0.25)  # fmt: skip


PLENTIFUL = SpotRecord(observed_s=24 * 3600, available_s=22 * 3600, spells=2, last_at=0.0)
SCARCE = SpotRecord(observed_s=24 * 3600, available_s=2 * 3600, spells=2, last_at=0.0)
"""A day of checks that saw spot most of the time, or a little of it."""


def test_a_run_whose_checks_saw_little_spot_goes_on_demand_at_once_after_an_interruption() -> None:
    # 8.5 h of work in 10 h: spot seen 2 h a day leaves most of it to on-demand, more than two
    # thirds of the outages to come; spot seen 22 h a day leaves almost none.
    hot = {"g5.xlarge#us-east-1a": 3, "g5.xlarge#us-east-1c": 3}
    late = progress(done_h=1.5, elapsed_h=10.0)
    scarce = decide(pool_interruptions=hot, progress=late, record=SCARCE)
    assert (scarce.action, scarce.desired) == ("on-demand", {"east-on-demand": 1})
    assert "on-demand while spot is gone" in scarce.reason
    plentiful = decide(pool_interruptions=hot, progress=late, record=PLENTIFUL, now=99_999.0,
                       short_since=0.0)  # fmt: skip
    assert plentiful.action == "wait-for-spot"  # however long it has waited
    assert "wait for spot" in plentiful.reason


def test_a_run_on_demand_stays_there_until_spot_returns_and_each_check_adds_its_look() -> None:
    covering = Group(**{**ON_DEMAND.__dict__, "desired": 2})
    short = Group(**{**PRIMARY.__dict__, "in_service": 0})
    arguments: dict[str, Any] = {"short_since": 0.0, "on_demand_deadline_s": 600.0,
                                 "progress": progress(done_h=2.2)}  # fmt: skip
    gone = policy.looked(PLENTIFUL, [short, covering], 3600.0, interval_h=1.0)
    assert gone == replace(PLENTIFUL, observed_s=25 * 3600, last_at=3600.0)  # an hour, no spot
    keep = policy.reconcile(groups=[short, covering], now=3600.0, record=gone, **arguments)
    assert (keep.action, keep.desired) == ("none", {})
    assert "stays on on-demand until spot returns" in keep.reason
    there = policy.looked(gone, [PRIMARY, covering], 7200.0, interval_h=1.0)
    assert there.spells == 3 and there.available_s == 22 * 3600  # a spell begins
    back = policy.reconcile(groups=[PRIMARY, covering], now=7200.0, record=there, **arguments)
    assert (back.action, back.desired) == ("spot-is-back", {"east-on-demand": 0})
    # Ten hours later, after checks that did not happen: two intervals count, no more.
    assert policy.looked(there, [PRIMARY], 43_200.0, interval_h=1.0).observed_s == 28 * 3600


def test_the_deadline_safety_net_covers_the_shortfall_to_the_end() -> None:
    short = Group(**{**PRIMARY.__dict__, "in_service": 0})
    late = policy.reconcile(groups=[short, ON_DEMAND], short_since=None,
                             now=0.0, on_demand_deadline_s=600.0,
                             progress=progress(done_h=9.0, elapsed_h=18.6))  # fmt: skip
    assert (late.action, late.desired) == ("on-demand", {"east-on-demand": 2})
    assert "to the end" in late.reason


def test_a_run_whose_spot_machines_train_keeps_them_within_two_changeovers_of_its_deadline() -> (
    None
):
    # 44.95 h left for 44.61 h of work: within 2 changeovers (0.4 h), not within one. Its spot
    # machines are all in service: the authors' rule keeps them, and the reason says so.
    near = Progress(elapsed_h=7.05, deadline_h=52, work_h=48, done_h=3.388, changeover_h=0.2,
                    decision_interval_h=5 / 60)  # fmt: skip
    decision = policy.reconcile(groups=[PRIMARY, ON_DEMAND], short_since=None,
                                 now=0.0, on_demand_deadline_s=600.0, progress=near)  # fmt: skip
    assert (decision.action, decision.desired) == ("none", {})
    assert "spot machines are training and stay" in decision.reason
    assert "on-demand" not in decision.reason


def test_the_handler_acts_on_every_on_demand_choice_as_the_simulator_bills_it() -> None:
    """Spot comes back at the check where the deadline's net catches a run that was short:
    the simulator moves the idle gang to on-demand (and bills the move); so does the handler,
    whose spot machines give way to the fallback's."""
    from spotrain.cost import simulation, traces

    job = simulation.Job(work_h=8, deadline_h=14, changeover_h=0.25, on_demand_price=3.0,
                         spot_price=1.0)  # fmt: skip
    timeline: list[tuple[float, float, bool, str]] = []
    available = (0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 1)  # short at 8 and 9 h, back at 10
    simulation.simulate(job, traces.Trace("scripted", 3600, available),
                        simulation.OUTAGE_FILL, timeline=timeline)  # fmt: skip
    t, done, spot, mode = timeline[10]
    assert (spot, mode) == (True, "on-demand")  # the net, at the tick spot returns
    back = Group(**{**PRIMARY.__dict__, "min_size": 0})  # every spot machine in service again
    decision = policy.reconcile(
        groups=[back, ON_DEMAND], short_since=1.0, now=2.0,
        on_demand_deadline_s=600.0,
        progress=Progress(elapsed_h=t, deadline_h=14, work_h=8, done_h=done, changeover_h=0.25,
                          decision_interval_h=1),
    )  # fmt: skip
    assert decision.action == "on-demand", decision.reason
    assert decision.desired == {"east-on-demand": 2, "east-spot": 0}
    assert "move from spot to east-on-demand" in decision.reason


def test_a_gang_asked_for_is_released_only_when_it_has_not_come_whole_in_time() -> None:
    """Rule 8: a whole gang ends the asking; a partial one is kept waiting until the timeout,
    then released (every group with a size to 0) with what the wait cost; a run short while
    training is left to rule 7 unless it lost every machine, when it asks anew."""
    partial = [replace(PRIMARY, in_service=1), ON_DEMAND]
    asked = policy.GangAsked(since=1000.0, spend_usd=4.0)

    def gang(groups: list[Group], asked: policy.GangAsked | None, now: float) -> Any:
        return policy.whole_gang(groups, minimum=2, asked=asked, now=now, timeout_s=900,
                                 spend_usd=4.5)  # fmt: skip

    assert gang([PRIMARY, ON_DEMAND], asked, 1100.0) == (None, None)  # whole
    assert gang(
        [replace(PRIMARY, in_service=1), replace(ON_DEMAND, desired=1, in_service=1)], asked, 1100.0
    ) == (None, None)  # whole with the on-demand fallback's machine
    assert gang(partial, asked, 1899.0) == (asked, None)
    kept, released = gang(partial, asked, 1900.0)
    assert kept is None and released.action == "gang-released"
    assert (released.desired, released.min_sizes) == ({"east-spot": 0}, {"east-spot": 0})
    said = "1 of the 2 machines its rendezvous needs came in 15 min (limit 15 min)"
    assert said in released.reason
    assert "the wait cost $0.50" in released.reason
    assert gang(partial, None, 1100.0) == (None, None)  # lost one while training: rule 7's
    lost_all = [replace(PRIMARY, in_service=0), ON_DEMAND]
    assert gang(lost_all, None, 1100.0) == (policy.GangAsked(1100.0, 4.5), None)
    assert gang(lost_all, asked, 9000.0) == (asked, None)  # none came: nothing to release
    nothing_asked = [replace(PRIMARY, desired=0, min_size=0, in_service=0), ON_DEMAND]
    assert gang(nothing_asked, asked, 5000.0) == (None, None)
    assert policy.gang_minimum([PRIMARY.declared]) == 1  # a declaration without a minimum
    two = replace(PRIMARY.declared, min_size=2)
    assert policy.gang_minimum([two, ON_DEMAND.declared]) == 2


def test_a_released_gang_waits_longer_each_release_in_a_row_before_asking_again() -> None:
    """Rule 8's wait after a release: one timeout, doubling with each release in a row, at
    most `GANG_RETRY_MAX_TIMEOUTS`; the release's reason says when it asks again."""
    waits = [policy.gang_retry_at(1000.0, n, 900) - 1000.0 for n in range(1, 6)]  # type: ignore[operator]
    assert waits == [900, 1800, 3600, 3600, 3600]
    assert policy.GANG_RETRY_MAX_TIMEOUTS * 900 == 3600
    assert (
        policy.gang_retry_at(None, 2, 900) is None and policy.gang_retry_at(1000.0, 0, 900) is None
    )
    partial = [replace(PRIMARY, in_service=1), ON_DEMAND]
    _, released = policy.whole_gang(partial, minimum=2, asked=policy.GangAsked(0.0), now=7200.0,
                                    timeout_s=15, spend_usd=0.0, releases=1)  # fmt: skip
    assert released is not None
    assert (
        "came in 7200 s" not in released.reason
        and "came in 120 min (limit 15 s)" in released.reason
    )
    assert released.reason.endswith(
        "its gang did not come whole in time (2 times in a row): it asks again at 02:00:30 UTC, "
        "in 30 s, then waits its turn behind the runs queued before its release"
    ), released.reason


def test_a_run_the_queue_keeps_without_machines_is_waiting_whether_or_not_it_started() -> None:
    """`run list`'s phase: a run the queue holds (waiting for room, or preempted by a run of
    higher priority) is waiting, not idle (a started run scaled to 0 by hand); one whose
    machines are still leaving trains until they are gone; a stop or hold says so first."""
    from spotrain.core import run_lifecycle as lifecycles

    started = Lifecycle(started_at=1.0)

    def phase(lifecycle: Lifecycle, **facts: Any) -> str:
        given = {"failed": False, "over_cap": False, "in_service": 0, "published": True,
                 "desired": 0, **facts}  # fmt: skip
        return lifecycles.phase(lifecycle, **given)

    assert phase(started, queued=True) == lifecycles.WAITING  # preempted: its groups at 0
    assert phase(started) == lifecycles.IDLE  # scaled to 0 by hand
    assert phase(Lifecycle(), queued=True) == lifecycles.WAITING
    assert phase(started, queued=True, in_service=1, desired=0) == lifecycles.TRAINING
    assert phase(started, queued=True, over_cap=True) == lifecycles.HELD
    assert phase(replace(started, cancelled_at=2.0), queued=True) == lifecycles.CANCELLED
