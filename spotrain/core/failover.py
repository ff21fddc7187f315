"""When a run leaves a region that does not answer: the failover rule, pure, shared by the
interruption handler (which orders the move) and the machines (which carry it out).

Every region of the environment has its handler, and a run has groups in each (at 0 where it
does not train). When the region the run trains in stops answering (connections fail, or 5xx
after botocore's retries: `errors.does_not_answer`), its own handler cannot act, so the others
decide, each for itself, from what it sees:

1. The region the run trains in answers: nothing moves (a withdrawn order, below).
2. The run's successor is the first region after it, in the run's order (the environment's,
   home first, wrapping round), that answers; only the successor's handler acts, so two
   surviving regions never both take the run.
3. The successor waits until the silent region has failed `after_checks` scheduled checks in
   a row (`handler_settings.FAILOVER_AFTER_CHECKS`: 10 to 15 minutes at the 5-minute
   schedule), so a blip moves nothing.
4. Then it orders the move (`MoveOrder`, from the run's current epoch to here, kept in its own
   region's failover item of the run's fleet state: `fleet_state.FailoverState`) and starts
   the run's groups here at their declared sizes.

The handler never writes the catalog (its role may not): the machines it starts read the
order as they boot and claim the run's next epoch here themselves (`order_applies`, then
`RunCheckpoints.move_here`: the newest checkpoint whose every piece is here and verifies), as
`spotrain checkpoints move` does for an operator. From that claim on, the catalog's epochs
fence whatever the old region's machines publish, even if they were only cut off and train on
(`run_epochs`); a region that answers again before the claim has its order withdrawn, and a
machine that boots after that finds none and does not train here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from spotrain.core.run_epochs import EpochId


@dataclass(frozen=True)
class MoveOrder:
    """A handler's order that run's current epoch (`from_epoch`, in `from_region`) be left
    for `to_region`, whose machines claim the next epoch there."""

    from_epoch: int
    from_region: str
    to_region: str
    ordered_at: float
    reason: str

    def to_item(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> MoveOrder:
        return cls(from_epoch=int(item["from_epoch"]), from_region=str(item["from_region"]),
                   to_region=str(item["to_region"]), ordered_at=float(item["ordered_at"]),
                   reason=str(item["reason"]))  # fmt: skip


@dataclass(frozen=True)
class Silence:
    """How long a region has not answered this handler's checks: since when, and how many
    checks in a row."""

    since: float
    checks: int = 1

    def to_item(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> Silence:
        return cls(since=float(item["since"]), checks=int(item["checks"]))


def heard(silences: Mapping[str, Silence], answered: Mapping[str, bool], now: float
          ) -> dict[str, Silence]:  # fmt: skip
    """The silences after a check that asked the regions in `answered`: one more check for a
    region that did not answer (from now, if it answered the last time); none for the others
    (a region not asked this time is forgotten: every check asks what the rule needs)."""
    after = {}
    for region, answers in answered.items():
        if not answers:
            before = silences.get(region)
            after[region] = (
                Silence(now) if before is None else Silence(before.since, before.checks + 1)
            )
    return after


def successor(trains_in: str, regions: Sequence[str], silent: Mapping[str, Silence]) -> str | None:
    """The first region after `trains_in` in the run's order (wrapping round) that answers,
    or None when none does."""
    if trains_in not in regions:
        return None
    at = regions.index(trains_in)
    for region in [*regions[at + 1 :], *regions[:at]]:
        if region not in silent:
            return region
    return None


@dataclass(frozen=True)
class Verdict:
    order: MoveOrder | None
    """The move to order now (None: no move from here)."""
    reason: str


def failover(
    *, here: str, trains_in: str, epoch: int, regions: Sequence[str],
    silent: Mapping[str, Silence], now: float, after_checks: int,
) -> Verdict:  # fmt: skip
    """Rules 1-4 of the module's docstring, as the handler of region `here` sees them after its
    check (`silent`: the regions that did not answer it, `heard` folded in)."""
    silence = silent.get(trains_in)
    if silence is None:
        return Verdict(None, f"the run trains in {trains_in}, which answers")
    quiet = f"{trains_in} has not answered {silence.checks} check(s) in a row"
    to = successor(trains_in, regions, silent)
    if to != here:
        return Verdict(
            None,
            f"{quiet}; the run's next region that answers is {to}, whose handler moves it"
            if to
            else f"{quiet}; no region of the run answers",
        )
    if silence.checks < after_checks:
        return Verdict(None, f"{quiet}: the run moves here after {after_checks}, unless it "
                       "answers meanwhile")  # fmt: skip
    minutes = (now - silence.since) / 60
    return Verdict(MoveOrder(
        from_epoch=epoch, from_region=trains_in, to_region=here, ordered_at=now,
        reason=f"{trains_in} has not answered for {silence.checks} checks ({minutes:.0f} min): "
               f"the run moves to {here}, the next of its regions that answers",
    ), f"{quiet}: the run moves here")  # fmt: skip


def order_applies(order: MoveOrder | None, current: EpochId | None, here: str) -> str | None:
    """Why a machine booting in `here` may not carry out `order` (None: it claims the run's
    next epoch here). `current` is the run's current epoch in this region's copy."""
    if order is None:
        return "no move is ordered"
    if order.to_region != here:
        return f"the move is ordered to {order.to_region}, not here ({here})"
    if current is None:
        return "the run never trained: it has nothing to move"
    if current.region == here:
        return f"the run already trains here (epoch {current.number})"
    if (current.number, current.region) != (order.from_epoch, order.from_region):
        return (
            f"the order moves the run from epoch {order.from_epoch} in {order.from_region}, "
            f"but it is at epoch {current.number} in {current.region} now"
        )
    return None
