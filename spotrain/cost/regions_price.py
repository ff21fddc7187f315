"""What an environment's other regions add to a run's cost: replication sends each checkpoint's
new bytes from the region the run trains in to every other region as it is published (so a run
can move there and resume from it), and a move costs its changeover, the gang idle while it
restarts and restores there, and no transfer of its own (the checkpoint is there already).
The run's dataset crossed once, when it was prepared: replication copied it with everything
else, and a run reads it from the region it trains in. Pure: `spotrain cost plan` gives it
the plan's figures."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from spotrain.core import inter_region


@dataclass(frozen=True)
class RegionsPrice:
    home: str
    others: tuple[str, ...]
    checkpoints: float
    """Checkpoints the run is expected to publish (its work over the plan's interval)."""
    checkpoint_gb: float | None
    """New bytes a checkpoint sends (its changed chunks), in GB; None: not known."""
    usd_per_gb: dict[str, float | None]
    """Per other region, what a GB from home to it costs (None: not known)."""
    changeover_h: float
    move_usd: float
    """A move's changeover: the gang idle at its hourly price."""
    replication_usd: float | None = None
    """Every checkpoint's new bytes to every other region, over the run (None: not known)."""
    dataset_gb: float | None = None
    """The run's dataset (its shards), in GB; None: not given."""
    dataset_usd: float | None = None
    """The dataset to every other region, once (shared by every run that reads it)."""
    missing: list[str] = field(default_factory=list)
    """What to give for the figures that are not known."""


def regions_price(
    home: str, others: Sequence[str], *, work_h: float, interval_s: float,
    checkpoint_gb: float | None, changeover_h: float, gang_usd_per_h: float,
    given_usd_per_gb: float | None = None, dataset_gb: float | None = None,
) -> RegionsPrice:  # fmt: skip
    """The price of the other regions for a run of `work_h` hours checkpointing every
    `interval_s` (at least the final checkpoint), whose gang costs `gang_usd_per_h`."""
    checkpoints = max(1.0, work_h * 3600 / interval_s) if math.isfinite(interval_s) else 1.0
    rates = {
        other: given_usd_per_gb if given_usd_per_gb is not None
        else inter_region.usd_per_gb(home, other)
        for other in others
    }  # fmt: skip
    missing = []
    unknown = [other for other, rate in rates.items() if rate is None]
    if unknown:
        missing.append(f"the rate from {home} to {', '.join(unknown)} depends on the pair: give "
                       "--transfer-usd-per-gb")  # fmt: skip
    if checkpoint_gb is None:
        missing.append("the bytes a checkpoint sends: give --checkpoint-gb, or a --metrics file "
                       "with published checkpoints")  # fmt: skip
    replication = None
    if not missing:
        per_checkpoint = sum(checkpoint_gb * rate for rate in rates.values())  # type: ignore[operator]
        replication = per_checkpoint * checkpoints
    dataset = None
    if dataset_gb is not None and not unknown:
        dataset = sum(dataset_gb * rate for rate in rates.values())  # type: ignore[operator]
    return RegionsPrice(
        home=home, others=tuple(others), checkpoints=checkpoints, checkpoint_gb=checkpoint_gb,
        usd_per_gb=rates, changeover_h=changeover_h, move_usd=changeover_h * gang_usd_per_h,
        replication_usd=replication, dataset_gb=dataset_gb, dataset_usd=dataset, missing=missing,
    )  # fmt: skip


def describe(price: RegionsPrice, gang: str) -> list[str]:
    """The lines `cost plan` prints (`gang`: whose hourly price a move idles)."""
    rates = ", ".join(f"{o} at ${r:.2f}/GB" if r is not None else f"{o} at an unknown rate"
                      for o, r in price.usd_per_gb.items())  # fmt: skip
    sent = (f"{price.checkpoint_gb:,.2f} GB" if price.checkpoint_gb is not None
            else "its new bytes")  # fmt: skip
    lines = [
        f"regions: {price.home} (home) and {', '.join(price.others)}",
        f"  replication: each checkpoint sends {sent} to every other region ({rates})"
        + (f": ${price.replication_usd:,.2f} over the run's ~{price.checkpoints:,.0f} "
           "checkpoints" if price.replication_usd is not None else ""),
        f"  a move: its changeover, {price.changeover_h:.2f} h of {gang} idle "
        f"(${price.move_usd:,.2f}); nothing more is sent (the checkpoint it resumes from is "
        "there already)",
    ]  # fmt: skip
    if price.dataset_gb is None:
        lines.append("  the dataset: sent to every other region once, when prepared (shared by "
                     "the runs that read it; a run reads it where it trains): give "
                     "--dataset-gb to price it")  # fmt: skip
    else:
        cost = f": ${price.dataset_usd:,.2f}" if price.dataset_usd is not None else ""
        lines.append(f"  the dataset: {price.dataset_gb:,.2f} GB sent to every other region "
                     f"once, when prepared{cost} (shared by the runs that read it; a run reads "
                     "it where it trains, so a move sends none of it)")  # fmt: skip
    lines += [f"  to price it: {need}" for need in price.missing]
    return lines
