"""What a user types, checked before a command uses it: argparse types (`number`, `whole`)
for flags argparse converts, and checks a command makes first (`finite`, `run_name`,
`figure_path`) that raise one SpotrainError naming the flag and what to give instead. So no
number that is not finite, no name a run cannot have and no figure path matplotlib cannot
write gets into the work.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotrain.core.catalog_schema import run_name_problem
from spotrain.core.errors import ConfigError, CostInputError, SpotrainError

MAX_REPLAYS = 10_000
"""The most traces, starts or samples a command replays (each one walks every tick)."""
EVENTS_TABLE_FIX = (
    "give the catalog stack's events table (spotrain-<env>-events) and credentials that may read it"
)
CATALOG_TABLE_FIX = (
    "give the catalog stack's checkpoint table (spotrain-<env>-checkpoints) and credentials that "
    "may read it"
)


def number(kind: type = float, *, maximum: float | None = None) -> Callable[[str], float]:
    """An argparse type: a finite number (of `kind`) above 0, and at most `maximum`."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(
                f"{text} is not a finite number: give a number above 0"
            )
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} is not positive: give a number above 0")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{text} is too many: give at most {maximum:,}")
        return value  # type: ignore[no-any-return]

    return parse


def whole(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number in [minimum, maximum]."""

    def parse(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            upper = f" and at most {maximum}" if maximum is not None else ""
            raise argparse.ArgumentTypeError(
                f"{text!r}: give a whole number of at least {minimum}{upper}"
            )
        return value

    return parse


def finite(
    flag: str,
    value: float | None,
    *,
    unit: str,
    zero: bool = False,
    error: type[SpotrainError] = SpotrainError,
) -> None:
    """A flag's number (when given) is finite and positive, or 0 too with `zero`."""
    if value is None:
        return
    if math.isfinite(value) and (value >= 0 if zero else value > 0):
        return
    wanted = f"a number of {unit}, 0 or more" if zero else f"a positive number of {unit}"
    raise error(f"{flag} is {value}: give {wanted}")


def run_name(value: str | None, flag: str = "--run", *, kind: str = "run") -> str:
    """A run's (or a dataset's) name, as its bucket keys, catalog keys, IAM conditions and
    tags accept it."""
    problem = run_name_problem(value, kind)
    if problem:
        raise SpotrainError(f"{flag}: {problem}")
    assert value is not None  # a valid name
    return value


def figure_path(value: str | None, flag: str = "--plot") -> None:
    """Where a figure goes (when asked for): a file type matplotlib writes, in a folder that
    exists; checked before the work, so a long computation does not end at a path it cannot
    write."""
    if value is None:
        return
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(value)
    kinds = FigureCanvasBase.get_supported_filetypes()
    suffix = path.suffix.lower().removeprefix(".")
    if suffix not in kinds:
        kind = f"ends in {path.suffix}" if path.suffix else "has no file type"
        raise SpotrainError(
            f"{flag} {value} {kind}: name a .png file (or .{', .'.join(sorted(kinds))})"
        )
    if not path.parent.is_dir():
        raise SpotrainError(
            f"{flag} {value}: the folder {path.parent} does not exist; create it or write "
            "the figure elsewhere"
        )
    if path.is_dir():
        raise SpotrainError(f"{flag} {value} is a folder: name a file in it")


def environment(name: str) -> Any:
    """The environment configuration of that name (stacks/environments.py)."""
    from spotrain.stacks.environments import all_environments

    found = {e.name: e for e in all_environments()}
    if name not in found:
        raise CostInputError(f"environment {name!r} is unknown: use one of {', '.join(found)}")
    return found[name]


def reach_fix(environment: str) -> str:
    """What to check when environment `environment` does not answer: for `local`, from a shell
    not pointed at the local cloud, that first."""
    if environment == "local" and not os.environ.get("AWS_ENDPOINT_URL"):
        return ('the local environment is on the local cloud: point this shell at it with '
                '`eval "$(spotrain local env)"` (`spotrain deploy local` starts it and deploys '
                "the environment)")  # fmt: skip
    return (f"check the environment is deployed (`spotrain deploy {environment}`), "
            "AWS_DEFAULT_REGION and your credentials")  # fmt: skip


def raise_all(problems: list[str], subject: str = "the plan") -> None:
    """Every problem of `subject`'s inputs at once: one line for one, a list for several."""
    if len(problems) == 1:
        raise CostInputError(problems[0])
    if problems:
        raise ConfigError(subject, problems)
