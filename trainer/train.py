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
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spotrain.errors import SpotrainError, raise_if_problems
from spotrain.trainer.engine import TrainConfig, train
from spotrain.trainer.model import GPTConfig


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _type_problems(cls: type, given: dict[str, Any], prefix: str) -> list[str]:
    """Fields whose JSON value has the wrong type, named with the type they need."""
    hints, problems = typing.get_type_hints(cls), []
    for name, value in given.items():
        wanted = hints.get(name)
        if wanted is None or dataclasses.is_dataclass(wanted):
            continue
        allowed = typing.get_args(wanted) or (wanted,)
        if float in allowed:
            allowed += (int,)
        if isinstance(value, bool) and bool not in allowed:
            allowed = ()
        if not isinstance(value, tuple(type(None) if a is None else a for a in allowed)):
            need = " or ".join(
                "null" if a is type(None) else a.__name__
                for a in typing.get_args(wanted) or (wanted,)
            )
            problems.append(f"{prefix}{name} is {value!r}: it must be {need}")
    return problems


def load_config(path: Path, overrides: Sequence[str] = ()) -> TrainConfig:
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise SpotrainError(f"training configuration {path} not found") from None
    except json.JSONDecodeError as error:
        raise SpotrainError(f"training configuration {path} is not JSON: {error}") from None
    problems = []
    for override in overrides:
        name, equals, text = override.partition("=")
        if not equals:
            problems.append(f"--set {override!r}: write FIELD=VALUE, e.g. steps=1000")
        elif name.startswith("model."):
            document.setdefault("model", {})[name.removeprefix("model.")] = _value(text)
        else:
            document[name] = _value(text)
    model_fields = document.get("model", {})
    for cls, given, prefix in ((TrainConfig, document, ""), (GPTConfig, model_fields, "model.")):
        known = {f.name for f in dataclasses.fields(cls)}
        problems += [
            f"unknown field {name!r} in {cls.__name__}: use one of {', '.join(sorted(known))}"
            for name in sorted(set(given) - known)
        ]
        problems += _type_problems(cls, {k: v for k, v in given.items() if k in known}, prefix)
    missing = [
        f.name
        for f in dataclasses.fields(TrainConfig)
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and f.name not in document
    ]
    problems += [
        f"{name} is missing: set it in the file or with --set {name}=..." for name in missing
    ]
    raise_if_problems(f"training configuration {path}", problems)
    model = GPTConfig(**document.pop("model", {}))
    return TrainConfig(**document, model=model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spotrain.trainer.train")
    parser.add_argument("config", type=Path, help="training configuration (JSON)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="override one field"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        train(load_config(args.config, args.set))
    except (SpotrainError, TypeError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


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
