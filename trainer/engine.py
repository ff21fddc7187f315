"""The training loop on DeepSpeed ZeRO, with checkpoints published through the checkpoint core.

Every rank runs `train(config)` (under torchrun). At start the run's newest good checkpoint is
restored (rank 0 fetches and verifies it, every rank loads its shards); every
`checkpoint_every` steps, and at once when preemption is signalled (preemption.py), all ranks
write a DeepSpeed checkpoint locally and rank 0 publishes it.
A restored run continues with the same batches and the same random state, so its losses equal
an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spotrain.errors import raise_if_problems
from spotrain.trainer import checkpoint
from spotrain.trainer.catalog import Catalog, DynamoCatalog, ManifestCatalog
from spotrain.trainer.data import Sampler, TokenFile
from spotrain.trainer.model import GPT, GPTConfig
from spotrain.trainer.preemption import PreemptionFlag
from spotrain.trainer.storage import open_storage


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    run: str
    """Run name: the key of its checkpoints and catalog items."""
    store: str
    """Where checkpoints go: s3://BUCKET or file:///PATH."""
    data: str
    """Token file (.bin with its .json)."""
    steps: int
    """Optimizer steps to train in total (a resumed run stops at the same step)."""
    work_dir: str
    """Fast local disk for DeepSpeed's checkpoint files before they are published."""
    catalog_table: str | None = None
    """DynamoDB catalog table; None finds checkpoints from their manifests."""
    kms_key_id: str | None = None
    """KMS key the checkpoint bucket requires on writes."""
    checkpoint_every: int = 50
    """Steps between checkpoints."""
    micro_batch: int = 8
    """Sequences per rank per step."""
    learning_rate: float = 3e-4
    """AdamW learning rate."""
    seed: int = 0
    """Seed of initialisation, data order and every rank's random state."""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage (1-3)."""
    bf16: bool = False
    """Train in bfloat16 (GPUs); fp32 otherwise."""
    model: GPTConfig = field(default_factory=GPTConfig)
    """Model shape."""
    metrics_file: str | None = None
    """JSON-lines file rank 0 appends one line per step to."""

    def __post_init__(self) -> None:
        problems = []
        if self.steps < 1:
            problems.append(f"steps is {self.steps}: train at least 1 step")
        if self.checkpoint_every < 1:
            problems.append(f"checkpoint_every is {self.checkpoint_every}: use 1 or more")
        if self.zero_stage not in (1, 2, 3):
            problems.append(f"zero_stage is {self.zero_stage}: DeepSpeed ZeRO stages are 1, 2, 3")
        if self.micro_batch < 1:
            problems.append(f"micro_batch is {self.micro_batch}: use 1 or more")
        if not self.learning_rate > 0:
            problems.append(f"learning_rate is {self.learning_rate}: use a positive rate")
        raise_if_problems("training configuration", problems)

    @property
    def config_hash(self) -> str:
        import hashlib

        fields = {
            k: v for k, v in asdict(self).items() if k not in ("steps", "work_dir", "metrics_file")
        }
        return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[
            :16
        ]


def _use_gloo_collectives_without_compiling() -> None:
    """On CPU, DeepSpeed would JIT-compile a shared-memory all-reduce (minutes on first use);
    gloo does the collectives without it. GPUs use NCCL and never build it."""
    import deepspeed.comm.torch  # noqa: F401  (the module, not torch)

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # type: ignore[attr-defined]


def _seed_everything(seed: int, rank: int) -> None:
    random.seed(seed + rank)
    np.random.seed(seed + rank)
    torch.manual_seed(seed + rank)


def _rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None:
        torch.cuda.set_rng_state_all(state["cuda"])


def _catalog(config: TrainConfig, storage: Any) -> Catalog:
    if config.catalog_table:
        return DynamoCatalog(config.catalog_table, config.run)
    return ManifestCatalog(storage, config.run)


def train(config: TrainConfig) -> list[float]:
    """Train to `config.steps`; returns this process's losses, one per step it ran."""
    import deepspeed
    import torch.distributed as dist

    _use_gloo_collectives_without_compiling()
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    _seed_everything(config.seed, 0)  # identical initial weights on every rank
    model = GPT(config.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        config={
            "train_micro_batch_size_per_gpu": config.micro_batch,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": config.zero_stage},
            "bf16": {"enabled": config.bf16},
            "steps_per_print": 10**9,
        },
    )
    storage = open_storage(config.store, kms_key_id=config.kms_key_id)
    catalog = _catalog(config, storage)
    work = Path(config.work_dir)
    generation = catalog.acquire_lease(f"{os.uname().nodename}:{os.getpid()}") if rank == 0 else 0
    start_step, parent = 0, None
    restore_dir = work / "restore"
    found = torch.tensor([0], dtype=torch.long, device=engine.device)
    if rank == 0:
        try:
            report = checkpoint.restore(
                restore_dir, storage=storage, catalog=catalog, run=config.run
            )
            found[0] = report.manifest.step
            for step, reason in report.skipped:
                print(f"[spotrain] skipped checkpoint step {step}: {reason}", flush=True)
        except checkpoint.RestoreError:
            found[0] = -1
    dist.broadcast(found, src=0)  # ranks share one file system on one machine; see notes
    _seed_everything(config.seed, rank)
    if found[0] >= 0:
        tag = f"step_{int(found[0]):09d}"
        _, client_state = engine.load_checkpoint(str(restore_dir), tag=tag)
        start_step = int(client_state["step"])
        parent = f"{config.run}/{tag}"
        _set_rng_state(torch.load(restore_dir / tag / f"rng_rank{rank}.pt", weights_only=False))
        if rank == 0:
            print(f"[spotrain] resumed {config.run} at step {start_step}", flush=True)
    preemption = PreemptionFlag().install()
    sampler = Sampler(
        TokenFile(Path(config.data)), config.model.context, config.micro_batch, config.seed
    )
    losses = []
    for step in range(start_step, config.steps):
        started = time.perf_counter()
        x, y = sampler.batch(step, rank)
        loss = engine(x.to(engine.device), y.to(engine.device))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        if rank == 0 and config.metrics_file:
            with open(config.metrics_file, "a") as metrics:
                tokens_per_s = x.numel() * world / (time.perf_counter() - started)
                metrics.write(
                    json.dumps({"step": step + 1, "loss": losses[-1], "tokens_per_s": tokens_per_s})
                    + "\n"
                )
        done = step + 1
        stopping = preemption.agreed(engine.device)
        if stopping or done % config.checkpoint_every == 0 or done == config.steps:
            parent = _save_and_publish(
                engine, config, storage, catalog, generation, done, parent, rank, world
            )
        if stopping:
            if rank == 0:
                reason = preemption.reason or "another rank was asked to stop"
                print(
                    f"[spotrain] stopped after step {done} ({reason}); it is published", flush=True
                )
            break
    return losses


def _save_and_publish(
    engine: Any, config: TrainConfig, storage: Any, catalog: Catalog, generation: int,
    step: int, parent: str | None, rank: int, world: int,
) -> str:  # fmt: skip
    import torch.distributed as dist

    tag = f"step_{step:09d}"
    folder = Path(config.work_dir) / "save"  # holds one tag at a time: the one being published
    engine.save_checkpoint(str(folder), tag=tag, client_state={"step": step})
    torch.save(_rng_state(), folder / tag / f"rng_rank{rank}.pt")
    dist.barrier()
    if rank == 0:
        report = checkpoint.publish(
            folder, storage=storage, catalog=catalog, generation=generation, run=config.run,
            step=step, world_size=world, zero_stage=config.zero_stage,
            config_hash=config.config_hash, code_version=_code_version(), parent=parent,
        )  # fmt: skip
        print(f"[spotrain] published step {step}: {report.uploaded_bytes:,} bytes sent, "
              f"{report.reused_bytes:,} reused", flush=True)  # fmt: skip
        shutil.rmtree(folder / tag, ignore_errors=True)
    dist.barrier()
    return f"{config.run}/{tag}"


def _code_version() -> str:
    from importlib.metadata import version

    return f"spotrain {version('spotrain')}, torch {torch.__version__}"
