"""The GitOps workflows pass actionlint and do what docs/runs.md says they do."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

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
    runs = [s.get("run", "") for s in job["steps"]]
    deploy = next(i for i, r in enumerate(runs) if "cdktf deploy" in r)
    # Merging is submitting: after the stacks, each declared run's configuration is stored.
    submit = next(i for i, r in enumerate(runs) if "spotrain run submit" in r)
    assert deploy < submit and "runs/${{ matrix.environment }}/*.toml" in runs[submit]


def _step(job: dict, name: str) -> dict:  # type: ignore[type-arg]
    return next(s for s in job["steps"] if s.get("name", "").startswith(name))


COMMENT_HARNESS = """
const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor;
const script = require("fs").readFileSync(process.argv[2], "utf8");
const posted = [];
const github = { rest: { issues: { createComment: async (c) => { posted.push(c); } } } };
const context = { repo: { owner: "acme", repo: "spotrain" }, issue: { number: 7 } };
new AsyncFunction("require", "github", "context", script)(require, github, context)
  .then(() => process.stdout.write(JSON.stringify(posted)));
"""


@pytest.mark.integration
def test_the_plan_comment_carries_each_runs_estimate_against_the_base_branch(
    local_cloud: Any, tmp_path: Path
) -> None:
    """The plan job's own estimate step and comment script, run as GitHub runs them: the base
    branch is fetched from `origin`, prices are refreshed through the plan role's credentials
    (here the local cloud, answering from a test book), and the comment shows the estimate
    with its change. The base branch ran dev's run on 3 machines; this one runs it on 2, and
    adds prod's run, which the comment shows as new."""
    from spotrain.localcloud import control

    job = load("plan.yml")["jobs"]["plan"]
    estimate_step, comment_step = _step(job, "Estimate"), _step(job, "Summary comment")
    assert estimate_step["env"]["BASE_REF"] == "${{ github.base_ref }}"
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    base = tmp_path / "base-source"
    (base / "runs" / "dev").mkdir(parents=True)
    ours = (ROOT / "runs" / "dev" / "gpt-small.toml").read_text()
    theirs = ours.replace("desired_size = 2\n", "desired_size = 3\n")
    assert theirs != ours  # dev's run's fleet, as the base branch had it
    (base / "runs" / "dev" / "gpt-small.toml").write_text(theirs)
    # prod's run is new in this pull request: the base declares no run there.
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for command in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-qm", "base"],
                    ["push", "-q", str(origin), "main"]):  # fmt: skip
        subprocess.run([*git, *command], cwd=base, check=True)
    book = tmp_path / "prices-in-the-account.json"
    row = {"region": "us-east-1", "source": "test figure", "taken_at": "2026-11-24"}
    book.write_text(json.dumps({"format": 1, "note": "Test figures only: not AWS prices.",
        "on_demand": [{**row, "instance_type": "g5.xlarge", "usd_per_hour": 1.0},
                      {**row, "instance_type": "p5en.48xlarge", "usd_per_hour": 32.0}],
        "spot": [{**row, "instance_type": t, "availability_zone": "us-east-1a", "usd_per_hour": p}
                 for t, p in (("g5.xlarge", 0.4), ("p5en.48xlarge", 12.0))]}))  # fmt: skip
    control.set_price_book(book)
    comments = {}
    try:
        for environment in ("dev", "prod"):
            runner = tmp_path / environment / "checkout"
            runner.mkdir(parents=True)
            subprocess.run([*git, "init", "-q"], cwd=runner, check=True)
            subprocess.run([*git, "remote", "add", "origin", str(origin)], cwd=runner, check=True)
            (runner / ".venv").symlink_to(ROOT / ".venv")
            (runner / f"plan-{environment}.txt").write_text("No changes.\n")
            env = {**os.environ, **control.aws_environment(local_cloud.endpoint, "us-east-1"),
                   "ENVIRONMENT": environment, "BASE_REF": "main"}  # fmt: skip
            ran = subprocess.run(["bash", "-e", "-c", estimate_step["run"]], cwd=runner, env=env,
                                 capture_output=True, text=True, check=False)  # fmt: skip
            assert ran.returncode == 0, ran.stdout + ran.stderr
            script = tmp_path / "comment.js"
            script.write_text(comment_step["with"]["script"])
            harness = tmp_path / "harness.js"
            harness.write_text(COMMENT_HARNESS)
            posted = subprocess.run(
                ["node", str(harness), str(script)], cwd=runner, capture_output=True, text=True,
                env={**env, "CHANGES": "no"}, check=True,
            ).stdout  # fmt: skip
            (comment,) = json.loads(posted)
            assert comment["issue_number"] == 7
            comments[environment] = comment["body"]
    finally:
        control.set_price_book(None)
    dev, prod = comments["dev"], comments["prod"]
    assert "Run estimate: `gpt-small`, 96 machine-hours of work on 2 x g5.xlarge us-east-1" in dev
    assert "<summary>terraform plan</summary>" in dev and "No changes." in dev
    # One machine fewer: a third less per day, about as much to completion (it takes longer).
    rows = [line.split("|") for line in dev.splitlines()
            if line.startswith(("| spot:", "| on-demand"))]  # fmt: skip
    assert len(rows) == 2, dev
    for *_, per_day, to_completion, _ in rows:
        assert re.fullmatch(r" -\$[\d.,]+ \(-3[23]\.\d%\) ", per_day), dev
        assert re.fullmatch(r" [-+]\$[\d.,]+ \([-+][0-4]\.\d%\) ", to_completion), dev
    assert re.search(r"taken \d{4}-\d{2}-\d{2} \(\d+ days ago; AWS Price List", dev), dev
    assert "Run estimate: `gpt-large`" in prod and "deadline 504 h" in prod, prod
    assert "the base has no run 'gpt-large' (it is new)" in prod, prod
    assert prod.count("| new | new |") == 2, prod
