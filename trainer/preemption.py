"""Stopping on preemption: every rank stops at the same step.

The SIGTERM (and SIGINT) handler only sets a flag (nothing else is safe inside a signal
handler); the spot-notice watcher sets the same flag, or asks for a checkpoint on a rebalance
recommendation. Each step the ranks agree with one all-reduce MAX of their flags (and of
whether any node is still uploading), so one rank's notice acts on all of them after the same
step; the loop then takes an emergency checkpoint, publishes it and exits 0.
torchrun forwards SIGTERM to every worker within milliseconds and SIGKILLs them after its
`--shutdown-timeout`; keep that longer than a checkpoint takes to publish (`spotrain train`
sets it).

Only the ranks act on a stop. Their helper processes must go on serving them until the
emergency checkpoint is published: a DataLoader worker that dies of the SIGTERM fails the rank's
next batch first. Three layers keep the stop from them: the machine's boot unit signals its main
process only (images/spotrain-trainer.service, `KillMode=mixed`), spotrain's torchrun signals
the rank alone, not its process group (`launch.py`), and, for a stop sent to every process at
once anyway (a batch scheduler, `kill` on a process group, a service manager's default), the
DataLoader workers a rank starts, forked or spawned, ignore SIGTERM and SIGINT
(`shield_data_loader_workers`): they end with their rank, as torch's workers do when their
parent is gone.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import multiprocessing.util  # noqa: F401  (its exit hook: below)
import signal
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch


@dataclass(frozen=True)
class Agreement:
    """What every rank decided together after a step."""

    stop: bool
    checkpoint_now: bool
    uploading: bool
    """Some node is still uploading the checkpoint in flight."""


class PreemptionFlag:
    def __init__(self) -> None:
        self.reason: str | None = None
        self.checkpoint_reason: str | None = None
        self._requested_at: float | None = None

    def install(self) -> PreemptionFlag:
        shield_data_loader_workers()
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)  # Ctrl-C: stop the same careful way
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.reason = signal.Signals(signum).name
        self._requested_at = time.monotonic()

    def request(self, reason: str) -> None:
        """Ask for a stop from code (a spot interruption notice)."""
        self.reason = reason
        self._requested_at = time.monotonic()

    def seconds_since_request(self) -> float | None:
        """Since this rank was asked to stop; None if another rank was asked."""
        return None if self._requested_at is None else time.monotonic() - self._requested_at

    def request_checkpoint(self, reason: str) -> None:
        """Ask for a checkpoint after this step without stopping (a rebalance recommendation)."""
        self.checkpoint_reason = reason

    def agree(self, device: torch.device | str = "cpu", *, uploading: bool = False) -> Agreement:
        """Collective: every rank gets the same answer. `device` is where the backend reduces
        (CUDA for NCCL)."""
        import torch.distributed as dist

        flags = torch.tensor(
            [bool(self.reason), bool(self.checkpoint_reason), uploading],
            dtype=torch.int32,
            device=device,
        )
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop, checkpoint_now, any_uploading = (bool(v) for v in flags.tolist())
        if checkpoint_now:
            self.checkpoint_reason = None
        return Agreement(stop=stop, checkpoint_now=checkpoint_now, uploading=any_uploading)


def shield_data_loader_workers() -> None:
    """DataLoader worker processes (torch's and torchdata's) the rank starts from now on ignore
    SIGTERM and SIGINT, forked (Linux's default) or spawned (`multiprocessing_context=
    "spawn"`). A stop is their rank's to handle; a worker still ends when its rank does
    (torch's workers watch their parent) and with SIGKILL.

    torch sets each worker's SIGTERM handler in C at its start, overriding what the worker
    inherits; the hook that does so is wrapped so the worker then ignores the stop signals. A
    spawned worker is a fresh interpreter that inherits no such wrapping: the loaders start
    their workers in this module's loops instead (the function a worker runs is sent to it by
    name), which wrap the hook there before torch's loop calls it. Until then a worker is a
    starting interpreter (a second or more, spawned) that a stop would kill, failing its rank
    at once (torch's "DataLoader worker ... is killed by signal"), its emergency checkpoint
    lost: so the loaders start their workers with the stop signals blocked (a blocked signal
    stays blocked across fork and exec, and waits), and the worker discards what waits once it
    ignores them. The rank's own stop that arrives meanwhile waits the few milliseconds of the
    start and is then delivered. (Workers started by a forkserver are forked from that server,
    not from the rank: their start is not covered.)

    Python ends the workers still running at the rank's exit with SIGTERM (torch relies on it
    when a loop leaves its iterator unfinished, or an exception keeps it alive), then waits for
    them: shielded, they would never end. Their iterators shut them down first instead (at
    exit, as torch does for persistent workers). Idempotent."""
    _shield_worker_signal_handlers()
    for module_name, shielded in _SHIELDED_LOOPS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # torchdata is the user's choice
            continue
        if module._worker_loop is not shielded:
            _ORIGINAL_LOOPS[module_name] = module._worker_loop
            module._worker_loop = shielded
        starts = _STARTS_WORKERS[module_name]
        iterator = getattr(importlib.import_module(starts[0]), starts[1])
        if not getattr(iterator.__init__, "blocks_stop_signals", False):
            iterator.__init__ = _with_stop_signals_blocked(iterator.__init__)


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_STARTED: weakref.WeakSet[Any] = weakref.WeakSet()
"""The iterators whose workers were started shielded, while they live."""


def _shut_down_workers_left_running() -> None:
    for iterator in list(_STARTED):
        iterator._shutdown_workers()  # torch's own: its workers end of themselves, then joined


# Exit hooks run last registered first: this one before multiprocessing's (imported above),
# which would SIGTERM the workers, and before torch's, after which `_shutdown_workers` does
# nothing.
atexit.register(_shut_down_workers_left_running)


def _with_stop_signals_blocked(start: Callable[..., None]) -> Callable[..., None]:
    """`start` (an iterator's constructor, which starts its workers) run with the stop signals
    blocked in this thread, and so in every process it starts until that unblocks them."""

    @functools.wraps(start)
    def blocked(iterator: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        context = loader.multiprocessing_context
        if context is not None and context.get_start_method() != "fork":
            # Python's resource tracker, started at the first queue, unblocks both signals
            # after it starts (its own way of ignoring them): started first, it is left be.
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()
        before = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            start(iterator, loader, *args, **kwargs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
        _STARTED.add(iterator)

    blocked.blocks_stop_signals = True  # type: ignore[attr-defined]
    return blocked


def _shield_worker_signal_handlers() -> None:
    from torch.utils.data._utils import signal_handling

    current = signal_handling._set_worker_signal_handlers
    if getattr(current, "shields_stop_signals", False):
        return

    def set_worker_signal_handlers(*args: object) -> None:
        current(*args)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Started with them blocked (`_with_stop_signals_blocked`): one sent meanwhile waited,
        # and is discarded now that they are ignored.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)

    set_worker_signal_handlers.shields_stop_signals = True  # type: ignore[attr-defined]
    signal_handling._set_worker_signal_handlers = set_worker_signal_handlers


_TORCH_LOADER, _TORCHDATA_LOADER = (
    "torch.utils.data._utils.worker",  # DataLoader reads `_utils.worker._worker_loop`
    "torchdata.stateful_dataloader.stateful_dataloader",  # StatefulDataLoader, its own import
)
_ORIGINAL_LOOPS: dict[str, Callable[..., None]] = {}
"""The loaders' own worker loops, in a process that put the shielded ones in their place."""


def _original_loop(module_name: str) -> Callable[..., None]:
    """The loader's own loop: in a spawned worker, the module's (nothing replaced it there)."""
    current = importlib.import_module(module_name)._worker_loop
    return _ORIGINAL_LOOPS[module_name] if current is _SHIELDED_LOOPS[module_name] else current


def _torch_worker_loop(*args: Any, **kwargs: Any) -> None:
    """What a DataLoader worker runs: torch's loop, its stop signals ignored."""
    _shield_worker_signal_handlers()
    _original_loop(_TORCH_LOADER)(*args, **kwargs)


def _torchdata_worker_loop(*args: Any, **kwargs: Any) -> None:
    """What a StatefulDataLoader worker runs: torchdata's loop, its stop signals ignored."""
    _shield_worker_signal_handlers()
    _original_loop(_TORCHDATA_LOADER)(*args, **kwargs)


_SHIELDED_LOOPS: dict[str, Callable[..., None]] = {
    _TORCH_LOADER: _torch_worker_loop,
    _TORCHDATA_LOADER: _torchdata_worker_loop,
}
_STARTS_WORKERS: dict[str, tuple[str, str]] = {
    _TORCH_LOADER: ("torch.utils.data.dataloader", "_MultiProcessingDataLoaderIter"),
    _TORCHDATA_LOADER: (_TORCHDATA_LOADER, "_StatefulMultiProcessingDataLoaderIter"),
}
"""Where each loader starts its workers: its multi-process iterator, in its constructor."""
