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
arithmetic). Compared within GOLDEN_REL; a resume is compared bit for bit with an uninterrupted
run on the same machine."""

GOLDEN_REL = 1e-4
"""How far the goldens may be from a run on another CPU: vector units and math libraries round
differently in the last bits (an fp32 step-1 loss is 1 ulp apart on two x86 machines), and in
bfloat16 that grows to about 1.2e-5 by step 6. A wrong learning rate, a lost optimizer moment or
a batch out of place moves a loss by 1e-3 or more at once."""

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


EPOCH_LOOP_LOSSES = [
    2.471458911895752, 2.365412950515747, 2.2936580181121826, 2.279404878616333,
    2.5334010124206543, 2.621429204940796, 2.5065770149230957, 2.43398380279541,
    2.1596179008483887, 2.152266025543213, 2.5853443145751953, 2.1346418857574463,
    2.205507516860962, 2.5371360778808594, 2.309654474258423, 2.176119327545166,
    2.144465446472168, 2.2374563217163086, 2.494992971420288, 2.4219512939453125,
    2.171566963195801, 2.340758800506592, 2.026135206222534, 2.3343303203582764,
]  # fmt: skip
"""examples/epoch_loop.py uninterrupted over two ranks of one machine: rank 0's
loss at steps 1-24 (two epochs of a shuffled DataLoader with worker processes), measured on a
2-core AMD EPYC machine. Another CPU, or a rank alone on its machine (torchrun sets
OMP_NUM_THREADS=1 only for several ranks a machine), rounds differently in the last bits, so
the fleet story compares within a tolerance; a resume at the wrong batch, or without the
optimizer's state, is off by far more at once."""

EPOCH_LOOP_RUNNING = [
    0.2471458911895752, 0.4589725971221924, 0.6424411392211914, 0.8061375131607056,
    0.9788638630867006, 1.14312039727211, 1.2794660590372087, 1.3949178334130288,
    1.471387840156565, 1.5394756586952298, 1.6440625242832265, 1.6931204604306487,
    1.7443591660736801, 1.8236368572543982, 1.8722386189548006, 1.9026266898138373,
    1.9268105654796703, 1.9578751411033342, 2.0115869241350297, 2.052623361116058,
    2.0645177213240324, 2.0921418292422884, 2.0855411669403128, 2.110420082282109,
]  # fmt: skip
"""The same run's own running loss (state the script keeps itself and hands the Checkpointer)."""


def script_steps(output: str) -> dict[int, dict[str, Any]]:
    """The JSON line each step of a script prints (`{"step": N, ...}`), by step, wherever it
    is in a line (a played machine prefixes its instance id)."""
    found = {}
    for line in output.splitlines():
        start = line.find('{"step": ')
        if start >= 0:
            record = json.loads(line[start:])
            found[record["step"]] = record
    return found


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
    it: the torchrun `spotrain train` runs (`spotrain.trainer.launch`), or `spotrain train`
    itself when `via_cli`."""
    path = tmp_path / f"{name}.json"
    metrics = tmp_path / f"{name}.jsonl"
    work = str(tmp_path / f"work-{name}")
    path.write_text(json.dumps({"metrics_file": str(metrics), "work_dir": work, **config}))
    if via_cli:
        command = [sys.executable, "-m", "spotrain.cli", "train", str(path),
                   "--nproc-per-node", str(nproc)]  # fmt: skip
    else:
        command = [sys.executable, "-m", "spotrain.trainer.launch", "--standalone",
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
