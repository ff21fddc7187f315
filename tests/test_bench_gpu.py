"""The GPU benchmark stays ready for the first GPU: without CUDA it says so at once and
measures nothing; its smoke run takes every step of the benchmark, tiny and on the CPU, and
reports figures that hang together."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "gpu.py"


def test_without_cuda_it_says_so_and_measures_nothing() -> None:
    report = ROOT / "bench" / "gpu.md"
    before = report.read_bytes() if report.exists() else None
    done = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "no CUDA device on this machine" in done.stdout and "nothing was measured" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert (report.read_bytes() if report.exists() else None) == before


def test_the_flash_line_names_the_forward_kernel_whatever_costs_most() -> None:
    """On a busy CPU the flash kernel's backward or its autograd node can take more of the
    step than the kernel: the line still names the forward kernel (the smoke run once named
    the node). On a GPU only kernels with GPU time count."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_bench", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    spec.loader.exec_module(bench)

    def event(name: str, device_ms: float = 0.0) -> dict[str, object]:
        return {"name": name, "device_ms": device_ms}

    by_cost = [event("ScaledDotProductFlashAttentionForCpuBackward0"),
               event("aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
               event("aten::_scaled_dot_product_flash_attention_for_cpu"),
               event("aten::scaled_dot_product_attention")]  # fmt: skip
    assert "`aten::_scaled_dot_product_flash_attention_for_cpu`." in bench.flash_line(
        by_cost, on_gpu=False)  # fmt: skip
    on_gpu = [event("flash_bwd_kernel", 3.0), event("flash_fwd_kernel", 1.0),
              event("aten::_flash_attention_forward")]  # fmt: skip
    assert "`flash_fwd_kernel`." in bench.flash_line(on_gpu, on_gpu=True)
    assert "No flash attention kernel ran" in bench.flash_line(on_gpu[2:], on_gpu=True)


@pytest.mark.integration
@pytest.mark.cpu_adam
def test_smoke_run_takes_every_step_and_reports_figures_that_hang_together(
    tmp_path: Path,
) -> None:
    out = tmp_path / "gpu.md"
    trace = tmp_path / "trace.json"
    done = subprocess.run([sys.executable, str(BENCH), "--smoke", str(out), "--work",
                           str(tmp_path), "--trace", str(trace)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    text = out.read_text()
    for heading in ("## Throughput", "## Attention", "## Checkpoint stall",
                    "## Preemption and restore", "## Memory options"):  # fmt: skip
        assert heading in text
    assert "**The flash attention kernel ran**: `aten::_scaled_dot_product_flash_attention" in text
    assert any(
        "attention" in e.get("name", "") for e in json.loads(trace.read_text())["traceEvents"]
    )
    figures = json.loads(out.with_suffix(".json").read_text())
    bare, trained, restored = figures["bare"], figures["trainer"], figures["restore"]
    for name in ("plain", "activation checkpointing", "optimizer in host memory"):
        assert bare[name]["tokens_per_s"] > 0
    assert trained["tokens_per_s_median"] > 0
    # Every timed step is kept, each saying whether a checkpoint was publishing as it began:
    # the first checkpoint's publish overlaps steps (the benchmark waits for it to land).
    kept = trained["timed_steps"]
    assert [s["step"] for s in kept] == list(range(kept[0]["step"], kept[-1]["step"] + 1))
    assert trained["publishing"]["steps"] == sum(s["publishing"] for s in kept) > 0
    assert trained["quiet"]["steps"] + trained["publishing"]["steps"] == len(kept)
    assert "begun while one published in the background" in text
    # The first checkpoint's whole cost in training time: the steps from its save to the first
    # begun after its publish, their wall time split into the steps' own and the time between.
    window = trained["first_checkpoint"]
    assert window["steps"] == window["last"] - window["saved"] > 0
    assert 0 < window["in_steps_s"] < window["wall_s"]
    assert window["cost_s"] == pytest.approx(
        window["wall_s"] - window["steps"] * window["quiet_gap_s"]
    )
    assert "What the first checkpoint cost the training in all" in text
    # One state, saved three ways: spotrain's checkpoint and DeepSpeed's hold the same tensors
    # (spotrain's adds each rank's random state and DeepSpeed's recovery scripts).
    assert 0.9 < trained["checkpoint_bytes"] / bare["deepspeed_save"]["bytes"] < 1.2
    assert trained["stall_s"] > 0 and 0 <= bare["pinned_copy_s"] < bare["deepspeed_save"]["stall_s"]
    # The emergency checkpoint is the one the next start restores.
    assert restored["step"] == trained["stopped_after"] > 0
    assert trained["notice_to_published_s"] < 60
    assert list(tmp_path.glob("spotrain-gpu-bench-*")) == []  # its scratch folder is gone
