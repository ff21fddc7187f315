"""The GPU benchmark: what the trainer and its checkpoints cost on one GPU, each figure beside
the figure it is judged by, measured in one run.

    python bench/gpu.py                   # on a CUDA machine: writes bench/gpu.md (and .json)
    python bench/gpu.py --smoke OUT.md    # the same steps, tiny, on the CPU (the tests' check)

On a machine without CUDA (and without --smoke) it says so and exits at once, measuring
nothing. It needs torch with CUDA, DeepSpeed and spotrain itself (the training extra; boto3
and the rest are not imported). On a GPU machine that has torch but cannot reach a package
index, bring DeepSpeed and the requirements such images often lack, pinned as
constraints.txt pins them, and install them and spotrain without dependencies:

    pip download --no-deps -d dist deepspeed==0.19.8           # a source distribution
    pip download --no-deps -d dist --only-binary=:all: --python-version X.Y \
        --platform manylinux_2_17_x86_64 hjson==3.1.0 pydantic==2.14.3 \
        pydantic_core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5
    # on the GPU machine:
    DS_BUILD_OPS=0 pip install --no-deps --no-build-isolation dist/*
    pip install --no-deps --no-build-isolation --ignore-requires-python -e .

(`--ignore-requires-python`: such images often carry a newer Python than the pinned one; the
benchmark ran on Python 3.12 with torch 2.11, whose torchrun has no `--shutdown-timeout`, so the
launcher makes that the least time every stop waits instead.)

Sized to finish in under 8 minutes on one H100 (an estimate from the model's FLOPs and its
checkpoint's size; the report records what it took): a ~1.0B-parameter GPT (20 layers, width
2048, context 2048) in bf16 on ZeRO-2, one rank, checkpoints to a `file://` store on the
fastest storage with room (memory-backed /dev/shm when it has room; `--work` chooses another:
it needs three checkpoints' worth, ~50 GB).

Measured, side by side:
- throughput: the built-in trainer (`spotrain train`: data from the token file, the loss
  all-reduced, the checkpointer's per-step agreement, checkpoints in the background) against a
  bare DeepSpeed loop over the same model and DeepSpeed configuration (`build_engine`, the
  trainer's own), in tokens/s and model FLOPs utilisation, of the datasheet's and of a bf16
  matrix product measured here;
- attention: the kernels one training step ran (torch profiler), to show the flash kernel;
- the checkpoint stall: the trainer's (a copy into warm host buffers, the rest in the
  background) against DeepSpeed's own synchronous `save_checkpoint` of the same state and a
  pinned device-to-host copy of as many bytes in one piece (the floor);
- a spot notice (from a local metadata service) to the emergency checkpoint published, and the
  restore of that checkpoint (fetch and verify, then DeepSpeed's load);
- the memory options (activation checkpointing, the optimizer offloaded to host memory):
  tokens/s and peak GPU memory against the plain configuration.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "bench" / "gpu.md"


@dataclass(frozen=True)
class Plan:
    """How big and how long: the GPU's plan, or the smoke check's."""

    name: str
    model: dict[str, int]
    micro_batch: int
    bf16: bool
    warmup_steps: int
    timed_steps: int
    """Steps the bare loop times (after warmup); the trainer trains as many before the notice."""
    offload_steps: int
    """Steps timed with the optimizer offloaded (each steps on the host: slow)."""
    corpus_tokens: int


GPU_PLAN = Plan(
    name="gpu",
    model={"context": 2048, "layers": 20, "heads": 16, "width": 2048},
    micro_batch=4, bf16=True, warmup_steps=3, timed_steps=20, offload_steps=4,
    corpus_tokens=4_000_000,
)  # fmt: skip
SMOKE_PLAN = Plan(
    name="smoke",
    model={"context": 32, "layers": 2, "heads": 2, "width": 64},
    micro_batch=2, bf16=False, warmup_steps=1, timed_steps=4, offload_steps=2,
    corpus_tokens=50_000,
)  # fmt: skip

PLANS = {plan.name: plan for plan in (GPU_PLAN, SMOKE_PLAN)}

ATTENTION_WORDS = ("flash", "attention", "fmha", "sdpa", "attn")


def say(message: str) -> None:
    print(f"[bench] {message}", flush=True)


# ---------------------------------------------------------------------------- the parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--smoke", type=Path, metavar="OUT.md",
        help="tiny and on the CPU, reported to OUT.md: checks that the script runs",
    )  # fmt: skip
    parser.add_argument("--work", type=Path, help="folder for the store and the checkpoints")
    parser.add_argument("--trace", type=Path, metavar="TRACE.json",
                        help="keep one training step's profiler trace there")  # fmt: skip
    parser.add_argument("--phase", choices=["bare", "memory"], help=argparse.SUPPRESS)
    parser.add_argument("--option", choices=list(MEMORY_OPTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--plan", choices=list(PLANS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase == "bare":
        return bare_phase(args.config, args.result, PLANS[args.plan], args.trace)
    if args.phase == "memory":
        return memory_option_phase(args.config, args.result, PLANS[args.plan], args.option)
    try:
        import torch
    except ImportError:
        print("bench/gpu.py needs torch and DeepSpeed: install the training extra first "
              "(README, \"Two commands\")", file=sys.stderr)  # fmt: skip
        return 2
    if args.smoke is None and not torch.cuda.is_available():
        print("no CUDA device on this machine: bench/gpu.py measures a GPU, so nothing was "
              f"measured ({REPORT.relative_to(ROOT)} keeps the last GPU's figures). Run it on "
              "a GPU machine; --smoke runs its steps tiny on the CPU.")  # fmt: skip
        return 0
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        print("bench/gpu.py needs DeepSpeed: install the training extra (README, \"Two "
              "commands\"; DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.19.8)",
              file=sys.stderr)  # fmt: skip
        return 2
    plan = SMOKE_PLAN if args.smoke else GPU_PLAN
    began = time.perf_counter()
    with _work_folder(args.work, plan) as work:
        results = measure(plan, work, args.trace)
    results["total_s"] = time.perf_counter() - began
    out = args.smoke or REPORT
    out.write_text(report(results, plan, smoke=bool(args.smoke)))
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    say(f"wrote {out} ({results['total_s']:.0f} s)")
    return 0


class _work_folder:
    """A scratch folder with room for the checkpoints, removed afterwards."""

    def __init__(self, given: Path | None, plan: Plan) -> None:
        self.given, self.plan = given, plan

    def __enter__(self) -> Path:
        # The store's two checkpoints (one on schedule, the emergency one) and a restore's copy.
        needed = 3 * checkpoint_bytes_estimate(self.plan)
        candidates = [self.given] if self.given else [Path("/dev/shm"), Path(tempfile.gettempdir())]
        for base in candidates:
            if base.is_dir() and shutil.disk_usage(base).free > needed * 1.2:
                self.path = Path(tempfile.mkdtemp(prefix="spotrain-gpu-bench-", dir=base))
                return self.path
        raise SystemExit(
            f"no folder with {needed * 1.2 / 1e9:.0f} GB free among "
            f"{', '.join(map(str, candidates))}: give --work a folder with room"
        )

    def __exit__(self, *_: Any) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def parameters(model: dict[str, int], vocab: int = 256) -> int:
    """The GPT's parameters (tied embeddings counted once), counted on the model itself, built
    on the meta device (no memory); byte tokens, as the benchmark's corpus has."""
    import torch

    from spotrain.trainer.model import GPT, GPTConfig

    with torch.device("meta"):
        built = GPT(GPTConfig(vocab_size=vocab, **model))
    return sum(p.numel() for p in built.parameters())


def flops_per_token(model: dict[str, int]) -> float:
    """Model FLOPs per trained token: 6 per parameter (forward and backward) plus causal
    attention's scores and weighted sum, 12 * layers * width * context (PaLM's count)."""
    return 6 * parameters(model) + 12 * model["layers"] * model["width"] * model["context"]


def checkpoint_bytes_estimate(plan: Plan) -> int:
    """ZeRO's checkpoint of the model: weights (2 or 4 bytes) and fp32 weights and moments."""
    return parameters(plan.model) * ((2 if plan.bf16 else 4) + 12)


def measure(plan: Plan, work: Path, trace: Path | None = None) -> dict[str, Any]:
    from spotrain.trainer.data import synthetic_corpus, write_token_file

    corpus = write_token_file(work / "corpus", synthetic_corpus(plan.corpus_tokens))
    config = {
        "run": "bench", "data": str(corpus), "store": f"file://{work / 'store'}",
        "work_dir": str(work / "work"), "steps": 100_000, "micro_batch": plan.micro_batch,
        "bf16": plan.bf16, "zero_stage": 2, "model": plan.model, "log_every": 1,
        "checkpoint_every": plan.warmup_steps + plan.timed_steps // 2,
    }  # fmt: skip
    say("bare DeepSpeed loop, attention kernels, DeepSpeed's save, the pinned copy")
    result_path = work / "bare.json"
    keep = ["--trace", str(trace.resolve())] if trace else []
    _run([sys.executable, str(Path(__file__).resolve()), "--phase", "bare",
          "--plan", plan.name,
          "--config", str(_config_file(work, "bare", config)), "--result", str(result_path),
          *keep])  # fmt: skip
    bare = json.loads(result_path.read_text())
    options_config = _config_file(work, "memory-option", config)
    for option in MEMORY_OPTIONS:
        say(f"memory option: {option}")
        option_path = work / "option.json"
        _run([sys.executable, str(Path(__file__).resolve()), "--phase", "memory",
              "--option", option, "--plan", plan.name, "--config", str(options_config),
              "--result", str(option_path)])  # fmt: skip
        bare[option] = json.loads(option_path.read_text())
    say(f"bare loop figures: {json.dumps(bare)}")  # kept in the log should a later phase fail
    say("the built-in trainer: throughput, a checkpoint, a spot notice")
    trained = trainer_phase(config, work, plan)
    say(f"trainer figures: {json.dumps(trained)}")
    say("restoring the emergency checkpoint")
    restored = restore_phase(config, work, trained["stopped_after"])
    return {"bare": bare, "trainer": trained, "restore": restored,
            "machine": machine_description()}  # fmt: skip


def _config_file(work: Path, phase: str, config: dict[str, Any]) -> Path:
    """The training configuration one phase trains with."""
    path = work / f"{phase}.json"
    path.write_text(json.dumps(config))
    return path


def _run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(command[:4])} ... failed:\n{(done.stdout + done.stderr)[-6000:]}"
        )
    return done.stdout + done.stderr


def _train_command(path: Path) -> list[str]:
    return [sys.executable, "-m", "spotrain.cli", "train", str(path), "--nproc-per-node", "1"]


def trainer_phase(config: dict[str, Any], work: Path, plan: Plan) -> dict[str, Any]:
    """`spotrain train` until one checkpoint is published and the timed steps are done, then
    a spot interruption notice: the emergency checkpoint is published and the run stops."""
    from spotrain.localcloud.imds import LocalMetadataService
    from spotrain.tools.rehearsal import Phase

    run = Phase("trainer", work / "trainer.jsonl")
    with LocalMetadataService() as imds:
        path = _config_file(work, "trainer", {
            **config, "metrics_file": str(run.metrics), "spot_notice_endpoint": imds.endpoint,
            "spot_notice_poll_seconds": 0.2,
        })  # fmt: skip
        process = subprocess.Popen(_train_command(path), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, cwd=ROOT)  # fmt: skip
        wanted = plan.warmup_steps + plan.timed_steps
        while len(run.losses()) < wanted or not run.events("published"):
            if process.poll() is not None:
                raise SystemExit(process.stdout.read() if process.stdout else "training failed")
            time.sleep(0.2)
        imds.announce_interruption()
        output, _ = process.communicate(timeout=900)
    if process.returncode != 0:
        raise SystemExit(output[-6000:])
    steps = [r for r in run.records() if "loss" in r]
    timed_steps = steps[plan.warmup_steps :]
    timed = [r["tokens_per_s"] for r in timed_steps]
    published = run.events("published")
    [stopped] = run.events("stopped")
    return {
        "tokens_per_s_median": statistics.median(timed),
        "tokens_per_s_mean": _harmonic(timed)["tokens_per_s"],
        # Steps that began while a checkpoint published in the background, and the rest: the
        # publish shares the host (serialising, hashing) with the step's Python.
        "publishing": _harmonic([r["tokens_per_s"] for r in timed_steps if r["publishing"]]),
        "quiet": _harmonic([r["tokens_per_s"] for r in timed_steps if not r["publishing"]]),
        "timed_steps": [
            {key: r[key] for key in ("step", "tokens_per_s", "step_s", "publishing", "at")}
            for r in timed_steps
        ],
        "first_checkpoint": _checkpoint_window(steps, published[0]["step"]),
        "steps": len(steps),
        "stall_s": published[0]["stall_s"],
        "save_to_published_s": published[0]["save_to_published_s"],
        "checkpoint_bytes": published[0]["uploaded_bytes"] + published[0]["reused_bytes"],
        "emergency_stall_s": published[-1]["stall_s"],
        "notice_to_published_s": stopped["notice_to_published_s"],
        "stopped_after": stopped["step"],
    }


def _checkpoint_window(steps: list[dict[str, Any]], saved: int) -> dict[str, Any]:
    """What the checkpoint of step `saved` cost the training, in wall time: from the end of
    its step to the end of the first step begun after it was published (its stall, the steps
    beside its publish, its commit), against as many steps with no checkpoint about. Each
    gap between two steps' ends is split into the step's own time and the time outside it."""
    ends = {r["step"]: r["at"] for r in steps}
    after = [r for r in steps if r["step"] > saved]
    last = next((r["step"] for r in after if not r["publishing"]), after[-1]["step"])
    inside = [r for r in after if r["step"] <= last]
    quiet = [r for r in steps if not r["publishing"] and r["step"] - 1 in ends
             and r["step"] - 1 != saved and r["step"] != last]  # fmt: skip
    quiet_gap = statistics.median(ends[r["step"]] - ends[r["step"] - 1] for r in quiet)
    wall = ends[last] - ends[saved]
    return {
        "saved": saved, "last": last, "steps": len(inside), "wall_s": wall,
        "in_steps_s": sum(r["step_s"] for r in inside), "quiet_gap_s": quiet_gap,
        "quiet_step_s": statistics.median(r["step_s"] for r in quiet),
        "cost_s": wall - len(inside) * quiet_gap,
    }  # fmt: skip


def _harmonic(tokens_per_s: list[float]) -> dict[str, float]:
    """Steps of equal tokens: their count and tokens/s over all of them (the harmonic mean)."""
    mean = len(tokens_per_s) / sum(1 / t for t in tokens_per_s) if tokens_per_s else 0.0
    return {"steps": len(tokens_per_s), "tokens_per_s": mean}


def restore_phase(config: dict[str, Any], work: Path, stopped_after: int) -> dict[str, Any]:
    """A new start of the run restores the emergency checkpoint (and has no step left)."""
    from spotrain.tools.rehearsal import Phase

    run = Phase("restore", work / "restore.jsonl")
    changes = {"steps": stopped_after, "metrics_file": str(run.metrics)}
    path = _config_file(work, "restore", {**config, **changes})
    began = time.perf_counter()
    _run(_train_command(path))
    took = time.perf_counter() - began
    [restored] = run.events("restored")
    return {"step": restored["step"], "fetch_s": restored["fetch_s"],
            "load_s": restored["load_s"], "start_to_end_s": took}  # fmt: skip


def machine_description() -> dict[str, str]:
    import deepspeed
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU)"
    return {
        "gpu": gpu, "cpus": str(os.cpu_count()), "python": platform.python_version(),
        "torch": torch.__version__, "cuda": str(torch.version.cuda),
        "deepspeed": deepspeed.__version__, "machine": platform.machine(),
    }  # fmt: skip


# ---------------------------------------------------------------------------- the bare loop


def _one_rank(config_path: Path) -> Any:
    """This process as the only rank of a process group, and the configuration it trains (the
    vocabulary read from the data)."""
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})  # fmt: skip
    from spotrain.trainer.preflight import preflight
    from spotrain.trainer.process import init_distributed
    from spotrain.trainer.train import load_config

    config = preflight(load_config(config_path)).config
    init_distributed()
    return config


def _leave_the_group() -> None:
    import torch.distributed as dist

    dist.destroy_process_group()


def bare_phase(config_path: Path, result_path: Path, plan: Plan, trace: Path | None = None
               ) -> int:  # fmt: skip
    """One process, one rank: the bare loop and everything measured beside it."""
    config = _one_rank(config_path)
    result: dict[str, Any] = {}
    engine = _engine(config)
    result["plain"] = _timed_loop(engine, config, plan.warmup_steps, plan.timed_steps)
    result["attention"] = _attention_kernels(engine, config, trace)
    result["deepspeed_save"] = _deepspeed_save(engine, Path(config.work_dir) / "deepspeed-save")
    result["pinned_copy_s"] = _pinned_copy_seconds(result["deepspeed_save"]["bytes"])
    result["matmul_tflops"] = _matmul_tflops()
    result_path.write_text(json.dumps(result))
    _leave_the_group()
    return 0


MEMORY_OPTIONS = {
    "activation checkpointing": {"activation_checkpointing": True},
    "optimizer in host memory": {"offload_optimizer": "cpu"},
}
"""DeepSpeed's own memory options, each timed in a process of its own: in the bare loop's
process the first engine's memory outlived `del` and inflated the options' peaks."""


def memory_option_phase(config_path: Path, result_path: Path, plan: Plan, option: str) -> int:
    """One process, one rank, one memory option: its tokens/s and peak GPU memory."""
    config = _one_rank(config_path)
    change = MEMORY_OPTIONS[option]
    steps = plan.offload_steps if "offload_optimizer" in change else plan.timed_steps
    try:  # an option that cannot run here (a host op that will not build) is reported
        engine = _engine(replace(config, **change))
        result = _timed_loop(engine, config, 1, steps)
    except Exception as error:  # reported in the table, not raised
        result = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    result_path.write_text(json.dumps(result))
    _leave_the_group()
    return 0


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _engine(config: Any) -> Any:
    import torch

    from spotrain.trainer.engine import build_engine

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    return build_engine(config, world_size=1)


def _release() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _batch(engine: Any, config: Any) -> tuple[Any, Any]:
    import torch

    shape = (config.micro_batch, config.model.context)
    x = torch.randint(0, int(config.model.vocab_size), shape, device=engine.device)
    return x, torch.roll(x, -1, dims=1)


def _step(engine: Any, x: Any, y: Any) -> None:
    loss = engine(x, y)
    engine.backward(loss)
    engine.step()


def _timed_loop(engine: Any, config: Any, warmup: int, steps: int) -> dict[str, float]:
    import torch

    x, y = _batch(engine, config)
    for _ in range(warmup):
        _step(engine, x, y)
    _sync()
    began = time.perf_counter()
    for _ in range(steps):
        _step(engine, x, y)
    _sync()
    took = time.perf_counter() - began
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
    return {"tokens_per_s": steps * x.numel() / took, "step_s": took / steps, "peak_bytes": peak}


def _attention_kernels(engine: Any, config: Any, trace: Path | None) -> dict[str, Any]:
    """The operators and GPU kernels of one training step whose names speak of attention,
    with their time; the step's whole trace (chrome://tracing, Perfetto) to `trace`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    x, y = _batch(engine, config)
    with profile(activities=activities) as profiler:
        _step(engine, x, y)
        _sync()
    if trace is not None:
        profiler.export_chrome_trace(str(trace))
    found = []
    for event in profiler.key_averages():
        if any(word in event.key.lower() for word in ATTENTION_WORDS):
            device_us = getattr(event, "self_device_time_total", 0) or 0
            found.append({
                "name": event.key[:120], "calls": event.count, "device_ms": device_us / 1000,
                "cpu_ms": event.self_cpu_time_total / 1000,
            })  # fmt: skip
    found.sort(key=lambda e: (-e["device_ms"], -e["cpu_ms"]))
    return {"events": found[:12]}


def _deepspeed_save(engine: Any, folder: Path) -> dict[str, float]:
    """DeepSpeed's own synchronous save of the same state, timed as a training loop feels it."""
    _sync()
    began = time.perf_counter()
    engine.save_checkpoint(str(folder), tag="sync")
    _sync()
    took = time.perf_counter() - began
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    shutil.rmtree(folder, ignore_errors=True)
    return {"stall_s": took, "bytes": size}


def _pinned_copy_seconds(size: int) -> float:
    """One device-to-host copy of `size` bytes into pinned memory, warm (the second of two)."""
    import torch

    cuda = torch.cuda.is_available()
    source = torch.empty(size, dtype=torch.uint8, device="cuda" if cuda else "cpu")
    target = torch.empty(size, dtype=torch.uint8, pin_memory=cuda)
    took = 0.0
    for _ in range(2):
        _sync()
        began = time.perf_counter()
        target.copy_(source, non_blocking=cuda)
        _sync()
        took = time.perf_counter() - began
    del source, target
    _release()
    return took


def _matmul_tflops() -> float | None:
    """A large bf16 matrix product's TFLOPS here: what this GPU reaches, not its datasheet."""
    import torch

    if not torch.cuda.is_available():
        return None
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    _sync()
    began = time.perf_counter()
    for _ in range(10):
        a @ b
    _sync()
    return 10 * 2 * n**3 / (time.perf_counter() - began) / 1e12


# ---------------------------------------------------------------------------- the report


def datasheet_tflops(gpu: str) -> float | None:
    from spotrain.core.gpu_types import GPU_TFLOPS

    for model in sorted(GPU_TFLOPS, key=len, reverse=True):
        if model in gpu:
            return GPU_TFLOPS[model]
    return None


def flash_line(events: list[dict[str, Any]], *, on_gpu: bool) -> str:
    """Whether a flash attention kernel ran (on the GPU: one with GPU time), and which."""
    flash = [e["name"] for e in events if "flash" in e["name"].lower()
             and (e["device_ms"] > 0 or not on_gpu)]  # fmt: skip
    # The forward kernel itself names it best: not its backward, nor an autograd node around
    # it, which on a busy CPU can take more of the step's time and so come first.
    flash.sort(key=lambda name: (any(w in name.lower() for w in ("backward", "bwd")),
                                 not name.startswith("aten::")))  # fmt: skip
    if flash:
        return f"**The flash attention kernel ran**: `{flash[0]}`."
    return "**No flash attention kernel ran**: attention took another kernel (above)."


def size(count: float) -> str:
    return f"{count / 2**30:,.2f} GiB" if count >= 2**30 else f"{count / 2**20:,.1f} MiB"


def report(results: dict[str, Any], plan: Plan, *, smoke: bool) -> str:
    machine, bare, trained = results["machine"], results["bare"], results["trainer"]
    restored = results["restore"]
    per_token = flops_per_token(plan.model)
    sheet = datasheet_tflops(machine["gpu"])
    measured = bare["matmul_tflops"]

    def mfu(tokens_per_s: float) -> str:
        achieved = tokens_per_s * per_token / 1e12
        parts = [f"{achieved:,.0f} TFLOPS"]
        if sheet:
            parts.append(f"{achieved / sheet:.1%} of the datasheet's {sheet:,.0f}")
        if measured:
            parts.append(f"{achieved / measured:.1%} of the matrix product's {measured:,.0f}")
        return "; ".join(parts)

    plain = bare["plain"]
    ds_save, pinned = bare["deepspeed_save"], bare["pinned_copy_s"]
    lines = [
        "# GPU benchmark" + (" (smoke: tiny, on the CPU; not GPU figures)" if smoke else ""),
        "",
        f"Command: `python bench/gpu.py` — {machine['gpu']}, {machine['cpus']} CPU cores, "
        f"{machine['machine']}, Python {machine['python']}, torch {machine['torch']} (CUDA "
        f"{machine['cuda']}), DeepSpeed {machine['deepspeed']}. Model "
        f"{plan.model} (~{parameters(plan.model) / 1e9:.2f}B parameters), "
        f"{'bf16' if plan.bf16 else 'fp32'}, ZeRO-2, one rank, micro batch {plan.micro_batch}; "
        f"checkpoints to a `file://` store on local storage. Took {results['total_s']:.0f} s.",
        "",
        "## Throughput",
        "",
        "| | tokens/s | model FLOPs |",
        "|---|---:|---|",
        f"| bare DeepSpeed loop (same engine, batches already on the GPU) | "
        f"{plain['tokens_per_s']:,.0f} | {mfu(plain['tokens_per_s'])} |",
        f"| built-in trainer, median step | {trained['tokens_per_s_median']:,.0f} | "
        f"{mfu(trained['tokens_per_s_median'])} |",
        f"| built-in trainer, every timed step (those beside a background publish too) | "
        f"{trained['tokens_per_s_mean']:,.0f} | {mfu(trained['tokens_per_s_mean'])} |",
        *[
            f"| built-in trainer, the {trained[kind]['steps']} timed steps {label} | "
            f"{trained[kind]['tokens_per_s']:,.0f} | {mfu(trained[kind]['tokens_per_s'])} |"
            for kind, label in (
                ("quiet", "with no checkpoint publishing"),
                ("publishing", "begun while one published in the background"),
            )
            if trained[kind]["steps"]
        ],
        "",
        f"Trainer / bare loop: **{trained['tokens_per_s_median'] / plain['tokens_per_s']:.2f}x** "
        f"(median step). Model FLOPs per token: 6 x parameters + 12 x layers x width x context "
        f"= {per_token / 1e9:.2f} GFLOP. The checkpoint's stall (below) is not in any step's time; "
        "a step that begins while a checkpoint publishes shares the host with it.",
        "",
        "## Attention",
        "",
        "The operators and kernels of one training step whose names speak of attention "
        "(torch profiler over one step):",
        "",
        "| name | calls | GPU ms | CPU ms |",
        "|---|---:|---:|---:|",
        *[
            f"| `{e['name']}` | {e['calls']} | {e['device_ms']:.2f} | {e['cpu_ms']:.2f} |"
            for e in bare["attention"]["events"]
        ],
        "",
        flash_line(bare["attention"]["events"], on_gpu=not smoke),
        "",
        "## Checkpoint stall",
        "",
        "| | bytes | training waits (s) |",
        "|---|---:|---:|",
        f"| spotrain (copy into warm host buffers; serialise, hash, publish in the background) | "
        f"{size(trained['checkpoint_bytes'])} | {trained['stall_s']:.3f} |",
        f"| DeepSpeed's own synchronous `save_checkpoint` | {size(ds_save['bytes'])} | "
        f"{ds_save['stall_s']:.3f} |",
        f"| one pinned device-to-host copy of as many bytes (the floor) | "
        f"{size(ds_save['bytes'])} | {pinned:.3f} |",
        "",
        f"DeepSpeed's save / spotrain's stall: **{ds_save['stall_s'] / trained['stall_s']:.1f}x**; "
        f"spotrain's stall / the pinned copy: **{trained['stall_s'] / pinned:.1f}x**. The "
        f"checkpoint was published {trained['save_to_published_s']:.1f} s after its save, "
        "while training went on.",
        "",
        *_window_lines(trained["first_checkpoint"], ds_save["stall_s"]),
        "## Preemption and restore",
        "",
        f"- Spot notice to the emergency checkpoint published: "
        f"**{trained['notice_to_published_s']:.1f} s** (after step {trained['stopped_after']}; "
        f"its stall {trained['emergency_stall_s']:.2f} s; EC2 gives 120 s).",
        f"- Restore of that checkpoint by a new start: choose, fetch and verify "
        f"{restored['fetch_s']:.1f} s, DeepSpeed's load {restored['load_s']:.1f} s; the whole "
        f"start (process, model, restore) {restored['start_to_end_s']:.0f} s.",
        "",
        "## Memory options",
        "",
        "The bare loop again with each option (DeepSpeed's own), peak GPU memory allocated:",
        "",
        "| | tokens/s | vs plain | peak GPU memory |",
        "|---|---:|---:|---:|",
    ]
    for name in ("plain", "activation checkpointing", "optimizer in host memory"):
        figures = bare[name]
        if "error" in figures:
            lines.append(f"| {name} | did not run: {figures['error']} | | |")
            continue
        lines.append(f"| {name} | {figures['tokens_per_s']:,.0f} | "
                     f"{figures['tokens_per_s'] / plain['tokens_per_s']:.2f}x | "
                     f"{size(figures['peak_bytes'])} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _window_lines(window: dict[str, Any], deepspeed_save_s: float) -> list[str]:
    """The checkpoint's whole cost in training time, beside DeepSpeed's synchronous save."""
    outside = window["wall_s"] - window["in_steps_s"]
    quiet_outside = window["quiet_gap_s"] - window["quiet_step_s"]
    return [
        f"What the first checkpoint cost the training in all (its stall, the steps beside its "
        f"publish, its commit): from the end of step {window['saved']} (its save) to the end "
        f"of step {window['last']} (the first begun after it was published), "
        f"{window['steps']} steps took {window['wall_s']:.2f} s, where as many steps with no "
        f"checkpoint take {window['steps'] * window['quiet_gap_s']:.2f} s: **"
        f"{window['cost_s']:.2f} s**, against DeepSpeed's save's {deepspeed_save_s:.2f} s "
        f"(**{deepspeed_save_s / max(window['cost_s'], 1e-9):.2f}x**). Of those "
        f"{window['wall_s']:.2f} s, the steps themselves took {window['in_steps_s']:.2f} s "
        f"and {outside:.2f} s passed between them ({quiet_outside * window['steps']:.2f} s "
        "between as many steps with no checkpoint).",
        "",
    ]


if __name__ == "__main__":
    sys.exit(main())
