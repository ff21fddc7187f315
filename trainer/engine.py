"""The training loop on DeepSpeed ZeRO: spotrain's GPT on the run's tokens, checkpointed by
the `Checkpointer` (checkpointer.py).

Every rank runs `train(config)` (under torchrun): the configuration is checked before anything
starts (`preflight.py`), the model and DeepSpeed engine are built, the checkpointer restores the
run's newest good checkpoint and then, after every step, takes the checkpoints that are due and
says when a preemption stops the run. A restored run continues with the same batches and the
same random state, so its losses equal an uninterrupted run's.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spotrain.core.errors import SpotrainError
from spotrain.trainer import datasets, memory
from spotrain.trainer.checkpointer import Checkpointer
from spotrain.trainer.config import TrainConfig
from spotrain.trainer.data import Sampler, TokenFile, TokenStream
from spotrain.trainer.deepspeed_loader import load_deepspeed
from spotrain.trainer.membership import Stop
from spotrain.trainer.metrics_file import MetricsFile
from spotrain.trainer.model import GPT
from spotrain.trainer.preflight import Prepared, preflight
from spotrain.trainer.process import Place, init_distributed, say
from spotrain.trainer.restore_policy import ConfigChanged, refuse_changed_definition

__all__ = ["ConfigChanged", "TrainConfig", "TrainResult", "build_engine", "train"]


def refuse_unintended_change(
    config: TrainConfig, trained: dict[str, Any] | None, world_size: int, step: int
) -> None:
    """Raise if the checkpoint at `step` was trained with another definition and the change
    was not declared intended."""
    if not config.allow_config_change:
        refuse_changed_definition(config.run, trained, config.definition(world_size), step)


def _open_data(config: TrainConfig, prepared: Prepared, place: Place) -> TokenFile | TokenStream:
    """Collective: the run's tokens on this machine. A dataset's shards are fetched by each
    machine's leader to its work disk (verified once, kept for later starts)."""
    import torch.distributed as dist

    if prepared.dataset is None:
        return TokenFile(Path(config.data))
    store, manifest = prepared.dataset
    folder = Path(config.work_dir) / "data" / manifest.name
    failure = None
    if place.leader:
        try:
            began = time.perf_counter()
            fetched = datasets.fetch(store, manifest, folder)
            took = time.perf_counter() - began
            if place.rank == 0:
                say(f"dataset {manifest.name}: {manifest.tokens:,} tokens in "
                     f"{len(manifest.shards)} shard(s), {fetched.downloaded} fetched, "
                     f"{len(manifest.shards) - fetched.downloaded} already on this disk "
                     f"({took:.1f} s)")  # fmt: skip
        except SpotrainError as error:
            failure = str(error)
    failures: list[Any] = [None] * place.world
    dist.all_gather_object(failures, failure)
    failed = [f for f in failures if f]
    if failed:
        raise datasets.DatasetError(failed[0])
    return TokenStream([folder / shard.key.rsplit("/", 1)[-1] for shard in manifest.shards])


def lr_factor(config: TrainConfig, step: int) -> float:
    """Multiplier of the peak learning rate at `step`: linear warmup, then cosine decay."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.decay_steps is None:
        return 1.0
    progress = min(1.0, (step - config.warmup_steps) / config.decay_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def _seed_everything(seed: int, rank: int) -> None:
    random.seed(seed + rank)
    np.random.seed(seed + rank)
    torch.manual_seed(seed + rank)


def _mean_over_ranks(loss: torch.Tensor, world: int) -> float:
    """The step's loss over the whole global batch, whatever the number of ranks."""
    import torch.distributed as dist

    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / world


def _deepspeed_config(config: TrainConfig, *, world_size: int) -> dict[str, Any]:
    sequences, passes = config.passes(world_size)
    return {
        "train_micro_batch_size_per_gpu": sequences,
        "gradient_accumulation_steps": passes,
        "zero_optimization": memory.zero_section(config),
        "bf16": {"enabled": config.bf16},
        "steps_per_print": 10**9,
    }


def build_engine(config: TrainConfig, *, world_size: int) -> Any:
    """Collective: the model (identical initial weights on every rank), its optimizer and
    learning-rate schedule in a DeepSpeed engine, as the trainer trains them (the GPU
    benchmark's bare loop builds the same)."""
    deepspeed = load_deepspeed()
    _seed_everything(config.seed, 0)
    model = GPT(config.model, recompute=memory.recompute_function(config))
    optimizer = memory.make_optimizer(
        model.parameters(), config, learning_rate=config.learning_rate
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, partial(lr_factor, config))
    engine, _, _, _ = deepspeed.initialize(  # DeepSpeed steps, saves and restores the schedule
        model=model, optimizer=optimizer, lr_scheduler=schedule,
        config=_deepspeed_config(config, world_size=world_size),
    )  # fmt: skip
    return engine


@dataclass(frozen=True)
class TrainResult:
    losses: list[float]
    """The loss of each step this start ran (mean over all ranks)."""
    stop: Stop | None = None
    """Why and how it stopped before its last step: this machine stays and meets the others
    again, or leaves (see `membership`); None: it trained to the end."""


def train(config: TrainConfig) -> TrainResult:
    """Train to `config.steps` (or until a stop is agreed)."""
    prepared = preflight(config)  # a run that cannot start takes no lease, nor a process group
    config = prepared.config
    import torch.distributed as dist

    init_distributed()
    place = Place.here()
    rank, world = place.rank, place.world
    progress = _Progress(config, place)
    checkpointer = Checkpointer(
        run=config.run, store=config.store, work_dir=config.work_dir,
        catalog_table=config.catalog_table, kms_key_id=config.kms_key_id,
        every=config.checkpoint_every, light_every=config.light_every,
        allow_definition_change=config.allow_config_change,
        spot_notice_endpoint=config.spot_notice_endpoint,
        spot_notice_poll_seconds=config.spot_notice_poll_seconds, on_event=progress.event,
    )  # fmt: skip
    # A run keeps the global batch it started with on any number of machines, unless its
    # configuration says another.
    config = config.with_global_batch(checkpointer.trained_definition(), world)
    config.per_rank_batch(world)  # a batch that does not split over these ranks: no lease
    checkpointer.definition = config.definition(world)
    sequences, passes = config.passes(world)
    if rank == 0 and passes > 1:
        say(f"global batch {config.global_batch} on {world} rank(s): {passes} passes of "
            f"{sequences} sequences a step on each")  # fmt: skip
    if (options := memory.describe(config)) and rank == 0:
        say(options)
    engine = build_engine(config, world_size=world)
    _seed_everything(config.seed, rank)  # a restore replaces these with the checkpoint's
    losses: list[float] = []
    try:
        start_step = checkpointer.restore(engine)
        progress.event("started", step=start_step, world=world)  # one per (re)formed group
        sampler = Sampler(
            _open_data(config, prepared, place), config.model.context,
            config.per_rank_batch(world), config.seed,
        )  # fmt: skip
        for step in range(start_step, config.steps):
            started = time.perf_counter()
            publishing = checkpointer.uploading_here  # a background publish shares the host
            x, y = sampler.batch(step, rank, world)
            parts = []
            for part_x, part_y in zip(x.split(sequences), y.split(sequences), strict=True):
                part = engine(part_x.to(engine.device), part_y.to(engine.device))
                engine.backward(part)  # DeepSpeed scales it by 1 / passes
                engine.step()  # DeepSpeed steps the optimizer after the last pass
                parts.append(part.detach())
            loss = parts[0] if len(parts) == 1 else torch.stack(parts).mean()
            losses.append(_mean_over_ranks(loss, world))
            done = step + 1
            progress.step(done, losses[-1], x.numel() * world, time.perf_counter() - started,
                          checkpointer.status, publishing)  # fmt: skip
            if checkpointer.after_step(done, last=done == config.steps, loss=losses[-1]):
                break
        checkpointer.close()
    except BaseException:
        checkpointer.abandon()
        raise
    finally:
        progress.close()
    # Tear the process group down before the interpreter exits: left to exit handlers, gloo's
    # threads can be destroyed still running (the process then aborts after its work is done).
    dist.barrier()
    dist.destroy_process_group()
    return TrainResult(losses, checkpointer.stop)


class _Progress:
    """Rank 0's terminal lines and metrics file (`metrics_file.MetricsFile`)."""

    def __init__(self, config: TrainConfig, place: Place) -> None:
        self.config, self.active = config, place.rank == 0
        self._metrics = MetricsFile(config.metrics_file if self.active else None)

    def event(self, kind: str, **fields: Any) -> None:
        self._metrics.event(kind, **fields)

    def step(self, done: int, loss: float, tokens: int, step_s: float, checkpoint: str,
             publishing: bool) -> None:  # fmt: skip
        tokens_per_s = tokens / step_s
        self._metrics.step(done, loss=loss, tokens_per_s=tokens_per_s, step_s=step_s,
                           publishing=publishing)  # fmt: skip
        if self.active and (done % self.config.log_every == 0 or done == self.config.steps):
            say(f"step {done}/{self.config.steps}  loss {loss:.4f}  {tokens_per_s:,.0f} tok/s  "
                 f"checkpoint: {checkpoint}")  # fmt: skip

    def close(self) -> None:
        self._metrics.close()
