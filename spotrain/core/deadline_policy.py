"""Spot or on-demand for a run with a deadline: one decision function, used by the cost
simulator (`spotrain cost simulate`, `spotrain cost plan`) and by the interruption handler's
scheduled capacity check, so what the planner predicts is what the fleet does.

Uniform Progress, from "Can't Be Late: Optimizing Spot Instance Savings under Deadlines"
(Wu et al., NSDI '24), as its authors' reference implementation decides. With C hours of
compute to do by the deadline R, the expected progress at time t is ep(t) = t * C / R; cp(t)
is the progress made; d is the changeover cost of a move (restart + restore + the work since
the last checkpoint).

- Safety net, for a job that is idle or on on-demand: once the time left is no more than the
  work left + 2d, go on-demand and stay.
- Guard, for every job: once the time left is no more than the work left + d, a job whose
  spot machines are training (past their changeover) keeps them until they are taken; any
  other job goes on-demand. (A job on spot is not thrown off it by the 2d net: a move would
  pay a changeover to avoid a risk the 1d guard still covers.)
- Spot available: an idle job takes it, a job on spot stays; a job on on-demand moves to spot
  only when it is strictly ahead of schedule by the hysteresis margin, cp(t) > ep(t + 2d).
- Spot unavailable: a job on on-demand stays there (it never goes from on-demand to idle);
  an idle job goes on-demand when it is behind, cp(t) < ep(t), else it waits.

A decision holds until the policy is asked again (the simulator's tick, the handler's check
interval): the net and the guard count the time left in whole intervals (rounded down) and
the work in whole intervals (rounded up), so the last safe move is never one interval late.
Every comparison is exact: the hours are taken as whole milliseconds and compared by
cross-multiplication, so a run exactly on its schedule (48 h of work in 52 h is 12/13 per hour)
is decided as the rule states, never by rounding noise.

`greedy` is the baseline it is measured against: spot whenever there is some, on-demand only
when the deadline forces it (the same net and guard). A gang of N machines runs on all N or
none; callers decide what "spot available" means for theirs.

Standard library only (and the catalog's names): it ships inside the interruption handler's
Lambda zip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import Any, NamedTuple

from spotrain.core import run_epochs
from spotrain.core.catalog_schema import (
    CHECKPOINT_PREFIX,
    SORT_KEY,
    checkpoint_sort_key,
    query_items,
    run_key,
)
from spotrain.core.run_epochs import read_head

SPOT = "spot"
ON_DEMAND = "on-demand"
IDLE = "idle"
MODES = (SPOT, ON_DEMAND, IDLE)
MS_PER_HOUR = 3_600_000


def whole_ms(hours: float) -> int:
    """Hours as whole milliseconds: the unit in which the policy's comparisons are exact."""
    return round(hours * MS_PER_HOUR)


class _Exact(NamedTuple):
    """A Progress in whole milliseconds (deadline None: there is none). A tuple: a replay
    makes one at every tick."""

    t: int
    deadline: int | None
    work: int
    done: int
    d: int
    d_left: int
    interval: int


@dataclass(frozen=True)
class Progress:
    """A run against its deadline, in hours of the gang's compute."""

    elapsed_h: float
    """Time since the run started (t)."""
    deadline_h: float
    """Time from the start to the deadline (R); infinite: no deadline."""
    work_h: float
    """Compute the run needs in all (C)."""
    done_h: float
    """Compute done so far (cp(t))."""
    changeover_h: float
    """Cost of a move to a new machine: restart + restore + work since the last checkpoint (d)."""
    changeover_left_h: float = 0.0
    """What the machines in hand still have to pay of their changeover (0: they train)."""
    decision_interval_h: float = 0.0
    """How long a decision holds before the policy is asked again (the simulator's tick, the
    handler's check interval); 0: it is asked continuously."""

    def __post_init__(self) -> None:
        problems = []
        for name in (
            "elapsed_h", "deadline_h", "work_h", "done_h", "changeover_h", "changeover_left_h",
            "decision_interval_h",
        ):  # fmt: skip
            value = getattr(self, name)
            endless = name == "deadline_h"  # no deadline
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or math.isnan(value)
                or value < 0
                or (math.isinf(value) and not endless)
            ):
                problems.append(f"{name} is {value!r}: give a finite number of hours, 0 or more")
        if not problems:
            problems += [
                f"{name} is 0: give a positive number of hours"
                for name in ("deadline_h", "work_h")
                if getattr(self, name) == 0
            ]
        if problems:
            raise ValueError("progress: " + "; ".join(problems))
        exact = _Exact(
            t=whole_ms(self.elapsed_h),
            deadline=whole_ms(self.deadline_h) if math.isfinite(self.deadline_h) else None,
            work=whole_ms(self.work_h),
            done=whole_ms(self.done_h),
            d=whole_ms(self.changeover_h),
            d_left=whole_ms(self.changeover_left_h),
            interval=whole_ms(self.decision_interval_h),
        )
        object.__setattr__(self, "_exact", exact)

    @classmethod
    def from_ms(
        cls, *, elapsed: int, deadline: int | None, work: int, done: int, changeover: int,
        changeover_left: int = 0, decision_interval: int = 0,
    ) -> Progress:  # fmt: skip
        """A Progress from whole milliseconds a replay counted (checked there, once, not at
        every tick)."""
        progress = object.__new__(cls)
        # Set as one mapping, not field by field through the frozen class's guard: a replay
        # makes one Progress at every tick (half of `cost estimate`'s time once).
        progress.__dict__.update(
            elapsed_h=elapsed / MS_PER_HOUR,
            deadline_h=math.inf if deadline is None else deadline / MS_PER_HOUR,
            work_h=work / MS_PER_HOUR, done_h=done / MS_PER_HOUR,
            changeover_h=changeover / MS_PER_HOUR,
            changeover_left_h=changeover_left / MS_PER_HOUR,
            decision_interval_h=decision_interval / MS_PER_HOUR,
            _exact=_Exact(elapsed, deadline, work, done, changeover, changeover_left,
                          decision_interval),
        )  # fmt: skip
        return progress

    @property
    def exact(self) -> _Exact:
        return self._exact  # type: ignore[attr-defined,no-any-return]

    def expected(self, at_h: float) -> float:
        """ep(t): where uniform progress to the deadline would be at `at_h` (for messages; the
        decisions compare exactly)."""
        return at_h * self.work_h / self.deadline_h


@dataclass(frozen=True)
class Choice:
    mode: str
    """spot | on-demand | idle"""
    reason: str


def _behind(x: _Exact) -> bool:
    """cp(t) < ep(t)."""
    return x.deadline is not None and x.done * x.deadline < x.t * x.work


def _ahead_by_two_changeovers(x: _Exact) -> bool:
    """cp(t) > ep(t + 2d), strictly (without a deadline ep is 0)."""
    if x.deadline is None:
        return x.done > 0
    return x.done * x.deadline > (x.t + 2 * x.d) * x.work


def _out_of_time(x: _Exact, changeovers: int) -> bool:
    """The work left and `changeovers` changeovers take all the time left, or more; with a
    decision interval, the time in whole intervals (down) and the work in whole ones (up)."""
    if x.deadline is None:
        return False
    left = x.deadline - x.t
    need = x.work - x.done + changeovers * x.d
    if x.interval:
        left = left // x.interval * x.interval
        need = -(-need // x.interval) * x.interval
    return need >= left


def _net_facts(progress: Progress, changeovers: int) -> str:
    interval = progress.decision_interval_h
    return (
        f"{progress.deadline_h - progress.elapsed_h:.2f} h left for "
        f"{progress.work_h - progress.done_h:.2f} h of work + {changeovers} changeover"
        f"{'s' if changeovers > 1 else ''} of {progress.changeover_h:.2f} h"
        + (f" (counted in whole decisions of {interval * 60:g} min)" if interval else "")
    )


def safety_net(progress: Progress, current: str, spot_available: bool, *,
               net: bool = True) -> Choice | None:  # fmt: skip
    """The net (2d, for a job idle or on on-demand) and the guard (1d, for every job): every
    deadline policy asks it first (`current` as `as_seen` gives it). `net=False`: the guard
    alone, for a policy that prices the deadline itself (`spotrain.cost.markov_policy`)."""
    x = progress.exact
    if not _out_of_time(x, 2 if net else 1):
        return None
    if x.d == 0 and spot_available:
        return Choice(SPOT, f"{_net_facts(progress, 1)}: a move costs nothing, spot")
    if _out_of_time(x, 1):
        if current == SPOT and x.d_left == 0:
            return Choice(SPOT, f"{_net_facts(progress, 1)}: the spot machines are training "
                          "and stay until they are taken")  # fmt: skip
        return Choice(ON_DEMAND, f"{_net_facts(progress, 1)}: on-demand to the end")
    if current != SPOT:
        return Choice(ON_DEMAND, f"{_net_facts(progress, 2)}: on-demand to the end")
    return Choice(SPOT, f"{_net_facts(progress, 2)}: the spot machines are training and stay "
                  "(one changeover still fits)")  # fmt: skip


def as_seen(current: str, spot_available: bool) -> str:
    """What the run is on, as a policy sees it (checked)."""
    if current not in MODES:
        raise ValueError(f"current is {current!r}: use one of {', '.join(MODES)}")
    # Spot machines without spot capacity are going: the job is as good as idle.
    return IDLE if current == SPOT and not spot_available else current


def uniform_progress(progress: Progress, *, current: str, spot_available: bool) -> Choice:
    """What the run should be on now, given what it is on (`current`) and whether spot
    capacity is there for the whole gang."""
    current = as_seen(current, spot_available)
    forced = safety_net(progress, current, spot_available)
    if forced is not None:
        return forced
    x, t, done = progress.exact, progress.elapsed_h, progress.done_h
    if spot_available:
        if current != ON_DEMAND:
            return Choice(SPOT, "spot is available")
        ahead_by = progress.expected(t + 2 * progress.changeover_h)
        if _ahead_by_two_changeovers(x):
            return Choice(
                SPOT,
                f"spot is back and progress {done:.2f} h is ahead of "
                f"{ahead_by:.2f} h (schedule + 2 changeovers): back to spot",
            )
        return Choice(
            ON_DEMAND,
            f"spot is back but progress {done:.2f} h is not ahead of "
            f"{ahead_by:.2f} h (schedule + 2 changeovers): stays on-demand",
        )
    if current == ON_DEMAND:
        return Choice(ON_DEMAND, "no spot capacity: stays on-demand")
    on_schedule = progress.expected(t)
    if _behind(x):
        return Choice(
            ON_DEMAND,
            f"no spot capacity and progress {done:.2f} h is behind "
            f"schedule ({on_schedule:.2f} h): on-demand",
        )
    return Choice(
        IDLE,
        f"no spot capacity; progress {done:.2f} h is on schedule "
        f"({on_schedule:.2f} h): wait for spot",
    )


def greedy(progress: Progress, *, current: str, spot_available: bool) -> Choice:
    """Spot whenever there is some; on-demand only when the deadline forces it."""
    current = as_seen(current, spot_available)
    forced = safety_net(progress, current, spot_available)
    if forced is not None:
        return forced
    if current == ON_DEMAND:  # only the safety net puts it there, and it stays
        return Choice(ON_DEMAND, "on-demand to the end")
    if spot_available:
        return Choice(SPOT, "spot is available")
    return Choice(IDLE, "no spot capacity: wait for spot")


# --- a run's deadline, as the environment configures it and the handler reads it ---------------
def instant(value: str) -> float:
    """Epoch seconds of an ISO 8601 time with its zone (e.g. 2026-12-01T00:00:00Z)."""
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError("it has no time zone")
    return parsed.timestamp()


@dataclass(frozen=True, kw_only=True)
class RunDeadline:
    """A run that must finish by a time: the interruption handler then decides between spot
    and on-demand with `uniform_progress` instead of a fixed wait."""

    started_at: str
    """When the run started (ISO 8601 with zone): time 0 of its schedule."""
    finish_by: str
    """When it must be done (ISO 8601 with zone)."""
    total_steps: int
    """The run's training steps; its throughput comes from its published checkpoints."""
    changeover_minutes: float = 15.0
    """d: restart + restore + the work since the last checkpoint, per move."""

    def problems(self) -> list[str]:
        found = []
        times = {}
        for name in ("started_at", "finish_by"):
            value = getattr(self, name)
            try:
                if not isinstance(value, str):
                    raise ValueError(f"it is a {type(value).__name__}, not text")
                times[name] = instant(value)
            except ValueError as error:
                found.append(
                    f"run_deadline.{name} {value!r} is not an ISO 8601 time with its zone "
                    f"({error}): write e.g. 2026-12-01T00:00:00Z"
                )
        if len(times) == 2 and times["finish_by"] <= times["started_at"]:
            found.append(
                "run_deadline.finish_by is not after started_at: give the time the run "
                "must be done by"
            )
        if (
            isinstance(self.total_steps, bool)
            or not isinstance(self.total_steps, int)
            or (self.total_steps < 1)
        ):
            found.append(
                f"run_deadline.total_steps is {self.total_steps!r}: give the run's "
                "number of training steps (1 or more)"
            )
        minutes = self.changeover_minutes
        if (
            isinstance(minutes, bool)
            or not isinstance(minutes, int | float)
            or not math.isfinite(minutes)
            or minutes < 0
        ):
            found.append(
                f"run_deadline.changeover_minutes is {minutes!r}: give a number of minutes, "
                "0 or more"
            )
        return found

    @property
    def start_s(self) -> float:
        return instant(self.started_at)

    @property
    def deadline_h(self) -> float:
        return (instant(self.finish_by) - self.start_s) / 3600


# --- a run's pace, from its checkpoint catalog ----------------------------------------------
@dataclass(frozen=True)
class Pace:
    step: int
    """The catalog head's step (0 before the first checkpoint)."""
    steps_per_hour: float | None
    """Between checkpoints published by one trainer start; None until there are two."""


def throughput(records: list[dict[str, Any]]) -> float | None:
    """Steps per hour between consecutive checkpoint records (their sort key, `step`,
    `created_at`, `generation`) of one trainer start: a restart's downtime is not throughput.
    A start is its lease generation in its epoch (each epoch's leases count from 1 again)."""

    def start(record: dict[str, Any]) -> tuple[str, Any]:
        stem = checkpoint_sort_key(int(record["step"]))
        return str(record.get(SORT_KEY, stem)).removeprefix(stem), record.get("generation")

    steps = seconds = 0.0
    ordered = sorted(records, key=lambda r: int(r["step"]))
    for before, after in pairwise(ordered):
        if start(before) != start(after):
            continue
        took = instant(after["created_at"]) - instant(before["created_at"])
        if took > 0:
            steps, seconds = steps + int(after["step"]) - int(before["step"]), seconds + took
    return steps / seconds * 3600 if steps else None


def read_throughput(
    table: Any, run: str, chain: list[run_epochs.Epoch] | None = None
) -> float | None:
    """The run's steps per hour (`throughput`) from the checkpoint catalog (a boto3 Table),
    over the checkpoints of its history: one a stale writer published after the run moved is
    no progress (and would count steps done twice). `chain`: the run's epochs, when the caller
    has read them already."""
    records = query_items(table, run_key(run), CHECKPOINT_PREFIX,
                          ProjectionExpression="#sk, step, created_at, generation")  # fmt: skip
    counted = run_epochs.in_history(run_epochs.read_chain(table, run) if chain is None else chain)
    return throughput([r for r in records if counted(str(r[SORT_KEY]), int(r["step"]))])


def read_pace(table: Any, run: str) -> Pace:
    """The run's head and throughput from the checkpoint catalog (a boto3 Table)."""
    chain = run_epochs.read_chain(table, run)  # read once, for both
    head = read_head(table, run, chain)
    return Pace(int(head["step"]) if head else 0, read_throughput(table, run, chain))
