"""DeepSpeed, imported so that starting a run does nothing twice and loads nothing for nothing.

`deepspeed.initialize` with ZeRO imports DeepSpeed's Muon optimizer to check whether the run's
optimizer is one it supports, and that module compiles its kernels when it is imported
(`torch.compile` at module level): that loads torch's whole compiler stack, about 2.7 s of CPU
per rank at every start and every restart after a preemption, for an optimizer most runs do
not use. With the hooks installed (`quicken_deepspeed_start`), Muon's kernels compile at their
first call instead: a run that trains with Muon compiles them on its first step, as it would
have at import.

DeepSpeed's CPU Adam (an offloaded optimizer) asks py-cpuinfo about the machine three times
at every start, once for the optimizer and twice for its op's compile flags, and py-cpuinfo
answers each time from a new interpreter it starts (about 1.1 CPU-s here); the machine does not
change while a process lives, so the hooks have py-cpuinfo ask once a process.

The hooks act only when those modules are imported; nothing is imported for them.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"
CPU_INFO_MODULE = "cpuinfo"


def load_deepspeed() -> Any:
    """The `deepspeed` module, with the start's hooks installed (`quicken_deepspeed_start`)."""
    quicken_deepspeed_start()
    import deepspeed

    return deepspeed


def quicken_deepspeed_start() -> None:
    """Have the Muon optimizer's module, whenever it is imported, compile its kernels at their
    first call, and py-cpuinfo ask about the machine once (installed once per process)."""
    if not any(isinstance(finder, _StartFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _StartFinder())


class _StartFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        hooked = _HOOKED_LOADERS.get(name)
        if hooked is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = hooked(spec.loader)
        return spec


class _HookedLoader(importlib.abc.Loader):
    """A module's own loader, with something done around its `exec_module`."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)  # type: ignore[no-any-return]


class _CompilingLater(_HookedLoader):
    """The module's own loader, run while DeepSpeed's `compiler.compile()` defers."""

    def exec_module(self, module: ModuleType) -> None:
        from deepspeed.runtime import compiler

        at_import = compiler.compile
        compiler.compile = lambda: compiled_at_first_call
        try:
            self.loader.exec_module(module)
        finally:
            compiler.compile = at_import


class _AskingOnce(_HookedLoader):
    """py-cpuinfo's package, its `get_cpu_info` (what DeepSpeed imports) answering from the
    first answer."""

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        module.get_cpu_info = asked_once(module.get_cpu_info)


_HOOKED_LOADERS: dict[str, type[_HookedLoader]] = {
    MUON_MODULE: _CompilingLater,
    CPU_INFO_MODULE: _AskingOnce,
}


def compiled_at_first_call(function: Any) -> Any:
    """`torch.compile(function)`, made when it is first called."""
    compiled = None

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal compiled
        if compiled is None:
            import torch

            compiled = torch.compile(function)
        return compiled(*args, **kwargs)

    return call


def asked_once(ask: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """`ask()`'s first answer at every call (a copy: a caller that changes it changes no other
    caller's)."""
    answer: dict[str, Any] | None = None

    @functools.wraps(ask)
    def remembered() -> dict[str, Any]:
        nonlocal answer
        if answer is None:
            answer = ask()
        return dict(answer)

    return remembered
