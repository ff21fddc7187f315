"""checkov over the synthesized stacks, with the reasoned suppressions in checkov-skips.yaml.

A finding is explained when an entry names its check id and a pattern matching its resource.
The scan passes when every finding is explained and every entry still explains something.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotrain.core.errors import SpotrainError

ROOT = Path(__file__).resolve().parents[2]
SKIPS_FILE = ROOT / "checkov-skips.yaml"


@dataclass(frozen=True)
class Finding:
    check_id: str
    stack: str
    resource: str


@dataclass
class ScanReport:
    passed: int
    findings: list[Finding]
    explained: dict[Finding, str] = field(default_factory=dict)
    unexplained: list[Finding] = field(default_factory=list)
    unused_skips: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.unexplained and not self.unused_skips


def load_skips(path: Path = SKIPS_FILE) -> list[dict[str, Any]]:
    import yaml

    entries = yaml.safe_load(path.read_text()) or []
    for entry in entries:
        missing = {"id", "resources", "reason"} - set(entry)
        if missing or not str(entry.get("reason", "")).strip():
            raise SpotrainError(
                f"{path.name}: entry {entry.get('id', '?')} lacks "
                f"{sorted(missing) or ['a reason']}: every suppression needs an id, resource "
                "patterns and a written reason"
            )
    return list(entries)


def checkov_executable() -> str:
    for candidate in (
        os.environ.get("SPOTRAIN_CHECKOV"),
        str(ROOT / ".venv-checkov/bin/checkov"),
        shutil.which("checkov"),
    ):
        if candidate and Path(candidate).exists():
            return candidate
    raise SpotrainError(
        "checkov is not installed: run `make setup` (it installs checkov in .venv-checkov) or "
        "set SPOTRAIN_CHECKOV to a checkov executable"
    )


UNREAD_BLOCKS = ("removed",)
"""Top-level Terraform blocks that checkov's terraform_json parser cannot read, failing the
whole file (3.3.30 takes each of their attributes for a block), and that make nothing to check:
`removed` only has Terraform forget a resource an older stack made (`forget_without_destroying`)."""


def _readable_copy(stacks_dir: Path, into: Path) -> Path:
    """Each stack's template, as checkov reads it: every resource, data source and setting,
    without the blocks in UNREAD_BLOCKS (their stack folder names kept: findings name them)."""
    for template in sorted(stacks_dir.glob("*/cdk.tf.json")):
        definition = json.loads(template.read_text())
        for block in UNREAD_BLOCKS:
            definition.pop(block, None)
        copy = into / template.parent.name / template.name
        copy.parent.mkdir(parents=True)
        copy.write_text(json.dumps(definition, indent=2))
    return into


def run_checkov(stacks_dir: Path, skip_ids: list[str] | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="spotrain-scan-") as folder:
        return _run_checkov(_readable_copy(stacks_dir, Path(folder)), skip_ids)


def _run_checkov(stacks_dir: Path, skip_ids: list[str] | None) -> dict[str, Any]:
    command = [
        checkov_executable(),
        "-d",
        str(stacks_dir),
        "--framework",
        "terraform_json",
        "--skip-download",
        "--quiet",
        "--compact",
        "-o",
        "json",
    ]
    if skip_ids:
        command += ["--skip-check", ",".join(sorted(set(skip_ids)))]
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKPOINT_DISABLE": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode not in (0, 1) or not result.stdout.strip():
        raise SpotrainError(f"checkov failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    report = json.loads(result.stdout)
    if isinstance(report, list):  # one entry per framework
        (report,) = [r for r in report if r.get("check_type") == "terraform_json"]
    return dict(report)


def scan(stacks_dir: Path, skips: list[dict[str, Any]] | None = None) -> ScanReport:
    """checkov over the synthesized stacks in `stacks_dir`, judged against `skips` (default:
    checkov-skips.yaml)."""
    return judge(run_checkov(stacks_dir), load_skips() if skips is None else skips)


def judge(raw: dict[str, Any], skips: list[dict[str, Any]]) -> ScanReport:
    """checkov's report (`run_checkov`) against `skips`: each finding explained by a skip or
    not, and each resource a skip names that no finding needs."""
    if raw.get("summary", {}).get("parsing_errors"):
        raise SpotrainError(f"checkov could not parse {raw['summary']['parsing_errors']} file(s)")
    findings = [
        Finding(f["check_id"], Path(f["file_path"]).parts[-2], f["resource"])
        for f in raw.get("results", {}).get("failed_checks", [])
    ]
    report = ScanReport(passed=int(raw["summary"]["passed"]), findings=findings)
    used: set[tuple[int, str]] = set()
    for finding in findings:
        for index, entry in enumerate(skips):
            matching = [p for p in entry["resources"] if fnmatch.fnmatch(finding.resource, p)]
            if entry["id"] == finding.check_id and matching:
                report.explained[finding] = str(entry["reason"]).strip()
                used.update((index, p) for p in matching)
                break
        else:
            report.unexplained.append(finding)
    # Every resource an entry names must still have its finding: a stale name would silence
    # whatever comes to carry it later.
    report.unused_skips = [
        f"{entry['id']} {pattern}"
        for index, entry in enumerate(skips)
        for pattern in entry["resources"]
        if (index, pattern) not in used
    ]
    return report
