"""Spot availability traces: how many spot instances could be had at each tick.

The file format is the public one of the "Can't Be Late" study (NSDI '24):
`{"metadata": {"gap_seconds": G}, "data": [n0, n1, ...]}`, each value the number of spot
instances available during that tick of G seconds (0: none). spotrain adds one optional field,
`metadata.start`: when the first tick starts (ISO 8601, e.g. "2026-11-02T05:00:00Z"), which
gives every tick its hour of the day (the Markov policy plans with how spells end by the hour).
The authors' own simulator reads the values inverted (as "preempted"); here a value is what it
says, availability, and a gang of N machines can run on spot in a tick only when N are
available.

Traces can also be generated from a per-instance interruption rate: each of `capacity` slots
alternates between available (exponential, mean 1/rate) and gone (exponential, mean
`recovery_h`), and a tick counts the slots available at its start.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spotrain.core.deadline_policy import instant
from spotrain.core.errors import SpotrainError, read_json

FORMAT_HINT = (
    'write it as {"metadata": {"gap_seconds": 60}, "data": [2, 2, 0, 1, ...]}: one count of '
    "available spot instances per tick"
)


class TraceError(SpotrainError, ValueError):
    """A trace file that is not the format, or generation settings that make no trace."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems) or [message]
        """Each problem on its own (several files'), for a caller that lists them."""


MIN_GAP_S, MAX_GAP_S = 1.0, 86_400.0
"""A tick's length: a second (replay walks every tick) to a day."""
MAX_GENERATED_TICKS = 2_000_000


@dataclass(frozen=True)
class Trace:
    name: str
    gap_s: float
    """Seconds per tick."""
    available: tuple[int, ...]
    """Spot instances available in each tick."""
    start_s: float | None = None
    """When the first tick starts (Unix seconds), where the trace says (`metadata.start`)."""

    @property
    def hours(self) -> float:
        return len(self.available) * self.gap_s / 3600

    def utc_hour(self, tick: float, *, after_h: float = 0.0) -> float | None:
        """The hour of the day (UTC) `after_h` hours after tick `tick` (a run's deadline, from
        its start tick); None: the trace does not say when it starts."""
        if self.start_s is None:
            return None
        return ((self.start_s + tick * self.gap_s) / 3600 + after_h) % 24

    def availability(self, nodes: int) -> float:
        """Share of ticks in which a gang of `nodes` could run on spot."""
        return sum(n >= nodes for n in self.available) / len(self.available)

    def to_json(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {"gap_seconds": self.gap_s, "name": self.name}
        if self.start_s is not None:
            when = datetime.fromtimestamp(self.start_s, UTC)
            metadata["start"] = when.isoformat().replace("+00:00", "Z")
        return {"metadata": metadata, "data": list(self.available)}


def parse(document: Any, name: str) -> Trace:
    """A trace from its decoded JSON, or TraceError naming what is wrong and the fix."""
    where = f"trace {name}"
    if not isinstance(document, dict) or not isinstance(document.get("metadata"), dict):
        raise TraceError(f"{where} has no metadata object: {FORMAT_HINT}")
    gap = document["metadata"].get("gap_seconds")
    if not _number(gap) or not MIN_GAP_S <= gap <= MAX_GAP_S:
        raise TraceError(
            f"{where}: metadata.gap_seconds is {gap!r}, not a number of seconds from "
            f"{MIN_GAP_S:g} to {MAX_GAP_S:g}: {FORMAT_HINT}"
        )
    data = document.get("data")
    if not isinstance(data, list) or not data:
        raise TraceError(f"{where}: data is not a non-empty list: {FORMAT_HINT}")
    for index, value in enumerate(data):
        if not _number(value) or value < 0 or value != int(value):
            raise TraceError(
                f"{where}: data[{index}] is {value!r}, not a count of available "
                f"instances (0, 1, 2, ...): {FORMAT_HINT}"
            )
    return Trace(
        name=name,
        gap_s=float(gap),
        available=tuple(int(v) for v in data),
        start_s=_start(document["metadata"].get("start"), where),
    )


def _start(value: Any, where: str) -> float | None:
    """`metadata.start` in Unix seconds (None when absent), or TraceError with the fix."""
    if value is None:
        return None
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return instant(value)
    except ValueError:
        raise TraceError(
            f"{where}: metadata.start is {value!r}, not a time with its zone: write it as ISO "
            '8601, e.g. "2026-11-02T05:00:00Z", or leave it out'
        ) from None


def _number(value: Any) -> bool:
    """A finite number that is not a bool (JSON's NaN, Infinity and 1e400 are not)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def coarsen(trace: Trace, tick_s: float) -> Trace:
    """The trace in ticks of `tick_s` seconds: a coarse tick has the fewest instances of the
    original ticks it overlaps (spot counts as there only if it was there all the time); a
    last coarse tick the trace does not fill is dropped."""
    if not _number(tick_s) or tick_s < trace.gap_s:
        raise TraceError(
            f"--tick {tick_s!r} is finer than trace {trace.name}'s tick of {trace.gap_s:g} s: "
            "give a number of seconds at least that long (a tick can only be coarsened)"
        )
    if tick_s == trace.gap_s:
        return trace
    count = math.floor(len(trace.available) * trace.gap_s / tick_s)
    if count < 1:
        raise TraceError(
            f"trace {trace.name} covers {trace.hours * 3600:g} s, less than one --tick of "
            f"{tick_s:g} s: give a shorter --tick"
        )
    coarse = []
    for index in range(count):
        first = math.floor(index * tick_s / trace.gap_s)
        last = math.ceil((index + 1) * tick_s / trace.gap_s)  # exclusive
        coarse.append(min(trace.available[first:last]))
    return Trace(
        name=trace.name, gap_s=float(tick_s), available=tuple(coarse), start_s=trace.start_s
    )


def load(path: str | Path) -> Trace:
    document = read_json(path, "trace", f"check the path; {FORMAT_HINT}", TraceError)
    return parse(document, str(path))


def load_all(paths: Sequence[str | Path]) -> list[Trace]:
    """Every trace of `paths`, or one TraceError naming every one that is not the format."""
    found, problems = [], []
    for path in paths:
        try:
            found.append(load(path))
        except TraceError as error:
            problems.append(str(error))
    if len(problems) > 1:  # the format said once, after them all
        each = [p.removesuffix(FORMAT_HINT).rstrip(":; ") for p in problems]
        each[-1] += f"; {FORMAT_HINT}"
        raise TraceError("; ".join(each), each)
    if problems:
        raise TraceError(problems[0])
    return found


def generate(
    *,
    hours: float,
    interruptions_per_hour: float,
    recovery_h: float,
    capacity: int,
    gap_s: float = 300.0,
    seed: int = 0,
    name: str | None = None,
) -> Trace:
    """A trace from a per-instance interruption rate (see the module's note), seeded."""
    problems = [
        f"{label} is {value!r}: use a positive number"
        for label, value in (("hours", hours), ("recovery_h", recovery_h))
        if not _number(value) or not value > 0
    ]
    if not _number(gap_s) or not MIN_GAP_S <= gap_s <= MAX_GAP_S:
        problems.append(f"gap_s is {gap_s!r}: use {MIN_GAP_S:g} to {MAX_GAP_S:g} seconds")
    if not _number(interruptions_per_hour) or interruptions_per_hour < 0:
        problems.append(f"interruptions_per_hour is {interruptions_per_hour!r}: use 0 or more")
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        problems.append(f"capacity is {capacity!r}: use 1 or more instances")
    if not problems and hours * 3600 / gap_s > MAX_GENERATED_TICKS:
        problems.append(
            f"{hours:g} h in ticks of {gap_s:g} s is over {MAX_GENERATED_TICKS:,} ticks: give "
            "fewer hours or longer ticks"
        )
    if problems:
        raise TraceError("cannot generate a trace: " + "; ".join(problems))
    rng = random.Random(seed)
    ticks = math.ceil(hours * 3600 / gap_s)
    gap_h = gap_s / 3600
    counts = [0] * ticks
    up_share = (
        1.0
        if interruptions_per_hour == 0
        else ((1 / interruptions_per_hour) / (1 / interruptions_per_hour + recovery_h))
    )
    for _ in range(capacity):
        up = rng.random() < up_share  # each slot starts in its long-run state
        t = 0.0
        while t < ticks * gap_h:
            if up:
                length = (
                    rng.expovariate(interruptions_per_hour) if interruptions_per_hour else math.inf
                )
            else:
                length = rng.expovariate(1 / recovery_h)
            if up:
                first = math.ceil(t / gap_h)
                last = ticks if math.isinf(length) else min(ticks, math.ceil((t + length) / gap_h))
                for tick in range(first, last):
                    counts[tick] += 1
            t += length
            up = not up
    label = name or (
        f"generated: {interruptions_per_hour:g}/h per instance, recovery "
        f"{recovery_h:g} h, {capacity} slots, seed {seed}"
    )
    return Trace(name=label, gap_s=gap_s, available=tuple(counts))


def generate_many(count: int, *, seed: int, **settings: Any) -> list[Trace]:
    """`count` traces of `generate(**settings)` with seeds seed, seed + 1, ..."""
    return [generate(seed=seed + index, **settings) for index in range(count)]
