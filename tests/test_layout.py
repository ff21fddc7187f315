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


# --- the house in floors -----------------------------------------------------------------------
FOLDERS = {"spotrain": ROOT / "spotrain", "spotrain.constructs": ROOT / "constructs",
           "spotrain.stacks": ROOT / "stacks", "spotrain.trainer": ROOT / "trainer"}  # fmt: skip
UNITS = ("core", "cdk", "trainer", "cost", "localcloud", "constructs", "stacks", "tools", "cli")
# What each unit may import: the core is the ground floor; the trainer, the cost model, the
# local cloud, the constructs and the stacks stand on it (stacks compose constructs, both
# through the CDKTF seam `cdk`); the tools drive them; the command line drives everything.
MAY_IMPORT = {
    "core": set(),
    "cdk": set(),
    "trainer": {"core"},
    "cost": {"core"},
    "localcloud": {"core"},
    "constructs": {"core", "cdk"},
    "stacks": {"core", "cdk", "constructs"},
    "tools": {"core", "cdk", "trainer", "cost", "localcloud", "constructs", "stacks"},
    "cli": {"core", "cdk", "trainer", "cost", "localcloud", "constructs", "stacks", "tools"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if package == "spotrain" and parts[0] in ("constructs", "stacks", "trainer"):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _unit(module: str) -> str:
    return module.split(".")[1]


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_imports_only_point_down_the_floors() -> None:
    modules = _modules()
    assert {_unit(m) for m in modules} == set(UNITS)
    edges = {
        (_unit(module), _unit(target))
        for module, path in modules.items()
        for target in _imports(path)
        if target in modules and _unit(target) != _unit(module)
    }
    upward = sorted(f"{a} -> {b}" for a, b in edges if b not in MAY_IMPORT[a])
    assert upward == [], f"imports that point up a floor: {upward}"


def test_the_core_needs_the_standard_library_and_boto3_alone() -> None:
    import sys

    allowed = set(sys.stdlib_module_names) | {"boto3", "botocore", "spotrain"}
    for module, path in _modules().items():
        if _unit(module) != "core":
            continue
        outside = sorted(
            name for name in _imports(path)
            if name.split(".")[0] not in allowed
            or (name.startswith("spotrain.") and not name.startswith("spotrain.core"))
        )  # fmt: skip
        assert outside == [], f"{module} imports {outside}: the Lambda zip and machines ship core"


RUNTIME = "spotrain.constructs.interruption_handler.runtime"
"""The interruption handler's Lambda code: it ships alone with the core."""


def test_the_handlers_runtime_imports_only_the_core_and_nothing_imports_the_runtime() -> None:
    import sys

    modules = _modules()
    runtime = {m: p for m, p in modules.items() if m == RUNTIME or m.startswith(f"{RUNTIME}.")}
    assert {m.rsplit(".", 1)[-1] for m in runtime} >= {"entry", "aws", "capacity_check"}
    allowed = set(sys.stdlib_module_names) | {"boto3", "botocore"}
    for module, path in runtime.items():
        outside = sorted(
            name for name in _imports(path)
            if not name.startswith(("spotrain.core", RUNTIME)) and name.split(".")[0] not in allowed
        )  # fmt: skip
        assert outside == [], f"{module} imports {outside}: the runtime stands on the core alone"
        lines = len(path.read_text().splitlines())
        assert lines <= 250, f"{module} has {lines} lines: give one of its paths its own file"
    importers = sorted(
        module for module, path in modules.items() if module not in runtime
        for name in _imports(path) if name == RUNTIME or name.startswith(f"{RUNTIME}.")
    )  # fmt: skip
    assert importers == [], f"{importers} import the handler's runtime: infrastructure never does"


def test_the_contract_between_stacks_handler_and_cli_is_defined_once() -> None:
    """Each environment variable's name, the run declaration's fields, the markets and the
    order of the holds are spelled in one place of the product."""
    import re

    product = [p for folder in FOLDERS.values() for p in folder.rglob("*.py")]
    texts = {p: p.read_text() for p in product}

    def places(pattern: str) -> list[str]:
        return sorted(str(p.relative_to(ROOT)) for p, text in texts.items()
                      if re.search(pattern, text, re.MULTILINE))  # fmt: skip

    for variable in ("EVENTS_TABLE", "ALERT_TOPIC_ARN", "CONFIG_BUCKET", "CHECKPOINTS_TABLE",
                     "DEAD_LETTER_QUEUE_URL", "HOT_POOL_THRESHOLD"):  # fmt: skip
        assert places(rf'"{variable}"') == [], f"{variable} spelled out: use HandlerSettings"
    # The markets once (the deadline policy's modes, the decisions' actions and the price
    # labels are words of their own that happen to match).
    assert places(r'^(SPOT|ON_DEMAND) = "') == sorted(
        ["spotrain/core/capacity.py", "spotrain/core/deadline_policy.py"])  # fmt: skip
    assert places(r'lifecycle="(spot|on-demand)"|== "spot"') == []
    assert places(r"^class (CapacityGroup|RunDeclaration)\b") == ["spotrain/core/capacity.py"]
    assert places(r'"min_size": ') == ["spotrain/core/capacity_policy.py"]
    assert places(r"def hold_for\(") == ["spotrain/core/capacity_policy.py"]
    assert places(r"METRIC_NAMESPACE = ") == ["spotrain/core/resource_names.py"]


def _definitions(path: Path) -> list[tuple[str, int]]:
    import ast

    return [
        (node.name, node.end_lineno - node.lineno + 1)  # type: ignore[operator]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def test_the_command_line_is_small_modules_of_short_functions() -> None:
    for path in sorted((ROOT / "spotrain" / "cli").glob("*.py")):
        lines = len(path.read_text().splitlines())
        assert lines <= 400, f"{path.name} has {lines} lines: give a command group its own module"
        long = [f"{name} ({n} lines)" for name, n in _definitions(path) if n > 60]
        assert long == [], f"{path.name}: {long}: split them"


def test_no_construct_is_built_by_a_constructor_over_120_lines() -> None:
    for path in sorted((ROOT / "constructs").rglob("*.py")):
        long = [f"{name} ({n} lines)" for name, n in _definitions(path)
                if name == "__init__" and n > 120]  # fmt: skip
        assert long == [], f"{path.relative_to(ROOT)}: {long}: build its parts in helpers"


def test_the_exception_tree_names_every_error_spotrain_raises() -> None:
    import spotrain.core.errors as errors

    for module in _modules():
        if _unit(module) in ("core", "cost", "trainer", "tools"):
            importlib.import_module(module)

    def every(kind: type) -> set[type]:
        return {kind} | {sub for child in kind.__subclasses__() for sub in every(child)}

    names = {kind.__name__ for kind in every(errors.SpotrainError)}
    assert len(names) >= 21
    missing = sorted(name for name in names if name not in (errors.__doc__ or ""))
    assert missing == [], f"spotrain/core/errors.py's tree lacks {missing}"


def test_the_readme_is_a_front_door_whose_map_names_every_unit_and_whose_links_hold() -> None:
    """Under 15 KB; its map names every top-level folder the repository tracks and every unit
    of `spotrain/`, in one hop; every relative link of it and of docs/ leads to a file."""
    import re
    import subprocess

    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) < 15_000, "move reference material to docs/"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()  # fmt: skip
    folders = {path.split("/")[0] for path in tracked if "/" in path}
    units = {f"spotrain/{p.name}" for p in (ROOT / "spotrain").iterdir()
             if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py")
             and p.name != "__init__.py"}  # fmt: skip
    unnamed = sorted(u for u in folders | units if f"`{u}" not in readme)
    assert unnamed == [], f"the README's map does not name {unnamed}"
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_every_spotrain_command_the_readme_and_docs_show_is_one_the_cli_takes() -> None:
    """The command lines in the README's and docs' bash blocks, as a reader copies them: each
    names a command, its arguments and flags as `spotrain` parses them (the runbooks' blocks
    run for real in tests/test_runbooks.py; these would need an account)."""
    import contextlib
    import io
    import re
    import shlex

    from spotrain import cli

    parser, shown = cli.parser(), 0
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                starts = [i for i, w in enumerate(words) if w.endswith("spotrain")]
                if not starts or "$(" in line.split("spotrain")[0]:
                    continue
                argv = words[starts[0] + 1 :]
                refused = io.StringIO()
                with contextlib.redirect_stderr(refused):
                    try:
                        parser.parse_args(argv)
                    except SystemExit:
                        raise AssertionError(
                            f"{page.name}: `{line.strip()}`: {refused.getvalue()}"
                        ) from None
                shown += 1
    assert shown >= 20, shown  # the pages still show the commands a newcomer copies


def test_no_script_folder_shadows_a_standard_library_module() -> None:
    """`python bench/x.py` puts bench/ first on the import path: a script named like a
    standard library module (a bench/queue.py once) breaks every import of it there, torch's
    among them."""
    import sys

    scripts = [
        p for folder in ("bench", "scripts", "examples") for p in (ROOT / folder).glob("*.py")
    ]
    assert scripts
    assert [p.name for p in scripts if p.stem in sys.stdlib_module_names] == []


def test_checking_a_run_files_training_section_imports_no_pytorch() -> None:
    """`spotrain deploy`, `plan`, `synth` and `run submit` check each run's `[training]` as the
    trainer would (`train.training_problems`), and `run submit` a user's entry point's
    configuration: PyTorch's import is seconds of CPU they need not pay."""
    import subprocess
    import sys

    check = (
        "import sys\n"
        "from spotrain.trainer.train import training_problems\n"
        "problems = training_problems({'steps': 0, 'model': {'width': 10, 'heads': 3}})\n"
        "assert any('steps is 0' in p for p in problems), problems\n"
        "assert any('model.width 10' in p for p in problems), problems\n"
        "from spotrain.trainer import entry_point\n"
        "document = {'run': 'demo', 'entry_point': {'script': 'train.py', 'steps': 'x'}}\n"
        "try:\n"
        "    entry_point.from_document(document, [], 'run.json')\n"
        "except Exception as error:\n"
        "    assert 'steps' in str(error), error\n"
        "else:\n"
        "    raise AssertionError('a mistyped entry point was taken')\n"
        "print(sorted({'torch', 'deepspeed'} & set(sys.modules)))\n"
    )  # fmt: skip
    imported = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                              check=True, cwd=ROOT).stdout.strip()  # fmt: skip
    assert imported == "[]", f"checking a training section imported {imported}"


def test_spotrain_train_checks_a_run_and_hands_over_to_torchrun_without_pytorch(
    tmp_path: Path,
) -> None:
    """`spotrain train` checks the run (the store, the data, the folders) and then hands its
    process to torchrun (`os.execv`), which imports PyTorch itself: an import before it was
    paid twice at every machine's start."""
    import json
    import subprocess
    import sys

    from spotrain.trainer.data import synthetic_corpus, write_token_file

    data = write_token_file(tmp_path / "corpus", synthetic_corpus(5_000))
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"run": "r", "data": str(data), "steps": 2,
                                  "store": f"file://{tmp_path / 'store'}",
                                  "work_dir": str(tmp_path / "work")}))  # fmt: skip
    check = (
        "import os, sys\n"
        "def handed_over(path, argv):\n"
        "    print(sorted({'torch', 'deepspeed'} & set(sys.modules)), argv[1:3])\n"
        "    sys.exit(0)\n"
        "os.execv = handed_over\n"
        "from spotrain import cli\n"
        f"cli.main(['train', {str(config)!r}, '--nproc-per-node', '1'])\n"
    )  # fmt: skip
    said = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          check=True, cwd=ROOT).stdout  # fmt: skip
    assert "[] ['-m', 'spotrain.trainer.launch']" in said, said
