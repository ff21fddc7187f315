"""Type checks for configuration dataclasses, before their values are used: a budget given as a
string, instance types given as one string instead of a list, a model given as a number. Each
problem names the field and the type it needs, so `raise_if_problems` can list them all.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def _plural(wanted: Any) -> str:
    return _describe(wanted).removeprefix("a ").removeprefix("an ") + "s"


def _describe(wanted: Any) -> str:
    origin, args = typing.get_origin(wanted), typing.get_args(wanted)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if wanted is type(None):
        return "null"
    if origin is tuple:
        return f"a list of {_plural(args[0])}" if args else "a list"
    if origin is not None and issubclass(origin, Mapping):
        return f"a mapping of {_plural(args[0])} to {_plural(args[1])}" if args else "a mapping"
    if dataclasses.is_dataclass(wanted):
        return f"a {wanted.__name__}"
    return {
        str: "a string",
        int: "an integer",
        float: "a finite number",
        bool: "true or false",
    }.get(wanted, getattr(wanted, "__name__", str(wanted)))


def matches(value: Any, wanted: Any) -> bool:
    """Whether `value` has type `wanted` (str, int, float, bool, None, unions, tuple[X, ...],
    Mapping[K, V], dataclasses). Integers pass for floats, booleans never for numbers, and
    floats must be finite."""
    origin, args = typing.get_origin(wanted), typing.get_args(wanted)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, a) for a in args)
    if wanted is type(None):
        return value is None
    if wanted is Any:
        return True
    if origin is tuple:
        if not isinstance(value, tuple | list):
            return False
        return not args or all(matches(v, args[0]) for v in value)
    if origin is not None and issubclass(origin, Mapping):
        if not isinstance(value, Mapping):
            return False
        return not args or all(
            matches(k, args[0]) and matches(v, args[1]) for k, v in value.items()
        )
    if wanted is bool:
        return isinstance(value, bool)
    if wanted in (int, float) and isinstance(value, bool):
        return False
    if wanted is float:
        return isinstance(value, int | float) and math.isfinite(value)
    if isinstance(wanted, type):
        return isinstance(value, wanted)
    return True  # a type this checker does not model is left to the dataclass's own checks


def type_problems(cls: type, values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """One problem per value in `values` (field name -> value) whose type is not the one `cls`
    declares for that field; fields `cls` does not declare are not judged here."""
    hints = typing.get_type_hints(cls)
    problems = []
    for name, value in values.items():
        wanted = hints.get(name)
        if wanted is None or matches(value, wanted):
            continue
        problems.append(f"{prefix}{name} is {value!r}: it must be {_describe(wanted)}")
    return problems


def says_any(problem: str, names: Iterable[str]) -> bool:
    """Whether `problem` speaks of any field of `names` ("steps", "model.width"): a whole name,
    not part of another ("warmup_steps", "training.steps")."""
    return any(re.search(rf"(^|[^\w.]){re.escape(name)}\b", problem) for name in names)


def field_values(instance: Any) -> dict[str, Any]:
    """A dataclass instance's fields, by name."""
    return {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)}


def instance_type_problems(instance: Any, prefix: str = "") -> list[str]:
    """`type_problems` for every field of a dataclass instance."""
    return type_problems(type(instance), field_values(instance), prefix)


def mistyped_fields(cls: type, values: Mapping[str, Any]) -> frozenset[str]:
    """The names in `values` whose values are not of the types `cls` declares for them (those
    `type_problems` speaks of): their values' own checks wait for the type's fix."""
    hints = typing.get_type_hints(cls)
    return frozenset(name for name, value in values.items()
                     if name in hints and not matches(value, hints[name]))  # fmt: skip


def writable_folder_problem(name: str, value: str, folder: Path) -> str | None:
    """Why the setting `name` (= `value`) cannot be used: its `folder` cannot be made or
    written here (checked with a probe file, removed at once); None if it can."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.NamedTemporaryFile(dir=folder, prefix=".spotrain-probe.").close()
    except OSError as error:
        return f"{name} {value!r} cannot be written here: {error}"
    return None
