"""CPU of the AWS provider's starts with and without an `endpoints` block, side by side.

    .venv/bin/python bench/provider_endpoints.py   # writes bench/provider_endpoints.md (2 min)

The `local` environment's stacks once pointed every service the blueprint calls at the local
cloud with the provider's `endpoints` block; they now name no endpoint (the provider reads
AWS_ENDPOINT_URL) and accept the local cloud's account alone (`stacks/base.py`). Here
`terraform validate` of a one-region stack and a two-region stack, as synthesized and with the
block the stacks had put back into each provider configuration: a schema fetch and a validate
walk, the starts every walk of every command pays (no cloud needed).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

from terraform import measured  # bench/terraform.py: `python bench/x.py` imports beside it

from spotrain.tools import deploy, terraform

RUNS = 3
STACKS = ("local-budget", "local-storage")
"""One provider configuration, and two (home and the second region)."""
SERVICES = ("autoscaling", "budgets", "dynamodb", "ec2", "ecr", "events", "iam", "kms", "lambda",
            "logs", "s3", "sns", "sqs", "ssm", "sts")  # fmt: skip
"""The services the `endpoints` block named."""
ENDPOINT = "https://127.0.0.1:4566"


def with_endpoints(stack: Path) -> tuple[Path, int]:
    """A copy of `stack` whose every provider configuration has the `endpoints` block, and
    how many provider configurations it has."""
    copy = stack.with_name(stack.name + "-with-endpoints")
    copy.mkdir()
    configuration = json.loads((stack / "cdk.tf.json").read_text())
    providers = configuration["provider"]["aws"]
    for provider in providers:
        provider["endpoints"] = [{service: ENDPOINT for service in SERVICES}]
    (copy / "cdk.tf.json").write_text(json.dumps(configuration))
    return copy, len(providers)


def rows() -> list[tuple[str, int, list[float]]]:
    """Per stack: its provider configurations and the median CPU-seconds, wall seconds of
    `validate` as synthesized, then with the block."""
    found = []
    with tempfile.TemporaryDirectory() as scratch:
        stacks = deploy.synth(Path(scratch) / "cdktf.out", only="local") / "stacks"
        env = terraform.terraform_env(terraform.write_cli_config(Path(scratch) / "terraform"))
        for name in STACKS:
            copy, providers = with_endpoints(stacks / name)
            folders = (stacks / name, copy)
            for folder in folders:
                measured(["terraform", "init", "-backend=false", "-input=false", "-no-color"],
                         folder, env)  # fmt: skip
            runs: dict[Path, list[tuple[float, float, float]]] = {f: [] for f in folders}
            for _ in range(RUNS):  # alternate, so machine noise hits both alike
                for folder in folders:
                    runs[folder].append(measured(["terraform", "validate", "-no-color"],
                                                 folder, env))  # fmt: skip
            medians = [statistics.median(m[i] for m in runs[f]) for f in folders for i in (0, 1)]
            found.append((name, providers, medians))
    return found


def main() -> None:
    lines = [
        "# The AWS provider's starts, with and without an `endpoints` block",
        "",
        "Command: `.venv/bin/python bench/provider_endpoints.py`",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}",
        "",
        f"`terraform validate` (median of {RUNS} runs of each, alternating; GOGC as `spotrain` "
        "sets it):",
        "",
        "| stack | provider configurations | CPU-s as synthesized | CPU-s with the block | "
        "ratio | wall s as synthesized | wall s with the block |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {name} | {providers} | {cpu:.1f} | {cpu_with:.1f} | {cpu / cpu_with:.2f}x | "
            f"{wall:.1f} | {wall_with:.1f} |"
            for name, providers, (cpu, wall, cpu_with, wall_with) in rows()
        ),
        "",
        "Target: as synthesized, at most 0.7x the CPU with the block.",
    ]
    path = Path(__file__).with_name("provider_endpoints.md")
    path.write_text("\n".join(lines) + "\n")
    print(path.read_text())


if __name__ == "__main__":
    main()
