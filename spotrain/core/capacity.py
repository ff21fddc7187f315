"""A run's capacity, declared and as it is: the contract between the run's stack (which
writes the declaration), the interruption handler (which reads it and scales the groups) and
the CLI (which holds and releases them).

A run's stack declares the run to its environment's handler (`RunDeclaration`, the value of
the SSM parameter `handler_settings.run_parameter_name`): the groups the handler may scale
for it, its spend cap and its deadline. The handler reads each group as it is now (`Group`:
the declaration and the group's current sizes, pools and machines) and decides with
`capacity_policy`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from spotrain.core.deadline_policy import RunDeadline
from spotrain.core.errors import raise_if_problems

SPOT = "spot"
ON_DEMAND = "on-demand"
MARKETS = (SPOT, ON_DEMAND)
"""A group's market (EC2's instance lifecycle): spot, or on-demand (the fallback)."""


@dataclass(frozen=True, kw_only=True)
class CapacityGroup:
    """An Auto Scaling group the handler may scale for the run, as the run declares it."""

    name: str
    region: str
    lifecycle: str
    """Its market: SPOT, or ON_DEMAND (the fallback when spot is short)."""
    holds_data: bool
    """In the run's home region, where it starts. Where it trains later is its epoch's region
    (`run_epochs`): the handler scales only that region's groups."""
    min_size: int = 0
    desired: int = 0
    """The sizes the run declares for the group: deployed empty, the group is started at
    these once the run's configuration is stored."""

    def problems(self) -> list[str]:
        found = []
        if self.lifecycle not in MARKETS:
            found.append(f"capacity group {self.name!r} has lifecycle {self.lifecycle!r}: "
                         f"use {SPOT!r} or {ON_DEMAND!r}")  # fmt: skip
        if not 0 <= self.min_size <= self.desired:
            found.append(f"capacity group {self.name!r} declares min_size {self.min_size} "
                         f"and desired {self.desired}: need 0 <= min_size <= desired")  # fmt: skip
        return found


MAX_GANG_TIMEOUT_MINUTES = 24 * 60
"""The longest a run's gang may take to come whole: a day."""


def gang_timeout_problem(minutes: object) -> str | None:
    """What is wrong with a run's `gang_timeout_minutes` (None: nothing, or not given)."""
    if minutes is None or (isinstance(minutes, int | float) and not isinstance(minutes, bool)
                           and 0 < minutes <= MAX_GANG_TIMEOUT_MINUTES):  # fmt: skip
        return None
    return (f"gang_timeout_minutes is {minutes!r}: give minutes above 0 and at most "
            f"{MAX_GANG_TIMEOUT_MINUTES} (fractions allowed), or leave it out for the "
            "handler's 15")  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class RunDeclaration:
    """A run as its stack declares it to the environment's handler: the groups the handler
    may scale for it (at least one spot group; an on-demand one for fallback), its spend cap
    (notices at 50, 80 and 100%; held at 100% until an operator raises it) and its deadline
    (spot or on-demand by its progress, instead of the fixed on-demand wait)."""

    run: str
    groups: tuple[CapacityGroup, ...]
    max_spend_usd: float | None = None
    run_deadline: RunDeadline | None = None
    team: str = ""
    """The team the run's GPUs and spend count against (the environment's queue)."""
    priority: int = 0
    """Its place in the queue before submission order: higher goes first."""
    gpus: int = 0
    """GPUs its machines carry at its declared sizes (what the queue counts)."""
    vcpus: Mapping[str, int] = field(default_factory=dict)
    """vCPUs it asks of each AWS quota at those sizes (`gpu_types.INSTANCE_QUOTAS`)."""
    instance_types: tuple[str, ...] = ()
    """The types its machines may be, in its order of preference: what spot placement scores
    are asked for and a move between regions is priced with."""
    gang_timeout_minutes: float | None = None
    """How long its gang may take to come whole before the machines that came are released
    (`capacity_policy` rule 8); None: the handler's (`GANG_TIMEOUT_MINUTES`)."""

    def problems(self) -> list[str]:
        found = []
        if problem := gang_timeout_problem(self.gang_timeout_minutes):
            found.append(problem)
        if SPOT not in [g.lifecycle for g in self.groups]:
            found.append("capacity_groups needs at least one spot group")
        for group in self.groups:
            found += group.problems()
        cap = self.max_spend_usd
        if cap is not None and not 0 < cap < float("inf"):
            found.append(f"max_spend_usd is {cap}: give a positive amount in USD")
        if self.run_deadline is not None:
            found += self.run_deadline.problems()
        return found

    def to_json(self) -> str:
        """The parameter's value; a declaration with problems is refused, each one named."""
        raise_if_problems(f"run {self.run!r}'s declaration to the interruption handler",
                          self.problems())  # fmt: skip
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, *, run: str) -> RunDeclaration:
        """The declaration of `run` in a parameter's value (a ValueError says what is wrong)."""
        document: Any = json.loads(text)
        if not isinstance(document, dict) or document.get("run") != run:
            raise ValueError(f"the declaration does not name run {run!r}")
        groups = document.get("groups")
        if not isinstance(groups, list) or not all(isinstance(g, dict) and g.get("name")
                                                   for g in groups):  # fmt: skip
            raise ValueError("its groups are not a list of named groups")
        cap, deadline = document.get("max_spend_usd"), document.get("run_deadline")
        return cls(
            run=run,
            groups=tuple(CapacityGroup(**g) for g in groups),
            max_spend_usd=float(cap) if cap is not None else None,
            run_deadline=RunDeadline(**deadline) if deadline else None,
            team=str(document.get("team", "")),
            priority=int(document.get("priority", 0)),
            gpus=int(document.get("gpus", 0)),
            vcpus={str(q): int(n) for q, n in (document.get("vcpus") or {}).items()},
            instance_types=tuple(str(t) for t in document.get("instance_types") or ()),
            gang_timeout_minutes=float(timeout) if (timeout := document.get(
                "gang_timeout_minutes")) is not None else None,
        )  # fmt: skip

    @property
    def regions(self) -> list[str]:
        """The regions the run may train in, in the environment's order (home first): the
        order its groups are declared in, which failover follows."""
        return list(dict.fromkeys(g.region for g in self.groups))

    @property
    def home_region(self) -> str:
        """Where the run starts: its groups that hold the data (the first group's, if none
        says so)."""
        return next((g.region for g in self.groups if g.holds_data), self.groups[0].region)


@dataclass(frozen=True, kw_only=True)
class Group:
    """A declared group as it is now."""

    declared: CapacityGroup
    pools: tuple[str, ...]
    """Pools it launches into: instance type x zone."""
    desired: int
    min_size: int
    max_size: int
    in_service: int = 0

    @property
    def name(self) -> str:
        return self.declared.name

    @property
    def region(self) -> str:
        return self.declared.region

    @property
    def lifecycle(self) -> str:
        return self.declared.lifecycle

    @property
    def holds_data(self) -> bool:
        return self.declared.holds_data


@dataclass(frozen=True)
class Sizes:
    """A group's name and current sizes, as Auto Scaling describes it: what a hold takes away
    and a release puts back, for a caller that has no declaration at hand (the CLI)."""

    name: str
    min_size: int
    desired: int

    @classmethod
    def described(cls, group: Mapping[str, Any]) -> Sizes:
        """From one group of DescribeAutoScalingGroups."""
        return cls(str(group["AutoScalingGroupName"]), int(group["MinSize"]),
                   int(group["DesiredCapacity"]))  # fmt: skip
