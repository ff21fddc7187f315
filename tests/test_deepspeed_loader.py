"""Starting a run loads no compiler it does not use: DeepSpeed's Muon optimizer, which ZeRO's
check imports, compiles its kernels at their first call instead of at import."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch

from spotrain.trainer.deepspeed_loader import compiled_at_first_call

LOADED = """
import sys
from spotrain.trainer.deepspeed_loader import defer_muon_compile
defer_muon_compile()
print("nothing imported" if "deepspeed" not in sys.modules else "deepspeed imported")
from deepspeed.runtime.zero.muon import muon_optimizer, original_muon  # as ZeRO's check does
from deepspeed.runtime import compiler
print("compiler" if "torch._inductor.compile_fx" in sys.modules else "no compiler")
kernel = original_muon.zeropower_via_newtonschulz5
print(kernel.__wrapped__.__name__, muon_optimizer.MuonWithAuxAdam.__name__)
print("restored" if compiler.compile() is __import__("torch").compile else compiler.compile())
"""


def test_deepspeeds_muon_is_importable_without_loading_the_compiler() -> None:
    done = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True,
                          check=True, timeout=120)  # fmt: skip
    lines = done.stdout.splitlines()
    assert lines[0] == "nothing imported" and lines[-3:] == [
        "no compiler", "zeropower_via_newtonschulz5 MuonWithAuxAdam", "restored"
    ], done.stdout + done.stderr  # fmt: skip


def test_a_deferred_kernel_is_compiled_once_at_its_first_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[Any] = []

    def compile_(function: Any) -> Any:
        made.append(function)
        return lambda *args: ("compiled", function(*args))

    monkeypatch.setattr(torch, "compile", compile_)
    kernel = compiled_at_first_call(lambda x: x + 1)
    assert made == []  # nothing compiled at import
    assert kernel(1) == ("compiled", 2) and kernel(2) == ("compiled", 3)
    assert len(made) == 1
