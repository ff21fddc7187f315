"""Entry point for one training process: `torchrun ... -m spotrain.trainer.train CONFIG.json`.

The JSON file holds TrainConfig's fields (`model` as a nested object)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from spotrain.errors import SpotrainError, raise_if_problems
from spotrain.trainer.engine import TrainConfig, train
from spotrain.trainer.model import GPTConfig


def load_config(path: Path) -> TrainConfig:
    document = json.loads(path.read_text())
    problems = []
    for cls, given in ((TrainConfig, document), (GPTConfig, document.get("model", {}))):
        known = {f.name for f in dataclasses.fields(cls)}
        problems += [
            f"unknown field {name!r} in {cls.__name__}: use one of {', '.join(sorted(known))}"
            for name in sorted(set(given) - known)
        ]
    raise_if_problems(f"training configuration {path}", problems)
    model = GPTConfig(**document.pop("model", {}))
    return TrainConfig(**document, model=model)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: torchrun ... -m spotrain.trainer.train CONFIG.json", file=sys.stderr)
        return 2
    try:
        train(load_config(Path(args[0])))
    except (SpotrainError, TypeError, ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
