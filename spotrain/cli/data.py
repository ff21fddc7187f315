"""`spotrain data prepare|show` (datasets: text into token shards in the store) and `spotrain
config put|get|history` (the run's training configuration, stored where the fleet reads it)."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotrain.cli.arguments import run_name, whole
from spotrain.cli.output import say
from spotrain.core.errors import SpotrainError


# --- config ------------------------------------------------------------------------------------
def checked_configuration(path: Path, overrides: list[str], store: str) -> dict[str, Any]:
    """The training configuration in `path` as it is stored, once checked: every problem at
    once, and a `dataset:NAME` it names prepared in `store`."""
    from dataclasses import asdict

    from spotrain.trainer import datasets, entry_point
    from spotrain.trainer.train import load_any

    config = load_any(path, overrides)  # every problem, before anything is stored
    if isinstance(config, entry_point.EntryPointConfig):  # the run's own script
        return {**asdict(config), "entry_point": config.entry_point.document()}
    if datasets.is_dataset(config.data):
        # Stored means ready: the run's machines start once a configuration is there, so
        # the dataset it names must be there first.
        datasets.read_manifest(*datasets.locate(config.data, store,
                                                kms_key_id=config.kms_key_id))  # fmt: skip
    return asdict(config)


def store_configuration(
    storage: Any, document: dict[str, Any], *, unless_newest: bool = False
) -> Any:
    """Store a checked configuration (`checked_configuration`) as its run's newest version;
    the stored version. `unless_newest`: when the run's newest version is this one already,
    store nothing and return that version."""
    from spotrain.trainer import run_config

    if unless_newest:
        try:
            newest = run_config.newest(storage, document["run"])
        except SpotrainError:  # none stored yet, or the newest unreadable: this one goes in
            newest = None
        if newest is not None and newest.document == document:
            return newest
    return run_config.put(storage, document)


def _put(storage: Any, args: argparse.Namespace) -> int:
    if args.config is None:
        raise SpotrainError("`spotrain config put` needs the configuration file: "
                            "spotrain config put CONFIG --store URI")  # fmt: skip
    stored = store_configuration(storage, checked_configuration(args.config, args.set, args.store))
    config = stored.document
    say(f"run {config['run']}: configuration stored as {storage.uri}/{stored.key}; its machines "
        "start at the interruption handler's next capacity check (if it waited for one), "
        "and machines that start from now on train with it")  # fmt: skip
    return 0


def _get(storage: Any, args: argparse.Namespace) -> int:
    from spotrain.trainer import run_config

    run = run_name(args.run)
    if not args.to:
        raise SpotrainError("`spotrain config get` needs --to FILE (where to write it)")
    if Path(args.to).is_dir():
        raise SpotrainError(f"--to {args.to} is a folder: give the file to write, e.g. "
                            f"{Path(args.to) / 'config.json'}")  # fmt: skip
    stored = run_config.newest(storage, run)
    run_config.write(stored, Path(args.to))
    say(f"run {run}: {storage.uri}/{stored.key} -> {args.to}")
    return 0


def _history(storage: Any, args: argparse.Namespace) -> int:
    from spotrain.trainer import run_config

    run = run_name(args.run)
    versions = run_config.history(storage, run)
    if not versions:
        say(f"run {run!r} has no stored configuration in {storage.uri}")
        return 1
    for key in versions:
        say(f"{key}{'  <- machines use this one' if key == versions[-1] else ''}")
    return 0


CONFIG_ACTIONS: dict[str, Callable[[Any, argparse.Namespace], int]] = {
    "put": _put, "get": _get, "history": _history,
}  # fmt: skip


def cmd_config(args: argparse.Namespace) -> int:
    from spotrain.trainer.storage import open_storage

    storage = open_storage(args.store, kms_key_id=args.kms_key_id)
    return CONFIG_ACTIONS[args.action](storage, args)


# --- data --------------------------------------------------------------------------------------
def _show(storage: Any, args: argparse.Namespace) -> int:
    from spotrain.trainer import datasets

    say(datasets.read_manifest(storage, args.name).to_json().decode())
    return 0


def _prepare(storage: Any, args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from spotrain.trainer import datasets

    sources = [Path(p) for p in args.inputs]
    with tempfile.TemporaryDirectory() as scratch, tqdm(
        total=len(sources), unit="file", desc=f"tokenizing ({args.tokenizer})", disable=None
    ) as bar:  # fmt: skip
        report = datasets.prepare(
            sources, storage=storage, name=args.name, tokenizer=args.tokenizer,
            vocab_size=args.vocab_size, text_field=args.text_field,
            shard_tokens=args.shard_tokens, workers=args.workers, scratch=Path(scratch),
            progress=lambda done: bar.update(done - bar.n),
        )  # fmt: skip
    manifest = report.manifest
    say(f"dataset {manifest.name}: {manifest.documents:,} documents, {manifest.tokens:,} "
        f"{manifest.tokenizer['kind']} tokens (vocabulary {manifest.vocab_size:,}) in "
        f"{len(manifest.shards)} shard(s), {report.uploaded_bytes:,} bytes stored; train on "
        f'it with "data": "dataset:{manifest.name}"')  # fmt: skip
    return 0


DATA_ACTIONS: dict[str, Callable[[Any, argparse.Namespace], int]] = {
    "prepare": _prepare, "show": _show,
}  # fmt: skip


def cmd_data(args: argparse.Namespace) -> int:
    from spotrain.trainer.storage import open_storage

    if args.action != "prepare":  # which lists it with the rest of its problems
        run_name(args.name, "--name", kind="dataset")
    storage = open_storage(args.store, kms_key_id=args.kms_key_id)
    return DATA_ACTIONS[args.action](storage, args)


def add_parsers(commands: Any) -> None:
    config = commands.add_parser(
        "config", help="the run's training configuration, stored where the fleet reads it"
    )
    config.add_argument(
        "action", choices=list(CONFIG_ACTIONS),
        help="put: check CONFIG and store it as the run's newest version; get: write the newest "
        "to --to FILE (the boot script does); history: list every version",
    )  # fmt: skip
    config.add_argument("config", nargs="?", type=Path, help="put: the configuration (JSON)")
    config.add_argument(
        "--store", required=True, help="the run's store: s3://BUCKET or file:///PATH"
    )
    config.add_argument("--run", help="run name (get, history)")
    config.add_argument("--to", help="get: file to write the configuration to")
    config.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="put: override one field before storing")  # fmt: skip
    config.add_argument("--kms-key-id", help="the bucket's KMS key (default: its default key)")
    config.set_defaults(handler=cmd_config)

    data = commands.add_parser("data", help="datasets: text into token shards in the store")
    data.add_argument("action", choices=list(DATA_ACTIONS),
                      help="prepare: tokenize INPUTS and store them as dataset NAME; show: "
                      "its manifest")  # fmt: skip
    data.add_argument("inputs", nargs="*", metavar="INPUT",
                      help="prepare: text files, or JSONL (.jsonl) with a text field")  # fmt: skip
    data.add_argument("--store", required=True, help="s3://BUCKET or file:///PATH")
    data.add_argument("--name", required=True, help="the dataset's name (never overwritten)")
    data.add_argument("--tokenizer", choices=["bytes", "bpe"], default="bytes",
                      help="bytes: one token per byte; bpe: a byte-pair tokenizer trained on "
                      "the input (kept with the dataset)")  # fmt: skip
    data.add_argument("--vocab-size", type=whole(257), default=8192,
                      help="bpe: vocabulary size")  # fmt: skip
    data.add_argument("--text-field", default="text", help="JSONL: the field holding the text")
    data.add_argument("--shard-tokens", type=whole(1), default=64 * 1024 * 1024,
                      help="tokens per shard file")  # fmt: skip
    data.add_argument("--workers", type=whole(1), default=os.cpu_count() or 1,
                      help="tokenizing processes")  # fmt: skip
    data.add_argument("--kms-key-id", help="the bucket's KMS key (default: its default key)")
    data.set_defaults(handler=cmd_data)
