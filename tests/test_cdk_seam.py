"""Loading only the provider submodules the blueprint uses changes nothing in the output.

A synthesis that first imports the whole provider (all ~2,100 submodules) is the reference.
It costs half a minute, and three on a fresh clone, where its ~2,100 modules are compiled
first, so it runs when the synthesized stacks are written again (`--update-snapshots`, with
tests/test_synth_snapshot.py), and records a fingerprint of what it synthesized; every run
of the suite synthesizes with the seam alone, in a fresh interpreter, and must match that
fingerprint. A change to the stacks without the reference's check fails here, naming the
command that runs it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_synth_snapshot import SNAPSHOTS, normalized

SYNTH_AND_COUNT = """
import pathlib, sys
{preload}
from spotrain.tools import deploy
from spotrain.cdk import PROVIDER_PACKAGE
out = deploy.synth(pathlib.Path(sys.argv[1]))
loaded = sum(1 for m in sys.modules if m.startswith(PROVIDER_PACKAGE + "."))
print(loaded)
"""
FULL_IMPORT = SNAPSHOTS / "full-import.sha256"
"""The fingerprint of the stacks a synthesis after a full import of the provider wrote."""
UPDATE = ".venv/bin/pytest tests/test_cdk_seam.py tests/test_synth_snapshot.py --update-snapshots"


def _synth(tmp_path: Path, label: str, preload: str) -> tuple[dict[str, str], int]:
    """Every stack synthesized in a fresh interpreter (normalized as the snapshots are), and
    how many of the provider's submodules it loaded."""
    out = tmp_path / label
    result = subprocess.run(
        [sys.executable, "-c", SYNTH_AND_COUNT.format(preload=preload), str(out)],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    stacks = {path.parent.name: normalized(json.loads(path.read_text()))
              for path in sorted(out.rglob("cdk.tf.json"))}  # fmt: skip
    return stacks, int(result.stdout.strip().splitlines()[-1])


def _fingerprint(stacks: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for name, text in sorted(stacks.items()):
        digest.update(f"{name}\n{text}".encode())
    return digest.hexdigest()


@pytest.mark.slow
def test_lazy_loading_synthesizes_what_a_full_import_does(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    lazy, lazy_modules = _synth(tmp_path, "lazy", "")
    assert len(lazy) == 25  # 7 stacks for each of 3 environments (2 regions), and 4 runs
    # The point of the seam: a few dozen submodules instead of all ~2,100.
    assert lazy_modules < 100
    if request.config.getoption("--update-snapshots"):
        full, full_modules = _synth(tmp_path, "full", "import cdktf_cdktf_provider_aws")
        assert full_modules > 2000
        assert lazy == full
        FULL_IMPORT.write_text(_fingerprint(full) + "\n")
    recorded = FULL_IMPORT.read_text().strip() if FULL_IMPORT.exists() else "none"
    assert _fingerprint(lazy) == recorded, (
        "the stacks changed since a synthesis after a full import of the provider checked "
        f"them: run `{UPDATE}` and review the snapshots' diff")  # fmt: skip
