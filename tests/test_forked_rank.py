"""A rank forked from torchrun's agent (launch.py, repair 6) is the process a new interpreter
running `python -u -m MODULE` would be: the same facts seen from inside, the same exit status,
its end's work done; only PyTorch's import is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spotrain.trainer.forked_rank import ForkedRank
from spotrain.trainer.launch import RANKS_AS_NEW_INTERPRETERS

REPORTER = """\
import atexit, json, os, signal, sys, threading, time
torch_before_the_script = "torch" in sys.modules
import numpy, torch
rank = os.environ.get("RANK")
atexit.register(lambda: print("atexit", rank, flush=True))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread", rank, flush=True))).start()
print(json.dumps({
    "name": __name__, "argv": sys.argv[1:], "script": sys.argv[0], "path0": sys.path[0],
    "rank": os.environ.get("RANK"), "threads": torch.get_num_threads(),
    "sigterm_default": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
    "sigint_default": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "own_session": os.getsid(0) == os.getpid(), "cwd": os.getcwd(),
    "numpy_draw": float(numpy.random.random()), "torch_before_the_script": torch_before_the_script,
}), flush=True)
"""

ENDINGS = {
    "return": ("", 0, None),
    "sys.exit(3)": ("import sys; sys.exit(3)", 3, None),
    "sys.exit(message)": ("import sys; sys.exit('the data is missing')", 1, "the data is missing"),
    "exception": ("raise ValueError('bad batch')", 1, "ValueError: bad batch"),
    "interrupt": ("raise KeyboardInterrupt", -signal.SIGINT, "KeyboardInterrupt"),
    "SIGTERM": ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM, None),
}


def _module(tmp_path: Path, name: str, body: str) -> None:
    (tmp_path / f"{name}.py").write_text(body)


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_forked_rank_ends_with_the_status_and_the_exit_work_of_a_new_interpreter(
    ending: str, tmp_path: Path
) -> None:
    body, status, said = ENDINGS[ending]
    _module(tmp_path, "ending", REPORTER + body + "\n")
    # The agent's own stop handler must not be the rank's (SIGTERM's row dies of its default).
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        with (tmp_path / "out").open("w") as out, (tmp_path / "err").open("w") as err:
            rank = ForkedRank((sys.executable, "-u", "-m", "ending", "a", "b"), cwd=tmp_path,
                              env={**os.environ, "RANK": "0"}, stdout=out, stderr=err,
                              start_new_session=True)  # fmt: skip
            assert rank.wait(timeout=60) == status
    finally:
        signal.signal(signal.SIGTERM, previous)
    printed = (tmp_path / "out").read_text().splitlines()
    seen = json.loads(printed[0])
    assert seen["name"] == "__main__" and seen["argv"] == ["a", "b"]
    assert seen["script"] == str(tmp_path / "ending.py") and seen["path0"] == str(tmp_path)
    assert seen["sigterm_default"] and seen["sigint_default"] and seen["own_session"]
    if ending != "SIGTERM":  # a signal's death runs nothing of Python's
        assert printed[1:] == ["thread 0", "atexit 0"]
    if said:
        assert said in (tmp_path / "err").read_text()


def _launch(tmp_path: Path, *, new_interpreters: bool) -> list[dict[str, object]]:
    env = {**os.environ, RANKS_AS_NEW_INTERPRETERS: "1" if new_interpreters else "0"}
    result = subprocess.run(
        [sys.executable, "-m", "spotrain.trainer.launch", "--standalone", "--nproc-per-node", "2",
         "-m", "reporter", "--flag", "x"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for rank in ("0", "1"):
        assert lines.index(f"thread {rank}") < lines.index(f"atexit {rank}"), result.stdout
    return sorted((json.loads(line) for line in lines if line.startswith("{")),
                  key=lambda seen: str(seen["rank"]))  # fmt: skip


@pytest.mark.integration
def test_ranks_forked_by_the_launcher_see_what_new_interpreters_see_without_importing_pytorch(
    tmp_path: Path,
) -> None:
    _module(tmp_path, "reporter", REPORTER)
    forked = _launch(tmp_path, new_interpreters=False)
    new = _launch(tmp_path, new_interpreters=True)
    assert [seen["torch_before_the_script"] for seen in forked] == [True, True]
    assert [seen["torch_before_the_script"] for seen in new] == [False, False]
    # Each rank draws numpy's global generator anew, as a new interpreter does.
    assert forked[0]["numpy_draw"] != forked[1]["numpy_draw"]
    drawn = ("torch_before_the_script", "numpy_draw")
    assert [{k: v for k, v in seen.items() if k not in drawn} for seen in forked] == [
        {k: v for k, v in seen.items() if k not in drawn} for seen in new
    ]
    assert [seen["threads"] for seen in forked] == [1, 1]  # torchrun's OMP_NUM_THREADS=1
