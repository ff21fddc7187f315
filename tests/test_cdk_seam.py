"""Loading only the provider submodules the blueprint uses changes nothing in the output."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

SYNTH_AND_HASH = """
import hashlib, pathlib, sys
{preload}
from spotrain.tools import deploy
from spotrain.cdk import PROVIDER_PACKAGE
out = deploy.synth(pathlib.Path(sys.argv[1]))
loaded = sum(1 for m in sys.modules if m.startswith(PROVIDER_PACKAGE + "."))
print(loaded)
"""


def _synth(tmp_path: Path, label: str, preload: str) -> tuple[dict[str, str], int]:
    out = tmp_path / label
    result = subprocess.run(
        [sys.executable, "-c", SYNTH_AND_HASH.format(preload=preload), str(out)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    digests = {
        str(path.relative_to(out)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(out.rglob("cdk.tf.json"))
    }
    return digests, int(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_lazy_loading_synthesizes_byte_identical_json(tmp_path: Path) -> None:
    lazy, lazy_modules = _synth(tmp_path, "lazy", "")
    full, full_modules = _synth(tmp_path, "full", "import cdktf_cdktf_provider_aws")
    assert len(lazy) == 25  # 7 stacks for each of 3 environments (2 regions), and 4 runs
    assert lazy == full
    # The point of the seam: a few dozen submodules instead of all ~2,100.
    assert lazy_modules < 100 < 2000 < full_modules
