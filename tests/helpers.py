"""Helpers for reading synthesized stacks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load_stack(synth_dir: Path, name: str) -> dict[str, Any]:
    return json.loads((synth_dir / "stacks" / name / "cdk.tf.json").read_text())


def resources(stack: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return stack.get("resource", {}).get(kind, {})


def data_sources(stack: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return stack.get("data", {}).get(kind, {})
