"""DeepSpeed, imported so that starting a run does not load torch's compiler for nothing.

`deepspeed.initialize` with ZeRO imports DeepSpeed's Muon optimizer to check whether the run's
optimizer is one it supports, and that module compiles its kernels when it is imported
(`torch.compile` at module level): that loads torch's whole compiler stack, about 2.7 s of CPU
per rank at every start and every restart after a preemption, for an optimizer most runs do
not use. Loaded here, Muon's kernels compile at their first call instead: a run that trains
with Muon compiles them on its first step, as it would have at import.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"


def load_deepspeed() -> Any:
    """The `deepspeed` module, its Muon optimizer imported with compiling deferred."""
    import deepspeed
    from deepspeed.runtime import compiler

    if MUON_MODULE not in sys.modules:
        at_import = compiler.compile
        compiler.compile = lambda: compiled_at_first_call
        try:
            importlib.import_module(MUON_MODULE)
        except ImportError:  # as DeepSpeed's check does: a build without Muon supports less
            pass
        finally:
            compiler.compile = at_import
    return deepspeed


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
