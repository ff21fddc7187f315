"""Helpers for tests that train for real: tiny configurations launched with torchrun (gloo)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TINY_MODEL = {"context": 32, "layers": 2, "heads": 2, "width": 64}
TIMEOUT_S = 300

TINY_LOSSES = [
    5.561663627624512, 5.475214004516602, 5.383045673370361, 5.310467720031738,
    5.276954650878906, 5.216063499450684, 5.196136474609375, 5.141663551330566,
    5.087118148803711, 5.082169055938721, 5.057430267333984, 4.995719909667969,
]  # fmt: skip
"""The built-in trainer on TINY_MODEL and the test corpus over two ranks of 4 sequences each
(fp32, seed 0, constant learning rate), uninterrupted: the mean loss of steps 1-12. The same
at ZeRO stages 1, 2 and 3, with activations recomputed and with parameters offloaded (the same
arithmetic). A resume that lost any state leaves these values at once."""

TINY_CPU_ADAM_LOSSES = [
    5.561663627624512, 5.475214004516602, 5.383045673370361, 5.310467720031738,
    5.2769551277160645, 5.216064453125, 5.196137428283691, 5.141664028167725,
]  # fmt: skip
"""As TINY_LOSSES, with the optimizer offloaded to host memory: DeepSpeed's CPU Adam, whose
rounding differs from torch's AdamW from step 5 on."""

TINY_BF16_LOSSES = [
    5.561711311340332, 5.477822303771973, 5.383174896240234, 5.310879230499268,
    5.276649475097656, 5.216742992401123,
]  # fmt: skip
"""As TINY_LOSSES, trained in bfloat16 (ZeRO-2)."""

TINY_WARMUP_COSINE_LOSSES = [
    5.561663627624512, 5.434113502502441, 5.212131500244141, 5.103728294372559,
    5.06442928314209, 5.021193027496338,
]  # fmt: skip
"""As TINY_LOSSES (ZeRO-2), with the learning rate at 1e-3 after 2 steps of warmup, then
decaying over 3 by a cosine."""

LLAMA_LOSSES = [
    5.557129383087158, 5.293605804443359, 5.081634521484375, 5.074024677276611,
    4.811350345611572, 4.701788425445557, 4.537586212158203, 4.388882160186768,
    4.178414344787598, 4.027592182159424, 3.9216034412384033, 3.943164110183716,
    3.5997517108917236, 3.566837787628174, 3.4139671325683594, 3.2343714237213135,
]  # fmt: skip
"""examples/train_llama.py uninterrupted over two ranks (one machine of two ranks, or two
machines of one; seeded model and data), rank 0's loss at steps 1-16, as printed by
`torchrun --standalone --nproc_per_node 2 examples/train_llama.py --steps 16 ...`. A resume
that lost any state (weights, optimizer moments, schedule, data position) leaves these values
at once."""


def printed_losses(output: str) -> dict[int, float]:
    """The step losses examples/train_llama.py printed, by step (a later line wins)."""
    return {int(m[1]): float(m[2])
            for m in re.finditer(r'\{"step": (\d+), "loss": ([\d.]+)\}', output)}  # fmt: skip


@dataclass
class Launch:
    command: list[str]
    metrics: Path


def prepare(
    config: dict[str, Any],
    tmp_path: Path,
    name: str,
    *,
    nproc: int = 2,
    overrides: tuple[str, ...] = (),
    via_cli: bool = False,
) -> Launch:
    """Write `config` (with its own metrics file and work folder) and the command that trains
    it: torchrun itself, or `spotrain train` (which runs torchrun) when `via_cli`."""
    path = tmp_path / f"{name}.json"
    metrics = tmp_path / f"{name}.jsonl"
    work = str(tmp_path / f"work-{name}")
    path.write_text(json.dumps({"metrics_file": str(metrics), "work_dir": work, **config}))
    if via_cli:
        command = [sys.executable, "-m", "spotrain.cli", "train", str(path),
                   "--nproc-per-node", str(nproc)]  # fmt: skip
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", str(nproc),
                   "-m", "spotrain.trainer.train", str(path)]  # fmt: skip
    for override in overrides:
        command += ["--set", override]
    return Launch(command, metrics)


def records_of(metrics: Path) -> list[dict[str, Any]]:
    if not metrics.exists():
        return []
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def losses_of(metrics: Path) -> list[float]:
    return [record["loss"] for record in records_of(metrics) if "loss" in record]


@dataclass
class Finished:
    losses: list[float]
    output: str
    returncode: int
    records: list[dict[str, Any]]


def train(
    config: dict[str, Any], tmp_path: Path, name: str, *, env: dict[str, str] | None = None,
    nproc: int = 2, overrides: tuple[str, ...] = (), check: bool = True, via_cli: bool = False,
) -> Finished:  # fmt: skip
    """Run to completion. The launcher gets its own process group, so a failpoint's SIGKILL
    takes it and its workers, nothing else."""
    launch = prepare(config, tmp_path, name, nproc=nproc, overrides=overrides, via_cli=via_cli)
    result = subprocess.run(
        launch.command, capture_output=True, text=True, timeout=TIMEOUT_S,
        env={**os.environ, **(env or {})}, start_new_session=True,
    )  # fmt: skip
    output = result.stdout + result.stderr
    (tmp_path / f"{name}.log").write_text(output)
    if check:
        assert result.returncode == 0, output[-4000:]
    return Finished(
        losses_of(launch.metrics), output, result.returncode, records_of(launch.metrics)
    )
