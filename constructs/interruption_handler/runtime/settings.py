"""What one check or event is handled with: the environment's settings (the function's
environment, `HandlerSettings`) and, for a run, its declaration (`RunDeclaration`, read from
the SSM parameters the runs' stacks write), with the clock decisions are made by."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace

from spotrain.constructs.interruption_handler.runtime import clients
from spotrain.core.capacity import RunDeclaration
from spotrain.core.handler_settings import HandlerSettings

log = logging.getLogger()


@dataclass(frozen=True)
class Settings:
    """The environment's settings, and the run's declaration once the run is known."""

    handler: HandlerSettings
    declaration: RunDeclaration | None = None

    @property
    def run(self) -> str:
        """The run handled ('' while it is not known)."""
        return self.declaration.run if self.declaration is not None else ""

    @property
    def gang_timeout_s(self) -> float:
        """How long the run's gang may take to come whole (rule 8): its own, or the handler's."""
        own = self.declaration.gang_timeout_minutes if self.declaration is not None else None
        return 60 * (own if own is not None else self.handler.gang_timeout_minutes)

    def of_run(self, declaration: RunDeclaration) -> Settings:
        return replace(self, declaration=declaration)


def from_environment() -> Settings:
    """The function's settings (a KeyError or ValueError names what is wrong)."""
    return Settings(HandlerSettings.from_environment(os.environ))


def now() -> float:
    """Wall clock of the decisions (deadlines, ledgers); one seam for tests."""
    return time.time()


DECLARATIONS_TTL_S = 30.0
"""How long a warm handler reuses the runs' declarations: a pool reclaimed at once sends
hundreds of warnings a minute, and reading SSM for each would exceed its throughput."""
_declarations: dict[str, tuple[float, dict[str, Settings]]] = {}
"""Per runs' parameter path: when read (monotonic) and what."""


def declared_runs(settings: Settings, *, fresh: bool = False) -> dict[str, Settings]:
    """Every run of the environment, by name, as the settings of its check: each run's stack
    declares it under the runs' parameter path. Read again when `fresh` or older than
    DECLARATIONS_TTL_S. A declaration that cannot be read is logged and left out (the other
    runs are served)."""
    path = settings.handler.runs_parameter_path
    read_at, runs = _declarations.get(path, (-DECLARATIONS_TTL_S, {}))
    if fresh or time.monotonic() - read_at >= DECLARATIONS_TTL_S:
        runs = read_declarations(settings)
        _declarations[path] = (time.monotonic(), runs)
    return runs


def read_declarations(settings: Settings) -> dict[str, Settings]:
    runs = {}
    pages = (
        clients.client("ssm")
        .get_paginator("get_parameters_by_path")
        .paginate(Path=settings.handler.runs_parameter_path, Recursive=False, WithDecryption=True)
    )
    for page in pages:
        for parameter in page["Parameters"]:
            run = parameter["Name"].rsplit("/", 1)[-1]
            try:
                runs[run] = settings.of_run(RunDeclaration.from_json(parameter["Value"], run=run))
            except (ValueError, TypeError, KeyError) as error:
                log.error("run %s is not served: its declaration %s is unusable (%s: %s)",
                          run, parameter["Name"], type(error).__name__, error)  # fmt: skip
    return runs
