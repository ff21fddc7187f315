"""Build spotrain's checked-in price book from SkyPilot's public AWS catalog (`vms.csv`).

    .venv/bin/python scripts/price_book_from_catalog.py CATALOG.csv [--out BOOK.json]

The catalog's rows hold AWS's own published figures: the on-demand price from AWS's public
Price List bulk file and a spot price per availability zone from EC2 DescribeSpotPriceHistory,
at collection time. Each figure keeps that source and the catalog commit it came through. The
catalog carries no date; `--taken-at` is the earliest day it can be from, so the planner's
stale-price warning errs on the side of old. Zones are AZ IDs (`use1-az2`: the same physical
zone in every account); Local Zones are left out (a fleet's subnets are in the region's zones).
`spotrain prices refresh` replaces all of it from an account.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

from spotrain.core import prices

CATALOG = "skypilot-org/skypilot-catalog catalogs/v9/aws/vms.csv"
COMMIT = "2c3d7ea7d76bf84cf80d382e946c1609571485fd"
EARLIEST = "2026-01-22"
"""The catalog's copy has no date; it cannot be older than the day its disk columns were added."""
ZONE_ID = re.compile(r"^[a-z]+\d-az\d+$")
"""A region's own zone (`use1-az2`), not a Local Zone (`use1-atl2-az1`)."""


def book_from(rows: list[dict[str, str]], *, commit: str, taken_at: str) -> prices.PriceBook:
    via = f"{CATALOG}@{commit[:7]}"
    on_demand: dict[tuple[str, str], prices.Figure] = {}
    spot: dict[tuple[str, str, str], prices.Figure] = {}
    for row in rows:
        region, kind, zone = row["Region"], row["InstanceType"], row["AvailabilityZone"]
        if row["Price"] and float(row["Price"]) > 0:
            on_demand.setdefault((region, kind), prices.Figure(
                region=region, instance_type=kind, taken_at=taken_at,
                usd_per_hour=float(row["Price"]),
                source=f"AWS Price List bulk file, On-Demand Linux, via {via}",
            ))  # fmt: skip
        if row["SpotPrice"] and float(row["SpotPrice"]) > 0 and ZONE_ID.match(zone):
            spot[(region, kind, zone)] = prices.Figure(
                region=region, instance_type=kind, taken_at=taken_at, availability_zone=zone,
                usd_per_hour=float(row["SpotPrice"]),
                source=f"EC2 DescribeSpotPriceHistory, Linux/UNIX, via {via}",
            )  # fmt: skip
    note = (
        f"Built by scripts/price_book_from_catalog.py from SkyPilot's public AWS catalog "
        f"({CATALOG} at commit {commit}): AWS's published prices, "
        f"collected on a date the catalog does not give, no earlier than {taken_at} (each "
        "figure's taken_at). Spot zones are AZ IDs. `spotrain prices refresh` replaces it with "
        "an account's current prices; Spot Instance Advisor bands are not in it."
    )
    return prices.PriceBook(
        on_demand=tuple(on_demand[k] for k in sorted(on_demand)),
        spot=tuple(spot[k] for k in sorted(spot)),
        note=note,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("catalog", type=Path, help="SkyPilot's catalogs/v9/aws/vms.csv")
    parser.add_argument("--out", type=Path, default=prices.SNAPSHOT)
    parser.add_argument("--commit", default=COMMIT, help="the catalog commit the rows are from")
    parser.add_argument("--taken-at", default=EARLIEST, help="earliest date of the figures")
    args = parser.parse_args(argv)
    with args.catalog.open(newline="") as opened:
        rows = list(csv.DictReader(opened))
    book = book_from(rows, commit=args.commit, taken_at=args.taken_at)
    prices.write(book, args.out)
    prices.load(args.out)  # what it wrote is a book the loader takes
    print(f"{args.out}: {len(book.on_demand)} on-demand and {len(book.spot)} spot figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
