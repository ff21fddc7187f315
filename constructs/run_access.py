"""IAM statements about a run's items that more than one construct grants, defined once."""

from __future__ import annotations

from typing import Any

from spotrain.constructs.policy import leading_keys, statement
from spotrain.core.catalog_schema import caps_key, crashes_key, releases_key


def read_run_crashes_and_releases(
    events_table_arn: str, run: str, *, caps: bool = False
) -> dict[str, Any]:
    """Read a run's crash records and their releases (whether it is held), and with `caps` the
    spend caps operators raised: reading only, never writing either."""
    keys = [crashes_key(run), releases_key(run), *([caps_key(run)] if caps else [])]
    return statement(
        "ReadRunCrashesAndReleases",
        actions=["dynamodb:Query"],
        resources=[events_table_arn],
        conditions=[leading_keys(*keys)],
    )
