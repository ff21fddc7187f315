"""Where a training process sits and what it says: its rank and machine (`Place`), the process
group for this machine (`init_distributed`), the random state every rank saves and restores,
and its messages. Used by the training loop, the `Checkpointer` and users' own loops."""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

Say = Callable[[str], None]


OnEvent = Callable[..., None]


def say(message: str) -> None:
    print(f"[spotrain] {message}", flush=True)


@dataclass(frozen=True)
class Place:
    """Where this process sits: one leader per machine fetches and watches for spot notices."""

    rank: int
    world: int
    leader: bool

    @classmethod
    def here(cls) -> Place:
        import torch.distributed as dist

        rank = dist.get_rank()
        return cls(rank, dist.get_world_size(), int(os.environ.get("LOCAL_RANK", rank)) == 0)


def init_distributed() -> None:
    """`deepspeed.init_distributed` for this machine: NCCL on GPUs; on CPUs gloo, and without
    the shared-memory all-reduce DeepSpeed would otherwise JIT-compile on first use (minutes)."""
    import deepspeed
    import deepspeed.comm.torch  # the module (sys.modules), not torch

    if not torch.cuda.is_available():
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # type: ignore[attr-defined]
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None:
        torch.cuda.set_rng_state_all(state["cuda"])


def ranks_per_machine() -> int:
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def broadcast_from_rank0(values: torch.Tensor) -> None:
    import torch.distributed as dist

    device = (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    )
    on_device = values.to(device)
    dist.broadcast(on_device, src=0)
    values.copy_(on_device.cpu())
