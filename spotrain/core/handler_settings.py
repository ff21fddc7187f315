"""The interruption handler's settings with their defaults, named once: the construct's props
default to them and pass them in the function's environment, the handler falls back to them,
and the cost simulator plays the blueprint's fixed on-demand wait with the same number."""

from __future__ import annotations

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


def runs_parameter_path(environment: str) -> str:
    """Where each run of the environment declares itself to the interruption handler: one SSM
    parameter per run, written by the run's stack (`run_parameter_name`), so the handler serves
    every run of its environment without being redeployed for each."""
    return f"/spotrain/{environment}/runs"


def run_parameter_name(environment: str, run: str) -> str:
    return f"{runs_parameter_path(environment)}/{run}"
