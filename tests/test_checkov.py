"""checkov on every synthesized stack of every environment: 0 failed checks beyond the
reasoned suppressions in checkov-skips.yaml, and no stale suppression."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spotrain.tools import scan


@pytest.fixture(scope="module")
def checkov_report(synth_dir: Path) -> dict[str, Any]:
    """One checkov run over every stack, judged below against several lists of skips."""
    return scan.run_checkov(synth_dir / "stacks")


def test_every_finding_is_explained_and_every_skip_is_used(checkov_report: dict[str, Any]) -> None:
    report = scan.judge(checkov_report, scan.load_skips())
    assert report.passed > 500
    assert report.unexplained == []
    assert report.unused_skips == []
    stacks = {f.stack for f in report.findings}
    assert {s.split("-")[0] for s in stacks} == {"local", "dev", "prod"}


def test_checkov_with_the_listed_skips_reports_zero_failed(synth_dir: Path) -> None:
    skip_ids = [entry["id"] for entry in scan.load_skips()]
    raw = scan.run_checkov(synth_dir / "stacks", skip_ids)
    assert raw["summary"]["failed"] == 0
    assert raw["summary"]["parsing_errors"] == 0
    assert raw["summary"]["passed"] > 500


def test_a_finding_without_a_skip_fails_the_scan(checkov_report: dict[str, Any]) -> None:
    skips = [e for e in scan.load_skips() if e["id"] != "CKV_AWS_117"]
    report = scan.judge(checkov_report, skips)
    assert {f.check_id for f in report.unexplained} == {"CKV_AWS_117"}
    assert not report.ok


def test_a_skip_without_a_reason_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "skips.yaml"
    bad.write_text("- id: CKV_AWS_18\n  resources: ['*']\n  reason: ''\n")
    with pytest.raises(scan.SpotrainError, match="written reason"):
        scan.load_skips(bad)


def test_a_skip_naming_a_resource_without_its_finding_is_stale(
    checkov_report: dict[str, Any],
) -> None:
    """Skips name resources one by one; a name whose finding is gone would silence whatever
    comes to carry it later, so it fails the scan."""
    skips = scan.load_skips()
    for entry in skips:
        if entry["id"] == "CKV_AWS_109":
            entry["resources"] = [*entry["resources"], "data.NoSuchKey_KeyPolicy_00000000"]
    report = scan.judge(checkov_report, skips)
    assert report.unexplained == []
    assert report.unused_skips == ["CKV_AWS_109 data.NoSuchKey_KeyPolicy_00000000"]
    assert not report.ok
