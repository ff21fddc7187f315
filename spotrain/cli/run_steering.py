"""`spotrain run cancel|resume`: a run held and released by hand, as the capacity policy holds
and releases one (`spotrain.core.capacity_policy`): `cancel` takes its groups to nothing at
once (each machine gets SIGTERM and publishes its emergency checkpoint before it goes),
remembers their sizes and marks it cancelled, so the interruption handler keeps it there and
no machine of it may start; `resume` puts back the sizes it had, unless the policy still holds
it (crashes, spend cap), and it continues from its head."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import Any

from spotrain.cli.fleet import caller_arn
from spotrain.cli.output import say
from spotrain.cli.run_status import Where, in_service, run_groups
from spotrain.core.errors import SpotrainError


def cancel(where: Where, args: argparse.Namespace) -> int:
    from spotrain.core import capacity_policy, fleet_state, run_lifecycle
    from spotrain.core.capacity import Sizes

    groups = groups_of(where, args)
    lifecycle = run_lifecycle.read(where.events, args.run)
    if lifecycle.finished_step is not None:
        raise SpotrainError(f"run {args.run} already finished (step {lifecycle.finished_step} "
                            "is final): its groups are at 0; nothing to cancel")  # fmt: skip
    by, now = caller_arn(), time.time()
    sizes = [Sizes.described(g) for g in groups]
    cancelled = replace(lifecycle, cancelled_at=now, cancelled_by=by)
    held = capacity_policy.hold_for(capacity_policy.Standing(run=args.run, lifecycle=cancelled))
    assert held is not None  # a cancelled run has no machines
    decision = capacity_policy.hold(sizes, held)
    # Sizes first, then the mark: a resume finds what to put back whichever step failed.
    if remembered := capacity_policy.sizes_to_remember(sizes, decision):
        fleet_state.set_held_sizes(where.events, args.run, remembered)
    run_lifecycle.mark_cancelled(where.events, args.run, by=by, at=now)
    _scale(where, decision, groups)
    said = sum(in_service(g) for g in groups)
    say(f"run {args.run} cancelled: its groups are at 0; {said} machine(s) publish their "
        f"emergency checkpoint and leave. `spotrain run resume {args.environment} {args.run}` "
        "continues it from its head")  # fmt: skip
    return 0


def resume(where: Where, args: argparse.Namespace) -> int:
    from spotrain.core import capacity_policy, fleet_state, run_lifecycle, spend_ledger
    from spotrain.core.capacity import Sizes

    described = groups_of(where, args)
    lifecycle = run_lifecycle.read(where.events, args.run)
    if lifecycle.finished_step is not None:
        raise SpotrainError(
            f"run {args.run} finished (step {lifecycle.finished_step} is final): "
            "to train further, store a configuration under a new run name"
        )
    if lifecycle.cancelled_at is None:
        say(f"run {args.run} is not cancelled: nothing to resume")
        return 0
    leaving = [i["InstanceId"] for g in described for i in g.get("Instances", [])]
    if leaving:
        # Their emergency checkpoint is the head a resumed run starts from: a machine started
        # before it is published would take the run's lease and refuse it.
        raise SpotrainError(f"run {args.run} is cancelled but {len(leaving)} machine(s) of it "
                            f"are still leaving ({', '.join(sorted(leaving))}), publishing "
                            "their emergency checkpoint: resume it once they are gone (about "
                            "two minutes; `spotrain run status` counts them)")  # fmt: skip
    run_lifecycle.clear_cancelled(where.events, args.run)
    state = fleet_state.run_state(where.events, args.run)
    ledger = spend_ledger.read(where.events, args.run)
    held = capacity_policy.hold_for(capacity_policy.Standing(
        run=args.run, lifecycle=run_lifecycle.read(where.events, args.run),
        crashed=state.failed, spend_usd=ledger.spend_usd, cap_usd=ledger.cap_usd,
        at_cap=ledger.held,
    ))  # fmt: skip
    if held is not None:
        say(f"run {args.run} is no longer cancelled, but still held ({held.why}): its groups "
            f"stay at 0 until it is released ({held.how_to_release})")  # fmt: skip
        return 0
    decision = capacity_policy.release([Sizes.described(g) for g in described],
                                       state.held_sizes or {})  # fmt: skip
    _scale(where, decision, described)
    fleet_state.set_held_sizes(where.events, args.run, None)
    if decision.desired:  # raised from none: it asks for its gang (the policy's rule 8)
        asked = capacity_policy.GangAsked(time.time(), ledger.spend_usd)
        fleet_state.set_gang_asked(where.events, args.run, asked, anew=True)
    back = ", ".join(f"{name} {decision.min_sizes[name]}..{desired}"
                     for name, desired in sorted(decision.desired.items()))  # fmt: skip
    say(f"run {args.run} resumed: {back or 'its groups start at the next check'}; it "
        "continues from its head")  # fmt: skip
    return 0


def _scale(where: Where, decision: Any, groups: list[dict[str, Any]]) -> None:
    """The capacity policy's hold or release, applied to the run's groups, each in its
    region."""
    region_of = {g["AutoScalingGroupName"]: g.get("Region", where.region) for g in groups}
    for name, desired in sorted(decision.desired.items()):
        where.autoscaling_of(region_of[name]).update_auto_scaling_group(
            AutoScalingGroupName=name, MinSize=decision.min_sizes[name], DesiredCapacity=desired
        )


def groups_of(where: Where, args: argparse.Namespace) -> list[dict[str, Any]]:
    groups = run_groups(where, args.run).get(args.run, [])
    if not groups:
        raise SpotrainError(f"no Auto Scaling group of run {args.run} in environment "
                            f"{args.environment}: `spotrain run list {args.environment}` shows "
                            "its runs")  # fmt: skip
    return groups
