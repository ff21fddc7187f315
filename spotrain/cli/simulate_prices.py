"""`spotrain cost simulate`'s prices: given by hand, or the price book's for an instance type
in the regions the traces are of (each region at its own price across regions)."""

from __future__ import annotations

import argparse

from spotrain.cli.arguments import number
from spotrain.cli.plan_inputs import problems_of
from spotrain.core import prices
from spotrain.core.errors import SpotrainError

BY_HAND = (
    "give --spot-price and --on-demand-price (and a --region-price for each region "
    "after home) instead of --instance-type and --region"
)
"""The other way to price a replay, said where the book lacks a region."""


def add_flags(command: argparse.ArgumentParser) -> None:
    """The prices by hand, or the price book's for an instance type in the traces' regions."""
    command.add_argument("--on-demand-price", type=number(), help="USD/h (or --instance-type)")
    command.add_argument("--spot-price", type=number(), help="USD/h (or --instance-type)")
    command.add_argument(
        "--instance-type",
        help="with --region: take both prices from the price book instead (spot the mean over "
        "the region's zones)",
    )
    command.add_argument(
        "--region",
        action="append",
        help="with --instance-type: the region the trace is of (with --across-regions one per "
        "--trace, in their order: each region at its own price)",
    )
    command.add_argument("--price-book", help="instead of the checked-in snapshot")


def resolve(args: argparse.Namespace) -> list[str]:
    """With --instance-type and --region, the price book's prices stand in for the price flags
    (the regions' after home's for --region-price); what is wrong with the prices given, all at
    once, otherwise."""
    given = args.on_demand_price is not None or args.spot_price is not None or args.region_price
    found: list[str] = []
    if not args.instance_type and not args.region:
        if args.on_demand_price is None or args.spot_price is None:
            found.append("give --on-demand-price and --spot-price, or --instance-type and "
                         "--region to take them from the price book")  # fmt: skip
        if args.price_book:
            found.append("--price-book is read for --instance-type and --region: give them, "
                         "or leave it out")  # fmt: skip
        return found
    if given:
        found.append("give the prices (--on-demand-price, --spot-price, --region-price) or "
                     "--instance-type with --region, not both")  # fmt: skip
    if not args.instance_type or not args.region:
        found.append("give --instance-type and --region together (the price book's prices "
                     "of that type in that region)")  # fmt: skip
    wanted = len(args.trace or []) if args.across_regions else 1
    if args.region and len(args.region) != wanted:
        found.append(f"give one --region per --trace, in the same order ({len(args.region)} "
                     f"for {wanted})" if args.across_regions else
                     f"give one --region (the trace's; {len(args.region)} given: several are "
                     "for --across-regions)")  # fmt: skip
    if found:
        return found
    try:
        book = prices.load(args.price_book) if args.price_book else prices.load()
    except SpotrainError as error:
        return problems_of(error)
    pools = []
    for region in args.region:
        try:
            pools.append(book.pool(args.instance_type, region, otherwise=BY_HAND))
        except SpotrainError as error:
            found.extend(problems_of(error))
    if not found:
        (args.spot_price, args.on_demand_price), *others = [
            (pool.spot_price, pool.on_demand.usd_per_hour) for pool in pools]  # fmt: skip
        args.region_price = others or None
    return found
