"""The interruption handler's zip is reproducible and its hash is what Terraform deploys."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path

from helpers import load_stack, resources

from spotrain.constructs.interruption_handler.construct import HANDLER_ENTRY, build_handler_zip

ROOT = Path(__file__).parent.parent


def test_zip_is_byte_identical_across_builds() -> None:
    assert build_handler_zip() == build_handler_zip()


def test_zip_entries_are_sorted_with_fixed_times_and_permissions() -> None:
    archive = zipfile.ZipFile(io.BytesIO(build_handler_zip()))
    names = archive.namelist()
    assert names == sorted(names)
    runtime = "spotrain/constructs/interruption_handler/runtime/"
    # The runtime folder and the core floor, each whole, and the empty packages above them.
    assert [n for n in names if n.startswith(runtime)] == sorted(
        runtime + p.name for p in (ROOT / "constructs/interruption_handler/runtime").glob("*.py")
    )
    assert [n for n in names if n.startswith("spotrain/core/")] == sorted(
        f"spotrain/core/{p.name}" for p in (ROOT / "spotrain/core").iterdir()
        if p.suffix in (".py", ".json")
    )  # fmt: skip
    assert sorted(set(names) - {n for n in names if n.startswith((runtime, "spotrain/core/"))}) == [
        "spotrain/__init__.py", "spotrain/constructs/__init__.py",
        "spotrain/constructs/interruption_handler/__init__.py",
    ]  # fmt: skip
    assert all(archive.read(n) == b"" for n in names if n.count("/") < 3 and "core" not in n)
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
        "import importlib; "
        f"module, _, name = {HANDLER_ENTRY!r}.rpartition('.'); "
        "h = importlib.import_module(module); "
        "import spotrain.core.catalog_schema as s, spotrain.core.capacity_policy as p; "
        "print(callable(getattr(h, name))); print(s.__file__); print(p.__file__); "
        "print(h.__file__)"
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
