"""What bytes cost between an environment's regions: AWS bills data sent to another region
per GB, by the region it leaves (receiving is free). A run's checkpoints cross once per other
region as they are published (the buckets replicate every way), so a move itself sends nothing:
the checkpoint it resumes from is already there.

The rates are AWS's published inter-region rates (EC2 and S3 pricing pages, "data transfer to
another AWS region"), for the regions whose rate is one figure: US, Canada and Europe send at
$0.02/GB, and us-east-1 and us-east-2 to each other at $0.01/GB. Elsewhere the rate depends on
the pair ($0.08 to $0.15/GB): the callers say so and take the figure as an input.
"""

from __future__ import annotations

SOURCE = ("AWS EC2/S3 pricing, data transfer to another AWS Region (charged by the sending "
          "region)")  # fmt: skip
FLAT_RATE_PREFIXES = ("us-", "ca-", "eu-")
"""Regions that send to any other region at FLAT_USD_PER_GB."""
FLAT_USD_PER_GB = 0.02
NEIGHBOUR_USD_PER_GB = {frozenset({"us-east-1", "us-east-2"}): 0.01}
"""Pairs priced below the flat rate, both ways."""


def usd_per_gb(source: str, destination: str) -> float | None:
    """What one GB sent from `source` to `destination` costs (0 within a region); None where
    the rate depends on the pair and is not one of the figures above."""
    if source == destination:
        return 0.0
    neighbour = NEIGHBOUR_USD_PER_GB.get(frozenset({source, destination}))
    if neighbour is not None:
        return neighbour
    return FLAT_USD_PER_GB if source.startswith(FLAT_RATE_PREFIXES) else None
