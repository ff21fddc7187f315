"""A rank forked from torchrun's agent (launch.py, repair 6) is the process a new interpreter
running `python -u -m MODULE` (or `python -u SCRIPT`) would be: the same facts seen from
inside, the same exit status, its end's work done; only PyTorch's import is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spotrain.trainer.launch import RANKS_AS_NEW_INTERPRETERS

REPORTER = """\
import atexit, json, os, signal, sys, threading, time
torch_before_the_script = "torch" in sys.modules
import numpy, torch
rank = os.environ.get("RANK")
def say(line):  # one write a line: the two ranks share the launcher's output
    os.write(1, (line + "\\n").encode())
atexit.register(lambda: say(f"atexit {rank}"))
threading.Thread(target=lambda: (time.sleep(0.2), say(f"thread {rank}"))).start()
say(json.dumps({
    "name": __name__, "argv": sys.argv[1:], "script": sys.argv[0], "path0": sys.path[0],
    "rank": os.environ.get("RANK"), "threads": torch.get_num_threads(),
    "sigterm_default": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
    "sigint_default": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "own_session": os.getsid(0) == os.getpid(), "cwd": os.getcwd(),
    "nvml_check": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"),
    "numpy_draw": float(numpy.random.random()), "torch_before_the_script": torch_before_the_script,
}))
"""

ENDINGS = {
    "returns": ("", 0, None),
    "exits_3": ("import sys; sys.exit(3)", 3, None),
    "exits_with_a_message": ("import sys; sys.exit('the data is missing')", 1, "data is missing"),
    "raises": ("raise ValueError('bad batch')", 1, "ValueError: bad batch"),
    "is_interrupted": ("raise KeyboardInterrupt", -signal.SIGINT, "KeyboardInterrupt"),
    "gets_sigterm": ("print('printed'); os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM,
                     None),
}  # fmt: skip
"""How a rank's module ends: (its last line, the status a new interpreter gives, what it says)."""

AGENT = """\
import json, os, signal, sys
import torch
from spotrain.trainer.forked_rank import ForkedRank, entry_of
signal.signal(signal.SIGTERM, lambda *_: None)  # the agent's own stop handler is not the rank's
if sys.argv[1] == "after-cuda":  # PyTorch's mark on a fork made after CUDA was asked anything
    torch.cuda._is_in_bad_fork = lambda: True
statuses = {}
for module in sys.argv[2:]:  # a name ending .py or / is a script's
    script = module.endswith((".py", "/"))
    command = (sys.executable, "-u", *(() if script else ("-m",)), module, "a", "b")
    named = module.rstrip("/")
    with open(named + ".out", "w") as out, open(named + ".err", "w") as err:
        rank = ForkedRank(entry_of(command), stdout=out, stderr=err,
                          env={**os.environ, "RANK": "0"}, start_new_session=True)
        statuses[module] = rank.wait(timeout=60)
print(json.dumps(statuses))
"""
"""An agent as torchrun's is (a new interpreter that has imported PyTorch) forking one rank per
module named, in turn: the tests' own process holds state a rank must not run at its end."""


def _fork_ranks(tmp_path: Path, modules: list[str], *, after_cuda: bool = False) -> dict[str, int]:
    buffered = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    result = subprocess.run(  # the agent's output buffered, as torchrun's is
        [sys.executable, "-c", AGENT, "after-cuda" if after_cuda else "-", *modules],
        cwd=tmp_path, env=buffered, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout.splitlines()[-1]))


def _seen(tmp_path: Path, module: str) -> tuple[dict[str, object], list[str]]:
    printed = (tmp_path / f"{module}.out").read_text().splitlines()
    return json.loads(printed[0]), printed[1:]


def test_a_forked_rank_ends_with_the_status_and_the_exit_work_of_a_new_interpreter(
    tmp_path: Path,
) -> None:
    for module, (last_line, _, _) in ENDINGS.items():
        (tmp_path / f"{module}.py").write_text(REPORTER + last_line + "\n")
    statuses = _fork_ranks(tmp_path, sorted(ENDINGS))
    for module, (_, status, said) in ENDINGS.items():
        assert statuses[module] == status, module
        seen, then = _seen(tmp_path, module)
        assert seen["name"] == "__main__" and seen["argv"] == ["a", "b"], module
        assert seen["script"] == str(tmp_path / f"{module}.py") and seen["path0"] == str(tmp_path)
        assert seen["sigterm_default"] and seen["sigint_default"] and seen["own_session"], module
        assert seen["torch_before_the_script"], module  # the agent's, not imported again
        if module == "gets_sigterm":  # a signal's death runs nothing of Python's, and `-u`
            assert then == ["printed"]  # left nothing unwritten
        else:
            assert then == ["thread 0", "atexit 0"], module
        if said:
            assert said in (tmp_path / f"{module}.err").read_text(), module


def test_a_forked_rank_whose_module_or_script_is_missing_or_has_no_main_says_so_as_python_does(
    tmp_path: Path,
) -> None:
    for without_a_main in ("a_package", "a_folder"):
        (tmp_path / without_a_main).mkdir()
        (tmp_path / without_a_main / "__init__.py").write_text("")
    entries = ["no_such_module", "no_such_script.py", "a_package", "a_folder/"]
    statuses = _fork_ranks(tmp_path, entries)
    assert statuses == {"no_such_module": 1, "no_such_script.py": 2, "a_package": 1,
                        "a_folder/": 1}  # fmt: skip
    said = {name: (tmp_path / f"{name.rstrip('/')}.err").read_text() for name in statuses}
    assert said["no_such_module"] == f"{sys.executable}: No module named no_such_module\n"
    assert said["no_such_script.py"] == (
        f"{sys.executable}: can't open file {str(tmp_path / 'no_such_script.py')!r}: "
        "[Errno 2] No such file or directory\n"
    )
    assert said["a_package"] == (
        f"{sys.executable}: No module named a_package.__main__; 'a_package' is a package and "
        "cannot be directly executed\n"
    )
    assert said["a_folder/"] == (
        f"{sys.executable}: can't find '__main__' module in {f'{tmp_path}/a_folder/'!r}\n"
    )


def test_a_fork_of_an_agent_that_asked_cuda_becomes_a_new_interpreter(tmp_path: Path) -> None:
    (tmp_path / "reporter.py").write_text(REPORTER)
    assert _fork_ranks(tmp_path, ["reporter"], after_cuda=True) == {"reporter": 0}
    seen, then = _seen(tmp_path, "reporter")
    assert not seen["torch_before_the_script"]  # a new interpreter, which imported it itself
    assert seen["argv"] == ["a", "b"] and seen["path0"] == str(tmp_path) and seen["own_session"]
    assert then == ["thread 0", "atexit 0"]


def _launch(tmp_path: Path, entry: list[str], *, new_interpreters: bool) -> list[dict[str, object]]:
    env = {**os.environ, RANKS_AS_NEW_INTERPRETERS: "1" if new_interpreters else "0"}
    result = subprocess.run(
        [sys.executable, "-m", "spotrain.trainer.launch", "--standalone", "--nproc-per-node", "2",
         *entry, "--flag", "x"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for rank in ("0", "1"):
        assert lines.index(f"thread {rank}") < lines.index(f"atexit {rank}"), result.stdout
    return sorted((json.loads(line) for line in lines if line.startswith("{")),
                  key=lambda seen: str(seen["rank"]))  # fmt: skip


@pytest.mark.integration
@pytest.mark.parametrize("entry", [["-m", "reporter"], ["reporter.py"]], ids=["module", "script"])
def test_ranks_forked_by_the_launcher_see_what_new_interpreters_see_without_importing_pytorch(
    entry: list[str], tmp_path: Path
) -> None:
    (tmp_path / "reporter.py").write_text(REPORTER)
    forked = _launch(tmp_path, entry, new_interpreters=False)
    new = _launch(tmp_path, entry, new_interpreters=True)
    assert [seen["torch_before_the_script"] for seen in forked] == [True, True]
    assert [seen["torch_before_the_script"] for seen in new] == [False, False]
    # Each rank draws numpy's global generator anew, as a new interpreter does.
    assert forked[0]["numpy_draw"] != forked[1]["numpy_draw"]
    drawn = ("torch_before_the_script", "numpy_draw")
    assert [{k: v for k, v in seen.items() if k not in drawn} for seen in forked] == [
        {k: v for k, v in seen.items() if k not in drawn} for seen in new
    ]
    assert [seen["threads"] for seen in forked] == [1, 1]  # torchrun's OMP_NUM_THREADS=1
