"""How `make test` shares the suite between its two workers (tests/conftest.py): xdist's own
scheduler with the suite's rules, driven by two stand-in workers that finish tests when told."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import conftest
import pytest
from deployment import MODULES, USERS_STORY_AFTER

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


def done(scheduler: Any, nodeid: str) -> bool:
    return any(tests.get(nodeid) for work in scheduler.assigned_work.values()
               for tests in work.values())  # fmt: skip


@pytest.fixture
def collection() -> list[str]:
    """The suite's order (conftest.pytest_collection_modifyitems): the deployment's stories,
    the one the user's story waits for last of them, the user's story, slow tests, the
    deployment's end, then quick tests."""
    return [f"{FIRST}::test_apply", f"{FIRST}::{USERS_STORY_AFTER}", f"{USERS}::test_users_story",
            *(f"tests/test_slow.py::test_{n}" for n in range(4)),
            f"{LAST}::test_schedule", f"{LAST}::test_destroy",
            *(f"tests/test_quick.py::test_{n}" for n in range(20))]  # fmt: skip


def test_the_users_story_goes_out_once_the_story_it_waits_for_is_over(
    collection: list[str],
) -> None:
    """The user's story is not handed out while the story it waits for runs (its worker would
    sit waiting); once that one is over, the other worker takes it next, before the slow tests
    left; the worker that runs the deployment's stories never does."""
    scheduler, first, other = started(collection)
    story, waited_for = f"{USERS}::test_users_story", f"{FIRST}::{USERS_STORY_AFTER}"
    assert taken(scheduler, first)[:2] == collection[:2]  # the deployment's module, one unit
    for nodeid in list(taken(scheduler, other)):  # slow tests meanwhile
        assert story not in taken(scheduler, other)
        finish(scheduler, other, nodeid)
    finish(scheduler, first, f"{FIRST}::test_apply")
    assert story not in taken(scheduler, first) + taken(scheduler, other)
    finish(scheduler, first, waited_for)
    assert story not in taken(scheduler, first)
    handed = len(taken(scheduler, other))
    while story not in taken(scheduler, other):  # the other worker asks for more: the story
        finish(scheduler, other, next(t for t in taken(scheduler, other) if not done(scheduler, t)))
    assert taken(scheduler, other)[handed] == story  # before anything else
    assert story not in taken(scheduler, first)


def test_the_deployments_end_waits_in_the_queue_while_a_story_runs(
    collection: list[str],
) -> None:
    """A worker that runs out of work while the user's story runs takes quick tests, not the
    deployment's end (whose tests would sit waiting for the story); the end is handed out as
    soon as the story is over, before the quick tests left."""
    scheduler, first, other = started(collection)
    story, end = f"{USERS}::test_users_story", [t for t in collection if t.startswith(LAST)]
    for nodeid in collection[:2]:  # the deployment's own stories: the user's story goes out
        finish(scheduler, first, nodeid)
    while story not in taken(scheduler, other):
        finish(scheduler, other, next(t for t in taken(scheduler, other) if not done(scheduler, t)))
    finished: set[str] = set(collection[:2])
    while len(finished) < 12:  # the first worker goes through its work: quick tests
        nodeid = next(t for t in taken(scheduler, first) if t not in finished)
        finish(scheduler, first, nodeid)
        finished.add(nodeid)
        assert not set(end) & set(taken(scheduler, first) + taken(scheduler, other))
    for nodeid in taken(scheduler, other):
        if nodeid != story and not done(scheduler, nodeid):
            finish(scheduler, other, nodeid)
    assert not set(end) & set(taken(scheduler, other))
    finish(scheduler, other, story)  # the last story ends: the end goes out, quick tests after
    assert taken(scheduler, other)[-2:] == end, taken(scheduler, other)


def test_the_deployments_end_is_handed_out_when_nothing_else_is_left() -> None:
    """With no other work, a worker takes the deployment's end at once (its tests wait)."""
    collection = [f"{USERS}::test_users_story", f"{LAST}::test_destroy"]
    scheduler, first, other = started(collection)
    assert taken(scheduler, first) + taken(scheduler, other) == collection
