"""DeepSpeed, imported so that starting a run does not load torch's compiler for nothing.

`deepspeed.initialize` with ZeRO imports DeepSpeed's Muon optimizer to check whether the run's
optimizer is one it supports, and that module compiles its kernels when it is imported
(`torch.compile` at module level): that loads torch's whole compiler stack, about 2.7 s of CPU
per rank at every start and every restart after a preemption, for an optimizer most runs do
not use. With `defer_muon_compile` installed, Muon's kernels compile at their first call
instead: a run that trains with Muon compiles them on its first step, as it would have at
import. The hook acts only when that module is imported; nothing is imported for it.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"


def load_deepspeed() -> Any:
    """The `deepspeed` module, with Muon's compiling deferred (`defer_muon_compile`)."""
    defer_muon_compile()
    import deepspeed

    return deepspeed


def defer_muon_compile() -> None:
    """Have the Muon optimizer's module, whenever it is imported, compile its kernels at their
    first call (installed once per process)."""
    if not any(isinstance(finder, _MuonFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MuonFinder())


class _MuonFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != MUON_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _CompilingLater(spec.loader)
        return spec


class _CompilingLater(importlib.abc.Loader):
    """The module's own loader, run while DeepSpeed's `compiler.compile()` defers."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        from deepspeed.runtime import compiler

        at_import = compiler.compile
        compiler.compile = lambda: compiled_at_first_call
        try:
            self.loader.exec_module(module)
        finally:
            compiler.compile = at_import


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
