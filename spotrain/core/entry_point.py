"""What a run trains: the built-in GPT (`spotrain train` over a training configuration), or the
user's own training script, its entry point.

A run file's `[entry_point]` names a script (a path in the repository that declares the run,
which `spotrain run submit` stores as the run's code bundle: core/code_bundle.py) or a module
the image carries, with its arguments. The fleet starts it under
the same launch as the built-in trainer: torchrun, repaired for an elastic fleet, the same
membership handling (a machine that stays meets the others again, one that is reclaimed
leaves) and the same shutdown timeout. The run's coordinates reach the script one way, as
environment variables (`COORDINATES`) that `spotrain.trainer.Checkpointer` reads for every
setting it is not given, so a loop written for a laptop runs unchanged on the fleet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

COORDINATES: dict[str, str] = {
    "run": "SPOTRAIN_RUN",
    "store": "SPOTRAIN_STORE",
    "catalog_table": "SPOTRAIN_CATALOG_TABLE",
    "kms_key_id": "SPOTRAIN_KMS_KEY_ID",
    "work_dir": "SPOTRAIN_CHECKPOINT_WORK_DIR",
    "spot_notice_endpoint": "SPOTRAIN_SPOT_NOTICE_ENDPOINT",
}
"""The Checkpointer's settings that say where the run is, by the environment variable that
carries each into a training process: `spotrain train` sets them from the machine's boot
settings; the Checkpointer reads any it is not given."""

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True, kw_only=True)
class EntryPoint:
    """The user's training script, started on every machine of the run (each rank runs it)."""

    script: str | None = None
    """A Python file, relative to the repository that declares the run (the folder above its
    `runs/`), e.g. `examples/train_llama.py`."""
    module: str | None = None
    """Or an importable module run as `python -m`, e.g. `mytraining.main`."""
    args: tuple[str, ...] = field(default_factory=tuple)
    """Its command-line arguments."""
    steps: int | None = None
    """The run's last step, when the script knows it: `spotrain run status` shows progress
    and an ETA against it. None: shown without a total."""
    code: str | None = None
    """The run's code bundle (`sha256:HEX`, core/code_bundle.py): the repository that declares
    the run, which `spotrain run submit` stores and each machine fetches and runs the script
    from. None: the image's code folder."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))

    def problems(self, prefix: str = "entry_point.") -> list[str]:
        found = []
        if (self.script is None) == (self.module is None):
            found.append(
                f"{prefix}script or {prefix}module: give exactly one, the file to run (e.g. "
                "'examples/train_llama.py') or the module (e.g. 'mytraining.main')"
            )
        if self.script is not None:
            path = PurePosixPath(self.script)
            if not self.script.endswith(".py") or path.is_absolute() or ".." in path.parts:
                found.append(
                    f"{prefix}script {self.script!r}: give a .py file by its path relative "
                    "to the repository's root (the folder above runs/), e.g. "
                    "'examples/train_llama.py'"
                )
        if self.module is not None and not _MODULE.match(self.module):
            found.append(
                f"{prefix}module {self.module!r} is not a module name: write it as for "
                "`python -m`, e.g. 'mytraining.main'"
            )
        if self.steps is not None and (isinstance(self.steps, bool) or self.steps < 1):
            found.append(f"{prefix}steps is {self.steps!r}: give the run's last step (1 or more)")
        if self.code is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", self.code):
            found.append(f"{prefix}code {self.code!r} is not a code bundle's digest "
                         "(sha256:HEX): `spotrain run submit` sets it")  # fmt: skip
        return found

    @property
    def target(self) -> tuple[str, str]:
        """How it is started: ("--script", path) or ("--module", name)."""
        return ("--script", str(self.script)) if self.script else ("--module", str(self.module))

    def document(self) -> dict[str, Any]:
        """As stored in the run's training configuration (JSON)."""
        shown: dict[str, Any] = {"script": self.script} if self.script else {"module": self.module}
        shown["args"] = list(self.args)
        if self.steps is not None:
            shown["steps"] = self.steps
        if self.code is not None:
            shown["code"] = self.code
        return shown
