"""CPU of a training start whose ranks are forks of torchrun's agent, against new interpreters.

    .venv/bin/python bench/rank_start.py   # writes bench/rank_start.md (about a minute)

`spotrain train` runs torchrun through `spotrain.trainer.launch`, whose ranks start as forks of
the agent (`trainer/forked_rank.py`) instead of new interpreters that import PyTorch again;
`SPOTRAIN_RANKS_AS_NEW_INTERPRETERS=1` starts them as torch does. Here the same launch both
ways, alternating: one machine of one and of two ranks, each rank joining a gloo group and
taking three optimizer steps of a small model (what every training start pays before its data:
PyTorch, its process group, the optimizer's first step). CPU is the launch's and every process
it waited for.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

from terraform import measured  # bench/terraform.py: `python bench/x.py` imports beside it

from spotrain.trainer.launch import RANKS_AS_NEW_INTERPRETERS

RUNS = 3
RANK = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
model = torch.nn.Linear(64, 64)
optimizer = torch.optim.AdamW(model.parameters())
for _ in range(3):
    model(torch.randn(8, 64)).square().mean().backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
"""
WAYS = {"forks of the agent": "0", "new interpreters": "1"}


def rows() -> list[tuple[int, dict[str, tuple[float, float, float]]]]:
    """Per ranks a machine: each way's median CPU-seconds, wall seconds and peak memory (MB)."""
    found = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "rank_start_probe.py").write_text(RANK)
        for ranks in (1, 2):
            command = [sys.executable, "-m", "spotrain.trainer.launch", "--standalone",
                       "--nproc-per-node", str(ranks), "-m", "rank_start_probe"]  # fmt: skip
            runs: dict[str, list[tuple[float, float, float]]] = {way: [] for way in WAYS}
            for _ in range(RUNS):  # alternate, so machine noise hits both alike
                for way, switch in WAYS.items():
                    env = {**os.environ, RANKS_AS_NEW_INTERPRETERS: switch}
                    runs[way].append(measured(command, folder, env))
            found.append((ranks, {way: tuple(statistics.median(m[i] for m in runs[way])
                                             for i in range(3)) for way in WAYS}))  # fmt: skip
    return found  # type: ignore[return-value]


def main() -> None:
    lines = [
        "# A training start's ranks: forks of torchrun's agent, or new interpreters",
        "",
        "Command: `.venv/bin/python bench/rank_start.py`",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}",
        "",
        f"`spotrain.trainer.launch --standalone` over ranks that each join a gloo group and take "
        f"three optimizer steps (median of {RUNS} runs of each, alternating):",
        "",
        "| ranks | CPU-s forked | CPU-s new interpreters | ratio | wall s forked | "
        "wall s new interpreters | peak MB of a process, forked | new interpreters |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ranks, ways in rows():
        (cpu, wall, peak), (cpu_new, wall_new, peak_new) = ways.values()
        lines.append(f"| {ranks} | {cpu:.2f} | {cpu_new:.2f} | {cpu / cpu_new:.2f}x | "
                     f"{wall:.2f} | {wall_new:.2f} | {peak:.0f} | {peak_new:.0f} |")  # fmt: skip
    lines += ["", "Target: two ranks forked at most 0.75x the CPU of new interpreters."]
    path = Path(__file__).with_name("rank_start.md")
    path.write_text("\n".join(lines) + "\n")
    print(path.read_text())


if __name__ == "__main__":
    main()
