"""The local cloud's prices: EC2 `DescribeSpotPriceHistory` and the Price List API's
`GetProducts` answer from a price book, as AWS answers from its markets and offer files.

moto answers every spot price history request with one made-up price and has no Price List
service. Here both read the price book beside the server's faults file (`price_book.json`,
written by `control.set_price_book`), else the checked-in snapshot, on every request, so
`spotrain prices refresh` runs against the local cloud as against an account.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any

from spotrain.core import prices
from spotrain.localcloud import faults

BOOK_NAME = "price_book.json"
GET_PRODUCTS_TARGET = "AWSPriceListService.GetProducts"


def book() -> prices.PriceBook:
    served = faults.served_file()
    local = served.with_name(BOOK_NAME) if served is not None else None
    chosen = local if local is not None and local.exists() else prices.SNAPSHOT
    stat = chosen.stat()
    return _loaded(str(chosen), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _loaded(path: str, mtime_ns: int, size: int) -> prices.PriceBook:
    """A book read once while its file stays as it is (a price check per machine per capacity
    check would parse the whole snapshot each time); a book set anew is read anew."""
    return prices.load(path)


def zone_names(region: str) -> dict[str, str]:
    """This cloud's one account's zone names by AZ ID (`use1-az6` -> `us-east-1a`): AWS maps
    them per account, and answers with names."""
    from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend

    return {zone.zone_id: zone.name for zone in RegionsAndZonesBackend.zones.get(region, [])}


def spot_price_history(
    region: str, instance_types: list[str], descriptions: list[str], zones: list[str]
) -> list[dict[str, str]]:
    if descriptions and not any(d.startswith(prices.PRODUCT_DESCRIPTION) for d in descriptions):
        return []  # the book holds Linux/UNIX prices only
    named = zone_names(region)
    found = []
    for f in book().spot:
        # A book may name a zone by its ID (the checked-in snapshot does): answered by name.
        zone = named.get(f.availability_zone or "", f.availability_zone or "")
        if f.region != region or (instance_types and f.instance_type not in instance_types) or (
                zones and zone not in zones):  # fmt: skip
            continue
        found.append({
            "InstanceType": f.instance_type,
            "ProductDescription": prices.PRODUCT_DESCRIPTION,
            "SpotPrice": f"{f.usd_per_hour:.6f}",
            "AvailabilityZone": zone,
            "Timestamp": f"{f.taken_at}T00:00:00.000Z",
        })  # fmt: skip
    return found


def products(filters: Iterable[dict[str, str]]) -> list[str]:
    """Price List products (JSON strings, as the API sends them) matching TERM_MATCH filters."""
    wanted = {f["Field"]: f["Value"] for f in filters if f.get("Type") == "TERM_MATCH"}
    found = []
    for figure in book().on_demand:
        attributes = {
            **prices.PRICE_LIST_FILTERS,
            "instanceType": figure.instance_type,
            "regionCode": figure.region,
            "servicecode": "AmazonEC2",
        }
        if any(attributes.get(field) != value for field, value in wanted.items()):
            continue
        sku = hashlib.sha256(f"{figure.instance_type} {figure.region}".encode()).hexdigest()[:16]
        found.append(
            json.dumps(
                {
                    "product": {
                        "productFamily": "Compute Instance",
                        "sku": sku,
                        "attributes": attributes,
                    },
                    "serviceCode": "AmazonEC2",
                    "terms": {
                        "OnDemand": {
                            f"{sku}.JRTCKXETXF": {
                                "sku": sku,
                                "effectiveDate": f"{figure.taken_at}T00:00:00Z",
                                "priceDimensions": {
                                    f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                                        "unit": "Hrs",
                                        "description": f"{figure.instance_type} (local cloud book)",
                                        "pricePerUnit": {"USD": f"{figure.usd_per_hour:.10f}"},
                                    }
                                },
                            }
                        }
                    },
                    "publicationDate": f"{figure.taken_at}T00:00:00Z",
                }
            )
        )
    return found


def served(app: Callable[..., Iterable[bytes]]) -> Callable[..., Any]:
    """WSGI middleware: Price List requests are answered here, the rest go to `app`."""

    def middleware(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("HTTP_X_AMZ_TARGET") != GET_PRODUCTS_TARGET:
            return app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        request = json.loads(environ["wsgi.input"].read(length) or b"{}")
        if request.get("ServiceCode") != "AmazonEC2":
            body = json.dumps({"PriceList": [], "FormatVersion": "aws_v1"}).encode()
        else:
            body = json.dumps(
                {"PriceList": products(request.get("Filters", [])), "FormatVersion": "aws_v1"}
            ).encode()
        start_response(
            "200 OK",
            [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(body)))],
        )
        return [body]

    return middleware


def install() -> None:
    """moto's spot price history answers from the book."""
    from moto.core.responses import ActionResult
    from moto.ec2.responses.spot_instances import SpotInstances

    def describe_spot_price_history(self: SpotInstances) -> ActionResult:
        filters = self._filters_from_querystring()
        history = spot_price_history(
            self.region,
            self._get_param("InstanceTypes", []),
            self._get_param("ProductDescriptions", []),
            filters.get("availability-zone", [])
            + (
                [self._get_param("AvailabilityZone")] if self._get_param("AvailabilityZone") else []
            ),
        )
        return ActionResult({"SpotPriceHistory": history})

    SpotInstances.describe_spot_price_history = describe_spot_price_history  # type: ignore[method-assign]
