"""How a training process ends when its run stops, so that torchrun does the right thing with
its machine. The same for the built-in trainer and a user's own script (a run's entry point):
the `Checkpointer` decides when it stops, the process's exit carries the decision.

- A machine that was not asked to stop (another one got a spot notice or SIGTERM) stays: its
  ranks exit `REJOIN_EXIT` and its torchrun agent meets the others again.
- A machine of several that got a spot notice leaves for good: its agent is stopped, so it does
  not meet the others again while they re-form without it.
- Otherwise (a lone machine, a SIGTERM on this machine, a finished run) the ranks exit 0.

Each machine's leader also marks the work folder once this start has trained a step
(`FIRST_STEP_MARKER`): a start that crashes without it never trained, and the boot script has
the machine replaced rather than restarted in place.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REJOIN_EXIT = 75
"""A rank's exit status when its machine should rejoin the run's group (EX_TEMPFAIL)."""

CANNOT_TRAIN_EXIT = 2
"""A rank's exit status when this start cannot train and trying again would not help, as for
every spotrain command refused for what it was given: its checkpoint was trained with another
definition, its configuration or data is wrong. spotrain's torchrun does not restart such
ranks (`launch.py`); the machine's exit counts as a crash, with the reason from
`FAILURE_NOTE`, and a run that crashes everywhere is held."""

FAILURE_NOTE = ".spotrain-failure"
"""Written to the work folder with the reason a rank could not train (images/bootstrap.sh
records it with the machine's crash; `spotrain run status` shows it)."""

FIRST_STEP_MARKER = ".spotrain-first-step"
"""Written to the work folder by each machine's leader once this start has trained a step
(images/bootstrap.sh reads it)."""


@dataclass(frozen=True)
class Stop:
    """What the machine does after the run stopped (a published checkpoint behind it)."""

    rejoin: bool
    """Stopped because another machine was asked to: this one stays and meets them again."""
    leave: bool
    """This machine got a spot notice and others remain: it must not meet them again."""


_decided: Stop | None = None


def agree(reason: str | None, world: int) -> Stop:
    """Collective, once every rank agreed to stop: why the ranks on this machine (torchrun's
    node, GROUP_RANK) were asked to stop, if any was (only the leader watches for spot notices,
    yet the whole machine goes). Recorded for `exit_status`."""
    import torch.distributed as dist

    from spotrain.trainer.spot_notice import SPOT_NOTICE_REASON

    global _decided
    node = os.environ.get("GROUP_RANK", "0")
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, (node, reason))
    reasons = [why for where, why in everyone if where == node and why]
    several_machines = int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1
    _decided = Stop(
        rejoin=not reasons,
        leave=several_machines and any(r.startswith(SPOT_NOTICE_REASON) for r in reasons),
    )
    return _decided


def decided() -> Stop | None:
    """This process's decision, if its run stopped."""
    return _decided


def exit_status(stop: Stop | None) -> int:
    """The rank's exit status for `stop` (None: the run did not stop, 0). A leaving machine's
    first rank stops its torchrun agent (this process's parent) first."""
    if stop is None:
        return 0
    if stop.leave and os.environ.get("TORCHELASTIC_RUN_ID") and os.environ.get("LOCAL_RANK") == "0":
        os.kill(os.getppid(), signal.SIGTERM)
    return REJOIN_EXIT if stop.rejoin else 0


def note_failure(work_dir: str | None, reason: str) -> None:
    """Leave `reason` in the work folder for the boot script (nothing without a folder)."""
    if not work_dir:
        return
    try:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
        (Path(work_dir) / FAILURE_NOTE).write_text(reason.strip()[:1000] + "\n")
    except OSError:
        pass  # the reason is printed anyway; the note only carries it further
