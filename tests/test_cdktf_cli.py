"""The cdktf CLI, as a CDKTF user runs it, deploys and destroys a stack of the `local`
environment on the local cloud (the rest of the suite drives Terraform through `spotrain
deploy`: test_integration_local_apply.py). It needs no deployed environment, so it runs on its
own worker's local cloud, beside the shared deployment's stories rather than after them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from spotrain.localcloud import control
from spotrain.tools import deploy

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
ACCOUNT = "123456789012"


def test_cdktf_cli_deploys_and_destroys_a_stack(
    local_cloud: control.RunningCloud, tmp_path: Path
) -> None:
    cdktf = ROOT / "node_modules" / ".bin" / "cdktf"
    if not cdktf.exists():
        pytest.fail("the cdktf CLI is missing: run `make setup` (npm ci installs it)")
    config = deploy.local_environment_ready(local_cloud.endpoint)
    # The same CLI configuration, credentials and endpoint as `spotrain deploy` gives Terraform.
    deployment = deploy.Deployment(config=config, outdir=tmp_path / "cdktf.out", log=lambda _: None)
    project = tmp_path / "project"
    project.mkdir()
    python = str(ROOT / ".venv" / "bin" / "python")
    (project / "cdktf.json").write_text(
        (ROOT / "cdktf.json").read_text().replace(".venv/bin/python", python)
    )
    temporary = tmp_path / "tmp"  # the app's own: what a synth leaves behind shows there
    temporary.mkdir()
    env = {**deployment.environment, "SPOTRAIN_LOCAL_ENDPOINT": local_cloud.endpoint, "CI": "1",
           "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
           "TMPDIR": str(temporary)}  # fmt: skip
    budgets = control.client("budgets", local_cloud.endpoint, config.primary_region)

    def cli(*args: str) -> None:
        result = subprocess.run(
            [str(cdktf), args[0], "local-budget", "--auto-approve", "--skip-provider-lock",
             *args[1:]],
            cwd=project, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    def names() -> set[str]:  # the worker's local cloud serves its other tests too
        return {b["BudgetName"] for b in budgets.describe_budgets(AccountId=ACCOUNT).get(
            "Budgets", [])}  # fmt: skip

    before = names()
    cli("deploy")
    assert names() - before == {"spotrain-local-budget-monthly"}
    # The handlers' packages waited in the app's temporary folder for its synth, and went with it.
    assert not list(temporary.glob("spotrain-lambda-*")), list(temporary.iterdir())
    cli("destroy", "--skip-synth")  # the app synthesized for the deploy, as the CLI allows
    assert names() == before - {"spotrain-local-budget-monthly"}
