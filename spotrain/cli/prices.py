"""`spotrain prices refresh|advisor|show`: the price book, rebuilt from the EC2 and Price List
APIs of the account the credentials reach, its interruption bands from the Spot Instance
Advisor's public data (no credentials), or shown with each figure's date."""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path
from typing import Any

from spotrain.cli.arguments import environment, number
from spotrain.cli.output import say
from spotrain.cli.plan_inputs import today
from spotrain.core import prices
from spotrain.core.errors import CostInputError
from spotrain.stacks.runs import load_runs


def _unknown_regions(regions: list[str]) -> list[str]:
    """The names that are no AWS region botocore knows (any partition)."""
    import boto3

    session = boto3.session.Session()
    known = {r for partition in session.get_available_partitions()
             for r in session.get_available_regions("ec2", partition_name=partition)}  # fmt: skip
    return [r for r in regions if r not in known]


def cmd_prices(args: argparse.Namespace) -> int:
    unknown = _unknown_regions(args.region or [])
    if unknown:
        raise CostInputError(
            f"--region {', '.join(unknown)}: no such AWS region; give a region code such as "
            "us-east-1 (`aws ec2 describe-regions` lists yours; a region newer than this boto3 "
            "needs a newer boto3)"
        )
    path = Path(args.price_book) if args.price_book else prices.SNAPSHOT
    if args.action != "show" and not path.parent.is_dir():
        raise CostInputError(
            f"--price-book {path}: the folder {path.parent} does not exist; create it or "
            "give a file in a folder that does"
        )
    # A book given to `show` must be there; `refresh` starts a new one where none is yet.
    fresh_book = args.action != "show" and not path.exists()
    book = prices.PriceBook(path=str(path)) if fresh_book else prices.load(path)
    environments = [environment(n) for n in (args.environment or ["local", "dev", "prod"])]
    types = args.instance_type or sorted(
        {t for e in environments for run in load_runs(e.name) for t in run.instance_types}
    )
    regions = args.region or sorted({r for e in environments for r in e.region_names})
    if args.action == "show":
        return _show(book, path, types, regions, args.stale_after_days)
    if args.action == "advisor":
        return _advisor(book, path, types, regions, args.from_file)
    return _refresh(book, path, types, regions)


def _advisor(book: prices.PriceBook, path: Path, types: list[str], regions: list[str],
             saved: str | None) -> int:  # fmt: skip
    """The Advisor's bands for these pools, from its public data (or a saved copy of it)."""
    import json
    import urllib.error
    import urllib.request

    if saved is not None:
        source = Path(saved)
        if not source.is_file():
            raise CostInputError(f"--from-file {saved}: no such file; save the Advisor's data "
                                 f"with `curl -o {saved} {prices.ADVISOR_DATA_URL}`")  # fmt: skip
        text = source.read_text()
    else:
        try:
            with urllib.request.urlopen(prices.ADVISOR_DATA_URL, timeout=60) as answer:
                text = answer.read().decode()
        except (urllib.error.URLError, TimeoutError) as error:
            raise CostInputError(
                f"could not read {prices.ADVISOR_DATA_URL} ({error}): save it from a machine "
                "that can (`curl -o advisor.json URL`) and give --from-file advisor.json"
            ) from None
    try:
        data = json.loads(text)
    except ValueError as error:
        raise CostInputError(f"the Spot Instance Advisor data is not JSON ({error})") from None
    figures, missing = prices.advisor_bands(data, types, regions, today().isoformat())
    prices.write(prices.with_advisor(book, figures), path)
    say(f"price book {path}: the Spot Instance Advisor's interruption band for {len(figures)} "
        f"pool(s) of {len(types)} instance type(s) in {', '.join(regions)}")  # fmt: skip
    for line in missing:
        say(f"  WARNING: {line} (is the type offered there?)")
    return 0 if not missing else 1


def _show(
    book: prices.PriceBook, path: Path, types: list[str], regions: list[str], stale_after: int
) -> int:
    if not (book.on_demand or book.spot):
        say(
            f"the price book {path} holds no prices yet: run `spotrain prices refresh` "
            "with credentials for an AWS account"
        )
        return 0
    for region in regions:
        for instance_type in types:
            try:
                found = book.pool(instance_type, region)
            except CostInputError as error:
                say(f"{instance_type} {region}: {error}")
                continue
            zones = ", ".join(f"{f.availability_zone} ${f.usd_per_hour:.4f}" for f in found.spot)
            band = found.advisor.band if found.advisor else "no Advisor band"
            stale = prices.staleness(found, today(), stale_after)
            say(
                f"{instance_type} {region}: on-demand ${found.on_demand.usd_per_hour:.4f}/h; "
                f"spot {zones}; {band}; taken {found.oldest()}"
                + (f"\n  WARNING: {stale}" if stale else "")
            )
    return 0


def _refresh(book: prices.PriceBook, path: Path, types: list[str], regions: list[str]) -> int:
    from spotrain.core import aws_clients

    clients: dict[str, Any] = {}

    def ec2_for(region: str) -> Any:
        if region not in clients:
            clients[region] = aws_clients.client("ec2", region)
        return clients[region]

    pricing = aws_clients.client("pricing", prices.PRICE_LIST_REGION)
    fresh, missing = prices.refresh(
        book, instance_types=types, regions=regions, ec2_for=ec2_for, pricing=pricing,
        now=datetime.datetime.now(datetime.UTC),
    )  # fmt: skip
    prices.write(fresh, path)
    say(
        f"price book {path}: {len(fresh.on_demand)} on-demand and {len(fresh.spot)} spot "
        f"prices for {len(types)} instance type(s) in {', '.join(regions)}"
    )
    for line in missing:
        say(f"  WARNING: {line} (is the type offered there?)")
    return 0 if not missing else 1


def add_parsers(commands: Any) -> None:
    book = commands.add_parser("prices", help="the price book: refresh it from AWS, show it")
    book.add_argument(
        "action",
        choices=["refresh", "advisor", "show"],
        help="refresh: prices from the account's EC2 and Price List APIs; advisor: interruption "
        "bands from the Spot Instance Advisor's public data (no credentials); show",
    )
    book.add_argument("--from-file", help="advisor: a saved copy of the Advisor's data")
    book.add_argument(
        "--environment",
        action="append",
        help="types and regions of these environments (default: all)",
    )
    book.add_argument("--instance-type", action="append", help="instead of the environments'")
    book.add_argument("--region", action="append", help="instead of the environments'")
    book.add_argument("--price-book", help="file to read and write (default: the snapshot)")
    book.add_argument(
        "--stale-after-days", type=number(int), default=prices.DEFAULT_STALE_AFTER_DAYS
    )
    book.set_defaults(handler=cmd_prices)
