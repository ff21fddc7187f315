"""Spot placement scores (EC2 `GetSpotPlacementScores`), which the emulator lacks: how likely a
spot request for a number of machines of some instance types is to succeed in each region,
from 1 to 10. Here a region scores `GONE` when the `spot_capacity_gone` fault names every
type asked there (none of them would launch), and `THERE` otherwise, so that what the scores
say of a region is what its groups then find."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spotrain.localcloud import faults

GONE, THERE = 1, 9


def scores(regions: Sequence[str], instance_types: Sequence[str]) -> list[dict[str, Any]]:
    """One score per region asked, as `GetSpotPlacementScores` answers without
    SingleAvailabilityZone."""
    now = faults.current()
    return [{"Region": region,
             "Score": GONE if all(now.spot_gone(region, t) for t in instance_types) else THERE}
            for region in regions]  # fmt: skip


def install() -> None:
    """EC2 answers `GetSpotPlacementScores` (moto has no such action)."""
    from moto.core.responses import ActionResult
    from moto.ec2.responses.spot_instances import SpotInstances

    def get_spot_placement_scores(self: SpotInstances) -> ActionResult:
        types = self._get_param("InstanceTypes", []) or []
        regions = self._get_param("RegionNames", []) or [self.region]
        return ActionResult({"SpotPlacementScores": scores(regions, types)})

    SpotInstances.get_spot_placement_scores = get_spot_placement_scores  # type: ignore[attr-defined]
