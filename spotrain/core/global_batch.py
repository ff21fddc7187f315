"""Whether a run's global batch survives every machine count its fleet may have.

A run keeps one global batch (sequences per optimizer step) whatever its number of machines:
on `m` machines of `ranks` GPUs each, every rank takes global_batch / (ranks x m) sequences,
in passes of at most micro_batch (gradient accumulation). That needs the division to be exact
for every count from the fleet's min_size to its max_size. Left unset, the global batch is the
one the run started with (micro_batch x its first start's ranks), so every count it may start
on must divide by every count it may resume on. Checked on the run file, before anything is
deployed (stacks/runs.py); the trainer applies it (trainer/engine.py, `TrainConfig.passes`).
"""

from __future__ import annotations

import math

DEFAULT_MICRO_BATCH = 8
"""Sequences a rank puts through the model at once when the configuration does not say."""


def global_batch_problems(
    *, micro_batch: int, global_batch: int | None, ranks: int, min_machines: int,
    max_machines: int,
) -> list[str]:  # fmt: skip
    """What stops one global batch from serving every machine count in
    [min_machines, max_machines] of `ranks` GPUs each; [] when it serves them all."""
    counts = range(max(1, min_machines), max_machines + 1)
    if not counts:
        return []  # sizes out of order: a problem of their own
    every = ranks * math.lcm(*counts)
    suggestion = every * max(1, round(micro_batch * ranks * counts[0] / every))
    fix = (f"set global_batch to a multiple of {every} (e.g. {suggestion}), or sizes whose "
           "machine counts divide one another (e.g. min_size = max_size)")  # fmt: skip
    if global_batch is not None:
        misfits = [m for m in counts if global_batch % (ranks * m)]
        if not misfits:
            return []
        return [f"global_batch {global_batch} does not split evenly over "
                f"{', '.join(str(m) for m in misfits)} machine(s) of {ranks} GPU(s) "
                f"(min_size {counts[0]} to max_size {counts[-1]}): {fix}"]  # fmt: skip
    pairs = [(n, m) for n in counts for m in counts if micro_batch * n % m]
    if not pairs:
        return []
    started, resumed = pairs[0]
    return [f"global_batch is not set, so the run keeps micro_batch x the GPUs it starts on "
            f"(started on {started} machine(s): {micro_batch * ranks * started}), which does "
            f"not split evenly over {resumed} machine(s) of {ranks} GPU(s): {fix}"]  # fmt: skip
