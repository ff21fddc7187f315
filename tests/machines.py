"""Fleet machines played on this host: `images/bootstrap.sh` run as the boot service runs it,
with a local metadata service for the instance, its own work disk, the local cloud for AWS
and spotrain from this environment instead of the container."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BOOTSTRAP = Path(__file__).resolve().parents[1] / "images" / "bootstrap.sh"


def boot(
    run_env: Path, imds_endpoint: str, work_dir: Path, aws_env: dict[str, str], **settings: str
) -> subprocess.Popen[str]:
    """Start one machine's boot script (its own process group, so it can be ended as EC2
    ends a machine); `settings` are more SPOTRAIN_* variables."""
    return subprocess.Popen(
        ["bash", str(BOOTSTRAP)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
        env={**os.environ, **aws_env,
             "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
             "SPOTRAIN_RUN_ENV": str(run_env), "SPOTRAIN_IMDS_ENDPOINT": imds_endpoint,
             "SPOTRAIN_CONTAINER_RUNTIME": "none", "SPOTRAIN_NPROC_PER_NODE": "1",
             "SPOTRAIN_WORK_DIR": str(work_dir), **settings},
    )  # fmt: skip
