"""Which of a run's checkpoints count across its moves between regions (`core/run_epochs.py`):
the rule every reader applies, on chains a brute force over the line checks."""

from __future__ import annotations

import itertools

import pytest

from spotrain.core import run_epochs
from spotrain.core.run_epochs import Epoch, EpochId

EAST, WEST, SOUTH = "us-east-1", "us-west-2", "eu-west-1"


def claim(number: int, region: str, base: EpochId | None = None, step: int | None = None) -> Epoch:
    return Epoch(EpochId(number, region), base, step, f"2026-11-27T10:0{number}:00Z", "test")


def test_a_run_that_never_moved_keeps_every_checkpoint_and_its_keys() -> None:
    chain = [claim(0, EAST)]
    line = run_epochs.valid_through(chain)
    assert line == {EpochId(0, EAST): None}
    assert run_epochs.counts(EpochId(0, EAST), 10**9, line)
    assert run_epochs.epoch_suffix(EpochId(0, EAST)) == ""
    assert run_epochs.head_sort_key(chain) == "HEAD"
    assert run_epochs.valid_through([]) == {} and run_epochs.current([]) is None


def test_each_epoch_counts_up_to_where_the_next_one_started_from() -> None:
    e0, e1, e2 = EpochId(0, EAST), EpochId(1, WEST), EpochId(2, EAST)
    chain = [claim(0, EAST), claim(1, WEST, e0, 20), claim(2, EAST, e1, 50)]
    line = run_epochs.valid_through(chain)
    assert line == {e2: None, e1: 50, e0: 20}
    assert [run_epochs.counts(e0, s, line) for s in (20, 30)] == [True, False]
    assert [run_epochs.counts(e1, s, line) for s in (50, 60)] == [True, False]
    assert run_epochs.head_sort_key(chain) == "HEAD#000002-us-east-1"


def test_a_move_from_before_an_epoch_fences_that_epoch_whole() -> None:
    """Epoch 1's checkpoints never reached epoch 2's region: epoch 2 started from epoch 0's."""
    e0, e1 = EpochId(0, EAST), EpochId(1, WEST)
    chain = [claim(0, EAST), claim(1, WEST, e0, 20), claim(2, SOUTH, e0, 20)]
    line = run_epochs.valid_through(chain)
    assert e1 not in line and line[e0] == 20
    assert not run_epochs.counts(e1, 30, line)


def test_a_claim_that_lost_to_another_of_its_number_counts_nothing() -> None:
    """The table kept west's epoch 1: what east wrote as epoch 1 is fenced, whatever its step."""
    e0 = EpochId(0, EAST)
    line = run_epochs.valid_through([claim(0, EAST), claim(1, WEST, e0, 10)])
    assert not run_epochs.counts(EpochId(1, EAST), 11, line)
    assert run_epochs.counts(EpochId(1, WEST), 11, line)


def test_a_base_whose_claim_is_not_here_yet_stops_the_line() -> None:
    """Epoch 2 arrived before epoch 1 (two regions, two lags): nothing before it counts yet."""
    chain = [claim(0, EAST), claim(2, SOUTH, EpochId(1, WEST), 40)]
    assert run_epochs.valid_through(chain) == {EpochId(2, SOUTH): None}


@pytest.mark.parametrize("moves", range(1, 5))
def test_the_line_is_the_one_a_walk_over_every_step_finds(moves: int) -> None:
    """Every chain of `moves` moves over three regions, each from a step of an earlier epoch.
    Each epoch trains every step after its base, each checkpoint's parent the step before it
    (the first one's: the base): a checkpoint counts exactly when the current epoch's newest
    checkpoint descends from it, found by walking parents, checkpoint by checkpoint."""
    regions, last = (EAST, WEST, SOUTH), 10 * (moves + 2)
    for picks in itertools.product(range(3), repeat=moves):
        chain = [claim(0, EAST)]
        for number, pick in enumerate(picks, start=1):
            base = chain[(number - 1) * pick // 2]  # an earlier epoch, not always the last
            chain.append(claim(number, regions[(number + pick) % 3], base.id, 10 * number + pick))
        parent: dict[tuple[EpochId, int], tuple[EpochId, int] | None] = {}
        for epoch in chain:
            first = (epoch.base_step or 0) + 1
            for step in range(first, last + 1):
                before = (epoch.base, epoch.base_step) if epoch.base else None
                parent[(epoch.id, step)] = (epoch.id, step - 1) if step > first else before  # type: ignore[assignment]
        ancestors, at = set(), (chain[-1].id, last)
        while at is not None:
            ancestors.add(at)
            at = parent[at]  # type: ignore[assignment]
        line = run_epochs.valid_through(chain)
        for checkpoint in parent:
            assert run_epochs.counts(*checkpoint, line) == (checkpoint in ancestors), (
                picks, checkpoint)  # fmt: skip


def test_claims_and_suffixes_read_back_what_they_wrote() -> None:
    moved = claim(3, WEST, EpochId(2, EAST), 1200)
    assert Epoch.from_item(moved.to_item()) == moved
    plain = {k: next(iter(v.values())) for k, v in moved.to_item().items()}  # a Table's items
    assert Epoch.from_item(plain) == moved
    suffix = run_epochs.epoch_suffix(moved.id)
    assert run_epochs.parse_epoch_suffix("CKPT#000000001300" + suffix, "CKPT#000000001300") == (
        moved.id
    )
    assert run_epochs.parse_epoch_suffix("CKPT#000000001300", "CKPT#000000001300") is None
