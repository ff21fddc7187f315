"""`pytest --cpu-durations=N`: the N tests that took the most CPU time, and the suite's whole.

On a machine whose cores the suite fills (`make test` runs a worker a core), the suite's time is
its CPU time divided by the cores, and a test's wall time says little: it includes waiting for
its turn on a busy core, and for stories on the other worker (tests/deployment.py). Its CPU
time does not: what its own process spent in it, plus what every process it started and waited
for spent (the kernel counts a waited-for process's CPU, its own waited-for children's
included, into its parent's). That is the budget a new test spends.

Not counted for the test that started them: processes nobody waits for until later, counted
where they are reaped (apart, as reaped between tests, if that is before a test starts; else
for the test running then, whatever it did), and those that outlive their parent (not counted
at all). A session fixture's setup counts for the test it ran with; the teardown after a
worker's last test, where the session's fixtures end, is counted apart: a local cloud's server
started for the whole session is waited for there, with all the CPU it and the handler runs it
started spent over the session. With xdist, each worker measures its own tests and hands the
figures to the controller, which reports them all.
"""

from __future__ import annotations

import resource
import subprocess
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

OPTION = "--cpu-durations"
BETWEEN = "(between tests: processes reaped after the test that started them)"
SESSION_END = "(the session's end: its fixtures torn down, their servers' whole CPU)"
_KEY = "cpu_seconds"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION, type=int, default=None, metavar="N",
        help="report the N tests that took the most CPU time (their own and that of the "
             "processes they started and waited for), by module too (0: every test)",
    )  # fmt: skip


def _cpu_seconds() -> float:
    mine = resource.getrusage(resource.RUSAGE_SELF)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + waited.ru_utime + waited.ru_stime


class CpuReport:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds: dict[str, float] = {}
        self._ended: float | None = None
        self._session_end = 0.0
        """CPU of the last test's teardown, where the session's fixtures end."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        # A process whose Popen was dropped while it ran is reaped when some later Popen is
        # made: its whole CPU would land on whichever test made it. One that has ended by now
        # is reaped here, before the test, and counted apart.
        subprocess._cleanup()  # type: ignore[attr-defined]  # the standard library's own reaper
        before = _cpu_seconds()
        if self._ended is not None:
            self.seconds[BETWEEN] = self.seconds.get(BETWEEN, 0.0) + before - self._ended
        yield
        self._ended = _cpu_seconds()
        spent, self._session_end = self._ended - before - self._session_end, 0.0
        self.seconds[item.nodeid] = self.seconds.get(item.nodeid, 0.0) + spent

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None
                                ) -> Iterator[None]:  # fmt: skip
        if nextitem is not None:
            yield
            return
        before = _cpu_seconds()
        yield
        self._session_end = _cpu_seconds() - before
        self.seconds[SESSION_END] = self.seconds.get(SESSION_END, 0.0) + self._session_end

    def pytest_sessionfinish(self) -> None:
        output = getattr(self.config, "workeroutput", None)
        if output is not None:  # an xdist worker: the controller reports
            output[_KEY] = self.seconds

    def pytest_testnodedown(self, node: Any) -> None:
        for nodeid, seconds in getattr(node, "workeroutput", {}).get(_KEY, {}).items():
            self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + seconds

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if hasattr(self.config, "workeroutput") or not self.seconds:
            return
        limit = self.config.getoption(OPTION)
        total = sum(self.seconds.values())
        write = terminalreporter.write_line
        terminalreporter.section(f"CPU time: {total:,.0f} s in all, the most first")
        modules: Counter[str] = Counter()
        for nodeid, seconds in self.seconds.items():
            modules[nodeid if nodeid in (BETWEEN, SESSION_END) else nodeid.split("::", 1)[0]
                    ] += seconds  # fmt: skip
        ranked = sorted(self.seconds.items(), key=lambda pair: -pair[1])
        for nodeid, seconds in ranked[:limit] if limit else ranked:
            write(f"{seconds:8.1f} s  {nodeid}")
        write("by module:")
        for module, seconds in modules.most_common():
            write(f"{seconds:8.1f} s  {module} ({100 * seconds / total:.0f}%)")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption(OPTION) is not None:
        config.pluginmanager.register(CpuReport(config), "cpu_report_collector")
