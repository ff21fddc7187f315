"""The CDKTF app: five stacks per environment, composed from the constructs.

Stacks per environment (deploy one environment with `cdktf deploy '<env>-*'`):
  <env>-storage        keys, access-log buckets, replicated checkpoint buckets
  <env>-catalog        checkpoint catalog and interruption events tables
  <env>-compute        private network and the spot fleet
  <env>-budget         monthly budget and alerts
  <env>-interruptions  EventBridge rules -> interruption handler Lambda

Run as `python -m spotrain.stacks.app` (cdktf.json does); `SPOTRAIN_LOCAL_ENDPOINT` points the
local environment at a local cloud on another port.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from spotrain.cdk import App
from spotrain.core.errors import SpotrainError
from spotrain.stacks.budget import BudgetStack
from spotrain.stacks.catalog import CatalogStack
from spotrain.stacks.compute import ComputeStack
from spotrain.stacks.config import EnvironmentConfig
from spotrain.stacks.environments import DEFAULT_LOCAL_ENDPOINT, all_environments
from spotrain.stacks.interruptions import InterruptionsStack
from spotrain.stacks.storage import StorageStack

STACK_PARTS = ("storage", "catalog", "compute", "budget", "interruptions")


def add_environment(app: App, config: EnvironmentConfig) -> dict[str, object]:
    """Create the environment's stacks in `app`; returns them by part."""
    storage = StorageStack(app, config=config)
    primary_key = storage.keys["Primary"].arn
    replica_key = storage.keys["Replica"].arn
    catalog = CatalogStack(
        app, config=config, primary_key_arn=primary_key, replica_key_arn=replica_key
    )
    compute = ComputeStack(
        app,
        config=config,
        primary_key_arn=primary_key,
        replica_key_arn=replica_key,
        checkpoint_bucket_arn=storage.checkpoints.primary.arn,
        checkpoint_bucket_name=storage.checkpoints.primary.name,
        replica_bucket_arn=storage.checkpoints.replica.arn,
        catalog_table_arn=catalog.checkpoints.arn,
        catalog_table_name=catalog.checkpoints.name,
        events_table_arn=catalog.events.arn,
        events_table_name=catalog.events.name,
    )
    budget = BudgetStack(app, config=config)
    interruptions = InterruptionsStack(
        app,
        config=config,
        primary_key_arn=primary_key,
        events_table_arn=catalog.events.arn,
        events_table_name=catalog.events.name,
        catalog_stream_arn=catalog.checkpoints.stream_arn,
        checkpoints_table_arn=catalog.checkpoints.arn,
        checkpoints_table_name=catalog.checkpoints.name,
        checkpoint_bucket_name=storage.checkpoints.primary.name,
        checkpoint_bucket_arn=storage.checkpoints.primary.arn,
    )
    return {
        "storage": storage,
        "catalog": catalog,
        "compute": compute,
        "budget": budget,
        "interruptions": interruptions,
    }


def build_app(environments: Iterable[EnvironmentConfig], outdir: str | None = None) -> App:
    app = App(outdir=outdir) if outdir else App()
    for config in environments:
        add_environment(app, config)
    return app


def main() -> int:
    try:
        endpoint = os.environ.get("SPOTRAIN_LOCAL_ENDPOINT", DEFAULT_LOCAL_ENDPOINT)
        app = build_app(all_environments(local_endpoint=endpoint))
        app.synth()
    except SpotrainError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
