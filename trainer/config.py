"""The built-in trainer's configuration: the run's fields (`TrainConfig`) and the model's shape
(`GPTConfig`), each checked as a whole when it is made. Without PyTorch: a run file's
`[training]` section is checked where runs are planned and submitted (`spotrain deploy`, `run
submit`: `train.training_problems`), which must not pay torch's import for it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from spotrain.core.catalog_schema import run_name_problem
from spotrain.core.errors import SpotrainError, raise_if_problems
from spotrain.core.global_batch import DEFAULT_MICRO_BATCH
from spotrain.core.validation import instance_type_problems
from spotrain.trainer import datasets


@dataclass(frozen=True)
class GPTConfig:
    """The model's shape."""

    vocab_size: int | None = None
    """Tokens the model knows; None takes the training data's vocabulary (256 for byte
    tokens, the tokenizer's for a byte-pair dataset)."""
    context: int = 128
    """Longest sequence the model reads."""
    layers: int = 4
    """Transformer blocks."""
    heads: int = 4
    """Attention heads per block."""
    width: int = 256
    """Model width; a multiple of `heads`."""
    dropout: float = 0.0
    """Dropout on residual branches (attention itself never drops)."""

    def __post_init__(self) -> None:
        problems = instance_type_problems(self, "model.")
        if not problems:
            problems = [
                f"model.{name} is {getattr(self, name)}: use 1 or more"
                for name in ("vocab_size", "context", "layers", "heads", "width")
                if getattr(self, name) is not None and getattr(self, name) < 1
            ]
        if not problems and self.width % self.heads:
            problems.append(
                f"model.width {self.width} is not a multiple of model.heads {self.heads}: "
                f"use e.g. width {self.heads * max(1, round(self.width / self.heads))}"
            )
        if not problems and not 0 <= self.dropout < 1:
            problems.append(f"model.dropout is {self.dropout}: use a fraction in [0, 1)")
        raise_if_problems("model", problems)


class MemoryOptions(Protocol):
    """The training configuration's fields these options are made of."""

    zero_stage: int
    activation_checkpointing: bool
    offload_optimizer: str
    offload_params: str
    work_dir: str


OPTIMIZER_OFFLOAD = ("none", "cpu")
"""Where ZeRO may keep the optimizer's state: the GPUs, or host memory. Not NVMe: DeepSpeed
0.19.8 resumes NVMe-swapped optimizer state inexactly (a resumed run's second step already
differs from an uninterrupted run's), and a run here resumes exactly or not at all."""

PARAMETER_OFFLOAD = ("none", "cpu", "nvme")
"""Where ZeRO stage 3 may keep the parameters: the GPUs, host memory, or NVMe files."""


def option_problems(options: MemoryOptions) -> list[str]:
    """What is wrong with the memory options, each problem with its fix."""
    offload_optimizer, offload_params = options.offload_optimizer, options.offload_params
    problems = []
    if offload_optimizer == "nvme":
        problems.append(
            'offload_optimizer = "nvme" is not offered: DeepSpeed does not resume optimizer '
            'state swapped to NVMe exactly; use "cpu" (host memory: 12 bytes a parameter), '
            'and offload_params = "nvme" at zero_stage 3 if the parameters must leave too'
        )
    elif offload_optimizer not in OPTIMIZER_OFFLOAD:
        problems.append(f"offload_optimizer is {offload_optimizer!r}: use one of "
                        f"{', '.join(OPTIMIZER_OFFLOAD)}")  # fmt: skip
    if offload_params not in PARAMETER_OFFLOAD:
        problems.append(f"offload_params is {offload_params!r}: use one of "
                        f"{', '.join(PARAMETER_OFFLOAD)}")  # fmt: skip
    elif offload_params != "none" and options.zero_stage != 3:
        problems.append(
            f"offload_params = {offload_params!r} needs zero_stage 3 (only stage 3 partitions "
            'the parameters): set zero_stage = 3, or offload_params = "none"'
        )
    return problems


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
        problems += option_problems(self)
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
