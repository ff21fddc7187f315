"""The price book: on-demand and spot prices (USD per instance-hour; spot per availability
zone) and the Spot Instance Advisor's interruption-frequency band, per instance type and
region, each figure with its source and the date it was taken.

A dated snapshot is checked in (`price_book.json` beside this module, built from AWS's
published prices by scripts/price_book_from_catalog.py); `spotrain prices refresh` rebuilds it
in an account from EC2 `DescribeSpotPriceHistory` (per zone) and the Price List API
(`GetProducts`, on-demand), keeping the Advisor bands it had; `spotrain prices advisor` fills
the bands from the Advisor's public data, without credentials. Estimates flag prices older than
`stale_after_days`.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spotrain.core.errors import CostInputError, json_kind, read_json

SNAPSHOT = Path(__file__).with_name("price_book.json")
DEFAULT_STALE_AFTER_DAYS = 30
PRODUCT_DESCRIPTION = "Linux/UNIX"
PRICE_LIST_REGION = "us-east-1"
"""The Price List API answers here for every region's prices."""
ADVISOR_BANDS = {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.25}
"""Spot Instance Advisor's frequency-of-interruption bands -> the monthly share read from each."""
SPOT_SOURCE = "EC2 DescribeSpotPriceHistory, Linux/UNIX, latest price per zone"
ON_DEMAND_SOURCE = "AWS Price List API GetProducts: AmazonEC2, Linux, shared tenancy, On-Demand"
PRICE_LIST_FILTERS = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
    "licenseModel": "No License required",
}
"""Price List attributes that pick the one on-demand Linux price of an instance type."""


@dataclass(frozen=True)
class Figure:
    region: str
    instance_type: str
    source: str
    taken_at: str
    """ISO date (YYYY-MM-DD) the figure was read from its source."""
    usd_per_hour: float | None = None
    availability_zone: str | None = None
    """Spot prices only: a zone name (`us-east-1a`, as refresh writes it) or its AZ ID
    (`use1-az6`, the same physical zone in every account)."""
    band: str | None = None
    """Advisor figures only: the frequency-of-interruption band."""


@dataclass(frozen=True)
class PoolPrices:
    """What the book knows of one instance type in one region."""

    instance_type: str
    region: str
    on_demand: Figure
    spot: tuple[Figure, ...]
    advisor: Figure | None

    @property
    def spot_price(self) -> float:
        """Mean over the zones: a capacity-optimized fleet does not chase the cheapest one."""
        return sum(f.usd_per_hour or 0.0 for f in self.spot) / len(self.spot)

    def oldest(self) -> datetime.date:
        return min(datetime.date.fromisoformat(f.taken_at) for f in (self.on_demand, *self.spot))


@dataclass(frozen=True)
class PriceBook:
    on_demand: tuple[Figure, ...] = ()
    spot: tuple[Figure, ...] = ()
    advisor: tuple[Figure, ...] = ()
    note: str = ""
    path: str = field(default="", compare=False)

    def pool(
        self, instance_type: str, region: str,
        otherwise: str = "give --on-demand-price and --spot-price",
    ) -> PoolPrices:  # fmt: skip
        """The prices of one pool, or CostInputError naming what is missing and the fix (the
        refresh, or `otherwise`: what the command asking takes instead)."""
        on_demand = [
            f for f in self.on_demand if (f.instance_type, f.region) == (instance_type, region)
        ]
        spot = tuple(f for f in self.spot if (f.instance_type, f.region) == (instance_type, region))
        missing = [kind for kind, found in (("on-demand", on_demand), ("spot", spot)) if not found]
        if missing:
            raise CostInputError(
                f"the price book ({self.path or 'given'}) has no {' or '.join(missing)} price for "
                f"{instance_type} in {region}: run `spotrain prices refresh --instance-type "
                f"{instance_type} --region {region}` with credentials for an account, or "
                f"{otherwise}"
            )
        advisor = self.advisor_for(instance_type, region)
        return PoolPrices(instance_type, region, on_demand[0], spot, advisor)

    def advisor_for(self, instance_type: str, region: str) -> Figure | None:
        return next(
            (f for f in self.advisor if (f.instance_type, f.region) == (instance_type, region)),
            None,
        )

    def to_json(self) -> dict[str, Any]:
        def rows(figures: Iterable[Figure]) -> list[dict[str, Any]]:
            return [{k: v for k, v in asdict(f).items() if v is not None} for f in figures]

        return {
            "format": 1,
            "note": self.note,
            "on_demand": rows(self.on_demand),
            "spot": rows(self.spot),
            "advisor": rows(self.advisor),
        }


def staleness(prices: PoolPrices, today: datetime.date, stale_after_days: int) -> str | None:
    """A warning when the pool's oldest figure is older than `stale_after_days`."""
    age = (today - prices.oldest()).days
    if age <= stale_after_days:
        return None
    return (
        f"prices for {prices.instance_type} in {prices.region} are {age} days old (taken "
        f"{prices.oldest()}): run `spotrain prices refresh` for current ones"
    )


BOOK_FIX = "rebuild it with `spotrain prices refresh`, or see the price book format in docs/cost.md"


def load(path: str | Path = SNAPSHOT) -> PriceBook:
    """A price book file, or CostInputError naming the first figures that are not prices."""
    document = read_json(path, "the price book", f"check the path; {BOOK_FIX}", CostInputError)
    if not isinstance(document, dict):
        raise CostInputError(
            f"the price book {path} holds {json_kind(document)}, not an object: {BOOK_FIX}"
        )
    problems: list[str] = []
    kinds: dict[str, tuple[Figure, ...]] = {}
    for kind in ("on_demand", "spot", "advisor"):
        rows = document.get(kind, [])
        if not isinstance(rows, list):
            problems.append(f"{kind} is {json_kind(rows)}, not a list of figures")
            continue
        kinds[kind] = tuple(
            figure for index, row in enumerate(rows)
            if (figure := _figure(row, f"{kind}[{index}]", kind, problems)) is not None
        )  # fmt: skip
    note = document.get("note", "")
    if not isinstance(note, str):
        problems.append(f"note is {json_kind(note)}, not text")
    if problems:
        shown = "; ".join(problems[:3]) + (
            f"; and {len(problems) - 3} more" if problems[3:] else ""
        )
        raise CostInputError(f"the price book {path} is not in the price book format: {shown}; "
                             f"{BOOK_FIX}")  # fmt: skip
    return PriceBook(kinds["on_demand"], kinds["spot"], kinds["advisor"], note, str(path))


_TEXT_FIELDS = {"region", "instance_type", "source", "taken_at", "availability_zone", "band"}
_REQUIRED = {
    "on_demand": ("region", "instance_type", "source", "taken_at", "usd_per_hour"),
    "spot": ("region", "instance_type", "source", "taken_at", "usd_per_hour",
             "availability_zone"),
    "advisor": ("region", "instance_type", "source", "taken_at", "band"),
}  # fmt: skip


def _figure(row: Any, where: str, kind: str, problems: list[str]) -> Figure | None:
    """One figure of the book, or None with its problems added."""
    if not isinstance(row, dict):
        problems.append(f"{where} is {json_kind(row)}, not an object")
        return None
    found = []
    unknown = sorted(set(row) - _TEXT_FIELDS - {"usd_per_hour"})
    if unknown:
        found.append(f"{where} has unknown field(s) {', '.join(unknown)}")
    found += [f"{where} lacks {name}" for name in _REQUIRED[kind] if name not in row]
    for name in sorted(_TEXT_FIELDS & set(row)):
        if not isinstance(row[name], str) or not row[name]:
            found.append(f"{where}.{name} is {row[name]!r}: give text")
    if isinstance(row.get("band"), str) and row["band"] not in ADVISOR_BANDS:
        found.append(f"{where}.band is {row['band']!r}: give one of {', '.join(ADVISOR_BANDS)}")
    price = row.get("usd_per_hour")
    if "usd_per_hour" in row and not (
        not isinstance(price, bool) and isinstance(price, int | float)
        and math.isfinite(price) and price > 0
    ):  # fmt: skip
        found.append(f"{where}.usd_per_hour is {price!r}: give USD per hour, a positive number")
    if isinstance(row.get("taken_at"), str):
        try:
            datetime.date.fromisoformat(row["taken_at"])
        except ValueError:
            found.append(f"{where}.taken_at is {row['taken_at']!r}: give a date, YYYY-MM-DD")
    if found:
        problems.extend(found)
        return None
    return Figure(**row)


def write(book: PriceBook, path: str | Path) -> None:
    path = Path(path)
    staging = path.with_name(path.name + ".partial")
    try:
        staging.write_text(json.dumps(book.to_json(), indent=1) + "\n")
        staging.replace(path)
    except OSError as error:
        raise CostInputError(
            f"the price book {path} cannot be written ({error.strerror or error}): give "
            "--price-book a file in a folder you may write"
        ) from None


# --- refresh: from the APIs -------------------------------------------------------------------
def spot_prices(
    ec2: Any, region: str, instance_types: Sequence[str], now: datetime.datetime
) -> list[Figure]:
    """The latest spot price of each type in each zone of the region."""
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    pages = ec2.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=list(instance_types),
        ProductDescriptions=[PRODUCT_DESCRIPTION],
        StartTime=now,
        EndTime=now,
    )
    for page in pages:
        for row in page["SpotPriceHistory"]:
            key = (row["InstanceType"], row["AvailabilityZone"])
            if key not in latest or row["Timestamp"] > latest[key]["Timestamp"]:
                latest[key] = row
    return [
        Figure(
            region=region,
            instance_type=kind,
            availability_zone=zone,
            usd_per_hour=float(row["SpotPrice"]),
            source=f"{SPOT_SOURCE} ({region})",
            taken_at=now.date().isoformat(),
        )
        for (kind, zone), row in sorted(latest.items())
    ]


def on_demand_price(
    pricing: Any, region: str, instance_type: str, now: datetime.datetime
) -> Figure | None:
    filters = {"instanceType": instance_type, "regionCode": region, **PRICE_LIST_FILTERS}
    products = pricing.get_products(
        ServiceCode="AmazonEC2",
        Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
    )["PriceList"]
    for product in products:
        document = json.loads(product) if isinstance(product, str) else product
        for term in document.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = float(dimension.get("pricePerUnit", {}).get("USD", 0))
                if usd > 0:
                    return Figure(
                        region=region,
                        instance_type=instance_type,
                        usd_per_hour=usd,
                        source=ON_DEMAND_SOURCE,
                        taken_at=now.date().isoformat(),
                    )
    return None


def refresh(
    previous: PriceBook,
    *,
    instance_types: Sequence[str],
    regions: Sequence[str],
    ec2_for: Callable[[str], Any],
    pricing: Any,
    now: datetime.datetime,
) -> tuple[PriceBook, list[str]]:
    """A new book with current prices for every type in every region (figures of other pools
    are kept), and what could not be found."""
    asked = {(t, r) for t in instance_types for r in regions}
    on_demand = [f for f in previous.on_demand if (f.instance_type, f.region) not in asked]
    spot = [f for f in previous.spot if (f.instance_type, f.region) not in asked]
    missing = []
    for region in regions:
        found = spot_prices(ec2_for(region), region, instance_types, now)
        spot += found
        for instance_type in instance_types:
            if not any(f.instance_type == instance_type for f in found):
                missing.append(f"no spot price for {instance_type} in {region}")
            figure = on_demand_price(pricing, region, instance_type, now)
            if figure is None:
                missing.append(f"no on-demand price for {instance_type} in {region}")
            else:
                on_demand.append(figure)
    order = lambda f: (f.region, f.instance_type, f.availability_zone or "")  # noqa: E731
    book = PriceBook(
        tuple(sorted(on_demand, key=order)),
        tuple(sorted(spot, key=order)),
        previous.advisor,
        previous.note,
        previous.path,
    )
    return book, missing


ADVISOR_DATA_URL = "https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json"
"""The data AWS's Spot Instance Advisor page shows, public and read without credentials. It is
not a documented API: `ranges` lists the interruption-frequency bands (`index`, `label`) and
`spot_advisor` maps region -> operating system -> instance type -> `r` (a band's index) and
`s` (savings over on-demand, %). A file of another shape is refused with what was expected."""
ADVISOR_SOURCE = "Spot Instance Advisor data (spot-advisor-data.json), Linux"


def advisor_bands(
    data: Any, instance_types: Sequence[str], regions: Sequence[str], taken_at: str
) -> tuple[list[Figure], list[str]]:
    """Each type's interruption-frequency band in each region, read from the Advisor's data
    (`ADVISOR_DATA_URL`); and the pools it has no band for."""
    try:
        labels = {int(r["index"]): str(r["label"]) for r in data["ranges"]}
        by_region = dict(data["spot_advisor"])
    except (KeyError, TypeError, ValueError):
        raise CostInputError(
            "the Spot Instance Advisor data has no `ranges` (index, label) and `spot_advisor` "
            f"(region -> Linux -> type -> r): give the file {ADVISOR_DATA_URL} serves"
        ) from None
    unknown = sorted(set(labels.values()) - set(ADVISOR_BANDS))
    if unknown:
        raise CostInputError(
            f"the Spot Instance Advisor data names band(s) {', '.join(unknown)}, which spotrain "
            f"does not read (it knows {', '.join(ADVISOR_BANDS)}): a newer spotrain may"
        )
    figures, missing = [], []
    for region in regions:
        linux = (by_region.get(region) or {}).get("Linux") or {}
        for instance_type in instance_types:
            entry = linux.get(instance_type)
            band = labels.get(entry.get("r")) if isinstance(entry, dict) else None
            if band is None:
                missing.append(f"no Advisor band for {instance_type} in {region}")
                continue
            figures.append(Figure(region, instance_type, ADVISOR_SOURCE, taken_at, band=band))
    return figures, missing


def with_advisor(book: PriceBook, figures: Sequence[Figure]) -> PriceBook:
    """`book` with these Advisor figures in place of its own for the same pools."""
    replaced = {(f.instance_type, f.region) for f in figures}
    kept = [f for f in book.advisor if (f.instance_type, f.region) not in replaced]
    ordered = sorted([*kept, *figures], key=lambda f: (f.region, f.instance_type))
    return PriceBook(book.on_demand, book.spot, tuple(ordered), book.note, book.path)
