"""The interruption handler's settings with their defaults, named once: the construct's props
default to them and pass them in the function's environment (`HandlerSettings`, which owns each
variable's name), the handler reads them back, and the cost simulator plays the blueprint's
fixed on-demand wait with the same number."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

EVENT_RETENTION_DAYS = 90
"""Days an event record is kept (the events table's TTL)."""
HOT_POOL_THRESHOLD = 2
"""Interruptions in the window that make a pool hot (its capacity moves elsewhere)."""
RATE_WINDOW_MINUTES = 60
"""The window those interruptions are counted in."""
ON_DEMAND_DEADLINE_MINUTES = 10
"""How long a run without a deadline waits short of spot before on-demand covers it."""
CAPACITY_CHECK_MINUTES = 5
"""How often the scheduled capacity check runs; a deadline decision holds until the next."""
GANG_TIMEOUT_MINUTES = 15
"""How long a run's gang may take to come whole before the machines that came are released
(rule 8 of `capacity_policy`): three checks, past the on-demand fallback's wait."""
FAILOVER_AFTER_CHECKS = 3
"""Scheduled checks in a row the region a run trains in must fail to answer before the next
of its regions moves it there (`failover`)."""


def runs_parameter_path(environment: str) -> str:
    """Where each run of the environment declares itself to the interruption handler: one SSM
    parameter per run, written by the run's stack (`run_parameter_name`), so the handler serves
    every run of its environment without being redeployed for each."""
    return f"/spotrain/{environment}/runs"


def run_parameter_name(environment: str, run: str) -> str:
    return f"{runs_parameter_path(environment)}/{run}"


@dataclass(frozen=True, kw_only=True)
class HandlerSettings:
    """What the construct hands the handler's function, each setting under its own
    environment variable (its field's name in capitals: `EVENTS_TABLE`, ...): the construct
    writes them with `to_environment`, the handler reads them with `from_environment`, and
    nothing else spells a variable's name."""

    events_table: str
    event_retention_days: int = EVENT_RETENTION_DAYS
    environment: str
    alert_topic_arn: str | None = None
    dead_letter_queue_url: str | None = None
    hot_pool_threshold: int = HOT_POOL_THRESHOLD
    rate_window_minutes: float = RATE_WINDOW_MINUTES
    on_demand_deadline_minutes: float = ON_DEMAND_DEADLINE_MINUTES
    capacity_check_minutes: float = CAPACITY_CHECK_MINUTES
    gang_timeout_minutes: float = GANG_TIMEOUT_MINUTES
    failover_after_checks: int = FAILOVER_AFTER_CHECKS
    checkpoints_table: str | None = None
    config_bucket: str | None = None
    """Where the runs' training configurations are stored: a run's groups start once it is."""
    queue_policy: str | None = None
    """The environment's teams and vCPU ceilings, as JSON (`admission.QueuePolicy`): runs
    that do not fit wait in the queue. None: an environment that limits neither."""

    @property
    def runs_parameter_path(self) -> str:
        return runs_parameter_path(self.environment)

    def to_environment(self) -> dict[str, str]:
        """The function's environment variables (the runs' parameter path beside them, for
        the operator who reads the function's configuration)."""
        variables: dict[str, str] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None:
                variables[field.name.upper()] = str(value)
            if field.name == "environment":
                variables[RUNS_PARAMETER_PATH_VARIABLE] = self.runs_parameter_path
        return variables

    @classmethod
    def variable(cls, setting: str) -> str:
        """The environment variable that carries `setting` (a field's name)."""
        if setting not in {f.name for f in fields(cls)}:
            raise KeyError(setting)
        return setting.upper()

    @classmethod
    def from_environment(cls, environment: Mapping[str, str]) -> HandlerSettings:
        """The settings in `environment` (a KeyError names a missing required one, a
        ValueError a number that is not one); absent optional ones keep their defaults."""
        given: dict[str, Any] = {}
        for field in fields(cls):
            name = field.name.upper()
            if name not in environment:
                if field.default is MISSING:
                    raise KeyError(name)
                continue
            text = environment[name]
            kind = field.type if isinstance(field.type, str) else field.type.__name__
            given[field.name] = (
                int(text) if kind == "int" else float(text) if kind == "float" else text
            )
        return cls(**given)


RUNS_PARAMETER_PATH_VARIABLE = "RUNS_PARAMETER_PATH"
