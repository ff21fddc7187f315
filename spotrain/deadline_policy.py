"""Spot or on-demand for a run with a deadline: one decision function, used by the cost
simulator (`spotrain cost simulate`, `spotrain cost plan`) and by the interruption handler's
scheduled capacity check, so what the planner predicts is what the fleet does.

Uniform Progress, from "Can't Be Late: Optimizing Spot Instance Savings under Deadlines"
(Wu et al., NSDI '24), as its authors' reference implementation decides. With C hours of
compute to do by the deadline R, the expected progress at time t is ep(t) = t * C / R; cp(t)
is the progress made.

- Safety net: once the time left is less than the work left + 2d (d: the changeover cost of a
  move, restart + restore + the work since the last checkpoint), go on-demand and stay.
- Spot available: an idle job takes it, a job on spot stays; a job on on-demand moves to spot
  only when it is ahead of schedule by the hysteresis margin, cp(t) > ep(t + 2d).
- Spot unavailable: a job on on-demand stays there (it never goes from on-demand to idle);
  an idle job goes on-demand when it is behind, cp(t) < ep(t), else it waits.

`greedy` is the baseline it is measured against: spot whenever there is some, on-demand only
when the deadline forces it. A gang of N machines runs on all N or none; callers decide what
"spot available" means for theirs.

Standard library only (and the catalog's names): it ships inside the interruption handler's
Lambda zip.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import Any

from spotrain.catalog_schema import (
    CHECKPOINT_PREFIX,
    HEAD_SORT_KEY,
    PARTITION_KEY,
    SORT_KEY,
    query_items,
    run_key,
)

SPOT = "spot"
ON_DEMAND = "on-demand"
IDLE = "idle"
MODES = (SPOT, ON_DEMAND, IDLE)


@dataclass(frozen=True)
class Progress:
    """A run against its deadline, in hours of the gang's compute."""

    elapsed_h: float
    """Time since the run started (t)."""
    deadline_h: float
    """Time from the start to the deadline (R)."""
    work_h: float
    """Compute the run needs in all (C)."""
    done_h: float
    """Compute done so far (cp(t))."""
    changeover_h: float
    """Cost of a move to a new machine: restart + restore + work since the last checkpoint (d)."""

    def expected(self, at_h: float) -> float:
        """ep(t): where uniform progress to the deadline would be at `at_h`."""
        return at_h * self.work_h / self.deadline_h

    @property
    def slack_h(self) -> float:
        """Time left minus work left minus the margin of two changeovers."""
        left = self.deadline_h - self.elapsed_h
        return left - (self.work_h - self.done_h) - 2 * self.changeover_h


@dataclass(frozen=True)
class Choice:
    mode: str
    """spot | on-demand | idle"""
    reason: str


def _safety_net(progress: Progress) -> Choice | None:
    if progress.slack_h < 0:
        return Choice(
            ON_DEMAND,
            f"{progress.deadline_h - progress.elapsed_h:.2f} h left for "
            f"{progress.work_h - progress.done_h:.2f} h of work + 2 changeovers of "
            f"{progress.changeover_h:.2f} h: on-demand to the end",
        )
    return None


def uniform_progress(progress: Progress, *, current: str, spot_available: bool) -> Choice:
    """What the run should be on now, given what it is on (`current`) and whether spot
    capacity is there for the whole gang."""
    if current not in MODES:
        raise ValueError(f"current is {current!r}: use one of {', '.join(MODES)}")
    forced = _safety_net(progress)
    if forced is not None:
        return forced
    t, done = progress.elapsed_h, progress.done_h
    if spot_available:
        if current != ON_DEMAND:
            return Choice(SPOT, "spot is available")
        ahead_by = progress.expected(t + 2 * progress.changeover_h)
        if done > ahead_by:
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
    if done < on_schedule:
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
    if current not in MODES:
        raise ValueError(f"current is {current!r}: use one of {', '.join(MODES)}")
    forced = _safety_net(progress)
    if forced is not None:
        return forced
    if current == ON_DEMAND:  # only the safety net puts it there, and it stays
        return Choice(ON_DEMAND, "on-demand to the end")
    if spot_available:
        return Choice(SPOT, "spot is available")
    return Choice(IDLE, "no spot capacity: wait for spot")


# --- a run's deadline, as the environment configures it and the handler reads it ---------------
def _instant(value: str) -> float:
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
            try:
                times[name] = _instant(getattr(self, name))
            except (ValueError, AttributeError) as error:
                found.append(
                    f"run_deadline.{name} {getattr(self, name)!r} is not an ISO 8601 "
                    f"time with its zone ({error}): write e.g. 2026-12-01T00:00:00Z"
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
        if not self.changeover_minutes >= 0:
            found.append(
                f"run_deadline.changeover_minutes is {self.changeover_minutes}: use 0 or more"
            )
        return found

    @property
    def start_s(self) -> float:
        return _instant(self.started_at)

    @property
    def deadline_h(self) -> float:
        return (_instant(self.finish_by) - self.start_s) / 3600


# --- a run's pace, from its checkpoint catalog ----------------------------------------------
@dataclass(frozen=True)
class Pace:
    step: int
    """The catalog head's step (0 before the first checkpoint)."""
    steps_per_hour: float | None
    """Between checkpoints published by one trainer start; None until there are two."""


def throughput(records: list[dict[str, Any]]) -> float | None:
    """Steps per hour between consecutive checkpoint records (`step`, `created_at`,
    `generation`) of one trainer start: a restart's downtime is not throughput."""
    steps = seconds = 0.0
    ordered = sorted(records, key=lambda r: int(r["step"]))
    for before, after in pairwise(ordered):
        if before.get("generation") != after.get("generation"):
            continue
        took = _instant(after["created_at"]) - _instant(before["created_at"])
        if took > 0:
            steps, seconds = steps + int(after["step"]) - int(before["step"]), seconds + took
    return steps / seconds * 3600 if steps else None


def read_pace(table: Any, run: str) -> Pace:
    """The run's head and throughput from the checkpoint catalog (a boto3 Table)."""
    head = table.get_item(
        Key={PARTITION_KEY: run_key(run), SORT_KEY: HEAD_SORT_KEY}, ConsistentRead=True
    ).get("Item")
    records = query_items(table, run_key(run), CHECKPOINT_PREFIX,
                          ProjectionExpression="#sk, step, created_at, generation")  # fmt: skip
    return Pace(int(head["step"]) if head else 0, throughput(records))
