"""A run's deadline plan: the Markov policy's solved programme (`spotrain.cost.markov_policy`)
as the interruption handler looks it up at each scheduled check, and the cost simulator
replays it. One decision function, `decide`, serves both.

The plan holds, for every state of the run (ticks left to the deadline, ticks of work left, the
regions with spot now, where the run is and on what, the changeover it still pays), the action
the programme chose: idle, go on, on-demand here, or spot in a region. Solving it needs numpy,
which the handler's Lambda does not carry, so it is solved where numpy is (`spotrain run
deadline-plan`, which `run submit` calls for a run with a deadline) and stored in the events
table under a key of its own that the run's machines cannot reach: a header item (what the plan
assumed: each region's mean spell and outage of spot and the hour its spells end most, the
gang's prices, the tick) and the plan
in parts, each a run of ticks-left slices compressed on their own (the actions change little
between neighbouring states: about 1 MB for three regions over 72 h at 5-minute ticks, 215 MB
raw). A check reads the header and the one part its tick is in, and decompresses one slice (at
most a few hundred kilobytes). A plan replaced while a check reads it is new parts under a new
id, then the header, then the old parts deleted: a check sees the old plan or the new one,
whole, or, if its part went in between, no plan (outage fill decides that check; the handler
logs it).

A run with no plan (none solved, or its regions' history unknown) is decided by outage fill
(`spotrain.core.outage_fill`), as before.

Standard library only: it ships in the interruption handler's Lambda zip.
"""

from __future__ import annotations

import bisect
import json
import math
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from spotrain.core.catalog_schema import (
    DEADLINE_PLAN_HEADER_SORT_KEY,
    DEADLINE_PLAN_PART_PREFIX,
    PARTITION_KEY,
    SORT_KEY,
    deadline_plan_key,
    deadline_plan_part_prefix,
    deadline_plan_part_sort_key,
    query_items,
)
from spotrain.core.deadline_policy import (
    IDLE,
    ON_DEMAND,
    SPOT,
    Choice,
    Progress,
    RunDeadline,
    as_seen,
    safety_net,
)
from spotrain.core.errors import SpotrainError
from spotrain.core.outage_fill import Placement, SpotRecord

# Actions, by their value in a plan's slices.
IDLE_THERE, GO_ON, ON_DEMAND_HERE, SPOT_IN = 0, 1, 2, 3
"""`SPOT_IN + r`: spot in region r."""

MOVED_RATIO = 1.5
"""A region's mean spell or outage has moved from a plan's when it is more than this factor
away: the simulator's policy then solves again (`markov_policy`); the handler, which cannot,
says so in its reasons (`moved_note`)."""
SEEN_ENOUGH_H = 24.0
"""The hours of a run's checks of a region before its means count as evidence against a plan's
(and, for `spotrain run deadline-plan --spot-seen-by`, plan another)."""

PART_BYTES = 256 * 1024
"""A part's compressed slices at most (a DynamoDB item holds 400 KB)."""


@dataclass(frozen=True)
class Header:
    """What a plan was solved for."""

    regions: tuple[str, ...]
    """The run's regions, home first (the plan's region indices)."""
    means: tuple[tuple[float, float], ...]
    """Per region, the mean spell and the mean outage of spot the plan assumed (hours)."""
    spot_per_hour: float
    on_demand_per_hour: float
    """What an hour of the run's gang costs on each market (USD), at home."""
    move_usd: float
    tick_h: float
    ticks: int
    """The most ticks left it plans for (the deadline's)."""
    work: int
    """The most ticks of work left it plans for."""
    changeover: int
    """A start's changeover, in ticks."""
    source: str = ""
    """Where the means came from, for the reasons."""
    plan_id: str = ""
    """Names its parts; a new plan gets a new one."""
    deadline: str = ""
    """The run's deadline it was solved for (`solved_for`): a run whose deadline changed since
    is not decided by it."""
    parts: tuple[int, ...] = ()
    """The first tick of each stored part, in order."""
    regional_prices: tuple[tuple[float, float], ...] = ()
    """Per region, the spot and on-demand price an hour it was solved with (empty: every region
    at home's, as plans stored before regions' prices were told apart)."""
    daily: tuple[tuple[float, float], ...] = ()
    """Per region, how much more often than on average its spells end at their peak hour, and
    that hour (UTC), as the plan assumed (empty: alike at every hour)."""

    @property
    def states(self) -> int:
        return 1 << len(self.regions)

    @property
    def modes(self) -> int:
        return 3 * len(self.regions)

    def mode_index(self, region: int, mode: str) -> int:
        """Modes, by index: idle in region r is r, on-demand R + r, spot 2R + r."""
        return {IDLE: 0, ON_DEMAND: 1, SPOT: 2}[mode] * len(self.regions) + region

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Header:
        d = json.loads(text)
        regional = tuple(tuple(p) for p in d.get("regional_prices", ()))  # none before
        return cls(**{**d, "regions": tuple(d["regions"]), "parts": tuple(d["parts"]),
                      "means": tuple(tuple(m) for m in d["means"]),
                      "regional_prices": regional,
                      "daily": tuple(tuple(s) for s in d.get("daily", ()))})  # fmt: skip


class Slices(Protocol):
    def at(self, left: int) -> tuple[Sequence[int], Sequence[int]]:
        """The plan's slice at `left` ticks left: its actions, indexed [work left, spot
        bits, mode, changeover left] flat, and the region to be idle in for a run that has
        not started, indexed [work left, spot bits] flat."""
        ...


def solved_for(deadline: RunDeadline) -> str:
    """A run's deadline as a plan records it: its start, its end and its changeover."""
    return (f"{deadline.started_at} to {deadline.finish_by}, changeovers of "
            f"{deadline.changeover_minutes:g} minutes")  # fmt: skip


def moved(before: tuple[float, float], now: tuple[float, float]) -> bool:
    """Whether a region's (mean spell, mean outage) has moved past `MOVED_RATIO`."""
    return any(max(a / b, b / a) > MOVED_RATIO for a, b in zip(now, before, strict=True))


def moved_note(header: Header, records: Sequence[SpotRecord], environment: str, run: str) -> str:
    """'' or, where the run's own checks (a day of them at least) saw a region's means move
    away from the plan's, what they saw and how to plan with it."""
    seen = [
        f"{region}: spells of {r.spell_h():.1f} h, outages of {r.outage_h():.1f} h over "
        f"{r.observed_s / 3600:.0f} h"
        for region, means, r in zip(header.regions, header.means, records, strict=False)
        if r.observed_s >= SEEN_ENOUGH_H * 3600 and moved(means, (r.spell_h(), r.outage_h()))
    ]
    if not seen:
        return ""
    return (f"; this run's checks saw another market than the plan's ({'; '.join(seen)}): "
            f"`spotrain run deadline-plan {environment} {run} --spot-seen-by {run}` plans with "
            "it")  # fmt: skip


def in_ticks(progress: Progress, tick_h: float) -> tuple[int, int]:
    """The whole ticks left to the deadline (down) and of work left (up)."""
    left = math.floor((progress.deadline_h - progress.elapsed_h) / tick_h + 1e-9)
    work = math.ceil((progress.work_h - progress.done_h) / tick_h - 1e-9)
    return max(0, left), max(0, work)


def decide(header: Header, slices: Slices, progress: Progress, *, region: int | None,
           current: str, spot_available: Sequence[bool]) -> Placement:  # fmt: skip
    """Where and on what the run should be now; `region` None: it has not started. Only the
    safety net's 1d guard goes before the plan (the plan prices the deadline itself)."""
    here = region or 0
    current = as_seen(current, spot_available[here])
    forced = safety_net(progress, current, spot_available[here], net=False)
    if forced is not None:
        return Placement(here, forced.mode, forced.reason)
    left, work = in_ticks(progress, header.tick_h)
    left, work = min(left, header.ticks), min(work, header.work)
    spot = sum(1 << r for r, there in enumerate(spot_available) if there)
    if work == 0:
        return Placement(here, current, "the work is done")
    actions, first_region = slices.at(left)
    if region is None and current == IDLE:  # not started: every region is as near
        here = first_region[work * header.states + spot]
    changeover = min(header.changeover,
                     math.ceil(progress.changeover_left_h / header.tick_h - 1e-9))  # fmt: skip
    index = (work * header.states + spot) * header.modes + header.mode_index(here, current)
    action = actions[index * (header.changeover + 1) + changeover]
    return _placement(header, action, here, current, left, work, spot)


def _placement(header: Header, action: int, here: int, current: str, left: int, work: int,
               spot: int) -> Placement:  # fmt: skip
    name = header.regions[here]
    daily = header.daily or ((0.0, 0.0),) * len(header.regions)
    market = ", ".join(
        f"{r} {'has' if spot >> i & 1 else 'lacks'} spot (spells of {m[0]:.1f} h"
        + (f", ending most near {round(peak) % 24:02d}:00 UTC" if swing else "")
        + f", outages of {m[1]:.1f} h)"
        for i, (r, m, (swing, peak)) in enumerate(
            zip(header.regions, header.means, daily, strict=True))
    )  # fmt: skip
    whence = f" (means {header.source})" if header.source else ""
    facts = (f"plan: {work * header.tick_h:.1f} h of work in {left * header.tick_h:.1f} h; "
             f"{market}{whence}")  # fmt: skip
    if action == IDLE_THERE:
        return Placement(here, IDLE, f"{facts}: wait in {name} (spot is expected soon enough)")
    if action == GO_ON:
        return Placement(here, current, f"{facts}: go on with {current} in {name}")
    if action == ON_DEMAND_HERE:
        return Placement(here, ON_DEMAND, f"{facts}: on-demand in {name}")
    to = action - SPOT_IN
    verb = "spot" if to == here else "move to spot"
    return Placement(to, SPOT, f"{facts}: {verb} in {header.regions[to]}")


# --- stored in the events table ------------------------------------------------------------
def _key(run: str, sort_key: str) -> dict[str, str]:
    return {PARTITION_KEY: deadline_plan_key(run), SORT_KEY: sort_key}


ORPHANED_AFTER_S = 3600.0
"""Parts of a plan whose store never wrote its header (the command was stopped) are removed by
the next store once this old: a store still writing its parts is never as slow."""


class PlanReplaced(SpotrainError):
    """Another plan was stored for the run while this one was: that one is the run's."""


def store(
    table: Any, run: str, header: Header, slices: Iterable[tuple[bytes, bytes]], *,
    now: float | None = None,
) -> Header:  # fmt: skip
    """Store the plan whose slices, by ticks left from 0, are `slices` (each its actions and
    its first regions, a byte each) as the run's: its parts first, then its header, written
    only if the plan it replaces is still the run's (one writer: of two stores at once, one
    wins; the other removes its parts and raises PlanReplaced), then the replaced plan's parts
    go. The header stored (with its parts). `now`: epoch seconds (None: the clock's)."""
    from botocore.exceptions import ClientError  # the CLI's: the handler only reads plans

    now = time.time() if now is None else now
    replaced = read_header(table, run, consistent=True)
    parts: list[dict[str, Any]] = []
    size = PART_BYTES
    for left, (actions, first) in enumerate(slices):
        packed = (zlib.compress(bytes(actions), 6), zlib.compress(bytes(first), 6))
        if size + len(packed[0]) + len(packed[1]) > PART_BYTES:
            part_key = _key(run, deadline_plan_part_sort_key(header.plan_id, left))
            parts.append({**part_key, "first": left, "actions": [], "firsts": [],
                          "written_at": int(now)})  # fmt: skip
            size = 0
        parts[-1]["actions"].append(packed[0])
        parts[-1]["firsts"].append(packed[1])
        size += len(packed[0]) + len(packed[1])
    stored = replace(header, parts=tuple(p["first"] for p in parts))
    for part in parts:
        table.put_item(Item=part)
    still = "attribute_not_exists(plan_id)" if replaced is None else "plan_id = :replaced"
    try:
        table.put_item(
            Item={**_key(run, DEADLINE_PLAN_HEADER_SORT_KEY), "header": stored.to_json(),
                  "plan_id": stored.plan_id},
            ConditionExpression=still,
            **({"ExpressionAttributeValues": {":replaced": replaced.plan_id}}
               if replaced is not None else {}),
        )  # fmt: skip
    except ClientError as error:
        if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise
        own = deadline_plan_part_prefix(stored.plan_id)
        _delete_parts(table, run, lambda key, _: key.startswith(own))
        now_there = read_header(table, run, consistent=True)
        raise PlanReplaced(
            f"another deadline plan was stored for run {run} while this one was (plan "
            f"{now_there.plan_id if now_there else 'gone'}): it is the run's now; run `spotrain "
            "run deadline-plan` again to replace it"
        ) from error

    def gone(key: str, written_at: float) -> bool:  # the replaced plan's; a stopped store's
        if key.startswith(deadline_plan_part_prefix(stored.plan_id)):
            return False
        if replaced is not None and key.startswith(deadline_plan_part_prefix(replaced.plan_id)):
            return True
        return now - written_at > ORPHANED_AFTER_S

    _delete_parts(table, run, gone)
    return stored


def _delete_parts(table: Any, run: str, which: Callable[[str, float], bool]) -> None:
    """Delete the run's stored parts for which `which(sort key, written_at)` holds."""
    items = query_items(table, deadline_plan_key(run), DEADLINE_PLAN_PART_PREFIX,
                        ProjectionExpression="#sk, written_at")  # fmt: skip
    with table.batch_writer() as batch:
        for item in items:
            if which(str(item[SORT_KEY]), float(item.get("written_at", 0))):
                batch.delete_item(Key=_key(run, str(item[SORT_KEY])))


def read_header(table: Any, run: str, *, consistent: bool = False) -> Header | None:
    """The run's plan's header (None: no plan); `consistent`: as of every write before (a
    store compares it with what it replaces), not as a check may see it."""
    item = table.get_item(Key=_key(run, DEADLINE_PLAN_HEADER_SORT_KEY),
                          ConsistentRead=consistent).get("Item")  # fmt: skip
    return None if item is None else Header.from_json(str(item["header"]))


class StoredPart:
    """One part of a stored plan, its slices decompressed when asked for (the last kept)."""

    def __init__(self, item: dict[str, Any]) -> None:
        self.first = int(item["first"])
        self.actions, self.firsts = list(item["actions"]), list(item["firsts"])
        self._slice: tuple[int, tuple[bytes, bytes]] | None = None

    def at(self, left: int) -> tuple[Sequence[int], Sequence[int]]:
        if self._slice is None or self._slice[0] != left:
            i = left - self.first
            if not 0 <= i < len(self.actions):
                raise KeyError(f"tick {left} is not in the part from tick {self.first}")
            self._slice = left, (zlib.decompress(_bytes(self.actions[i])),
                                 zlib.decompress(_bytes(self.firsts[i])))  # fmt: skip
        return self._slice[1]


def _bytes(value: Any) -> bytes:
    return bytes(getattr(value, "value", value))  # boto3 reads Binary values as Binary


def part_holding(header: Header, progress: Progress) -> int:
    """The first tick of the stored part holding the tick `progress` is at."""
    left = min(in_ticks(progress, header.tick_h)[0], header.ticks)
    return header.parts[max(0, bisect.bisect_right(header.parts, left) - 1)]


def read_part(table: Any, run: str, header: Header, first: int) -> StoredPart | None:
    """The stored part of the run's plan from tick `first` (None: the plan was replaced
    since its header was read)."""
    key = _key(run, deadline_plan_part_sort_key(header.plan_id, first))
    item = table.get_item(Key=key).get("Item")
    return None if item is None else StoredPart(item)


@dataclass(frozen=True)
class AtCheck:
    """A run's stored plan as one look at its market sees it: the region the run is in and
    spot in each of its regions (this region's is set by `choose`, as its groups find it)."""

    header: Header
    slices: Slices
    region: int = 0
    spot_available: tuple[bool, ...] = ()
    note: str = ""
    """Said after every reason (`moved_note`)."""

    def choose(self, progress: Progress, *, current: str, spot_here: bool) -> Choice:
        """What the run should be on in its region now. A move the plan would make is not
        made here (the check of the run's region makes it, `runtime/deadline.for_spot`): the
        run waits for it."""
        available = list(self.spot_available or [False] * len(self.header.regions))
        available[self.region] = spot_here
        placed = decide(self.header, self.slices, progress, region=self.region,
                        current=current, spot_available=available)  # fmt: skip
        if placed.region != self.region:
            return Choice(IDLE, f"{placed.reason}; the move is its region's check's to make"
                          f"{self.note}")  # fmt: skip
        return Choice(placed.mode, placed.reason + self.note)
