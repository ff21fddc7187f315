"""A run's spend so far: every machine its groups launched, second by second, at the price of
its pool (spot price history for spot machines, the on-demand price otherwise), kept in the
events table under the run's own spend key (`catalog_schema.spend_key`), which machines
cannot write.

The interruption handler's scheduled capacity check (every 5 minutes) moves the ledger
forward: it counts the machine time in (as_of, now] and writes the new ledger only if no
other check moved it meanwhile (a conditional write on `as_of`). So a check delivered twice,
or one that arrives late (its now is not after as_of), counts nothing, and a machine that
terminated since the last check still counts up to its end: terminated machines stay in
DescribeInstances for about an hour, far longer than a check interval. A region that does not
answer (an outage; a run moves away from one) does not stop the count: the regions that answer
are counted to now, and the silent one is kept `behind` from the time it was last counted,
until a check it answers counts its machines from then (a terminated machine is listed for
about an hour: a longer silence loses the time of machines that ended in it, said by the
ledger's `behind`). EBS volumes, data transfer and requests are not counted. Each counted
check also leaves a spend point (the ledger as it left it) and each cap notice an item of its
own, for `spotrain cost report`.

Boto3 and the standard library only: it ships in the interruption handler's Lambda zip, and
`spotrain cost status` reads the same item.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Protocol

from spotrain.core import prices as price_book
from spotrain.core.capacity import ON_DEMAND, SPOT
from spotrain.core.catalog_schema import (
    CAP_NOTICE_PREFIX,
    EXPIRES_AT_KEY,
    LEDGER_SORT_KEY,
    PARTITION_KEY,
    RUN_TAG,
    SORT_KEY,
    SPEND_POINT_PREFIX,
    cap_notice_sort_key,
    cap_sort_key,
    caps_key,
    query_items,
    spend_key,
    spend_point_sort_key,
)
from spotrain.core.errors import does_not_answer

_ENDED_AT = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")
"""When a machine stopped, in its StateTransitionReason: "User initiated (2026-11-23 10:00:00
GMT)"."""


@dataclass(frozen=True)
class Machine:
    instance_id: str
    instance_type: str
    zone: str
    market: str
    """spot | on-demand"""
    launched_at: float
    ended_at: float | None
    """None: still running."""

    @property
    def region(self) -> str:
        return self.zone[:-1]

    @property
    def pool(self) -> str:
        return f"{self.instance_type}#{self.zone}#{self.market}"


@dataclass(frozen=True)
class Ledger:
    as_of: float | None = None
    """Machine time up to here is counted (epoch seconds); None: nothing counted yet."""
    spend_usd: float = 0.0
    on_demand_usd: float = 0.0
    """The same machine time at on-demand prices."""
    per_pool: dict[str, dict[str, float]] = field(default_factory=dict)
    """`<type>#<zone>#<market>` -> seconds, spend_usd, on_demand_usd."""
    unpriced_seconds: float = 0.0
    """Machine time of pools with no price (counted in per_pool, not in the dollars)."""
    cap_usd: float | None = None
    """The cap the spend was last judged against (None: the run has none)."""
    notified: tuple[int, ...] = ()
    """Percentages of that cap already announced."""
    held: bool = False
    """The spend reached the cap: the run may not start and its groups are at 0."""
    behind: dict[str, float] = field(default_factory=dict)
    """Regions that did not answer a check: the time their machines are counted up to (0:
    never counted), behind `as_of`."""

    @property
    def saved(self) -> float:
        return 1 - self.spend_usd / self.on_demand_usd if self.on_demand_usd else 0.0


class Prices(Protocol):
    def on_demand(self, instance_type: str, region: str) -> float | None: ...

    def spot(self, instance_type: str, zone: str, start: float, end: float) -> float | None: ...


def accrue(
    ledger: Ledger, machines: Iterable[Machine], prices: Prices, now: float,
    silent: Iterable[str] = (),
) -> Ledger:  # fmt: skip
    """The ledger with the machine time in (as_of, now] added (all of it on the first check;
    from the time a region was last counted for a region `behind` that answered now). The
    `silent` regions did not answer: they stay (or fall) behind."""
    start = ledger.as_of
    if start is not None and now <= start:
        return ledger  # repeated or late: this time is counted already
    behind = {region: ledger.behind.get(region, start or 0.0) for region in silent}
    per_pool = {pool: dict(figures) for pool, figures in ledger.per_pool.items()}
    spend, on_demand_total, unpriced = (
        ledger.spend_usd,
        ledger.on_demand_usd,
        ledger.unpriced_seconds,
    )
    for machine in machines:
        since = ledger.behind.get(machine.region, start)
        begin = machine.launched_at if since is None else max(machine.launched_at, since)
        end = now if machine.ended_at is None else min(machine.ended_at, now)
        if end <= begin:
            continue
        seconds = end - begin
        figures = per_pool.setdefault(
            machine.pool, {"seconds": 0.0, "spend_usd": 0.0, "on_demand_usd": 0.0}
        )
        figures["seconds"] += seconds
        on_demand_rate = prices.on_demand(machine.instance_type, machine.region)
        rate = (
            on_demand_rate
            if machine.market == ON_DEMAND
            else prices.spot(machine.instance_type, machine.zone, begin, end)
        )
        if rate is None or on_demand_rate is None:
            unpriced += seconds
            continue
        figures["spend_usd"] += rate * seconds / 3600
        figures["on_demand_usd"] += on_demand_rate * seconds / 3600
        spend += rate * seconds / 3600
        on_demand_total += on_demand_rate * seconds / 3600
    return Ledger(now, spend, on_demand_total, per_pool, unpriced, ledger.cap_usd,
                  ledger.notified, ledger.held, behind)  # fmt: skip


def machines(reservations: Iterable[dict[str, Any]], now: float) -> list[Machine]:
    """The run's machines from DescribeInstances; a stopped machine whose end is not written
    in its state reason counts to `now` (the cautious side for a cap)."""
    found = []
    for reservation in reservations:
        for instance in reservation["Instances"]:
            state = instance["State"]["Name"]
            ended = None
            if state not in ("pending", "running"):
                match = _ENDED_AT.search(instance.get("StateTransitionReason") or "")
                ended = (
                    datetime.fromisoformat(match.group(1) + "+00:00").timestamp() if match else now
                )
            launched = instance["LaunchTime"]
            found.append(
                Machine(
                    instance_id=instance["InstanceId"],
                    instance_type=instance.get("InstanceType") or "unknown",
                    zone=instance["Placement"]["AvailabilityZone"],
                    market=SPOT if instance.get("InstanceLifecycle") == SPOT else ON_DEMAND,
                    launched_at=launched.timestamp()
                    if hasattr(launched, "timestamp")
                    else launched,
                    ended_at=ended,
                )
            )
    return found


def mean_price(history: list[tuple[float, float]], start: float, end: float) -> float | None:
    """Time-weighted mean over [start, end] of prices that each hold from their timestamp
    until the next one (the first one also before it)."""
    if not history:
        return None
    ordered = sorted(history)
    current = next((p for t, p in reversed(ordered) if t <= start), ordered[0][1])
    total, since = 0.0, start
    for at, price in ordered:
        if at <= start:
            continue
        if at >= end:
            break
        total += current * (at - since)
        since, current = at, price
    total += current * (end - since)
    return total / (end - start) if end > start else current


class AwsPrices:
    """Prices from the account: the Price List's on-demand price, and each zone's spot price
    history over the check's window, each asked once per check (not once per machine)."""

    def __init__(
        self, ec2_for: Callable[[str], Any], pricing: Any, *, since: float, now: float
    ) -> None:
        self._ec2_for, self._pricing, self._since, self._now = ec2_for, pricing, since, now
        self._on_demand: dict[tuple[str, str], float | None] = {}
        self._history: dict[tuple[str, str], list[tuple[float, float]]] = {}

    def on_demand(self, instance_type: str, region: str) -> float | None:
        key = (instance_type, region)
        if key not in self._on_demand:
            figure = price_book.on_demand_price(
                self._pricing, region, instance_type, datetime.fromtimestamp(self._now, UTC)
            )
            self._on_demand[key] = figure.usd_per_hour if figure else None
        return self._on_demand[key]

    def spot(self, instance_type: str, zone: str, start: float, end: float) -> float | None:
        key = (instance_type, zone)
        if key not in self._history or start < self._since:
            self._since = min(self._since, start)
            rows = self._ec2_for(zone[:-1]).describe_spot_price_history(
                InstanceTypes=[instance_type],
                AvailabilityZone=zone,
                ProductDescriptions=[price_book.PRODUCT_DESCRIPTION],
                StartTime=datetime.fromtimestamp(self._since, UTC),
                EndTime=datetime.fromtimestamp(max(end, self._now), UTC),
            )["SpotPriceHistory"]
            self._history[key] = [(r["Timestamp"].timestamp(), float(r["SpotPrice"])) for r in rows]
        return mean_price(self._history[key], start, end)


# --- the item ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Counted:
    written: bool
    """False: already counted to now, or another check counted this time first."""
    machines: int
    ledger: Ledger
    """As it stands now."""
    previous: Ledger

    @property
    def already_counted(self) -> bool:
        """Nothing to count since the ledger's as_of (a check delivered twice, or late)."""
        return self.ledger is self.previous


def count(
    table: Any, run: str, *, regions: Iterable[str], ec2_for: Callable[[str], Any], pricing: Any,
    now: float, retention_days: int,
) -> Counted:  # fmt: skip
    """Count the run's machine time since the ledger's as_of (every machine tagged with the
    run in `regions`, terminated ones included) and write it, with a spend point: the
    handler's capacity check, and `run retire` settling a run's last minutes."""
    from botocore.exceptions import BotoCoreError, ClientError

    found, silent = [], []
    for region in regions:
        try:
            pages = ec2_for(region).get_paginator("describe_instances").paginate(
                Filters=[{"Name": f"tag:{RUN_TAG}", "Values": [run]}])  # fmt: skip
            found += [m for page in pages for m in machines(page["Reservations"], now)]
        except (BotoCoreError, ClientError) as error:
            if not does_not_answer(error):
                raise  # it answered no (a permission): the check reports it
            silent.append(region)  # an outage: the region falls behind
    previous = read(table, run)
    # The earliest machine time this count prices: from the ledger's as_of, a region's that
    # fell behind, or (never counted) a machine's launch.
    starts = [previous.as_of, *previous.behind.values()]
    since = min([s for s in starts if s] or [m.launched_at for m in found] or [now])
    prices = AwsPrices(ec2_for, pricing, since=since, now=now)
    ledger = accrue(previous, found, prices, now, silent)
    if ledger is previous:
        return Counted(False, len(found), previous, previous)
    if not write(table, run, ledger, previous):
        return Counted(False, len(found), read(table, run), previous)
    record_point(table, run, ledger, retention_days)
    return Counted(True, len(found), ledger, previous)


def _key(run: str) -> dict[str, str]:
    return {PARTITION_KEY: spend_key(run), SORT_KEY: LEDGER_SORT_KEY}


def read(table: Any, run: str) -> Ledger:
    item = table.get_item(Key=_key(run), ConsistentRead=True).get("Item")
    if not item:
        return Ledger()
    return Ledger(
        as_of=float(item["as_of"]),
        spend_usd=float(item["spend_usd"]),
        on_demand_usd=float(item["on_demand_usd"]),
        per_pool={
            pool: {name: float(value) for name, value in figures.items()}
            for pool, figures in item.get("per_pool", {}).items()
        },
        unpriced_seconds=float(item.get("unpriced_seconds", 0)),
        cap_usd=float(item["cap_usd"]) if item.get("cap_usd") is not None else None,
        notified=tuple(int(p) for p in item.get("notified", [])),
        held=bool(item.get("held", False)),
        behind={region: float(at) for region, at in item.get("behind", {}).items()},
    )


def write(table: Any, run: str, ledger: Ledger, previous: Ledger) -> bool:
    """Store `ledger` if no other check moved the run's ledger since `previous` was read;
    False if one did (its count stands; this one's time is counted by the next check)."""
    from botocore.exceptions import ClientError

    def number(value: float) -> Decimal:
        return Decimal(str(round(value, 6)))

    item = {
        **_key(run),
        "as_of": number(ledger.as_of or 0.0),
        "spend_usd": number(ledger.spend_usd),
        "on_demand_usd": number(ledger.on_demand_usd),
        "per_pool": {
            pool: {name: number(value) for name, value in figures.items()}
            for pool, figures in ledger.per_pool.items()
        },
        "unpriced_seconds": number(ledger.unpriced_seconds),
        "cap_usd": None if ledger.cap_usd is None else number(ledger.cap_usd),
        "notified": list(ledger.notified),
        "held": ledger.held,
        "behind": {region: number(at) for region, at in ledger.behind.items()},
    }
    condition: dict[str, Any] = (
        {"ConditionExpression": "attribute_not_exists(#p)",
         "ExpressionAttributeNames": {"#p": PARTITION_KEY}}
        if previous.as_of is None
        else {"ConditionExpression": "as_of = :seen",
              "ExpressionAttributeValues": {":seen": number(previous.as_of)}}
    )  # fmt: skip
    try:
        table.put_item(Item=item, **condition)
    except ClientError as error:
        if error.response["Error"]["Code"] == "ConditionalCheckFailedException":
            return False
        raise
    return True


# --- its history (the report's figure) --------------------------------------------------------
@dataclass(frozen=True)
class SpendPoint:
    at: float
    spend_usd: float
    on_demand_usd: float


@dataclass(frozen=True)
class CapNotice:
    at: float
    percent: int
    spend_usd: float
    cap_usd: float


def _expiry(now: float, retention_days: int) -> int:
    return int(now) + retention_days * 86400


def record_point(table: Any, run: str, ledger: Ledger, retention_days: int) -> None:
    """The ledger as this check left it; kept as long as the run's interruption events."""
    assert ledger.as_of is not None
    table.put_item(Item={
        PARTITION_KEY: spend_key(run), SORT_KEY: spend_point_sort_key(ledger.as_of),
        "spend_usd": Decimal(str(round(ledger.spend_usd, 6))),
        "on_demand_usd": Decimal(str(round(ledger.on_demand_usd, 6))),
        EXPIRES_AT_KEY: _expiry(ledger.as_of, retention_days),
    })  # fmt: skip


def record_notice(table: Any, run: str, notice: CapNotice, retention_days: int) -> None:
    table.put_item(Item={
        PARTITION_KEY: spend_key(run), SORT_KEY: cap_notice_sort_key(notice.at, notice.percent),
        "percent": notice.percent, "spend_usd": Decimal(str(round(notice.spend_usd, 6))),
        "cap_usd": Decimal(str(notice.cap_usd)), EXPIRES_AT_KEY: _expiry(notice.at, retention_days),
    })  # fmt: skip


def read_history(table: Any, run: str) -> tuple[list[SpendPoint], list[CapNotice]]:
    """The ledger after each check and the cap notices sent, in time order."""
    points = [
        SpendPoint(int(i[SORT_KEY].removeprefix(SPEND_POINT_PREFIX)) / 1000,
                   float(i["spend_usd"]), float(i["on_demand_usd"]))
        for i in query_items(table, spend_key(run), SPEND_POINT_PREFIX)
    ]  # fmt: skip
    notices = [
        CapNotice(int(i[SORT_KEY].removeprefix(CAP_NOTICE_PREFIX).split("#")[0]) / 1000,
                  int(i["percent"]), float(i["spend_usd"]), float(i["cap_usd"]))
        for i in query_items(table, spend_key(run), CAP_NOTICE_PREFIX)
    ]  # fmt: skip
    return points, notices


def month_to_date(table: Any, run: str, now: float, ledger: Ledger | None = None) -> float:
    """What the run spent in the calendar month (UTC) of `now`: its ledger (read unless given)
    less the last spend point before the month began (0 if none: it started this month, or its
    points expired)."""
    month = datetime.fromtimestamp(now, UTC).replace(day=1, hour=0, minute=0, second=0,
                                                     microsecond=0).timestamp()  # fmt: skip
    spent = (ledger or read(table, run)).spend_usd
    # The one point before the month (a check's query: never the whole history, which grows
    # by a point every check for 90 days).
    last = table.query(
        KeyConditionExpression="#pk = :pk AND #sk BETWEEN :first AND :month",
        ExpressionAttributeNames={"#pk": PARTITION_KEY, "#sk": SORT_KEY},
        ExpressionAttributeValues={":pk": spend_key(run), ":first": SPEND_POINT_PREFIX,
                                   ":month": spend_point_sort_key(month - 0.001)},
        ScanIndexForward=False, Limit=1,
    )["Items"]  # fmt: skip
    return max(0.0, spent - (float(last[0]["spend_usd"]) if last else 0.0))


# --- the cap ----------------------------------------------------------------------------------
NOTICE_PERCENTAGES = (50, 80, 100)


@dataclass(frozen=True)
class CapCheck:
    ledger: Ledger
    """With the cap's state brought up to date."""
    crossed: tuple[int, ...]
    """Percentages of the cap reached since the last notice (to announce now)."""


def judge(ledger: Ledger, cap_usd: float | None) -> CapCheck:
    """Where the spend stands against the cap: the percentages newly reached, and whether the
    run is held. A new cap (raised) starts its notices afresh."""
    if cap_usd is None:
        return CapCheck(replace(ledger, cap_usd=None, notified=(), held=False), ())
    notified = ledger.notified if ledger.cap_usd == cap_usd else ()
    reached = tuple(p for p in NOTICE_PERCENTAGES if ledger.spend_usd >= cap_usd * p / 100)
    crossed = tuple(p for p in reached if p not in notified)
    judged = replace(ledger, cap_usd=cap_usd, notified=tuple(sorted({*notified, *reached})),
                     held=ledger.spend_usd >= cap_usd)  # fmt: skip
    return CapCheck(judged, crossed)


def save_cap_state(table: Any, run: str, ledger: Ledger) -> None:
    """The cap's state on the ledger item (only the handler writes it)."""
    table.update_item(
        Key=_key(run),
        UpdateExpression="SET cap_usd = :cap, notified = :notified, held = :held",
        ExpressionAttributeValues={
            ":cap": None if ledger.cap_usd is None else Decimal(str(ledger.cap_usd)),
            ":notified": list(ledger.notified), ":held": ledger.held,
        },
    )  # fmt: skip


def current_cap(table: Any, run: str, configured: float | None) -> float | None:
    """The run's cap: the latest raise an operator wrote, else the configured one."""
    latest = table.query(
        KeyConditionExpression="#pk = :pk",
        ExpressionAttributeNames={"#pk": PARTITION_KEY},
        ExpressionAttributeValues={":pk": caps_key(run)},
        ScanIndexForward=False, Limit=1, ConsistentRead=True,
    )["Items"]  # fmt: skip
    return float(latest[0]["max_spend_usd"]) if latest else configured


def raise_cap(table: Any, run: str, max_spend_usd: float, *, raised_by: str, now: float) -> None:
    """An operator's new cap (machines cannot write it); the next capacity check releases a run
    held at its old cap."""
    table.put_item(Item={
        PARTITION_KEY: caps_key(run), SORT_KEY: cap_sort_key(now),
        "max_spend_usd": Decimal(str(max_spend_usd)), "raised_by": raised_by, "at": int(now),
    })  # fmt: skip
