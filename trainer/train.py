"""Entry point for one training process:
`torchrun ... -m spotrain.trainer.train CONFIG.json [--set FIELD=VALUE ...]`
(`spotrain train` builds that command line).

The JSON file holds TrainConfig's fields (`model` as a nested object); `--set` overrides one
field (`model.width=128` reaches into the model), its value read as JSON when it parses and as
a string otherwise. Every problem with the result is reported at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotrain.core.errors import ConfigError, SpotrainError, raise_if_problems
from spotrain.core.validation import mistyped_fields, says_any, type_problems
from spotrain.trainer import membership
from spotrain.trainer.config import GPTConfig, TrainConfig

if TYPE_CHECKING:
    from spotrain.trainer.entry_point import EntryPointConfig


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def read_document(path: Path, overrides: Sequence[str] = ()) -> tuple[dict[str, Any], list[str]]:
    """The training configuration in `path` (a JSON object) with `overrides` applied, and the
    problems found with the overrides; an error when the file is not a JSON object."""
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise SpotrainError(f"training configuration {path} not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SpotrainError(f"training configuration {path} cannot be read: {error}") from None
    except json.JSONDecodeError as error:
        raise SpotrainError(f"training configuration {path} is not JSON: {error}") from None
    if not isinstance(document, dict):
        kind = {list: "array", str: "string"}.get(type(document), type(document).__name__)
        example = '{"run": ..., "store": ..., ...}'
        raise ConfigError(f"training configuration {path}",
                          [f"it holds a JSON {kind}, not an object: write {example}"])  # fmt: skip
    problems = []
    for override in overrides:
        name, equals, text = override.partition("=")
        if not equals or not name:
            problems.append(f"--set {override!r}: write FIELD=VALUE, e.g. steps=1000")
        elif name.startswith("model."):
            model = document.setdefault("model", {})
            if isinstance(model, dict):
                model[name.removeprefix("model.")] = _value(text)
        else:
            document[name] = _value(text)
    return document, problems


def load_any(path: Path, overrides: Sequence[str] = ()) -> TrainConfig | EntryPointConfig:
    """The run's configuration in `path`, read once: the built-in trainer's, or the user's
    entry point's when it names one; checked as a whole either way."""
    from spotrain.trainer import entry_point

    document, problems = read_document(path, overrides)
    if entry_point.runs_entry_point(document):
        return entry_point.from_document(document, problems, path)
    return _train_config(document, problems, path)


def load_config(path: Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """The configuration in `path` with `overrides`, checked as a whole: one ConfigError
    lists every problem (unknown, missing and mistyped fields, values out of range)."""
    return _train_config(*read_document(path, overrides), path)


_STAND_INS: dict[str, Any] = {
    "run": "stand-in", "store": "file:///stand-in", "data": "stand-in", "steps": 1,
    "work_dir": "stand-in",
}  # fmt: skip
"""For each field a configuration must give, a value that passes its own checks: a
configuration missing it is still checked for the rest (`_train_config`), never used."""


def training_problems(document: Mapping[str, Any]) -> list[str]:
    """Every problem of the built-in trainer's configuration as a run file declares it
    (`[training]`): the fields each machine fills in (`store`, `work_dir`) and the run's name
    stand in, as `spotrain run submit` gives them."""
    given = {"run": "stand-in", "store": "s3://stand-in", "work_dir": "stand-in", **document}
    try:
        _train_config(given, [], "the run's training", missing_fix="set it in [training]")
    except ConfigError as error:
        return error.problems
    return []


def _train_config(
    document: dict[str, Any],
    problems: list[str],
    path: Path | str,
    missing_fix: str = "set it in the file or with --set {name}=...",
) -> TrainConfig:
    subject = f"training configuration {path}" if isinstance(path, Path) else path
    model_fields = document.get("model", {})
    if not isinstance(model_fields, dict):
        problems.append(
            f"model is {model_fields!r}: it must be an object of model fields, e.g. "
            '{"layers": 4, "width": 256, "heads": 4, "context": 128}'
        )
        model_fields = {}
    mistyped: dict[str, set[str]] = {}  # per prefix: fields whose values are not checked further
    for cls, given, prefix in ((TrainConfig, document, ""), (GPTConfig, model_fields, "model.")):
        known = {f.name for f in dataclasses.fields(cls)}
        problems += [
            f"unknown field {prefix}{name!r}: use one of {', '.join(sorted(known))}"
            for name in sorted(set(given) - known)
        ]
        typed = {k: v for k, v in given.items() if k in known and k != "model"}
        mistyped[prefix] = set(mistyped_fields(cls, typed))
        problems += type_problems(cls, typed, prefix)
    # What the checks below say through a mistyped value (left out: its default or stand-in
    # takes its place) is not said.
    unsaid = [f"{prefix}{name}" for prefix, names in mistyped.items() for name in names]
    missing = [
        f.name
        for f in dataclasses.fields(TrainConfig)
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and f.name not in document
    ]
    problems += [f"{name} is missing: {missing_fix.format(name=name)}" for name in missing]
    # Each part's own checks too, so one message lists every problem.
    known_model = {f.name for f in dataclasses.fields(GPTConfig)}
    try:
        model = GPTConfig(**{k: v for k, v in model_fields.items()
                             if k in known_model and k not in mistyped["model."]})  # fmt: skip
    except ConfigError as error:
        problems += [p for p in error.problems if not says_any(p, unsaid)]
        model = GPTConfig()
    config = None
    absent = [*missing, *(n for n in mistyped[""] if n in _STAND_INS)]
    if all(name in _STAND_INS for name in missing):
        # With fields missing, the values given are still checked: each missing one stands in
        # with a value its own checks pass (none of the checks relates it to another field).
        known_train = {f.name for f in dataclasses.fields(TrainConfig)} - {"model"}
        given = {k: v for k, v in document.items() if k in known_train and k not in mistyped[""]}
        try:
            config = TrainConfig(**{**{n: _STAND_INS[n] for n in absent}, **given}, model=model)
        except ConfigError as error:
            problems += [p for p in error.problems if not says_any(p, unsaid)]
    raise_if_problems(subject, list(dict.fromkeys(problems)))
    assert config is not None  # no problems: every field was there and right
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spotrain.trainer.train")
    parser.add_argument("config", type=Path, help="training configuration (JSON)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="override one field"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from spotrain.trainer.engine import train  # PyTorch: only where a run trains

    config = None
    try:
        config = load_config(args.config, args.set)
        result = train(config)
    except SpotrainError as error:  # a changed definition, a configuration or data problem
        print(f"error: {error}", file=sys.stderr)
        membership.note_failure(config.work_dir if config else None, str(error))
        return membership.CANNOT_TRAIN_EXIT
    return membership.exit_status(result.stop)


def run_process() -> None:
    """Run one rank and end its process without interpreter teardown: by then every checkpoint
    is published, and the C++ threads of torch.distributed and DeepSpeed can still be running
    when static destructors fire, which aborts a finished process ("terminate called without
    an active exception") and makes torchrun report a failure."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_process()
