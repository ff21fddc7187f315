"""Synthesis time of all environments, in a fresh process as `spotrain synth` runs it, with
the seam's lazy provider loading vs importing the whole provider package first.

    .venv/bin/python bench/synth.py            # writes bench/synth.md
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 3
CODE = """
{preload}
import pathlib, sys
from spotrain.tools import deploy
deploy.synth(pathlib.Path(sys.argv[1]))
"""


def timed(preload: str) -> tuple[float, int]:
    """Seconds to synthesize every environment, and how many stacks that made."""
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", CODE.format(preload=preload), f"{out}/cdktf.out"],
            check=True,
            capture_output=True,
        )
        took = time.perf_counter() - started
        return took, len(list(Path(out, "cdktf.out", "stacks").iterdir()))


def main() -> None:
    kinds = {
        "lazy (spotrain.cdk seam)": "",
        "whole provider package": "import cdktf_cdktf_provider_aws",
    }
    times: dict[str, list[float]] = {label: [] for label in kinds}
    stacks = 0
    for _ in range(RUNS):  # alternate the kinds so machine noise hits both alike
        for label, preload in kinds.items():
            took, stacks = timed(preload)
            times[label].append(took)
    rows = [(label, statistics.median(t), min(t), max(t)) for label, t in times.items()]
    lazy = rows[0][1]
    lines = [
        f"# Synthesis time: all environments and their runs ({stacks} stacks), fresh process",
        "",
        f"Command: `.venv/bin/python bench/synth.py` ({RUNS} runs of each kind, alternating)",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}",
        "",
        "| provider loading | median s | min s | max s | ratio to lazy |",
        "|---|---|---|---|---|",
        *[
            f"| {label} | {median:.1f} | {low:.1f} | {high:.1f} | {median / lazy:.1f}x |"
            for label, median, low, high in rows
        ],
        "",
        "Target: under 15 s for every environment.",
    ]
    path = Path(__file__).with_name("synth.md")
    path.write_text("\n".join(lines) + "\n")
    print(path.read_text())


if __name__ == "__main__":
    main()
