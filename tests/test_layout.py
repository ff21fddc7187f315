"""The repository layout keeps `constructs/` from shadowing the constructs library."""

import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL_PACKAGES = ("constructs", "stacks", "spotrain")


def test_import_constructs_is_the_library_not_our_folder() -> None:
    constructs = importlib.import_module("constructs")
    assert hasattr(constructs, "Construct")
    assert Path(constructs.__file__).resolve().parent != ROOT / "constructs"
    assert "site-packages" in constructs.__file__


def test_top_level_folders_have_no_init_file() -> None:
    offenders = [name for name in TOP_LEVEL_PACKAGES if (ROOT / name / "__init__.py").exists()]
    assert offenders == [], f"{offenders} would shadow libraries of the same name"


def test_folders_are_reachable_under_the_spotrain_name() -> None:
    fleet = importlib.import_module("spotrain.constructs.spot_fleet")
    app = importlib.import_module("spotrain.stacks.app")
    assert Path(fleet.__file__).resolve() == ROOT / "constructs" / "spot_fleet.py"
    assert Path(app.__file__).resolve() == ROOT / "stacks" / "app.py"
