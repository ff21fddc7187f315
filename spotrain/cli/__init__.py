"""`spotrain`: the command line.

spotrain local up|down|status     the local cloud (AWS emulator on loopback)
spotrain synth                    synthesize every environment into cdktf.out/
spotrain deploy ENV               apply ENV's stacks (local starts the local cloud)
spotrain plan ENV                 show whether ENV's stacks would change
spotrain destroy ENV              destroy ENV's stacks
spotrain scan                     checkov over every synthesized stack, reasoned skips only
spotrain train CONFIG             train (torchrun on this machine, or one node of many)
spotrain config put|get|history   the run's configuration, stored where the fleet reads it
spotrain run submit|list|status|logs|cancel|resume|retire|env ENV [RUN]
                                  an environment's runs: phase, step, machines, spend
spotrain image build|bake ENV     the trainer image with your code; the machine image
spotrain data prepare|show        datasets: text into token shards in the store
spotrain checkpoints ...          list, show, verify, restore, gc a run's checkpoints
spotrain cost plan|simulate       a run's cost per strategy before it starts; trace replay
spotrain prices refresh|show      the price book (on-demand, spot per zone, Advisor bands)
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

# The command groups, in the order `spotrain --help` lists them; each registers its own
# parsers and handlers (`add_parsers`), and imports what it needs only when it runs.
from spotrain.cli import (
    budget,
    checkpoints,
    cost,
    data,
    fleet,
    image,
    infra,
    local,
    logs,
    prices,
    runs,
    train,
)
from spotrain.core.errors import SpotrainError
from spotrain.tools.terraform import INSTALL_HINT


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="spotrain", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    root.add_argument(
        "--debug", action="store_true", help="show the traceback of any error (for bug reports)"
    )
    commands = root.add_subparsers(dest="command", required=True)
    local.add_parsers(commands)
    runs.add_parsers(commands)
    fleet.add_parsers(commands)
    logs.add_parsers(commands)
    budget.add_parsers(commands)
    cost.add_parsers(commands)
    prices.add_parsers(commands)
    infra.add_synth_parsers(commands)
    image.add_parsers(commands)
    train.add_parsers(commands)
    data.add_parsers(commands)
    checkpoints.add_parsers(commands)
    infra.add_environment_parsers(commands)
    return root


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's arguments, its words in any order around its options: `spotrain data
    prepare --store S --name N a.txt` as `spotrain data prepare a.txt --store S --name N`
    (argparse alone gives an optional positional, such as INPUT... or CONFIG, only the words
    before the first option)."""
    root = parser()
    args, extra = root.parse_known_args(argv)
    if not extra:
        return args
    words = list(sys.argv[1:] if argv is None else argv)
    sub = _subcommands(root)[args.command]
    if _subcommands(sub):  # argparse cannot intermix through a second level of commands
        return root.parse_args(argv)  # its own refusal of the words left over
    again = sub.parse_intermixed_args(words[words.index(args.command) + 1 :])
    again.debug, again.command = args.debug, args.command
    return again


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parsers of `parser`'s commands, by name (none: it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        return int(args.handler(args))
    except SpotrainError as error:
        if args.debug:
            traceback.print_exc()
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as error:  # the last line of defence: one line, not a trace
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError, NoRegionError

        from spotrain.core.errors import no_region_fix

        if args.debug:
            traceback.print_exc()
        extra = _extra_for(error) if isinstance(error, ImportError) else None
        if extra is not None:
            print(f"error: `spotrain {args.command}` needs the {extra} extra, which this "
                  f"installation lacks ({error}): pip install 'spotrain[{extra}]'",
                  file=sys.stderr)  # fmt: skip
            return 2
        if isinstance(error, FileNotFoundError) and _missing_program(error):
            program = _missing_program(error)
            # jsii's half-started node process complains again as it is collected: once is enough.
            sys.unraisablehook = lambda _: None
            print(f"error: `spotrain {args.command}` runs `{program}`, which is not installed "
                  f"here: {PROGRAM_FIX[program]}", file=sys.stderr)  # fmt: skip
            return 2
        if isinstance(error, NoRegionError):
            print(f"error: no AWS region: {no_region_fix()}", file=sys.stderr)
            return 2
        # An upload s3transfer gave up on carries AWS's refusal as its message.
        if isinstance(error, ClientError | BotoCoreError | S3UploadFailedError):
            print(f"error: AWS refused or could not be reached: {error}; check your "
                  "credentials, AWS_DEFAULT_REGION and the names you gave",
                  file=sys.stderr)  # fmt: skip
            return 2
        print(
            f"error: {type(error).__name__}: {error}\nThis is a bug in spotrain "
            f"{_version()}: please report it with the command you ran and its output with "
            "--debug (which shows where it happened).",
            file=sys.stderr,
        )
        return 70


EXTRA_OF = {
    "torch": "training", "deepspeed": "training", "numpy": "cost", "tokenizers": "training",
    "tqdm": "training", "watchtower": "training", "torchdata": "training",
    "cdktf": "infrastructure", "cdktf_cdktf_provider_aws": "infrastructure",
    "constructs": "infrastructure", "yaml": "infrastructure",
    "moto": "localcloud", "cryptography": "localcloud", "cheroot": "localcloud",
    "matplotlib": "plots",
}  # fmt: skip
"""The library each optional part of spotrain imports, and the extra (pyproject.toml) that
installs it: a machine installs only what its kind needs. numpy is in `training` too, with
torch, which a training command imports first: the smallest extra that has it is named."""


PROGRAM_FIX = {
    "node": "install Node.js 20 or newer (CDK for Terraform synthesizes the stacks on it); "
    "watching and steering runs needs neither it nor the infrastructure extra",
    "terraform": INSTALL_HINT,
    "docker": "install Docker (the image build needs it)",
}
"""The programs a command may start, and how to get each."""


def _missing_program(error: FileNotFoundError) -> str | None:
    """The program a command tried to start and found missing, if it is one of those."""
    name = str(error.filename or "")
    return name if name in PROGRAM_FIX else None


def _extra_for(error: ImportError) -> str | None:
    name = error.name or str(error).split()[0].strip("'\"")
    return EXTRA_OF.get(name.split(".")[0])


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("spotrain")
    except PackageNotFoundError:
        return "(not installed)"
