"""What can be checked about a run of the built-in trainer before it starts: `spotrain train`
runs it before torchrun, and every rank again before it takes the run's lease.

It imports no PyTorch: `spotrain train` hands its process to torchrun (`os.execv`), which
imports PyTorch itself, so an import here was seconds of CPU paid twice at every start. (A
run with an offload option is the exception: `memory.machine_problems` asks torch's extension
builder where ninja is, for the DeepSpeed op that run compiles anyway.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from spotrain.core.errors import SpotrainError, raise_if_problems
from spotrain.core.validation import writable_folder_problem
from spotrain.trainer import datasets, memory
from spotrain.trainer.config import TrainConfig
from spotrain.trainer.data import TokenFile, fit_problems
from spotrain.trainer.storage import Storage, open_storage


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
