"""The training loop on DeepSpeed ZeRO, with checkpoints published through the checkpoint core.

Every rank runs `train(config)` (under torchrun). At start the run's newest good checkpoint is
restored: a light one on this machine's disk if it may be used (local_tier.py), else the
published head (rank 0 chooses, each machine's leader fetches and verifies it). Every
`checkpoint_every` steps, and at once when preemption is signalled (preemption.py), all ranks
write a DeepSpeed checkpoint locally; the leaders upload it while training goes on and rank 0
publishes it once every upload is verified (`_Saver`).
A restored run continues with the same batches and the same random state, so its losses equal
an uninterrupted run's.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spotrain.catalog_schema import checkpoint_id, checkpoint_tag, run_name_problem
from spotrain.errors import SpotrainError, raise_if_problems
from spotrain.trainer import checkpoint, datasets, failpoints, local_tier
from spotrain.trainer.catalog import Catalog, CatalogError, open_catalog
from spotrain.trainer.data import Sampler, TokenFile, TokenStream, fit_problems
from spotrain.trainer.manifest import Shard
from spotrain.trainer.model import GPT, GPTConfig
from spotrain.trainer.preemption import PreemptionFlag
from spotrain.trainer.spot_notice import SPOT_NOTICE_REASON, SpotNoticeWatcher
from spotrain.trainer.storage import Storage, open_storage
from spotrain.validation import instance_type_problems

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
    """Fast local disk for DeepSpeed's checkpoint files before they are published."""
    catalog_table: str | None = None
    """DynamoDB catalog table; None finds checkpoints from their manifests."""
    kms_key_id: str | None = None
    """KMS key the checkpoint bucket requires on writes."""
    checkpoint_every: int = 50
    """Steps between full checkpoints (uploaded to the store and published)."""
    light_every: int | None = None
    """Steps between light checkpoints (kept on this machine's work disk only: a restart on the
    same machines resumes from there); None takes none."""
    micro_batch: int = 8
    """Sequences per rank per step (unless global_batch is set)."""
    global_batch: int | None = None
    """Sequences per step over all ranks, whatever their number: each rank takes
    global_batch / ranks (which must divide), so a fleet that grows or shrinks keeps training
    the same run. None: micro_batch per rank."""
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

    def config_hash(self, world_size: int) -> str:
        import hashlib

        text = json.dumps(self.definition(world_size), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


_NOT_DEFINITION = frozenset(
    {"steps", "store", "catalog_table", "kms_key_id", "work_dir", "checkpoint_every",
     "light_every", "micro_batch", "global_batch", "metrics_file", "log_every",
     "spot_notice_endpoint",
     "spot_notice_poll_seconds", "allow_config_change",
     # A token file's path differs between machines; a dataset's name is its identity.
     "data"}
)  # fmt: skip


class ConfigChanged(SpotrainError):
    """The run's checkpoint was trained with another definition, and the change was not
    declared intended."""


def definition_changes(trained: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The fields whose values differ between the definition a checkpoint was trained with and
    the one starting now, as `field: old -> new`."""
    changes = []
    for name in sorted(set(trained) | set(now)):
        if trained.get(name) != now.get(name):
            changes.append(f"{name}: {trained.get(name)!r} -> {now.get(name)!r}")
    return changes


def refuse_unintended_change(
    config: TrainConfig, trained: dict[str, Any] | None, world_size: int, step: int
) -> None:
    """Raise if the checkpoint at `step` was trained with another definition and the change
    was not declared intended."""
    if trained is None or config.allow_config_change:
        return
    changes = definition_changes(trained, config.definition(world_size))
    if changes:
        listed = "".join(f"\n  - {change}" for change in changes)
        raise ConfigChanged(
            f"run {config.run!r}: its checkpoint at step {step} was trained with another "
            f"configuration:{listed}\nset allow_config_change=true to continue with the new "
            "values, or start again with the old ones; nothing was changed"
        )


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
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".spotrain-probe.")  # noqa: SIM115
            probe.close()
        except OSError as error:
            problems.append(f"{name} {value!r} cannot be written here: {error}")
    raise_if_problems("training configuration", problems)
    return Prepared(replace(config, model=model), dataset)


def _open_data(config: TrainConfig, prepared: Prepared, place: _Place) -> TokenFile | TokenStream:
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
                _say(f"dataset {manifest.name}: {manifest.tokens:,} tokens in "
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


@dataclass(frozen=True)
class _Place:
    """Where this process sits: one leader per machine fetches, uploads and watches IMDS."""

    rank: int
    world: int
    leader: bool


@dataclass(frozen=True)
class _Restored:
    step: int
    world_size: int
    folder: Path
    """DeepSpeed checkpoint root holding the tag `step_<step>`."""
    from_light: bool = False
    """Restored from this machine's light checkpoint rather than from the store."""


def _restore(
    config: TrainConfig, storage: Storage, catalog: Catalog, place: _Place, generation: int
) -> _Restored | None:
    """Collective: every machine offers its newest light checkpoint; rank 0 uses it if it may,
    else picks the newest good published one (with fallback, moving the head back past what it
    skipped); every machine's leader fetches and verifies that one, and converts it to
    DeepSpeed's universal format when the world size changed (plain loading refuses a
    different data-parallel size)."""
    import torch.distributed as dist

    folder = Path(config.work_dir) / "restore"
    if place.leader:  # this machine's own scratch: whatever a crashed start left goes
        shutil.rmtree(folder, ignore_errors=True)
    chosen = torch.tensor([-1, 0, 0], dtype=torch.long)  # step, its world size, 1 if light
    manifest_of_chosen: list[str | None] = [None]
    light_root = Path(config.work_dir) / "light"
    light = local_tier.newest(light_root) if place.leader else None
    if light is not None and light.world_size != place.world:
        light = None  # written by another number of ranks: only the store's copy converts
    offers: list[Any] = [None] * place.world
    dist.all_gather_object(offers, (place.leader, (light.step, light.parent) if light else None))
    if place.rank == 0:
        light_step = _light_step_to_use(config, catalog, [o for lead, o in offers if lead])
        if light_step is not None and light is not None:
            refuse_unintended_change(config, light.config, place.world, light_step)
            chosen[0], chosen[1], chosen[2] = light_step, place.world, 1
    if place.rank == 0 and not chosen[2]:
        try:
            report = checkpoint.restore_as_writer(
                folder, storage=storage, catalog=catalog, run=config.run, generation=generation,
                accept=lambda manifest: refuse_unintended_change(
                    config, manifest.extra.get("config"), place.world, manifest.step
                ),
            )  # fmt: skip
            chosen[0], chosen[1] = report.manifest.step, report.manifest.world_size
            manifest_of_chosen[0] = checkpoint.key_of(report.manifest)
            if report.catalog_unavailable:
                _say(f"catalog unavailable ({report.catalog_unavailable}); found checkpoints "
                     "from the store's records")  # fmt: skip
            for step, reason in report.skipped:
                _say(f"skipped checkpoint step {step}: {reason}")
            for note in report.notes:
                _say(f"damaged copy passed over (another copy served): {note}")
            if report.rolled_back_from is not None:
                _say(f"head moved back from step {report.rolled_back_from} to "
                     f"{report.manifest.step}")  # fmt: skip
        except checkpoint.NothingPublished:
            pass  # a new run
    _broadcast(chosen)
    dist.broadcast_object_list(manifest_of_chosen, src=0)
    step, world_size, from_light = (int(v) for v in chosen)
    if place.leader:  # light checkpoints older than the one restored are of no more use
        local_tier.prune(light_root, keep=step if from_light else None)
    if step < 0:
        return None
    if from_light:
        if place.rank == 0:
            _say(f"restoring step {step} from this machine's light checkpoint (newer than the "
                 "published head, descended from it)")  # fmt: skip
        dist.barrier()
        folder = light_root / checkpoint_tag(step)
        return _Restored(step=step, world_size=world_size, folder=folder, from_light=True)
    if place.leader and place.rank != 0:
        checkpoint.fetch(storage, str(manifest_of_chosen[0]), folder, run=config.run)
    tag = checkpoint_tag(step)
    if world_size != place.world:
        if place.leader:
            _convert_to_universal(folder, tag)
            _say(f"converted step {step} from {world_size} to {place.world} ranks")
        folder = folder / "universal"
    dist.barrier()
    return _Restored(step=step, world_size=world_size, folder=folder)


def _light_step_to_use(
    config: TrainConfig, catalog: Catalog, offers: list[tuple[int, str | None] | None]
) -> int | None:
    """Rank 0: the light step every machine can restore, if it is newer than the published
    head and descends from it."""
    if not any(offers):
        return None
    try:
        head = catalog.head()
    except CatalogError:
        return None  # without the head, descent cannot be checked: restore from the store
    head_id = checkpoint_id(config.run, head.step) if head else None
    return local_tier.usable_step(offers, head.step if head else None, head_id)


def _convert_to_universal(folder: Path, tag: str) -> None:
    from types import SimpleNamespace

    from deepspeed.checkpoint import ds_to_universal

    output = folder / "universal" / tag
    shutil.rmtree(output, ignore_errors=True)
    ds_to_universal.main(
        SimpleNamespace(
            input_folder=str(folder / tag),
            output_folder=str(output),
            num_extract_workers=1,
            num_merge_workers=1,
            keep_temp_folder=False,
            strict=True,
            inject_missing_state=True,
        )
    )


def _broadcast(values: torch.Tensor) -> None:
    import torch.distributed as dist

    device = (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    )
    on_device = values.to(device)
    dist.broadcast(on_device, src=0)
    values.copy_(on_device.cpu())


def _mean_over_ranks(loss: torch.Tensor, world: int) -> float:
    """The step's loss over the whole global batch, whatever the number of ranks."""
    import torch.distributed as dist

    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / world


def _say(message: str) -> None:
    print(f"[spotrain] {message}", flush=True)


def _deepspeed_config(config: TrainConfig, *, world_size: int, universal: bool) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": config.per_rank_batch(world_size),
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": config.zero_stage},
        "bf16": {"enabled": config.bf16},
        "checkpoint": {"load_universal": universal},
        "steps_per_print": 10**9,
    }


@dataclass(frozen=True)
class TrainResult:
    losses: list[float]
    """The loss of each step this start ran (mean over all ranks)."""
    rejoin: bool = False
    """Stopped because another machine of the run was asked to (a spot notice there): this
    machine stays and should meet the others again (torchrun restarts it: exit REJOIN)."""
    leave: bool = False
    """This machine got a spot interruption notice: it is going away, and its torchrun agent
    must not meet the others again (they are re-forming without it)."""


FIRST_STEP_MARKER = ".spotrain-first-step"
"""Written to the work folder by each machine's leader once this start has trained a step: a
start that crashes without it never trained (images/bootstrap.sh then has the machine
replaced rather than restarted in place)."""

REJOIN_EXIT = 75
"""A rank's exit status when its machine should rejoin the run's group (EX_TEMPFAIL)."""


def _why_this_machine_stops(reason: str | None, world: int) -> list[str]:
    """Collective: why the ranks on this machine (torchrun's node, GROUP_RANK) were asked to
    stop, if any was: only the leader watches for spot notices, yet the whole machine goes."""
    import torch.distributed as dist

    node = os.environ.get("GROUP_RANK", "0")
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, (node, reason))
    return [why for where, why in everyone if where == node and why]


def train(config: TrainConfig) -> TrainResult:
    """Train to `config.steps` (or until a stop is agreed)."""
    prepared = preflight(config)  # a run that cannot start takes no lease, nor a process group
    config = prepared.config
    import deepspeed
    import torch.distributed as dist

    _use_gloo_collectives_without_compiling()
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    place = _Place(rank, world, leader=int(os.environ.get("LOCAL_RANK", rank)) == 0)
    config.per_rank_batch(world)  # a batch that does not split over these ranks: no lease
    storage = open_storage(config.store, kms_key_id=config.kms_key_id)
    catalog = open_catalog(storage, config.run, table=config.catalog_table)
    generation = catalog.acquire_lease(f"{os.uname().nodename}:{os.getpid()}") if rank == 0 else 0
    first_step = Path(config.work_dir) / FIRST_STEP_MARKER
    if place.leader:  # local saves a killed run never published are of no use
        shutil.rmtree(Path(config.work_dir) / "save", ignore_errors=True)
        first_step.unlink(missing_ok=True)
    restored = _restore(config, storage, catalog, place, generation)
    universal = restored is not None and restored.world_size != world
    _seed_everything(config.seed, 0)  # identical initial weights on every rank
    model = GPT(config.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, partial(lr_factor, config))
    engine, _, _, _ = deepspeed.initialize(  # DeepSpeed steps, saves and restores the schedule
        model=model, optimizer=optimizer, lr_scheduler=schedule,
        config=_deepspeed_config(config, world_size=world, universal=universal),
    )  # fmt: skip
    _seed_everything(config.seed, rank)
    start_step, parent = 0, None
    if restored is not None:
        tag = checkpoint_tag(restored.step)
        _, client_state = engine.load_checkpoint(str(restored.folder), tag=tag)
        start_step, parent = int(client_state["step"]), checkpoint_id(config.run, restored.step)
        if not universal:  # a different world has different ranks: their streams start afresh
            _set_rng_state(
                torch.load(restored.folder / tag / f"rng_rank{rank}.pt", weights_only=False)
            )
        dist.barrier()
        if place.leader:
            shutil.rmtree(Path(config.work_dir) / "restore", ignore_errors=True)
        if rank == 0:
            _say(f"resumed {config.run} at step {start_step}"
                 + (" (light checkpoint)" if restored.from_light else ""))  # fmt: skip
    preemption = PreemptionFlag().install()
    watcher = None
    if config.spot_notice_endpoint and place.leader:
        watcher = SpotNoticeWatcher(
            config.spot_notice_endpoint,
            on_interruption=preemption.request,
            on_rebalance=preemption.request_checkpoint,
            poll_seconds=config.spot_notice_poll_seconds,
        ).start()
    progress = _Progress(config, place)
    progress.event("started", step=start_step, world=world)  # one per (re)formed group
    saver = _Saver(engine, config, storage, catalog, generation, place, parent, progress)
    sampler = Sampler(
        _open_data(config, prepared, place), config.model.context, config.per_rank_batch(world),
        config.seed,
    )  # fmt: skip
    losses: list[float] = []
    rejoin = leave = False
    try:
        for step in range(start_step, config.steps):
            started = time.perf_counter()
            x, y = sampler.batch(step, rank, world)
            loss = engine(x.to(engine.device), y.to(engine.device))
            engine.backward(loss)
            engine.step()
            losses.append(_mean_over_ranks(loss, world))
            done = step + 1
            if place.leader and len(losses) == 1:
                first_step.touch()
            progress.step(done, losses[-1], x.numel() * world, time.perf_counter() - started, saver)
            asked = preemption.checkpoint_reason
            agreed = preemption.agree(engine.device, uploading=saver.uploading_here)
            if saver.in_flight is not None and not agreed.uploading:
                saver.finish()
            if agreed.checkpoint_now and rank == 0:
                _say(f"checkpoint requested after step {done} ({asked or 'on another machine'})")
            scheduled = done % config.checkpoint_every == 0 or done == config.steps
            if agreed.stop or agreed.checkpoint_now or scheduled:
                saver.start(done)
            elif config.light_every and done % config.light_every == 0:
                saver.save_light(done)
            if agreed.stop:
                saver.finish()
                # A machine that was not asked to stop stays: its agent meets the others again.
                # One that got a spot notice leaves the group for good.
                reasons = _why_this_machine_stops(preemption.reason, world)
                rejoin = not reasons
                several_machines = int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1
                leave = several_machines and any(r.startswith(SPOT_NOTICE_REASON) for r in reasons)
                if rank == 0:
                    reason = preemption.reason or "another rank was asked to stop"
                    since = preemption.seconds_since_request()
                    _say(
                        f"stopped after step {done} ({reason}); it is published"
                        + (f", {since:.1f} s after the notice" if since is not None else "")
                    )
                    progress.event("stopped", step=done, reason=reason, notice_to_published_s=since)
                break
        saver.finish()
    finally:
        if watcher is not None:
            watcher.stop()
        saver.close()
        progress.close()
    # Tear the process group down before the interpreter exits: left to exit handlers, gloo's
    # threads can be destroyed still running (the process then aborts after its work is done).
    dist.barrier()
    dist.destroy_process_group()
    return TrainResult(losses, rejoin, leave)


class _Progress:
    """Rank 0's terminal lines and metrics file (one JSON line per step and per checkpoint
    event; line-buffered, so a killed run leaves every line it finished)."""

    def __init__(self, config: TrainConfig, place: _Place) -> None:
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

    def step(self, done: int, loss: float, tokens: int, step_s: float, saver: _Saver) -> None:
        tokens_per_s = tokens / step_s
        self._record({"step": done, "loss": loss, "tokens_per_s": tokens_per_s, "step_s": step_s})
        if self.active and (done % self.config.log_every == 0 or done == self.config.steps):
            _say(f"step {done}/{self.config.steps}  loss {loss:.4f}  {tokens_per_s:,.0f} tok/s  "
                 f"checkpoint: {saver.status}")  # fmt: skip

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()


@dataclass
class _InFlight:
    step: int
    root: Path
    upload: Future[checkpoint.UploadReport] | None
    """This machine's upload (leaders only)."""
    stall_s: float
    """How long training waited for the local save."""
    began: float


class _Saver:
    """Checkpoints without stopping training for the upload: every rank writes its shards to
    local disk (the only stall), then each machine's leader uploads them on a background
    thread while training goes on. When every machine is done (all ranks learn it in the
    per-step agreement), rank 0 commits: manifest, then the catalog's conditional write. At most
    one checkpoint is in flight; the next save waits for it to be published."""

    def __init__(
        self, engine: Any, config: TrainConfig, storage: Storage, catalog: Catalog,
        generation: int, place: _Place, parent: str | None, progress: _Progress,
    ) -> None:  # fmt: skip
        self.engine, self.config, self.storage, self.catalog = engine, config, storage, catalog
        self.generation, self.place, self.parent, self.progress = (
            generation,
            place,
            parent,
            progress,
        )
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="upload") if place.leader else None
        self.in_flight: _InFlight | None = None
        self.status = f"resumed from {parent}" if parent else "none yet"

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    @property
    def uploading_here(self) -> bool:
        upload = self.in_flight.upload if self.in_flight else None
        return upload is not None and not upload.done()

    def start(self, step: int) -> None:
        """Collective: save `step` locally on every rank and start uploading it."""
        if self.in_flight is not None:
            if self.in_flight.step == step:
                return
            self.finish()
        began = time.perf_counter()
        root = self._write_locally(step, "save")
        if self.place.rank == 0:
            failpoints.hit("after-local-save")
        upload = None
        if self._pool is not None:
            upload = self._pool.submit(
                checkpoint.upload_folder, root, storage=self.storage, run=self.config.run
            )
        self.in_flight = _InFlight(step, root, upload, time.perf_counter() - began, began)
        self.status = f"step {step} uploading"

    def _write_locally(self, step: int, tier_folder: str) -> Path:
        """Collective: every rank writes its state of `step` under work_dir/<tier_folder>/;
        returns the DeepSpeed checkpoint root."""
        import torch.distributed as dist

        failpoints.saving(step)
        tag = checkpoint_tag(step)
        root = Path(self.config.work_dir) / tier_folder / tag
        # The configuration rides along, so a checkpoint says what trained it.
        state = {"step": step, "config": asdict(self.config)}
        self.engine.save_checkpoint(str(root), tag=tag, client_state=state)
        torch.save(_rng_state(), root / tag / f"rng_rank{self.place.rank}.pt")
        dist.barrier()
        return root

    def save_light(self, step: int) -> None:
        """Collective: a light checkpoint of `step` on this machine's work disk; the leader
        seals it (hashes every file) in the background, after any upload in flight."""
        began = time.perf_counter()
        root = self._write_locally(step, "light")
        # Descends from the checkpoint in flight if there is one: once published it is the head.
        parent = (
            checkpoint_id(self.config.run, self.in_flight.step) if self.in_flight else self.parent
        )
        if self._pool is not None:
            self._pool.submit(self._seal_light, root, step, parent, self.place.world,
                              self.config.definition(self.place.world))  # fmt: skip
        self.progress.event("light", step=step, stall_s=time.perf_counter() - began)

    @staticmethod
    def _seal_light(
        root: Path, step: int, parent: str | None, world_size: int, config: dict[str, Any]
    ) -> None:
        local_tier.seal(root, step=step, parent=parent, world_size=world_size, config=config)
        local_tier.prune(root.parent, keep=step)
        failpoints.hit("after-light-seal", step=step)

    def finish(self) -> None:
        """Collective: wait for every machine's upload of the checkpoint in flight, then
        publish it. Raises on every rank if any upload or the publish failed."""
        import torch.distributed as dist

        flight, self.in_flight = self.in_flight, None
        if flight is None:
            return
        mine: checkpoint.UploadReport | str | None = None
        if flight.upload is not None:
            try:
                mine = flight.upload.result()
            except Exception as error:  # reported on every rank below
                mine = f"upload of step {flight.step} failed: {error}"
        everyone: list[Any] = [None] * self.place.world
        dist.all_gather_object(everyone, mine)
        outcome: list[str | None] = [None]
        if self.place.rank == 0:
            outcome[0] = self._commit(flight, [r for r in everyone if r is not None])
        dist.broadcast_object_list(outcome, src=0)
        if self.place.leader:
            shutil.rmtree(flight.root, ignore_errors=True)
        if outcome[0] is not None:
            self.status = f"step {flight.step} failed"
            raise SpotrainError(outcome[0])
        self.parent = checkpoint_id(self.config.run, flight.step)
        self.status = f"step {flight.step} published"

    def _commit(self, flight: _InFlight, reports: list[Any]) -> str | None:
        """Rank 0: publish the union of every machine's shards; the error, if any."""
        errors = [r for r in reports if isinstance(r, str)]
        if errors:
            return "; ".join(errors)
        shards: dict[str, Shard] = {}
        for report in reports:
            for shard in report.shards:
                if shards.setdefault(shard.name, shard).sha256 != shard.sha256:
                    return (
                        f"machines wrote different files named {shard.name} at step {flight.step}"
                    )
        timings = {"stall_s": round(flight.stall_s, 3),
                   "upload_s": round(time.perf_counter() - flight.began, 3),
                   "machines": len(reports)}  # fmt: skip
        try:
            checkpoint.commit(
                list(shards.values()), storage=self.storage, catalog=self.catalog,
                generation=self.generation, run=self.config.run, step=flight.step,
                world_size=self.place.world, zero_stage=self.config.zero_stage,
                config_hash=self.config.config_hash(self.place.world),
                code_version=_code_version(), parent=self.parent,
                config=self.config.definition(self.place.world), timings=timings,
            )  # fmt: skip
        except SpotrainError as error:
            return str(error)
        sent = sum(r.uploaded_bytes for r in reports)
        reused = sum(r.reused_bytes for r in reports)
        took = time.perf_counter() - flight.began
        _say(
            f"published step {flight.step}: {sent:,} bytes sent, {reused:,} reused; training "
            f"stalled {flight.stall_s:.2f} s, published {took:.1f} s after the save"
        )
        self.progress.event(
            "published", step=flight.step, uploaded_bytes=sent, reused_bytes=reused,
            stall_s=flight.stall_s, save_to_published_s=took,
        )  # fmt: skip
        return None


def _code_version() -> str:
    from importlib.metadata import version

    libraries = {name: version(name) for name in ("spotrain", "torch", "deepspeed")}
    return ", ".join(f"{name} {number}" for name, number in libraries.items())
