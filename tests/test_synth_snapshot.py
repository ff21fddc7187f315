"""Every environment's synthesized stacks against a checked-in, normalized snapshot: a change
detector (the construct tests say what must hold; this says that something changed, and where).
The handler package's file name and hash are left out: they change with the handler's code.

After an intended change, write the snapshot again and review its diff:

    .venv/bin/pytest tests/test_cdk_seam.py tests/test_synth_snapshot.py --update-snapshots

(the first also checks that a synthesis after a full import of the provider writes the same).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

SNAPSHOTS = Path(__file__).parent / "fixtures" / "synth"
_PACKAGE = re.compile(r"assets/Handler_Package_[0-9A-F]+/[0-9A-F]+/")


def normalized(stack: dict[str, Any]) -> str:
    """One line per block entry (`resource.TYPE.NAME`, `output.NAME`, ...), keys sorted, the
    handler package's path and hash replaced: diffs read resource by resource."""
    lines = []
    for block, entries in sorted(stack.items()):
        if block == "//":  # CDKTF's metadata (its version, the stack's path)
            continue
        if block in ("resource", "data"):
            for kind, named in sorted(entries.items()):
                for name, body in sorted(named.items()):
                    lines.append(f"{block}.{kind}.{name} {json.dumps(body, sort_keys=True)}")
        elif isinstance(entries, dict):
            for name, body in sorted(entries.items()):
                lines.append(f"{block}.{name} {json.dumps(body, sort_keys=True)}")
        else:
            lines.append(f"{block} {json.dumps(entries, sort_keys=True)}")
    text = "\n".join(lines) + "\n"
    text = _PACKAGE.sub("assets/HANDLER_PACKAGE/", text)
    return re.sub(r'"source_code_hash": "[^"]+"', '"source_code_hash": "HANDLER_HASH"', text)


def test_every_stack_synthesizes_as_its_snapshot(
    synth_dir: Path, request: pytest.FixtureRequest
) -> None:
    stacks = sorted(p.parent.name for p in (synth_dir / "stacks").glob("*/cdk.tf.json"))
    now = {n: normalized(json.loads((synth_dir / "stacks" / n / "cdk.tf.json").read_text()))
           for n in stacks}  # fmt: skip
    if request.config.getoption("--update-snapshots"):
        SNAPSHOTS.mkdir(parents=True, exist_ok=True)
        for old in SNAPSHOTS.glob("*.txt"):
            old.unlink()
        for name, text in now.items():
            (SNAPSHOTS / f"{name}.txt").write_text(text)
    kept = sorted(p.stem for p in SNAPSHOTS.glob("*.txt"))
    assert kept == stacks, "stacks came or went: write the snapshot again (see the docstring)"
    changed = []
    for name in stacks:
        before = set((SNAPSHOTS / f"{name}.txt").read_text().splitlines())
        after = set(now[name].splitlines())
        changed += [f"{name}: - {line[:160]}" for line in sorted(before - after)]
        changed += [f"{name}: + {line[:160]}" for line in sorted(after - before)]
    assert not changed, "the synthesized stacks changed:\n" + "\n".join(changed[:40])
