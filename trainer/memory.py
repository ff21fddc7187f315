"""Fitting a larger model on fewer GPUs with DeepSpeed's own means: activation checkpointing
(a block's activations are recomputed in the backward pass instead of kept) and ZeRO offload
(the optimizer's state and, at stage 3, the parameters kept in host memory or on NVMe, the
optimizer step taken by DeepSpeed's CPU Adam).

The training configuration names the options (`activation_checkpointing`, `offload_optimizer`,
`offload_params`) and checks their values with its others (config.py); this module says what
a machine lacks for them before the run starts, and turns them into DeepSpeed's configuration,
the model's recompute function and the optimizer.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotrain.trainer.config import MemoryOptions

if TYPE_CHECKING:  # what checks a run before it starts (preflight.py) imports no PyTorch
    import torch

    from spotrain.trainer.model import Recompute

ADAMW_WEIGHT_DECAY = 0.01
"""torch.optim.AdamW's default, which DeepSpeed's CPU Adam (default 0) is given too: a run
means the same optimizer wherever its state lives."""


def machine_problems(options: MemoryOptions) -> list[str]:
    """What this machine lacks for the offload options: DeepSpeed compiles CPU Adam (optimizer
    offload) and its async I/O op (parameters on NVMe) at first use, with a C++ compiler and
    ninja, the async I/O op against libaio."""
    compiles = []
    if options.offload_optimizer != "none":
        compiles.append(f"offload_optimizer = {options.offload_optimizer!r} (CPU Adam)")
    if options.offload_params == "nvme":
        compiles.append('offload_params = "nvme" (async I/O)')
    if not compiles:
        return []
    problems = []
    compiler = os.environ.get("CXX", "c++")  # what torch's extension builder runs
    missing = [tool for tool, found in ((compiler, shutil.which(compiler)),
                                        ("ninja", _ninja_on_path())) if not found]  # fmt: skip
    if missing:
        problems.append(
            f"{' and '.join(compiles)} needs DeepSpeed to compile its op here, and this machine "
            f"has no {' and no '.join(missing)} on PATH: install them (the trainer image has "
            "both), or leave the option off"
        )
    if options.offload_params == "nvme":
        from deepspeed.ops.op_builder import AsyncIOBuilder

        if not AsyncIOBuilder().is_compatible(verbose=False):
            problems.append(
                'offload_params = "nvme" needs DeepSpeed\'s async I/O op, which needs libaio: '
                'install libaio-dev (the trainer image has it), or offload to "cpu"'
            )
    return problems


def _ninja_on_path() -> bool:
    """Whether torch's extension builder finds ninja. The ninja DeepSpeed requires (a Python
    package) sits beside this interpreter, on PATH only in an activated environment: it is put
    there, as activating would."""
    from torch.utils.cpp_extension import is_ninja_available

    if is_ninja_available():
        return True
    here = Path(sys.executable).parent
    if not (here / "ninja").is_file():
        return False
    os.environ["PATH"] = f"{here}{os.pathsep}{os.environ.get('PATH', '')}"
    return bool(is_ninja_available())


def offload_folder(work_dir: str) -> Path:
    """Where NVMe offload keeps its files: the work disk, the machine's fast local NVMe."""
    return Path(work_dir) / "offload"


def zero_section(options: MemoryOptions) -> dict[str, Any]:
    """DeepSpeed's `zero_optimization` section for the stage and offload options."""
    section: dict[str, Any] = {"stage": options.zero_stage}
    for key, device in (("offload_optimizer", options.offload_optimizer),
                        ("offload_param", options.offload_params)):  # fmt: skip
        if device == "none":
            continue
        section[key] = {"device": device}
        if device == "nvme":
            folder = offload_folder(options.work_dir) / key
            folder.mkdir(parents=True, exist_ok=True)
            section[key]["nvme_path"] = str(folder)
    return section


def make_optimizer(parameters: Iterable[torch.nn.Parameter], options: MemoryOptions, *,
                   learning_rate: float) -> torch.optim.Optimizer:  # fmt: skip
    """AdamW: torch's on the GPUs, DeepSpeed's CPU Adam (AdamW mode, same hyperparameters)
    where ZeRO offloads the optimizer, since ZeRO then steps it on the host, where DeepSpeed's
    vectorised kernel is several times faster than torch's."""
    import torch

    if options.offload_optimizer == "none":
        return torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=ADAMW_WEIGHT_DECAY)
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam(parameters, lr=learning_rate, weight_decay=ADAMW_WEIGHT_DECAY,
                            adamw_mode=True)  # fmt: skip


def recompute_function(options: MemoryOptions) -> Recompute | None:
    """How the model runs each block: through DeepSpeed's checkpoint function (its defaults:
    no partitioning of activations, which is for model parallelism), or None to keep every
    block's activations. Call after the process group is up."""
    if not options.activation_checkpointing:
        return None
    import deepspeed

    deepspeed.checkpointing.configure(None)
    return deepspeed.checkpointing.checkpoint


def describe(options: MemoryOptions) -> str | None:
    """One line saying which memory options a run trains with; None when it uses none."""
    parts = []
    if options.activation_checkpointing:
        parts.append("activations recomputed in the backward pass")
    if options.offload_optimizer == "cpu":
        parts.append("optimizer state in host memory (CPU Adam)")
    if options.offload_params != "none":
        where = "host memory" if options.offload_params == "cpu" else "NVMe files"
        parts.append(f"parameters in {where}")
    return "memory: " + ", ".join(parts) if parts else None
