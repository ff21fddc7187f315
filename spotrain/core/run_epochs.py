"""A run's epochs: one writer at a time across regions, on a catalog that replicates with the
last writer winning.

The catalog is a global table: every region reads and writes its own copy, a change reaches
the others later, and of two writes to one item the later wins everywhere. A conditional write
is judged against the writer's own region's copy only, so no condition alone can stop an old
region, cut off from the others, from accepting its machines' publishes. Fencing across
regions therefore rests on what the readers accept, not on what the writers are refused:

- A run trains in one region at a time: its *epoch*. Epoch 0 is claimed by the run's first
  writer (`EPOCH#000000`, its region); a move claims the next number in the destination
  region (`EPOCH#<n>`), naming the checkpoint it starts from (its *base*: one whose every piece
  replicated there and verified). A claim item is written once, only if its number is not
  taken in that region; should two regions claim one number at once (only possible while
  they cannot see each other), the global table keeps one of the two claims in every region,
  so every reader ends up agreeing on each epoch's region.
- Every item a writer writes carries its epoch in its key (`epoch_suffix`: none for epoch 0,
  so a run that never moved keeps its keys): `HEAD<suffix>`, `LEASE<suffix>` and
  `CKPT#<step><suffix>`. Two epochs' writers never write the same item, so replication
  cannot mix their histories: each stays whole and readable.
- A reader takes the run's history back from its current epoch (the highest claimed): all of
  the current epoch's checkpoints, then its base's epoch up to the base's step, then that
  epoch's base, and so on (`valid_through`). What a stale writer published after the run
  moved on, or an epoch whose claim lost, is *fenced*: listed, never the head, never restored.
- A writer checks in each publish that its region's copy shows its own claim and no next one
  (`publish_conditions`), and a writer starting in a region the run is not in is refused: a
  stale writer is stopped as soon as the move reaches its region, and what it published
  before cannot become the head anywhere, once the move reaches the reader.

`docs/ARCHITECTURE.md` (Regions) states the argument; the trainer's catalog and the handler
use these functions, and nothing else decides which of a run's checkpoints count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from spotrain.core.catalog_schema import (
    HEAD_SORT_KEY,
    PARTITION_KEY,
    SORT_KEY,
    checkpoint_sort_key,
    query_items,
    run_key,
)

EPOCH_PREFIX = "EPOCH#"
_EPOCH_DIGITS = 6


def epoch_sort_key(number: int) -> str:
    """The sort key of epoch `number`'s claim: zero-padded, so a query lists them in order."""
    if number < 0:
        raise ValueError(f"epoch must be >= 0, got {number}")
    return f"{EPOCH_PREFIX}{number:0{_EPOCH_DIGITS}d}"


@dataclass(frozen=True, order=True)
class EpochId:
    """Who writes: the epoch's number and the region its claim named."""

    number: int
    region: str


def epoch_suffix(epoch: EpochId) -> str:
    """What a writer of `epoch` appends to the sort keys it writes (its head, lease and
    checkpoints): nothing in epoch 0, so a run that never moved keeps its keys."""
    return "" if epoch.number == 0 else f"#{epoch.number:0{_EPOCH_DIGITS}d}-{epoch.region}"


def parse_epoch_suffix(sort_key: str, stem: str) -> EpochId | None:
    """The epoch a sort key written by `epoch_suffix` names (`stem`: the key without it; None
    for epoch 0, whose region is its claim's)."""
    rest = sort_key.removeprefix(stem)
    if not rest:
        return None
    number, _, region = rest.removeprefix("#").partition("-")
    return EpochId(int(number), region)


@dataclass(frozen=True)
class Epoch:
    """A claim: the run trains in `region` from checkpoint `base_step` of epoch `base`."""

    id: EpochId
    base: EpochId | None
    """The epoch whose checkpoint this one starts from (None: epoch 0 starts from nothing)."""
    base_step: int | None
    claimed_at: str = ""
    claimed_by: str = ""

    def to_item(self) -> dict[str, Any]:
        """The claim's attributes (DynamoDB's typed form), besides its keys."""
        item: dict[str, Any] = {
            "epoch": {"N": str(self.id.number)},
            "region": {"S": self.id.region},
            "claimed_at": {"S": self.claimed_at},
            "claimed_by": {"S": self.claimed_by},
        }
        if self.base is not None and self.base_step is not None:
            item["base_epoch"] = {"N": str(self.base.number)}
            item["base_region"] = {"S": self.base.region}
            item["base_step"] = {"N": str(self.base_step)}
        return item

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> Epoch:
        """From a claim item, typed (a client's) or plain (a boto3 Table's)."""

        def value(name: str) -> Any:
            raw = item.get(name)
            if isinstance(raw, Mapping):
                return next(iter(raw.values()))
            return raw

        base = None
        if value("base_epoch") is not None:
            base = EpochId(int(value("base_epoch")), str(value("base_region")))
        base_step = value("base_step")
        return cls(
            id=EpochId(int(value("epoch")), str(value("region"))),
            base=base,
            base_step=None if base_step is None else int(base_step),
            claimed_at=str(value("claimed_at") or ""),
            claimed_by=str(value("claimed_by") or ""),
        )


def current(chain: Iterable[Epoch]) -> Epoch | None:
    """The run's current epoch: the highest claimed (None: no writer ever started)."""
    return max(chain, key=lambda e: e.id.number, default=None)


def valid_through(chain: Iterable[Epoch]) -> dict[EpochId, int | None]:
    """Per epoch on the run's line, the last step of its that counts (None: every step, the
    current epoch's). Walks back from the current epoch through each base; an epoch not on the
    line (its claim lost, or a move started from before it) is absent: fenced whole."""
    claims = {e.id.number: e for e in chain}
    latest = current(claims.values())
    if latest is None:
        return {}
    line: dict[EpochId, int | None] = {latest.id: None}
    at = latest
    while at.base is not None and at.base_step is not None:
        claimed = claims.get(at.base.number)
        if claimed is None or claimed.id != at.base or claimed.id in line:
            break  # the base's claim lost (or is not here yet): nothing before it counts
        line[claimed.id] = at.base_step
        at = claimed
    return line


def trains_in(chain: Iterable[Epoch], home: str) -> str:
    """The region the run trains in: its current epoch's, `home` until it moves."""
    latest = current(chain)
    return latest.id.region if latest is not None else home


def head_sort_key(chain: Iterable[Epoch]) -> str:
    """Where the run's head is: its current epoch's head item."""
    latest = current(chain)
    return HEAD_SORT_KEY + (epoch_suffix(latest.id) if latest else "")


def read_chain(table: Any, run: str) -> list[Epoch]:
    """Run `run`'s epoch claims from a boto3 Table (this region's copy, consistent reads)."""
    claims = query_items(table, run_key(run), EPOCH_PREFIX, ConsistentRead=True)
    return [Epoch.from_item(i) for i in claims]


def read_head(table: Any, run: str, chain: list[Epoch] | None = None) -> dict[str, Any] | None:
    """Run `run`'s head item from a boto3 Table (consistent reads), its current epoch's; while
    that epoch has published nothing, where it starts from (`{"step", "latest"}`: its base's).
    `chain`: the run's epochs, when the caller has read them already."""
    chain = read_chain(table, run) if chain is None else chain
    item: dict[str, Any] | None = table.get_item(
        Key={PARTITION_KEY: run_key(run), SORT_KEY: head_sort_key(chain)}, ConsistentRead=True
    ).get("Item")
    latest = current(chain)
    if item is None and latest is not None and (where := base_sort_key(latest)) is not None:
        return {"step": latest.base_step, "latest": where}
    return item


def base_sort_key(epoch: Epoch) -> str | None:
    """The catalog item of the checkpoint `epoch` started from (None: epoch 0's nothing)."""
    if epoch.base is None or epoch.base_step is None:
        return None
    return checkpoint_sort_key(epoch.base_step) + epoch_suffix(epoch.base)


def counts(epoch: EpochId, step: int, line: Mapping[EpochId, int | None]) -> bool:
    """Whether checkpoint `step` written in `epoch` is part of the run's history."""
    if epoch not in line:
        return False
    last = line[epoch]
    return last is None or step <= last


def publish_conditions(epoch: EpochId) -> list[tuple[str, str, dict[str, Any]]]:
    """What a writer of `epoch` checks in its own region's copy with every publish, as
    (claim sort key, condition expression, expression values): its claim is the one there
    (for epoch 0, or none: a run whose writer started before epochs), and no next epoch is
    claimed."""
    mine = "#region = :region"
    own = (
        epoch_sort_key(epoch.number),
        f"attribute_not_exists(#region) OR {mine}" if epoch.number == 0 else mine,
        {":region": {"S": epoch.region}},
    )
    none_next = (epoch_sort_key(epoch.number + 1), "attribute_not_exists(#region)", {})
    return [own, none_next]


def in_history(chain: list[Epoch]) -> Callable[[str, int], bool]:
    """Whether a checkpoint item (its sort key and step) is part of the run's history, as a
    reader of a copy with claims `chain` sees it: a stale writer's checkpoint is not (it is
    FENCED), nor is any of an epoch whose claim lost. Without claims, every one is."""
    if not chain:
        return lambda _key, _step: True
    line = valid_through(chain)
    return lambda key, step: counts(written_by(key, step, chain), step, line)


REFUSAL_PREFIX = "REFUSED#"
"""A writer the run's epoch refused says it tried: one catalog item per refusal (its time and
region in the key, never changed), written in the writer's region and replicated, so the
catalog's watcher raises the stale-writer alarm even though nothing was published."""


def refusal_item(writer: EpochId, latest: EpochId | None, action: str, at: str) -> dict[str, Any]:
    """The refusal's sort key and attributes (DynamoDB's typed form): who was refused
    (`writer`), doing what, and the epoch the run was in as the writer's copy showed it."""
    item: dict[str, Any] = {
        SORT_KEY: {"S": f"{REFUSAL_PREFIX}{at}#{writer.region}"},
        "epoch": {"N": str(writer.number)},
        "region": {"S": writer.region},
        "action": {"S": action},
        "at": {"S": at},
    }
    if latest is not None:
        item |= {"run_epoch": {"N": str(latest.number)}, "run_region": {"S": latest.region}}
    return item


def written_by(sort_key: str, step: int, chain: list[Epoch]) -> EpochId:
    """The epoch that wrote checkpoint item `sort_key` (of `step`): its key's suffix, or the
    run's epoch 0 for a key without one."""
    stem = checkpoint_sort_key(step)
    named = parse_epoch_suffix(sort_key, stem)
    if named is not None:
        return named
    first = min(chain, key=lambda e: e.id.number, default=None)
    return first.id if first else EpochId(0, "")
