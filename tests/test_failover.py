"""The failover rule (`spotrain.core.failover`): which surviving region takes a run whose
region stopped answering, after how many checks, and when a machine booting there carries the
order out. The deployed handlers play it in test_integration_local_apply.py (a run that moves
region); a machine's claim through the local cloud is in test_checkpoint_store.py."""

from __future__ import annotations

import pytest

from spotrain.core.failover import MoveOrder, Silence, failover, heard, order_applies, successor
from spotrain.core.run_epochs import EpochId

REGIONS = ["us-east-1", "us-west-2", "eu-west-1"]


def test_a_region_is_silent_from_the_first_check_it_missed_and_forgotten_once_it_answers() -> None:
    first = heard({}, {"us-east-1": False}, now=100.0)
    assert first == {"us-east-1": Silence(100.0, 1)}
    second = heard(first, {"us-east-1": False, "eu-west-1": True}, now=400.0)
    assert second == {"us-east-1": Silence(100.0, 2)}  # counted from the first
    assert heard(second, {"us-east-1": True}, now=700.0) == {}
    # A region not asked this time is forgotten: each check asks what the rule needs.
    assert heard(second, {"eu-west-1": False}, now=700.0) == {"eu-west-1": Silence(700.0, 1)}


@pytest.mark.parametrize(
    ("trains_in", "silent", "expected"),
    [("us-east-1", {"us-east-1"}, "us-west-2"),
     ("us-east-1", {"us-east-1", "us-west-2"}, "eu-west-1"),
     ("eu-west-1", {"eu-west-1"}, "us-east-1"),  # wraps round to home
     ("us-west-2", set(REGIONS), None),
     ("ap-south-1", {"ap-south-1"}, None)],  # not one of the run's regions
)  # fmt: skip
def test_the_successor_is_the_next_region_in_the_runs_order_that_answers(
    trains_in: str, silent: set[str], expected: str | None
) -> None:
    assert successor(trains_in, REGIONS, {r: Silence(0.0) for r in silent}) == expected


def _verdict(here: str, silent: dict[str, Silence], after_checks: int = 3):  # type: ignore[no-untyped-def]
    return failover(here=here, trains_in="us-east-1", epoch=4, regions=REGIONS, silent=silent,
                    now=1_000.0, after_checks=after_checks)  # fmt: skip


def test_the_next_region_moves_the_run_after_the_checks_in_a_row_and_no_other_does() -> None:
    assert _verdict("us-west-2", {}).order is None
    assert "which answers" in _verdict("us-west-2", {}).reason
    waiting = _verdict("us-west-2", {"us-east-1": Silence(400.0, 2)})
    assert waiting.order is None
    assert "has not answered 2 check(s) in a row: the run moves here after 3" in waiting.reason
    moved = _verdict("us-west-2", {"us-east-1": Silence(400.0, 3)})
    assert moved.order == MoveOrder(
        from_epoch=4, from_region="us-east-1", to_region="us-west-2", ordered_at=1_000.0,
        reason="us-east-1 has not answered for 3 checks (10 min): the run moves to us-west-2, "
               "the next of its regions that answers",
    )  # fmt: skip
    # The third region leaves the run to the second, whatever the count: never two takers.
    other = _verdict("eu-west-1", {"us-east-1": Silence(0.0, 9)})
    assert other.order is None and "next region that answers is us-west-2" in other.reason
    # ... unless the second is silent too.
    both = {"us-east-1": Silence(0.0, 9), "us-west-2": Silence(0.0, 1)}
    assert _verdict("eu-west-1", both).order is not None
    assert "no region of the run answers" in _verdict("us-west-2", {
        r: Silence(0.0, 9) for r in REGIONS}).reason  # fmt: skip


ORDER = MoveOrder(from_epoch=4, from_region="us-east-1", to_region="us-west-2",
                  ordered_at=0.0, reason="us-east-1 has not answered")  # fmt: skip


@pytest.mark.parametrize(
    ("order", "current", "here", "why_not"),
    [(ORDER, EpochId(4, "us-east-1"), "us-west-2", None),
     (None, EpochId(4, "us-east-1"), "us-west-2", "no move is ordered"),
     (ORDER, EpochId(4, "us-east-1"), "eu-west-1", "ordered to us-west-2, not here"),
     (ORDER, None, "us-west-2", "never trained"),
     (ORDER, EpochId(5, "us-west-2"), "us-west-2", "already trains here (epoch 5)"),
     # The run moved on since the order (back home, say): the order is stale.
     (ORDER, EpochId(6, "us-east-1"), "us-west-2", "but it is at epoch 6 in us-east-1 now")],
)  # fmt: skip
def test_a_machine_carries_out_an_order_only_from_the_epoch_it_names_and_only_where_it_goes(
    order: MoveOrder | None, current: EpochId | None, here: str, why_not: str | None
) -> None:
    found = order_applies(order, current, here)
    assert found is None if why_not is None else why_not in (found or "")
