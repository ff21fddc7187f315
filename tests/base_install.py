"""spotrain's commands as an ML engineer's laptop runs them: the base install (boto3), without
CDK for Terraform, moto, matplotlib, PyTorch or Node.js. Every library of the other extras is
blocked at import and PATH holds no program; the commands run in one process, one after
another, each with its exit status and output kept.

    run_base_install([["run", "list", "local"], ...], cwd=..., env=...) -> [Ran, ...]
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

OTHER_EXTRAS = (
    "cdktf", "cdktf_cdktf_provider_aws", "constructs", "jsii", "yaml",  # infrastructure
    "moto", "cryptography", "flask",  # localcloud
    "matplotlib",  # plots
    "torch", "deepspeed", "numpy", "tokenizers", "torchdata",  # training
)  # fmt: skip


@dataclass(frozen=True)
class Ran:
    argv: list[str]
    code: int
    out: str
    err: str


def run_base_install(commands: list[list[str]], *, cwd: Path, env: dict[str, str]) -> list[Ran]:
    with tempfile.TemporaryDirectory() as no_programs:
        done = subprocess.run(
            [sys.executable, __file__], input=json.dumps(commands), capture_output=True,
            text=True, cwd=cwd, env={**env, "PATH": no_programs}, timeout=300,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return [Ran(**ran) for ran in json.loads(done.stdout)]


def _block_other_extras() -> None:
    import importlib.abc

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, *_: object) -> None:
            if name.split(".")[0] in OTHER_EXTRAS:
                raise ImportError(f"No module named {name!r} (not in the base install)", name=name)

    sys.meta_path.insert(0, Blocked())


def _main() -> None:
    _block_other_extras()
    from spotrain import cli

    results = []
    for argv in json.loads(sys.stdin.read()):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(argv)
            except SystemExit as stopped:  # argparse's refusals
                code = int(stopped.code or 0)
        results.append({"argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue()})
    os.write(1, json.dumps(results).encode())


if __name__ == "__main__":
    _main()
