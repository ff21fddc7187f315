"""`pytest --cpu-durations` (tests/cpu_report.py) counts a test's CPU time with that of the
processes it waited for, with xdist workers and without."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

BUSY = """
import os, subprocess, sys, time

import pytest

@pytest.fixture(scope="session", autouse=True)
def a_server():
    # Busy for the session, and waited for at its end, as a local cloud's server is.
    server = subprocess.Popen([sys.executable, "-c",
                               "import time\\nend = time.process_time() + 0.8\\n"
                               "while time.process_time() < end: pass"])
    yield
    server.wait()

def _spin(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_busy_in_a_child():
    subprocess.run([sys.executable, "-c",
                    "import time\\nend = time.process_time() + 0.8\\n"
                    "while time.process_time() < end: pass"], check=True)

def test_busy_itself():
    _spin(0.4)

def test_idle():
    time.sleep(0.5)

def test_leaves_a_busy_process_behind():
    left = subprocess.Popen([sys.executable, "-c",  # dropped while it runs: nobody reaps it
                             "import time\\nend = time.process_time() + 0.8\\n"
                             "while time.process_time() < end: pass"]).pid
    # It ends meanwhile, however loaded the machine, and is left unreaped (WNOWAIT).
    os.waitid(os.P_PID, left, os.WEXITED | os.WNOWAIT)

def test_after_it_starts_a_process():
    subprocess.run(["true"], check=True)  # a Popen: the standard library reaps the one left
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_the_report_counts_each_tests_cpu_with_its_waited_for_processes(
    tmp_path: Path, workers: str
) -> None:
    (tmp_path / "test_busy.py").write_text(BUSY)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "cpu_report", "-p", "no:cacheprovider",
         "--numprocesses", workers, "--dist", "loadfile", "--cpu-durations=0", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    seconds = {
        m[2]: float(m[1]) for m in re.finditer(r"^ +([\d.]+) s  \S+::(\w+)$", ran.stdout, re.M)
    }
    assert set(seconds) == {"test_busy_in_a_child", "test_busy_itself", "test_idle",
                            "test_leaves_a_busy_process_behind",
                            "test_after_it_starts_a_process"}, ran.stdout  # fmt: skip
    assert seconds["test_busy_in_a_child"] >= 0.8  # its child's, counted once waited for
    assert 0.4 <= seconds["test_busy_itself"] < 0.8
    assert seconds["test_idle"] < 0.3  # sleeping costs nothing, however long it takes
    # The process left behind is counted apart, not for the test that happened to reap it.
    assert seconds["test_after_it_starts_a_process"] < 0.3, ran.stdout
    between = re.search(r"^ +([\d.]+) s  \(between tests", ran.stdout, re.M)
    assert between and float(between[1]) >= 0.8, ran.stdout
    # The session's server, waited for after the last test: apart, not for that test.
    end = re.search(r"^ +([\d.]+) s  \(the session's end", ran.stdout, re.M)
    assert end and float(end[1]) >= 0.8, ran.stdout
    ranked = [m[1] for m in re.finditer(r"^ +[\d.]+ s  \S+::(\w+)$", ran.stdout, re.M)]
    assert ranked[0] == "test_busy_in_a_child"
    assert re.search(r"CPU time: [\d,]+ s in all", ran.stdout)
    assert re.search(r"^ +[\d.]+ s  test_busy\.py \(\d+%\)$", ran.stdout, re.M), ran.stdout
