"""What an environment costs while nothing trains: per region, the interface endpoints its
network keeps in every zone (billed per endpoint per zone-hour, used or not) and its data key.
A region a run may move to pays this whether a run ever trains there: the price of being able
to move.

The endpoints' services are listed here once; the network construct builds exactly these.
Not counted: bytes through the endpoints ($0.01/GB), storage, flow logs, the handler's calls
(each scales with use, not with time).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

INTERFACE_ENDPOINT_SERVICES = (
    "autoscaling", "logs", "ecr.api", "ecr.dkr", "ssm", "ssmmessages", "ec2messages",
)  # fmt: skip
"""The APIs a machine calls besides S3 and DynamoDB (gateway endpoints, free): one interface
endpoint each in every region's network."""

ENDPOINT_USD_PER_ZONE_HOUR = 0.01
KMS_KEY_USD_PER_MONTH = 1.0
HOURS_PER_MONTH = 730.0
SOURCE = (
    "AWS PrivateLink pricing (interface endpoint, $0.01 per endpoint per zone-hour in us-east-1, "
    "used for every region) and AWS KMS pricing ($1 per key-month)"
)


@dataclass(frozen=True)
class RegionStanding:
    region: str
    zones: int
    home: bool

    @property
    def endpoints(self) -> int:
        return len(INTERFACE_ENDPOINT_SERVICES) * self.zones

    @property
    def usd_per_hour(self) -> float:
        return self.endpoints * ENDPOINT_USD_PER_ZONE_HOUR + KMS_KEY_USD_PER_MONTH / HOURS_PER_MONTH

    @property
    def usd_per_month(self) -> float:
        return self.usd_per_hour * HOURS_PER_MONTH


def standing(regions: Iterable[tuple[str, int]]) -> list[RegionStanding]:
    """Each region's standing cost, from (region, zones) in the environment's order (the
    first is home)."""
    return [
        RegionStanding(region=region, zones=zones, home=index == 0)
        for index, (region, zones) in enumerate(regions)
    ]
