"""The training loop on DeepSpeed ZeRO: spotrain's GPT on the run's tokens, checkpointed by
the `Checkpointer` (checkpointer.py).

Every rank runs `train(config)` (under torchrun): the configuration is checked before anything
starts (`preflight`), the model and DeepSpeed engine are built, the checkpointer restores the
run's newest good checkpoint and then, after every step, takes the checkpoints that are due and
says when a preemption stops the run. A restored run continues with the same batches and the
same random state, so its losses equal an uninterrupted run's.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spotrain.core.catalog_schema import run_name_problem
from spotrain.core.errors import SpotrainError, raise_if_problems
from spotrain.core.global_batch import DEFAULT_MICRO_BATCH
from spotrain.core.validation import instance_type_problems, writable_folder_problem
from spotrain.trainer import datasets, memory
from spotrain.trainer.checkpointer import Checkpointer
from spotrain.trainer.data import Sampler, TokenFile, TokenStream, fit_problems
from spotrain.trainer.deepspeed_loader import load_deepspeed
from spotrain.trainer.membership import Stop
from spotrain.trainer.model import GPT, GPTConfig
from spotrain.trainer.process import Place, init_distributed, say
from spotrain.trainer.restore_policy import ConfigChanged, refuse_changed_definition
from spotrain.trainer.storage import Storage, open_storage

__all__ = ["ConfigChanged", "TrainConfig", "TrainResult", "build_engine", "preflight", "train"]

TRAIN_FIELD_HINTS = {
    "store": "give s3://BUCKET or file:///PATH",
    "data": "give the token file (.bin) to train on",
    "work_dir": "give a folder on the machine's fast local disk",
}


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
    """Fast local disk: light checkpoints, restores before they are loaded, a dataset's
    fetched shards."""
    catalog_table: str | None = None
    """DynamoDB catalog table; None finds checkpoints from their manifests."""
    kms_key_id: str | None = None
    """KMS key the checkpoint bucket requires on writes."""
    checkpoint_every: int = 50
    """Steps between full checkpoints (uploaded to the store and published)."""
    light_every: int | None = None
    """Steps between light checkpoints (kept on this machine's work disk only: a restart on the
    same machines resumes from there); None takes none."""
    micro_batch: int = DEFAULT_MICRO_BATCH
    """The most sequences a rank puts through the model at once (what its GPU memory holds)."""
    global_batch: int | None = None
    """Sequences per step over all ranks, whatever their number: each rank takes
    global_batch / ranks (which must divide), in as few passes of at most micro_batch as
    divide it evenly (gradient accumulation), so a fleet that grows or shrinks trains the same
    run. None: the global batch the run started with (micro_batch x its first start's ranks),
    read from its checkpoints at every later start."""
    learning_rate: float = 3e-4
    """AdamW peak learning rate."""
    warmup_steps: int = 0
    """Steps over which the learning rate rises linearly to `learning_rate`."""
    decay_steps: int | None = None
    """Steps after warmup of cosine decay to a tenth of `learning_rate` (then held); None keeps
    it constant. Independent of `steps`, so extending a run does not change its past."""
    seed: int = 0
    """Seed of initialisation, data order and every rank's random state."""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage (1-3)."""
    bf16: bool = False
    """Train in bfloat16 (GPUs); fp32 otherwise."""
    activation_checkpointing: bool = False
    """Recompute each transformer block's activations in the backward pass instead of keeping
    them (DeepSpeed's activation checkpointing): the activations of one block in memory instead
    of every block's, for about a third more compute. The losses are the same either way."""
    offload_optimizer: str = "none"
    """Where ZeRO keeps the optimizer's state (fp32 weights and Adam's moments, 12 bytes a
    parameter) and takes the optimizer step: "none" on the GPUs; "cpu" in host memory, stepped
    by DeepSpeed's CPU Adam (any ZeRO stage). Its numerics differ in the last bits from torch's
    AdamW, so changing it is a change of the run's definition."""
    offload_params: str = "none"
    """Where ZeRO stage 3 keeps the parameters between their uses: "none" on the GPUs, "cpu" in
    host memory, "nvme" in files on work_dir's disk. The losses are the same either way."""
    model: GPTConfig = field(default_factory=GPTConfig)
    """Model shape."""
    metrics_file: str | None = None
    """JSON-lines file rank 0 appends one line per step (and per checkpoint event) to."""
    log_every: int = 10
    """Steps between progress lines on the terminal."""
    spot_notice_endpoint: str | None = None
    """Instance metadata service to watch for spot notices (on EC2: http://169.254.169.254);
    None watches nothing (SIGTERM still stops the run)."""
    spot_notice_poll_seconds: float = 5.0
    """Seconds between polls of the metadata service."""
    allow_config_change: bool = False
    """Resume a run whose head checkpoint was trained with a different definition (learning
    rate, schedule, seed, global batch, ...): the new values apply from the next step. Without
    it such a start is refused and the differences are listed."""

    def __post_init__(self) -> None:
        problems = instance_type_problems(self)
        raise_if_problems("training configuration", problems)  # the checks below need types
        run_problem = run_name_problem(self.run)
        if run_problem:
            problems.append(f"run: {run_problem}")
        for name in ("store", "data", "work_dir"):
            if not getattr(self, name).strip():
                problems.append(f"{name} is empty: {TRAIN_FIELD_HINTS[name]}")
        for name in ("catalog_table", "kms_key_id", "metrics_file", "spot_notice_endpoint"):
            if getattr(self, name) is not None and not getattr(self, name).strip():
                problems.append(f"{name} is empty: give a value or null")
        if self.seed < 0:
            problems.append(f"seed is {self.seed}: use 0 or more")
        if self.steps < 1:
            problems.append(f"steps is {self.steps}: train at least 1 step")
        if self.checkpoint_every < 1:
            problems.append(f"checkpoint_every is {self.checkpoint_every}: use 1 or more")
        if self.zero_stage not in (1, 2, 3):
            problems.append(f"zero_stage is {self.zero_stage}: DeepSpeed ZeRO stages are 1, 2, 3")
        problems += memory.option_problems(self)
        if self.light_every is not None and self.light_every < 1:
            problems.append(f"light_every is {self.light_every}: use 1 or more, or null for none")
        if self.log_every < 1:
            problems.append(f"log_every is {self.log_every}: use 1 or more")
        if not self.spot_notice_poll_seconds > 0:
            problems.append(
                f"spot_notice_poll_seconds is {self.spot_notice_poll_seconds}: use a positive "
                "interval (EC2 gives two minutes' notice; 5 s is plenty)"
            )
        if self.micro_batch < 1:
            problems.append(f"micro_batch is {self.micro_batch}: use 1 or more")
        if self.global_batch is not None and self.global_batch < 1:
            problems.append(f"global_batch is {self.global_batch}: use 1 or more, or null")
        if self.warmup_steps < 0:
            problems.append(f"warmup_steps is {self.warmup_steps}: use 0 or more")
        if self.decay_steps is not None and self.decay_steps < 1:
            problems.append(f"decay_steps is {self.decay_steps}: use 1 or more, or null")
        if not self.learning_rate > 0:
            problems.append(f"learning_rate is {self.learning_rate}: use a positive rate")
        raise_if_problems("training configuration", problems)

    def definition(self, world_size: int) -> dict[str, Any]:
        """What makes the run the run: every field but where it runs, how often it saves and
        what it prints, with the global batch (what the data order depends on) instead of the
        per-rank one. A resumed run continues exactly only under the same definition."""
        fields = {k: v for k, v in asdict(self).items() if k not in _NOT_DEFINITION}
        return {
            **fields,
            "global_batch": self.per_rank_batch(world_size) * world_size,
            "dataset": datasets.dataset_name(self.data),
        }

    def per_rank_batch(self, world_size: int) -> int:
        """Sequences each of `world_size` ranks takes per step."""
        if self.global_batch is None:
            return self.micro_batch
        if self.global_batch % world_size:
            raise SpotrainError(
                f"global_batch {self.global_batch} does not split over {world_size} ranks: "
                "choose a global batch every world size the fleet can have divides (e.g. a "
                "multiple of 12 serves 1, 2, 3, 4 or 6 ranks)"
            )
        return self.global_batch // world_size

    def passes(self, world_size: int) -> tuple[int, int]:
        """(sequences per pass, passes per step) for each of `world_size` ranks: the fewest
        equal passes of at most micro_batch that make up its share of the global batch."""
        share = self.per_rank_batch(world_size)
        accumulation = next(n for n in range(1, share + 1)
                            if share % n == 0 and share // n <= self.micro_batch)  # fmt: skip
        return share // accumulation, accumulation

    def with_global_batch(self, trained: dict[str, Any] | None, world_size: int) -> TrainConfig:
        """This configuration with its global batch fixed: as given; else the one the run's
        newest checkpoint was trained with (`trained`, its definition); else, for a new run,
        micro_batch x `world_size`."""
        if self.global_batch is not None:
            return self
        kept = (trained or {}).get("global_batch")
        chosen = kept if isinstance(kept, int) and kept > 0 else self.micro_batch * world_size
        return replace(self, global_batch=chosen)

    def config_hash(self, world_size: int) -> str:
        text = json.dumps(self.definition(world_size), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


_NOT_DEFINITION = frozenset(
    {"steps", "store", "catalog_table", "kms_key_id", "work_dir", "checkpoint_every",
     "light_every", "micro_batch", "global_batch", "metrics_file", "log_every",
     "spot_notice_endpoint",
     "spot_notice_poll_seconds", "allow_config_change",
     # Recomputed activations are the same activations, and parameters are the same wherever
     # they wait: switching these on to fit a run on smaller GPUs does not change what it
     # learns (tested: the losses are equal bit for bit).
     "activation_checkpointing", "offload_params",
     # A token file's path differs between machines; a dataset's name is its identity.
     "data"}
)  # fmt: skip


def refuse_unintended_change(
    config: TrainConfig, trained: dict[str, Any] | None, world_size: int, step: int
) -> None:
    """Raise if the checkpoint at `step` was trained with another definition and the change
    was not declared intended."""
    if not config.allow_config_change:
        refuse_changed_definition(config.run, trained, config.definition(world_size), step)


@dataclass(frozen=True)
class Prepared:
    """A configuration that passed the preflight, and where its data comes from."""

    config: TrainConfig
    """With the model's vocabulary taken from the data when the configuration left it out."""
    dataset: tuple[Storage, datasets.DatasetManifest] | None
    """A dataset in a store, fetched to each machine's work disk; None: a token file here."""


def preflight(config: TrainConfig) -> Prepared:
    """Everything about the run that can be checked before it starts (and before it takes the
    run's lease): the store's address, the data (a token file here, or a dataset's manifest in
    its store) and how it fits the model, the work folder. Raises one error listing every
    problem."""
    problems = []
    try:
        open_storage(config.store, kms_key_id=config.kms_key_id)
    except SpotrainError as error:
        problems.append(f"store: {error}")
    model, dataset = config.model, None
    try:
        if datasets.is_dataset(config.data):
            store, name = datasets.locate(config.data, config.store, kms_key_id=config.kms_key_id)
            manifest = datasets.read_manifest(store, name)
            vocab, count, dataset = manifest.vocab_size, manifest.tokens, (store, manifest)
        else:
            local = TokenFile(Path(config.data))
            vocab, count = local.vocab_size, len(local.tokens)
        if model.vocab_size is None:
            model = replace(model, vocab_size=vocab)
        problems += fit_problems(vocab, count, context=model.context,
                                 vocab_size=int(model.vocab_size or 0))  # fmt: skip
    except SpotrainError as error:
        problems.append(f"data: {error}")
    for name in ("work_dir", "metrics_file"):
        value = getattr(config, name)
        if value is None:
            continue
        folder = Path(value) if name == "work_dir" else Path(value).parent
        if problem := writable_folder_problem(name, value, folder):
            problems.append(problem)
    problems += memory.machine_problems(config)
    raise_if_problems("training configuration", problems)
    return Prepared(replace(config, model=model), dataset)


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
                          checkpointer.status)  # fmt: skip
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
    """Rank 0's terminal lines and metrics file (one JSON line per step and per checkpoint
    event; line-buffered, so a killed run leaves every line it finished)."""

    def __init__(self, config: TrainConfig, place: Place) -> None:
        self.config, self.active = config, place.rank == 0
        self._metrics = (
            open(config.metrics_file, "a", buffering=1)  # noqa: SIM115 (open for the run)
            if self.active and config.metrics_file
            else None
        )

    def _record(self, fields: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._metrics.write(json.dumps(fields) + "\n")

    def event(self, kind: str, **fields: Any) -> None:
        self._record({"event": kind, "at": time.time(), **fields})

    def step(self, done: int, loss: float, tokens: int, step_s: float, checkpoint: str) -> None:
        tokens_per_s = tokens / step_s
        self._record({"step": done, "loss": loss, "tokens_per_s": tokens_per_s, "step_s": step_s})
        if self.active and (done % self.config.log_every == 0 or done == self.config.steps):
            say(f"step {done}/{self.config.steps}  loss {loss:.4f}  {tokens_per_s:,.0f} tok/s  "
                 f"checkpoint: {checkpoint}")  # fmt: skip

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
