"""How `make test` shares the suite between its two workers (tests/conftest.py): xdist's own
scheduler with the suite's rules, driven by two stand-in workers that finish tests when told."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import conftest
import pytest
from deployment import MODULES

FIRST, USERS, LAST = (f"tests/{module}" for module in MODULES)


class Worker:
    """What the scheduler asks of a worker: the tests it is sent, in order."""

    def __init__(self, name: str) -> None:
        self.name, self.sent, self.shutting_down = name, [], False
        self.gateway = SimpleNamespace(id=name)

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


def started(collection: list[str]) -> tuple[Any, Worker, Worker]:
    config: Any = SimpleNamespace(getvalue=lambda name: ["2*popen"],
                                  option=SimpleNamespace(loadscopereorder=False))  # fmt: skip
    scheduler = conftest.pytest_xdist_make_scheduler(config, None)
    first, other = Worker("gw0"), Worker("gw1")
    for worker in (first, other):
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    return scheduler, first, other


def taken(scheduler: Any, worker: Worker) -> list[str]:
    return [scheduler.collection[i] for i in worker.sent]


def finish(scheduler: Any, worker: Worker, nodeid: str) -> None:
    scheduler.mark_test_complete(worker, scheduler.collection.index(nodeid))


@pytest.fixture
def collection() -> list[str]:
    """The suite's order (conftest.pytest_collection_modifyitems): the deployment's stories,
    the user's story among slow tests, the deployment's end, then quick tests."""
    return [f"{FIRST}::test_apply", f"{FIRST}::test_story", "tests/test_slow.py::test_a",
            f"{USERS}::test_users_story", f"{LAST}::test_second_plan", f"{LAST}::test_destroy",
            *(f"tests/test_quick.py::test_{n}" for n in range(20))]  # fmt: skip


def test_the_deployments_end_waits_in_the_queue_while_a_story_runs(
    collection: list[str],
) -> None:
    """The user's story goes to the worker that does not run the deployment's own stories; a
    worker that runs out of work while that story runs takes quick tests, not the deployment's
    end (whose tests would sit waiting for the story); the end is handed out as soon as the
    story is over, before the quick tests left."""
    scheduler, first, other = started(collection)
    story, end = f"{USERS}::test_users_story", [t for t in collection if t.startswith(LAST)]
    assert taken(scheduler, first)[:2] == collection[:2]  # the deployment's module, one unit
    assert story in taken(scheduler, other) and story not in taken(scheduler, first)
    done: set[str] = set()
    while len(done) < 10:  # the first worker goes through its work: its stories, quick tests
        nodeid = next(t for t in taken(scheduler, first) if t not in done)
        finish(scheduler, first, nodeid)
        done.add(nodeid)
        assert not set(end) & set(taken(scheduler, first) + taken(scheduler, other))
    for nodeid in taken(scheduler, other):
        if nodeid != story:
            finish(scheduler, other, nodeid)
    assert not set(end) & set(taken(scheduler, other))
    finish(scheduler, other, story)  # the last story ends: the end goes out, quick tests after
    assert taken(scheduler, other)[-2:] == end, taken(scheduler, other)


def test_the_deployments_end_is_handed_out_when_nothing_else_is_left() -> None:
    """With no other work, a worker takes the deployment's end at once (its tests wait)."""
    collection = [f"{USERS}::test_users_story", f"{LAST}::test_destroy"]
    scheduler, first, other = started(collection)
    assert taken(scheduler, first) + taken(scheduler, other) == collection
