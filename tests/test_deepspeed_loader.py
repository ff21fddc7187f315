"""Starting a run loads no compiler it does not use and asks nothing twice: DeepSpeed's Muon
optimizer, which ZeRO's check imports, compiles its kernels at their first call instead of at
import; py-cpuinfo, which DeepSpeed's CPU Adam asks three times a start, asks once."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch

from spotrain.trainer.deepspeed_loader import compiled_at_first_call

LOADED = """
import sys
from spotrain.trainer.deepspeed_loader import quicken_deepspeed_start
quicken_deepspeed_start()
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


ASKED = """
import subprocess, sys
from spotrain.trainer.deepspeed_loader import quicken_deepspeed_start
quicken_deepspeed_start()
started = []
class Counted(subprocess.Popen):
    def __init__(self, command, *args, **kwargs):
        started.extend(command[1:2] if "--json" in command else [])  # not its `uname`
        super().__init__(command, *args, **kwargs)
subprocess.Popen = Counted  # py-cpuinfo asks a new interpreter of its own
from deepspeed.ops.op_builder import CPUAdamBuilder
import cpuinfo
builder = CPUAdamBuilder()
flags = builder.cpu_arch(), builder.simd_width()  # the op's compile flags, as its load takes them
answer = cpuinfo.get_cpu_info()  # as the optimizer asks
answer["arch"] = "changed by one caller"
again = cpuinfo.get_cpu_info()
print(len(started), again == cpuinfo.cpuinfo.get_cpu_info(), again["arch"] != answer["arch"])
print(flags == (builder.cpu_arch(), builder.simd_width()), len(started))
"""


def test_py_cpuinfo_asks_once_a_process_however_often_deepspeed_asks() -> None:
    done = subprocess.run([sys.executable, "-c", ASKED], capture_output=True, text=True,
                          check=True, timeout=120)  # fmt: skip
    # One interpreter started for three questions (and one more for the unhooked comparison);
    # each caller gets its own copy of the one answer. (DeepSpeed's log lines begin with "[".)
    said = [line for line in done.stdout.splitlines() if not line.startswith("[")]
    assert said == ["1 True True", "True 2"], done.stdout + done.stderr
