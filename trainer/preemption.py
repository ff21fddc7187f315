"""Stopping on preemption: every rank stops at the same step.

The SIGTERM handler only sets a flag (nothing else is safe inside a signal handler). Each step
the ranks agree with an all-reduce MAX of their flags, so one rank's notice stops all of them
after the same step; the loop then takes an emergency checkpoint, publishes it and exits 0.
torchrun forwards SIGTERM to every worker within milliseconds and SIGKILLs them after its
`--shutdown-timeout`; keep that longer than a checkpoint takes to publish.
"""

from __future__ import annotations

import signal
from types import FrameType

import torch


class PreemptionFlag:
    def __init__(self) -> None:
        self.reason: str | None = None

    def install(self) -> PreemptionFlag:
        signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.reason = signal.Signals(signum).name

    def request(self, reason: str) -> None:
        """Ask for a stop from code (e.g. a spot interruption notice)."""
        self.reason = reason

    def agreed(self, device: torch.device | str = "cpu") -> bool:
        """Collective: True on every rank once any rank was asked to stop. `device` is where
        the backend reduces (CUDA for NCCL)."""
        import torch.distributed as dist

        flag = torch.tensor([1 if self.reason else 0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
