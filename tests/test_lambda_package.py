"""The interruption handler's zip is reproducible and its hash is what Terraform deploys."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path

from helpers import load_stack, resources

from spotrain.constructs.interruption_handler.construct import build_handler_zip


def test_zip_is_byte_identical_across_builds() -> None:
    assert build_handler_zip() == build_handler_zip()


def test_zip_entries_are_sorted_with_fixed_times_and_permissions() -> None:
    archive = zipfile.ZipFile(io.BytesIO(build_handler_zip()))
    names = archive.namelist()
    assert names == sorted(names)
    assert names == [
        "catalog_watch.py",
        "interruption_handler.py",
        "requeue.py",
        "spotrain/__init__.py",
        # The core floor, whole: what the handler imports, and nothing from above it.
        "spotrain/core/__init__.py",
        "spotrain/core/catalog_schema.py",
        "spotrain/core/code_bundle.py",
        "spotrain/core/deadline_policy.py",
        "spotrain/core/entry_point.py",
        "spotrain/core/errors.py",
        "spotrain/core/events.py",
        "spotrain/core/fleet_state.py",
        "spotrain/core/global_batch.py",
        "spotrain/core/gpu_types.py",
        "spotrain/core/handler_settings.py",
        "spotrain/core/image_reference.py",
        "spotrain/core/price_book.json",
        "spotrain/core/prices.py",
        "spotrain/core/resource_names.py",
        "spotrain/core/run_lifecycle.py",
        "spotrain/core/spend_ledger.py",
        "spotrain/core/validation.py",
    ]
    for info in archive.infolist():
        assert info.date_time == (1980, 1, 1, 0, 0, 0)
        assert (info.external_attr >> 16) & 0o777 == 0o644


def test_zip_imports_and_exposes_the_handler(tmp_path: Path) -> None:
    import subprocess
    import sys

    zipfile.ZipFile(io.BytesIO(build_handler_zip())).extractall(tmp_path)
    # Only the unpacked zip on the path first, as in the Lambda runtime.
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
        "import interruption_handler as h, spotrain.core.catalog_schema as s, "
        "spotrain.core.fleet_state as f; "
        "print(callable(h.handle)); print(s.__file__); print(f.__file__); "
        "print(h.requeue.__file__)"
    )
    check = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    )
    handler_is_callable, *module_files = check.stdout.split()
    assert handler_is_callable == "True"
    for module_file in module_files:
        assert Path(module_file).is_relative_to(tmp_path), module_file


def test_source_code_hash_matches_the_deployed_asset(synth_dir: Path) -> None:
    stack = load_stack(synth_dir, "local-interruptions")
    function = next(iter(resources(stack, "aws_lambda_function").values()))
    asset = synth_dir / "stacks" / "local-interruptions" / function["filename"]
    digest = base64.b64encode(hashlib.sha256(asset.read_bytes()).digest()).decode()
    assert function["source_code_hash"] == digest
    assert asset.read_bytes() == build_handler_zip()
