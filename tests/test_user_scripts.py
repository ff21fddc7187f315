"""Scripts written the way users write them survive preemption: an epoch loop over a shuffled
DataLoader with worker processes (examples/epoch_loop.py, shaped like DeepSpeed's public CIFAR
example) on 2 ranks, stopped by SIGTERM to every process it has, early in its second epoch. Its
emergency checkpoint is published, its DataLoader's position and its own state ride along, and
the restart's losses equal an uninterrupted run's at every step."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import rest_of
from training import EPOCH_LOOP_LOSSES, script_steps

from spotrain.localcloud.machines import process_tree, signal_all

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "epoch_loop.py"
STEPS = len(EPOCH_LOOP_LOSSES)  # 2 epochs of 12 batches per rank


def _command(*args: str) -> list[str]:
    """The user's script under spotrain's torchrun, 2 ranks, as `spotrain train` starts it."""
    return [sys.executable, "-m", "spotrain.trainer.launch", "--standalone",
            "--nproc-per-node", "2", "--shutdown-timeout", "60",
            "-m", "spotrain.trainer.entry_point", "--script", str(SCRIPT), "--", *args]  # fmt: skip


def _env(tmp_path: Path, run: str) -> dict[str, str]:
    return {**os.environ, "SPOTRAIN_RUN": run, "SPOTRAIN_STORE": f"file://{tmp_path}/store",
            "SPOTRAIN_CHECKPOINT_WORK_DIR": str(tmp_path / f"work-{run}")}  # fmt: skip


@pytest.fixture(scope="module")
def reference_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[int, dict[str, Any]], Path]:
    """The same script run to its end, here (bit-for-bit comparisons hold on one machine: the
    goldens in training.py are this machine kind's): each step's line, and its metrics file."""
    tmp_path = tmp_path_factory.mktemp("uninterrupted")
    metrics = tmp_path / "metrics.jsonl"
    done = subprocess.run(_command("--metrics-file", str(metrics)), capture_output=True,
                          text=True, timeout=300, env=_env(tmp_path, "reference"))  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    steps = script_steps(done.stdout)
    assert sorted(steps) == list(range(1, STEPS + 1))
    return steps, metrics


@pytest.fixture(scope="module")
def uninterrupted(
    reference_run: tuple[dict[int, dict[str, Any]], Path],
) -> dict[int, dict[str, Any]]:
    return reference_run[0]


@pytest.mark.integration
def test_a_users_loop_writes_the_metrics_file_cost_plan_plans_with(
    reference_run: tuple[dict[int, dict[str, Any]], Path],
) -> None:
    """Given `metrics_file`, the Checkpointer writes the trainer's lines for a loop of the
    user's own: every step's end and whether a publish was in flight as it began, and every
    checkpoint's event, from which `cost plan --metrics` has a checkpoint's whole cost to
    training, not only its stall."""
    import json

    from spotrain.cost import planner

    lines = [json.loads(line) for line in reference_run[1].read_text().splitlines()]
    steps = [line for line in lines if "event" not in line]
    assert [line["step"] for line in steps] == list(range(1, STEPS + 1))
    assert all({"loss", "step_s", "publishing", "at"} <= set(line) for line in steps)
    assert [line["at"] for line in steps] == sorted(line["at"] for line in steps)
    events = [(line["event"], line.get("step")) for line in lines if "event" in line]
    assert events == [("started", 0), *(("published", s) for s in (5, 10, 15, 20, STEPS))]
    found = planner.measured(str(reference_run[1]))
    assert (found.steps, found.checkpoints) == (STEPS, 5)
    assert found.step_s is not None and found.checkpoint_bytes
    whole = planner.checkpoint_training_cost(lines)  # None without the steps' lines
    assert whole is not None and found.checkpoint_s is not None and found.checkpoint_s >= whole


@pytest.mark.integration
def test_sigterm_to_every_process_mid_epoch_publishes_and_the_restart_continues_the_epoch(
    uninterrupted: dict[int, dict[str, Any]], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = _env(tmp_path, "stopped")
    first = subprocess.Popen(_command("--step-seconds", "0.3"), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env,
                             start_new_session=True)  # fmt: skip
    seen, deadline = [], time.monotonic() + 240
    assert first.stdout is not None
    request.addfinalizer(lambda: signal_all(process_tree(first.pid), signal.SIGKILL))
    for line in first.stdout:
        seen.append(line)
        # The second epoch's first step: its loader's iterator was built after the script's
        # set_epoch; its workers are busy prefetching.
        if line.startswith('{"step": 13,'):
            tree = process_tree(first.pid)
            ranks = [pid for pid in tree if _parent(pid) == first.pid]
            workers = [pid for pid in tree if _parent(pid) in ranks]
            assert len(ranks) == 2 and len(workers) == 4, tree  # 2 DataLoader workers a rank
            signal_all(tree, signal.SIGTERM)  # a stop sent to every process at once
            break
        assert time.monotonic() < deadline, "".join(seen)[-3000:]
    rest = rest_of(first, timeout=180)
    output = "".join(seen) + rest
    assert "DataLoader worker" not in output, output[-3000:]
    stopped = [int(line.split("stopped after step ")[1].split()[0])
               for line in output.splitlines() if "stopped after step" in line]  # fmt: skip
    assert len(stopped) == 1 and 13 <= stopped[0] < STEPS, output[-3000:]  # in epoch 1
    assert "Traceback" not in output, output[-3000:]

    second = subprocess.run(_command(), capture_output=True, text=True, timeout=300, env=env)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert f"resumed stopped at step {stopped[0]}" in second.stdout
    trained = {**script_steps(output), **script_steps(second.stdout)}
    assert sorted(trained) == list(range(1, STEPS + 1))
    # The same batches in the same order (the epoch went on where it was), the same weights,
    # and the script's own state restored: every step's loss and running loss are identical.
    assert trained == uninterrupted


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_a_stop_as_torchruns_agent_enters_its_monitor_is_its_shutdown_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The monitor torchrun's agent enters every interval runs without torch's metrics wrapper:
    a stop signal landing on the wrapper's first line (before it sets its start time) made its
    `finally` raise UnboundLocalError, a traceback and exit 1 instead of the shutdown."""
    from types import SimpleNamespace

    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.metrics import api as metrics_api
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    from spotrain.trainer.launch import _repair_torchrun

    monkeypatch.setattr(SubprocessHandler, "close", SubprocessHandler.close)
    monkeypatch.setattr(LocalElasticAgent, "_stop_workers", LocalElasticAgent._stop_workers)
    calm = RunResult(state=WorkerState.HEALTHY)

    def monitor(agent: Any, group: Any) -> RunResult:
        return calm

    # torch's own decoration of the monitor, around a stand-in body.
    monkeypatch.setattr(LocalElasticAgent, "_monitor_workers",
                        metrics_api.prof(monitor, group="agent"))  # fmt: skip
    _repair_torchrun(standalone=True)

    def stop_signal_arrives() -> float:
        raise SignalException("Process got signal: 15", sigval=signal.SIGTERM)

    monkeypatch.setattr(metrics_api, "time", SimpleNamespace(time=stop_signal_arrives))
    assert LocalElasticAgent._monitor_workers(object(), None) is calm


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_spotrains_torchrun_stops_a_rank_alone_and_kills_its_whole_group(
    stop: signal.Signals, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun signals a rank's process group; spotrain's passes a stop to the rank only, so
    its helpers (here a child in its group) serve it until it has published and exited."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    from spotrain.trainer.launch import _repair_torchrun

    # The repairs are undone after the test (they are meant for the launcher's process).
    monkeypatch.setattr(SubprocessHandler, "close", SubprocessHandler.close)
    monkeypatch.setattr(LocalElasticAgent, "_stop_workers", LocalElasticAgent._stop_workers)
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    _repair_torchrun(standalone=False)
    helper_file = tmp_path / "helper"
    # A shell cannot trap a signal ignored when it starts, and a test process started in the
    # background (`make test &`) ignores SIGINT: the rank starts with the default instead, as
    # one of a machine's service does. (A Python rank's own handler is installed either way.)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rank = SubprocessHandler(
            entrypoint="bash",
            # The trap first: once the helper's pid is written, the rank hears a stop (set after
            # it, a stop could come first and the shell wait on its helper instead).
            args=("-c", f"trap 'exit 0' TERM INT; sleep 60 & echo $! > {helper_file}; wait"),
            env={"PATH": os.environ["PATH"]}, stdout=None, stderr=None, local_rank_id=0,
            numa_options=None,
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 10
    while not helper_file.is_file() or not helper_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    helper = int(helper_file.read_text())
    try:
        rank.close(stop)
        assert rank.proc.wait(timeout=10) == 0  # the rank heard it
        time.sleep(0.2)
        assert _state(helper) not in (None, "Z")  # its helper did not
        rank.close(signal.SIGKILL)  # after the shutdown timeout: the whole group
        deadline = time.monotonic() + 10
        while _parent(helper) is not None and _state(helper) != "Z":
            assert time.monotonic() < deadline, "SIGKILL missed the rank's group"
            time.sleep(0.05)
    finally:
        signal_all([helper], signal.SIGKILL)
        rank.proc.kill()  # gone already when the test passed; reaped either way
        rank.proc.wait(timeout=10)


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def test_a_rank_that_dies_while_stopping_says_in_one_line_why_it_has_no_emergency_checkpoint(
    tmp_path: Path,
) -> None:
    from spotrain.trainer.checkpointer import Checkpointer
    from spotrain.trainer.process import Place

    checkpointer = Checkpointer(run="r", store=f"file://{tmp_path}/store")
    checkpointer._place = Place(rank=1, world=2, leader=False)
    checkpointer.last_step, checkpointer.parent = 6, "r/step_000000005"
    checkpointer.preemption.request("SIGTERM")
    error = RuntimeError("DataLoader worker (pid 9) is killed by signal: Terminated. \nmore")
    assert checkpointer.last_words(error) == (
        "rank 1 died after step 6 while stopping (SIGTERM), before its emergency checkpoint was "
        "published: RuntimeError: DataLoader worker (pid 9) is killed by signal: Terminated; "
        "the run resumes from r/step_000000005"
    )
    checkpointer.preemption.reason = None
    assert "with no emergency checkpoint (only a stop takes one)" in checkpointer.last_words(error)


@pytest.mark.integration
@pytest.mark.parametrize(("loader", "start"), [("torch", "spawn"), ("stateful", "spawn"),
                                               ("torch", "fork")])  # fmt: skip
def test_data_loader_workers_ignore_a_stop_sent_to_every_process_and_end_with_their_rank(
    loader: str, start: str
) -> None:
    """A DataLoader (torch's or torchdata's) whose workers are spawned (or forked): SIGTERM
    sent to its workers from outside as they start (spawned, fresh interpreters) leaves them
    serving their rank, which reads every batch; and the rank still ends when it leaves an
    epoch unfinished, its workers running (Python's exit stops them by SIGTERM, which they
    ignore). The same loader unshielded dies of the stop (the case this guards against; shown
    once)."""
    script = ROOT / "tests" / "fixtures" / "loader_workers.py"

    def stopped_workers(shield: str) -> subprocess.Popen[str]:
        rank = subprocess.Popen([sys.executable, str(script), loader, shield, start], text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)  # fmt: skip
        assert rank.stdout is not None and rank.stdin is not None
        said = [rank.stdout.readline()]
        while not said[-1].startswith("workers"):
            assert said[-1], "".join(said)[-3000:]
            said.append(rank.stdout.readline())
        for pid in said[-1].split()[1:]:
            os.kill(int(pid), signal.SIGTERM)
        time.sleep(1)  # delivered, and a worker that dies of it is noticed
        with contextlib.suppress(BrokenPipeError):  # the rank died of its workers' deaths
            rank.stdin.write("go\n")
            rank.stdin.close()
        return rank

    shielded = stopped_workers("shielded")
    output = rest_of(shielded, timeout=120)
    assert shielded.returncode == 0 and "sum 2016.0" in output, output[-3000:]  # 0 + ... + 63
    assert "leaving an epoch unfinished" in output, output[-3000:]
    if (loader, start) == ("torch", "spawn"):
        bare = stopped_workers("bare")
        output = rest_of(bare, timeout=120)
        assert bare.returncode != 0 and "sum" not in output, output[-3000:]
