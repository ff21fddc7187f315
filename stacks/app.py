"""The CDKTF app: five stacks per environment and one per run, composed from the constructs.

Stacks per environment (deploy one environment with `cdktf deploy '<env>-*'`):
  <env>-storage        keys, access-log buckets, replicated checkpoint buckets
  <env>-catalog        checkpoint catalog and interruption events tables
  <env>-network        private network, gateway and interface endpoints
  <env>-budget         monthly budget and alerts
  <env>-interruptions  EventBridge rules -> interruption handler Lambda (serves every run)
  <env>-run-<run>      per run (runs/<env>/<run>.toml): its fleet and its declaration to the
                       handler (deploy one run with `cdktf deploy <env>-run-<run>`)

Run as `python -m spotrain.stacks.app` (cdktf.json does); `SPOTRAIN_LOCAL_ENDPOINT` points the
local environment at a local cloud on another port.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from spotrain.cdk import App
from spotrain.core import resource_names as names
from spotrain.core.errors import SpotrainError
from spotrain.stacks.budget import BudgetStack
from spotrain.stacks.catalog import CatalogStack
from spotrain.stacks.config import EnvironmentConfig
from spotrain.stacks.environments import DEFAULT_LOCAL_ENDPOINT, all_environments
from spotrain.stacks.interruptions import InterruptionsStack
from spotrain.stacks.network import NetworkStack
from spotrain.stacks.run import RunStack
from spotrain.stacks.runs import RunConfig, load_runs
from spotrain.stacks.storage import StorageStack

STACK_PARTS = ("storage", "catalog", "network", "budget", "interruptions")
"""The environment's own stacks; each run adds `run-<run>`."""


def add_environment(
    app: App, config: EnvironmentConfig, runs: tuple[RunConfig, ...] | None = None
) -> dict[str, object]:
    """Create the environment's stacks and one per run in `app` (`runs`: those the repository
    declares, `runs/<env>/`); returns them by part."""
    runs = load_runs(config.name) if runs is None else runs
    storage = StorageStack(app, config=config)
    primary_key = storage.keys["Primary"].arn
    replica_key = storage.keys["Replica"].arn
    catalog = CatalogStack(
        app, config=config, primary_key_arn=primary_key, replica_key_arn=replica_key
    )
    network = NetworkStack(
        app,
        config=config,
        primary_key_arn=primary_key,
        checkpoint_bucket_arn=storage.checkpoints.primary.arn,
        catalog_table_arn=catalog.checkpoints.arn,
        events_table_arn=catalog.events.arn,
        image_repository_arn=storage.registry.repository.arn,
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
    stacks: dict[str, object] = {
        "storage": storage,
        "catalog": catalog,
        "network": network,
        "budget": budget,
        "interruptions": interruptions,
    }
    for run in runs:
        stacks[names.run_stack_part(run.name)] = RunStack(
            app,
            config=config,
            run=run,
            network=network.network,
            primary_key_arn=primary_key,
            replica_key_arn=replica_key,
            checkpoint_bucket_arn=storage.checkpoints.primary.arn,
            checkpoint_bucket_name=storage.checkpoints.primary.name,
            replica_bucket_arn=storage.checkpoints.replica.arn,
            catalog_table_arn=catalog.checkpoints.arn,
            catalog_table_name=catalog.checkpoints.name,
            events_table_arn=catalog.events.arn,
            events_table_name=catalog.events.name,
            image_repository_arn=storage.registry.repository.arn,
        )
    return stacks


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
