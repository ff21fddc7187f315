"""A run whose machines train the user's own script: its stored configuration, checked, and
the process each rank runs.

The run's training configuration (stored like the built-in trainer's, `spotrain config put`
or `run submit`) holds the run, its entry point and, filled in on each machine by the boot
script's `--set` overrides, where it is: store, catalog, key, work folder, metadata service.

    {"run": "llama", "entry_point": {"script": "examples/train_llama.py",
                                     "args": ["--steps", "200"], "steps": 200}}

`spotrain train CONFIG` starts it under torchrun (repaired, as for the built-in trainer) with
those coordinates in the environment (`COORDINATES`); every rank then runs

    python -m spotrain.trainer.entry_point --script examples/train_llama.py -- ARGS...

which runs the script as `python SCRIPT ARGS` would, then ends the process as the run's stop
requires (`membership`): a machine that stays rejoins, one that is reclaimed leaves. The
process ends without interpreter teardown, as the built-in trainer's does: by then every
checkpoint is published, and torch's and DeepSpeed's C++ threads can still be running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import runpy
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotrain.core import code_bundle
from spotrain.core.entry_point import COORDINATES, EntryPoint
from spotrain.core.errors import SpotrainError, json_kind, raise_if_problems
from spotrain.core.validation import type_problems, writable_folder_problem
from spotrain.trainer import membership
from spotrain.trainer.deepspeed_loader import quicken_deepspeed_start

ENTRY_POINT_FIELD = "entry_point"
"""A stored configuration with this field runs the user's script, not the built-in trainer."""


@dataclass(frozen=True, kw_only=True)
class EntryPointConfig:
    run: str
    entry_point: EntryPoint
    store: str | None = None
    catalog_table: str | None = None
    kms_key_id: str | None = None
    work_dir: str | None = None
    spot_notice_endpoint: str | None = None

    def environment(self) -> dict[str, str]:
        """The run's coordinates, as the script's Checkpointer reads them."""
        return {variable: str(getattr(self, name)) for name, variable in COORDINATES.items()
                if getattr(self, name) is not None}  # fmt: skip


def runs_entry_point(document: dict[str, object]) -> bool:
    return ENTRY_POINT_FIELD in document


def load(path: Path, overrides: Sequence[str] = ()) -> EntryPointConfig:
    """The entry-point configuration in `path` with `overrides`; one ConfigError lists every
    problem."""
    from spotrain.trainer.train import read_document

    return from_document(*read_document(path, overrides), path)


def from_document(document: dict[str, Any], problems: list[str], path: Path) -> EntryPointConfig:
    """`document` (read from `path`, `problems` found so far) checked as an entry-point
    configuration; one ConfigError lists every problem."""
    problems = list(problems)
    known = {f.name for f in dataclasses.fields(EntryPointConfig)}
    problems += [
        f"unknown field {name!r}: a run with an entry point takes {', '.join(sorted(known))} "
        "(its script's own settings go in entry_point.args)"
        for name in sorted(set(document) - known)
    ]
    entry = document.get(ENTRY_POINT_FIELD)
    entry_point = None
    if not isinstance(entry, dict):
        problems.append(f"entry_point is {json_kind(entry)}: give an object, e.g. "
                        '{"script": "train.py", "args": ["--steps", "100"]}')  # fmt: skip
    else:
        entry_fields = {f.name for f in dataclasses.fields(EntryPoint)}
        problems += [f"unknown field entry_point.{name!r}: use {', '.join(sorted(entry_fields))}"
                     for name in sorted(set(entry) - entry_fields)]  # fmt: skip
        given = {k: v for k, v in entry.items() if k in entry_fields}
        typed = type_problems(EntryPoint, given, "entry_point.")
        problems += typed
        if not typed:
            entry_point = EntryPoint(**given)
            problems += entry_point.problems()
    if "run" not in document:
        problems.append("run is missing: set it in the file or with --set run=...")
    values = {k: v for k, v in document.items() if k in known - {ENTRY_POINT_FIELD}}
    problems += type_problems(EntryPointConfig, values)
    raise_if_problems(f"training configuration {path}", list(dict.fromkeys(problems)))
    assert entry_point is not None
    return EntryPointConfig(entry_point=entry_point, **values)


def preflight(config: EntryPointConfig, code_dir: Path | None = None) -> Path:
    """What can be checked before any process starts: the run's code (its bundle fetched and
    checked into the work folder, or the image's code folder, the working directory), the
    script or module in it, the store's address, the work folder. Returns the folder the ranks
    run in."""
    from spotrain.trainer.storage import open_storage

    problems = []
    entry = config.entry_point
    folder = code_dir or Path.cwd()
    storage = None
    for name in ("run", "store"):
        if getattr(config, name) is None:
            problems.append(f"{name} is missing: set it with --set {name}=...")
    if config.store is not None:
        try:
            storage = open_storage(config.store, kms_key_id=config.kms_key_id)
        except SpotrainError as error:
            problems.append(f"store: {error}")
    if config.work_dir is not None and (
        problem := writable_folder_problem("work_dir", config.work_dir, Path(config.work_dir))
    ):
        problems.append(problem)
    if entry.code is not None and storage is not None and config.work_dir and not problems:
        try:
            folder = fetch_code(storage, str(config.run), entry.code, Path(config.work_dir))
        except SpotrainError as error:
            problems.append(f"entry_point.code: {error}")
    if entry.script is not None and not problems and not (folder / entry.script).is_file():
        where = "the run's code bundle" if entry.code else "the code folder"
        problems.append(
            f"entry_point.script {entry.script} is not in {where} {folder}: give the script's "
            "path relative to the root of the repository that declares the run"
        )
    if entry.module is not None and importlib.util.find_spec(entry.module.split(".")[0]) is None:
        problems.append(
            f"entry_point.module {entry.module} cannot be imported here: install its package "
            "in the image (the requirements file of `spotrain image build`), or give a script"
        )
    raise_if_problems(f"run {config.run}'s entry point", problems)
    return folder


def store_code(storage: Any, run: str, bundle: bytes, digest: str) -> None:
    """Store the repository `code_bundle.pack` packed as `run`'s code bundle `digest` (what
    `entry_point.code` names), written once: the same code is stored once."""
    from spotrain.trainer.storage import AlreadyExists

    key = code_bundle.bundle_key(run, digest)
    if not storage.exists(key):
        # Stored meanwhile by another submit of the same code: the same bytes.
        with contextlib.suppress(AlreadyExists):
            storage.put_bytes(key, bundle)


def fetch_code(storage: Any, run: str, digest: str, work_dir: Path) -> Path:
    """The run's code bundle `digest`, fetched, checked and unpacked into the work folder once
    (a later start on the machine reuses it); the folder."""
    folder = work_dir / "code" / digest.removeprefix(code_bundle.DIGEST_PREFIX)
    done = folder / ".spotrain-unpacked"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        code_bundle.unpack(storage.get_bytes(code_bundle.bundle_key(run, digest)), digest, folder)
        done.touch()
    return folder


def main(argv: list[str] | None = None) -> int:
    """One rank: run the script or module with its arguments, then exit as the run's stop
    requires."""
    given = list(sys.argv[1:] if argv is None else argv)
    if len(given) < 2 or given[0] not in ("--script", "--module"):
        raise SpotrainError("usage: python -m spotrain.trainer.entry_point "
                            "(--script FILE | --module NAME) [-- ARGS...]")  # fmt: skip
    kind, target, args = given[0], given[1], given[2:]
    # Here, not at the top: the configuration's checks (`run submit`, `spotrain train`'s
    # preflight) import this module, and the shield imports PyTorch, which only a rank needs.
    from spotrain.trainer.preemption import shield_data_loader_workers

    shield_data_loader_workers()  # before the script starts any: a stop is the rank's alone
    quicken_deepspeed_start()  # the script's DeepSpeed then does nothing twice or for nothing
    if args[:1] == ["--"]:
        args = args[1:]
    code = 0
    try:
        if kind == "--script":
            sys.argv = [target, *args]
            sys.path.insert(0, str(Path(target).resolve().parent))  # as `python SCRIPT` does
            runpy.run_path(target, run_name="__main__")
        else:
            sys.argv = [target, *args]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if exit_.code is not None and not isinstance(exit_.code, int):
            print(exit_.code, file=sys.stderr)
    if code == 0:
        code = membership.exit_status(membership.decided())
    return code


def run_process() -> None:
    work_dir = os.environ.get(COORDINATES["work_dir"])
    try:
        code = main()
    except SpotrainError as error:  # a changed definition, a configuration problem
        print(f"error: {error}", file=sys.stderr)
        membership.note_failure(work_dir, str(error))
        code = membership.CANNOT_TRAIN_EXIT
    except BaseException as error:
        import traceback

        from spotrain.trainer.checkpointer import Checkpointer

        traceback.print_exc()
        if Checkpointer.training is not None:  # what the traceback does not say, in one line
            words = Checkpointer.training.last_words(error)
            print(f"[spotrain] {words}", file=sys.stderr)
            membership.note_failure(work_dir, words)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_process()
