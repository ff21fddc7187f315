"""The queue's decision: which runs may have machines when they compete for an environment's
GPUs (quotas in vCPUs per region, teams' shares in GPUs and budgets in dollars, priorities)."""

from __future__ import annotations

import pytest

from spotrain.core.admission import Demand, Team, Verdict, admit, asked
from spotrain.core.gpu_types import INSTANCE_QUOTAS, MACHINES, quota_key, vcpus

G5 = "spot/G and VT"
TEAMS = {"vision": Team(name="vision", gpus=8), "speech": Team(name="speech", gpus=8)}


def _run(run: str, *, team: str = "vision", at: float = 0.0, machines: int = 2,
         priority: int = 0, holding: bool = False, preemptible: bool = True,
         finishing: bool = False) -> Demand:  # fmt: skip
    """A run of g5.12xlarge machines (4 GPUs, 48 vCPUs each) on spot."""
    gpus, wanted = asked(["g5.12xlarge"], {"spot": machines})
    return Demand(run=run, region="us-east-1", team=team, priority=priority, submitted_at=at,
                  gpus=gpus, vcpus=wanted, holding=holding, preemptible=preemptible,
                  finishing=finishing)  # fmt: skip


def _decide(*demands: Demand, ceiling: int = 192, spend: dict[str, float] | None = None,
            teams: dict[str, Team] | None = None) -> dict[str, Verdict]:  # fmt: skip
    return admit(demands, ceilings={"us-east-1": {G5: ceiling}},
                 teams=TEAMS if teams is None else teams, team_spend_usd=spend or {})  # fmt: skip


def test_three_runs_on_a_ceiling_that_fits_two_the_third_waits_then_starts() -> None:
    first, second, third = _run("a", at=1), _run("b", team="speech", at=2), _run("c", at=3)
    verdicts = _decide(first, second, third)
    assert [verdicts[r].admitted for r in "abc"] == [True, True, False]
    assert verdicts["c"].place == 1
    assert verdicts["c"].reason == (
        f"needs 96 vCPUs of {G5} in us-east-1, 0 of its ceiling 192 free: it starts when runs "
        "there finish, or with a higher ceiling (and AWS quota)")  # fmt: skip
    # The first finishes: the next check admits the third at once.
    holding = [Demand(**{**vars(second), "holding": True})]
    assert _decide(*holding, third)["c"] == Verdict(True, "admitted")


def test_a_team_at_its_dollar_budget_waits_and_another_teams_run_starts() -> None:
    teams = {**TEAMS, "vision": Team(name="vision", gpus=8, monthly_budget_usd=1000.0)}
    verdicts = _decide(_run("a", at=1), _run("b", team="speech", at=2),
                       spend={"vision": 1000.0, "speech": 5000.0}, teams=teams)  # fmt: skip
    assert not verdicts["a"].admitted and verdicts["a"].place == 1
    assert verdicts["a"].reason == (
        "team vision spent $1,000.00 of its $1,000.00 monthly "
        "budget: it waits for the next month or a larger budget"
    )
    assert verdicts["b"].admitted  # speech has no budget


def test_priority_goes_first_then_submission_and_a_run_that_cannot_start_blocks_none() -> None:
    low, high = _run("low", at=1), _run("high", at=5, priority=10, team="speech")
    verdicts = _decide(low, high, ceiling=96)
    assert verdicts["high"].admitted and verdicts["low"].place == 1
    # A large run that does not fit keeps nothing for itself: a later, smaller one starts.
    large, small = _run("large", at=1, machines=4), _run("small", at=2, machines=1)
    verdicts = _decide(large, small, ceiling=144)
    assert not verdicts["large"].admitted and verdicts["small"].admitted
    # Places count the waiting only, in the order they will be looked at.
    waiting = _decide(*(_run(name, at=i, team="speech") for i, name in enumerate("xyz")),
                      ceiling=96)  # fmt: skip
    assert [(waiting[r].admitted, waiting[r].place) for r in "xyz"] == [
        (True, None), (False, 1), (False, 2)]  # fmt: skip


def test_a_team_over_its_share_borrows_only_what_other_teams_leave_idle() -> None:
    ceiling = 10_000  # the quota is not what limits here
    # vision's share is 8 GPUs (two machines): a third machine's 4 GPUs borrow speech's idle.
    verdicts = _decide(_run("a", at=1), _run("b", at=2, machines=1), ceiling=ceiling)
    assert verdicts["b"] == Verdict(True, "admitted, borrowing 4 idle GPU(s) of other teams",
                                    borrowed_gpus=4)  # fmt: skip
    # Once speech holds its share, there is nothing idle to lend.
    speech = _run("s", team="speech", holding=True)
    verdicts = _decide(speech, _run("a", at=1), _run("b", at=2, machines=1), ceiling=ceiling)
    assert verdicts["a"].admitted and not verdicts["b"].admitted
    assert verdicts["b"].reason.startswith("team vision holds 8 of its 8 GPUs and the run needs "
                                           "4; other teams have 0 idle to lend")  # fmt: skip


def test_holding_runs_keep_their_machines_and_are_counted_first() -> None:
    # A ceiling lowered under what runs hold takes nothing back (that is preemption's, which
    # publishes a checkpoint first): they keep their machines, and nothing new starts.
    verdicts = _decide(_run("a", holding=True), _run("b", holding=True, team="speech"),
                       _run("c", at=0), ceiling=96)  # fmt: skip
    assert verdicts["a"].admitted and verdicts["b"].admitted
    assert verdicts["c"].place == 1 and "0 of its ceiling 96 free" in verdicts["c"].reason
    # A quota without a ceiling, and an environment without teams, hold nothing back.
    free = admit([_run("a"), _run("b")], ceilings={}, teams={}, team_spend_usd={})
    assert all(v.admitted for v in free.values())


def test_a_run_of_a_team_the_environment_does_not_have_waits_saying_which_it_has() -> None:
    [verdict] = _decide(_run("a", team="nlp")).values()
    assert verdict.reason == ("team 'nlp' is not one of the environment's teams (speech, "
                              "vision): set the run's team to one of them")  # fmt: skip


def test_what_a_run_asks_is_counted_per_quota_in_vcpus_and_in_gpus() -> None:
    # Two spot machines and the on-demand coordinator of p5.48xlarge (8 GPUs, 192 vCPUs).
    assert asked(["p5.48xlarge"], {"spot": 2, "on-demand": 1}) == (
        24, {"spot/P5": 384, "on-demand/P": 192})  # fmt: skip
    assert asked(["g5.12xlarge", "g6.12xlarge"], {"spot": 1, "on-demand": 0}) == (4, {G5: 48})
    assert {quota_key(t, m) for t in MACHINES for m in ("spot", "on-demand")} == set(
        INSTANCE_QUOTAS)  # every type counts against a quota AWS names  # fmt: skip
    assert [vcpus(t) for t in ("g5.xlarge", "g6e.12xlarge", "p4d.24xlarge", "g4dn.metal")] == [
        4, 48, 96, 96]  # fmt: skip
    with pytest.raises(ValueError, match="not a GPU type spotrain knows"):
        vcpus("g5.large")


def test_the_capacity_policy_holds_a_queued_run_and_a_preempted_one_remembering_its_sizes() -> None:
    from spotrain.core import capacity_policy
    from spotrain.core.capacity import CapacityGroup, Group
    from spotrain.core.run_lifecycle import Lifecycle

    standing = capacity_policy.Standing(run="c", lifecycle=Lifecycle(), queued="#1 in the queue")
    held = capacity_policy.hold_for(standing)
    assert held is not None and held.kind == capacity_policy.QUEUED
    assert held.why == "queued: #1 in the queue"
    empty = Group(declared=CapacityGroup(name="c-spot", region="us-east-1", lifecycle="spot",
                                         holds_data=True),
                  pools=(), desired=0, min_size=0, max_size=2)  # fmt: skip
    waiting = capacity_policy.hold([empty], held)
    assert waiting.action == "wait" and not capacity_policy.sizes_to_remember([empty], waiting)
    # Without a configuration it waits for that first.
    unsubmitted = capacity_policy.Standing(run="c", lifecycle=Lifecycle(), queued="#1",
                                           configuration_stored=False)  # fmt: skip
    assert capacity_policy.hold_for(unsubmitted).kind == capacity_policy.WAITING  # type: ignore[union-attr]
    # A started run the queue does not admit was preempted: its groups go to 0, their sizes
    # remembered for when it is admitted again.
    started = capacity_policy.Standing(run="c", lifecycle=Lifecycle(started_at=1.0),
                                       queued="#1 in the queue: preempted by run u")  # fmt: skip
    held = capacity_policy.hold_for(started)
    assert held is not None and held.remembers_sizes
    running = Group(**{**vars(empty), "desired": 2, "min_size": 2, "in_service": 2})
    preempted = capacity_policy.hold([running], held)
    assert preempted.action == "preempt" and "emergency checkpoint" in preempted.reason
    assert capacity_policy.sizes_to_remember([running], preempted) == {
        "c-spot": {"min_size": 2, "desired": 2}}  # fmt: skip
    admitted = capacity_policy.Standing(run="c", lifecycle=Lifecycle(started_at=1.0))
    assert capacity_policy.hold_for(admitted) is None


def test_a_higher_priority_run_preempts_the_fewest_lower_ones_it_needs_newest_first() -> None:
    # Three holders of one machine each (48 vCPUs) fill a ceiling of 144; an urgent run of two
    # machines takes the lowest priority's first, then the latest submitted of the rest.
    holders = [_run("old", at=1, machines=1, priority=1, holding=True),
               _run("new", at=2, machines=1, priority=1, holding=True),
               _run("least", at=3, machines=1, priority=0, holding=True)]  # fmt: skip
    urgent = _run("urgent", at=9, priority=5, team="speech")
    verdicts = _decide(*holders, urgent, ceiling=144)
    assert verdicts["urgent"] == Verdict(True, "admitted")
    assert [r for r, v in verdicts.items() if v.preempted_by == "urgent"] == ["new", "least"]
    assert verdicts["old"].admitted
    assert verdicts["least"].reason.startswith("preempted by run urgent (priority 5 over its 0):")
    assert (verdicts["least"].place, verdicts["new"].place) == (2, 1)  # waiting, in order
    # One that would then wait anyway preempts nobody: a larger run than the whole ceiling.
    huge = _run("huge", at=9, priority=5, machines=4)
    verdicts = _decide(*holders, huge, ceiling=144)
    assert all(verdicts[h.run].admitted for h in holders) and not verdicts["huge"].admitted
    # Equal priority never preempts; nor does any priority preempt a run with a deadline.
    assert not _decide(*holders, _run("peer", priority=1), ceiling=144)["peer"].admitted
    promised = [_run("deadline", machines=3, priority=0, holding=True, preemptible=False)]
    assert not _decide(*promised, urgent, ceiling=144)["urgent"].admitted
    # What it does not need is kept: one machine freed is enough for a one-machine run.
    verdicts = _decide(*holders, _run("one", at=9, priority=5, machines=1), ceiling=144)
    assert [r for r, v in verdicts.items() if v.preempted_by] == ["least"]


def test_what_the_accounts_quota_leaves_free_and_the_tightest_ceiling_counts() -> None:
    from spotrain.core.admission import QueuePolicy, account_room, tightest

    # A quota of 384 vCPUs, 240 in use of which the runs hold 192: others use 48.
    assert account_room(384, 240, 192) == 336
    assert account_room(384, None, 192) == 384  # no usage published: none counted
    assert account_room(100, 500, 0) == 0  # never below nothing
    set_here = {"us-east-1": {G5: 192}}
    free = {"us-east-1": {G5: 96, "spot/P5": 384}, "us-west-2": {G5: 48}}
    assert tightest(set_here, free) == {"us-east-1": {G5: 96, "spot/P5": 384},
                                        "us-west-2": {G5: 48}}  # fmt: skip
    reading = QueuePolicy(account_quotas=True)
    assert not reading.limits_nothing and QueuePolicy.from_json(reading.to_json()) == reading
    assert "account_quotas" not in QueuePolicy(teams=tuple(TEAMS.values())).to_json()


def test_the_next_run_starts_on_the_machines_of_a_run_publishing_its_final_checkpoint() -> None:
    """Warm starts (rule 5): a finishing run keeps its machines, uncounted, so the next run
    boots while it publishes; it is never preempted; the account's quota still counts it."""
    from spotrain.core.admission import account_room

    training = _run("a", at=1, holding=True)
    finishing = _run("a", at=1, holding=True, finishing=True)
    other = _run("b", team="speech", at=2, holding=True)
    waiting = _run("c", at=3)
    assert not _decide(training, other, waiting)["c"].admitted  # the ceiling is full
    verdicts = _decide(finishing, other, waiting)
    assert verdicts["c"] == Verdict(True, "admitted")
    assert verdicts["a"].admitted and verdicts["a"].reason.startswith("finishing:")
    # Its team's share counts it no more either: vision's 8 GPUs go to the next vision run.
    assert _decide(finishing, _run("d", at=3, machines=2),
                   ceiling=1000)["d"] == Verdict(True, "admitted")  # fmt: skip
    # A finishing run is about to give its machines up: an urgent run never preempts it.
    urgent = _run("urgent", at=9, priority=5, team="speech", machines=4)
    verdicts = _decide(finishing, other, urgent)
    assert verdicts["a"].admitted and verdicts["b"].preempted_by == "urgent"
    # Where AWS's quota is read, the finishing run's machines use it until they leave: of a
    # quota of 384 vCPUs used by the runs alone (288, the finishing run's 96 among them), 288
    # is the room: a next run of two machines (96 vCPUs) fits, one of four (192) waits.
    room = account_room(384, 288, 288, leaving_vcpus=96)
    assert room == 288
    held = [finishing, other, _run("e", at=2, holding=True)]
    two, four = _run("two", at=3), _run("four", at=3, machines=4)
    assert _decide(*held, two, ceiling=room, teams={})["two"].admitted
    assert not _decide(*held, four, ceiling=room, teams={})["four"].admitted
    assert _decide(*held, four, ceiling=account_room(384, 288, 288), teams={})["four"].admitted
