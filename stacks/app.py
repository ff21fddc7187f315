"""The CDKTF app: the environment's stacks (five, and two more for each region beyond home)
and one per run, composed from the constructs.

Stacks per environment (deploy one environment with `cdktf deploy '<env>-*'`):
  <env>-storage        keys, access-log buckets, replicated checkpoint buckets
  <env>-catalog        checkpoint catalog and interruption events tables
  <env>-network        private network, gateway and interface endpoints (home region)
  <env>-network-<region>  the same in each other region
  <env>-budget         monthly budget and alerts
  <env>-interruptions  EventBridge rules -> interruption handler Lambda (home region; serves
                       every run, and watches the catalog)
  <env>-interruptions-<region>  the same in each other region (its machines' warnings, and
                       the runs that train there)
  <env>-run-<run>      per run (runs/<env>/<run>.toml): its fleet and its declaration to the
                       handler (deploy one run with `cdktf deploy <env>-run-<run>`)

Run as `python -m spotrain.stacks.app` (cdktf.json does); `SPOTRAIN_LOCAL_ENDPOINT` points the
local environment at a local cloud on another port.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping

from spotrain.cdk import App
from spotrain.core import resource_names as names
from spotrain.core.errors import SpotrainError
from spotrain.stacks.budget import BudgetStack
from spotrain.stacks.catalog import CatalogStack
from spotrain.stacks.config import EnvironmentConfig
from spotrain.stacks.environments import DEFAULT_LOCAL_ENDPOINT, all_environments
from spotrain.stacks.interruptions import InterruptionsStack, interruptions_part
from spotrain.stacks.network import NetworkStack, network_part
from spotrain.stacks.run import RegionGround, RunStack
from spotrain.stacks.runs import RunConfig, load_runs
from spotrain.stacks.storage import StorageStack

STACK_PARTS = ("storage", "catalog", "network", "budget", "interruptions")
"""The environment's own stacks (`network` and `interruptions` at home; every other region
adds `network-<region>` and `interruptions-<region>`); each run adds `run-<run>`."""


def add_environment(
    app: App, config: EnvironmentConfig, runs: tuple[RunConfig, ...] | None = None
) -> dict[str, object]:
    """Create the environment's stacks and one per run in `app` (`runs`: those the repository
    declares, `runs/<env>/`); returns them by part."""
    runs = load_runs(config.name, against=config) if runs is None else runs
    storage = StorageStack(app, config=config)
    key_arns = {region: key.arn for region, key in storage.keys.items()}
    catalog = CatalogStack(app, config=config, key_arns=key_arns)
    networks = {
        region: NetworkStack(
            app,
            config=config,
            region=region,
            key_arn=key_arns[region],
            checkpoint_bucket_arn=storage.checkpoints.buckets[region].arn,
            catalog_table_name=catalog.checkpoints.name,
            events_table_name=catalog.events.name,
        )
        for region in config.region_names
    }
    budget = BudgetStack(app, config=config)
    handlers = {
        region: InterruptionsStack(
            app,
            config=config,
            region=region,
            key_arn=key_arns[region],
            events_table_name=catalog.events.name,
            checkpoints_table_name=catalog.checkpoints.name,
            checkpoint_bucket_name=storage.checkpoints.buckets[region].name,
            checkpoint_bucket_arn=storage.checkpoints.buckets[region].arn,
            # Home's handler watches the catalog (every region's writes replicate to it).
            catalog_stream_arn=catalog.checkpoints.stream_arn
            if region == config.primary_region
            else None,
        )
        for region in config.region_names
    }
    stacks: dict[str, object] = {
        "storage": storage,
        "catalog": catalog,
        **{network_part(config, region): stack for region, stack in networks.items()},
        "budget": budget,
        **{interruptions_part(config, region): stack for region, stack in handlers.items()},
    }
    for run in runs:
        stacks[names.run_stack_part(run.name)] = RunStack(
            app,
            config=config,
            run=run,
            grounds={
                region: RegionGround(
                    network=networks[region].network,
                    key_arn=key_arns[region],
                    checkpoint_bucket_arn=storage.checkpoints.buckets[region].arn,
                    checkpoint_bucket_name=storage.checkpoints.buckets[region].name,
                )
                for region in config.region_names
            },
            catalog_table_name=catalog.checkpoints.name,
            events_table_name=catalog.events.name,
        )
    return stacks


def build_app(
    environments: Iterable[EnvironmentConfig],
    outdir: str | None = None,
    runs: Mapping[str, tuple[RunConfig, ...]] | None = None,
) -> App:
    """Every environment's stacks, with its runs (`runs`, by environment: as checked already;
    else read from the run files)."""
    app = App(outdir=outdir) if outdir else App()
    for config in environments:
        add_environment(app, config, (runs or {}).get(config.name))
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
