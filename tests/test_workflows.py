"""The GitOps workflows pass actionlint and do what the README says they do."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: install Node.js 20 (make setup needs it too)")
    return subprocess.run(
        [node, str(ROOT / "scripts" / "actionlint.mjs"), *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )


def test_workflows_pass_actionlint() -> None:
    result = actionlint(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - run: echo ${{ github.no_such_property }}\n"
    )
    result = actionlint(broken)
    assert result.returncode == 1
    assert "no_such_property" in result.stdout


def load(name: str) -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())


def test_pull_requests_synthesize_scan_and_plan_every_real_environment() -> None:
    plan = load("plan.yml")
    assert "pull_request" in plan[True]  # YAML reads the bare key `on` as True
    steps = [s.get("run", "") for job in plan["jobs"].values() for s in job["steps"]]
    assert any("spotrain synth" in s for s in steps)
    assert any("spotrain scan" in s for s in steps)
    assert plan["jobs"]["plan"]["strategy"]["matrix"]["environment"] == ["dev", "prod"]
    # The summary comment quotes Terraform's plan, which only --verbose prints.
    assert any("spotrain plan --verbose" in s for s in steps)


def test_merges_deploy_dev_before_prod_one_at_a_time_behind_environments() -> None:
    job = load("deploy.yml")["jobs"]["deploy"]
    assert job["strategy"]["matrix"]["environment"] == ["dev", "prod"]
    assert job["strategy"]["max-parallel"] == 1
    assert job["environment"] == "${{ matrix.environment }}"  # prod approval lives there
    assert any("cdktf deploy" in s.get("run", "") for s in job["steps"])
