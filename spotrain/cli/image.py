"""`spotrain image build|bake ENV`: from a checkout to machines that boot the trainer.

`build` builds the trainer image (images/Dockerfile) and the user's code layered on it
(images/Dockerfile.code: the checkout as the code folder, images/requirements-code.txt) and
pushes both to the environment's registry (the storage stack's `image_repository`), each
tagged with the commit it was built from (tags are immutable: an image already pushed for
this commit is reused, not rebuilt). It prints the code image by digest, what `bake` takes.

`bake` runs the Packer recipe (images/spotrain.pkr.hcl) over that image: a machine image with
the image pulled in by digest and the boot service, whose id it writes to
`/spotrain/<env>/image-id`, where the runs' launch templates read it.

Both print every command before they run it; `--dry-run` prints them only (and needs no
Docker, Packer or credentials beyond reading the registry).
"""

from __future__ import annotations

import argparse
import base64
import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from spotrain.cli.arguments import environment
from spotrain.cli.output import say
from spotrain.core.errors import SpotrainError, aws_errors
from spotrain.core.image_reference import (
    image_repository_name,
    is_digest_reference,
    repository_of,
)

CHECKOUT = Path(__file__).resolve().parents[2]
IMAGES = CHECKOUT / "images"


def _run(command: list[str], *, dry_run: bool, stdin: str | None = None) -> str:
    say("$ " + " ".join(shlex.quote(part) for part in command))
    if dry_run:
        return ""
    if shutil.which(command[0]) is None:
        raise SpotrainError(f"`{command[0]}` is not installed here: install it (the image "
                            "build needs Docker, the bake Packer), or see the commands with "
                            "--dry-run")  # fmt: skip
    done = subprocess.run(command, cwd=CHECKOUT, input=stdin, text=True, capture_output=True)
    if done.returncode != 0:
        raise SpotrainError(f"`{command[0]} {command[1]}` failed (exit {done.returncode}): "
                            f"{(done.stderr or done.stdout).strip()[-2000:]}")  # fmt: skip
    return done.stdout


def _commit() -> str:
    """The checkout's commit: what the images are tagged with. A checkout with changes is
    refused: an image must be rebuildable from what its tag names."""
    status = subprocess.run(["git", "status", "--porcelain"], cwd=CHECKOUT, text=True,
                            capture_output=True)  # fmt: skip
    if status.returncode != 0:
        raise SpotrainError(f"{CHECKOUT} is not a git checkout: build the image from one "
                            "(its commit tags the image)")  # fmt: skip
    if status.stdout.strip():
        raise SpotrainError("the checkout has uncommitted changes: commit them first (the "
                            "image is tagged with the commit, and must be what it "
                            "names)")  # fmt: skip
    return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=CHECKOUT, text=True,
                          capture_output=True, check=True).stdout.strip()  # fmt: skip


def _repository(env_name: str, region: str | None = None) -> tuple[Any, str, str]:
    """The environment's registry client, repository name and URI in `region` (home's if
    None), as deployed."""
    from spotrain.core import aws_clients

    config = environment(env_name)
    ecr = aws_clients.client("ecr", region or config.primary_region)
    name = image_repository_name(config.name)
    fix = (
        f"deploy environment {env_name} first (`spotrain deploy {env_name}`: its storage "
        "stack holds the registry)"
    )
    with aws_errors(f"the registry {name}", fix):
        [found] = ecr.describe_repositories(repositoryNames=[name])["repositories"]
    return ecr, name, str(found["repositoryUri"])


def _pushed(ecr: Any, name: str, tag: str = "", digest: str = "") -> str | None:
    """The digest of the image tagged `tag` (or of `digest`) when the registry has it."""
    from botocore.exceptions import ClientError

    image_id = {"imageDigest": digest} if digest else {"imageTag": tag}
    try:
        [image] = ecr.describe_images(repositoryName=name, imageIds=[image_id])[
            "imageDetails"]  # fmt: skip
    except ClientError as error:
        if error.response["Error"]["Code"] in ("ImageNotFoundException", "RepositoryNotFound"):
            return None
        raise
    return str(image["imageDigest"])


def check_pushed(env_name: str, reference: str) -> None:
    """Refuse a run's image its machines could not pull: another registry's, or a digest the
    environment's registry does not hold in every region (a run's machines pull from their
    own region's)."""
    ecr, name, uri = _repository(env_name)
    if repository_of(reference) != uri:
        raise SpotrainError(f"image {reference} is not in environment {env_name}'s registry "
                            f"{uri}: pin an image `spotrain image build {env_name}` pushed "
                            "there")  # fmt: skip
    config = environment(env_name)
    registries = {config.primary_region: ecr} | {
        region: _repository(env_name, region)[0] for region in config.replica_regions
    }
    digest = reference.rsplit("@", 1)[1]
    missing = [r for r, ecr in registries.items() if _pushed(ecr, name, digest=digest) is None]
    if missing:
        raise SpotrainError(f"image {reference} is not in the registry in "
                            f"{', '.join(missing)}: push it with `spotrain image build "
                            f"{env_name}` (it pushes to every region) and pin the digest it "
                            "prints")  # fmt: skip


def _build_and_push(
    ecr: Any, name: str, uri: str, tag: str, dockerfile: str, build_args: list[str],
    dry_run: bool,
) -> str:  # fmt: skip
    """`uri@digest` of the image tagged `tag`: the registry's, or built and pushed now."""
    if (digest := _pushed(ecr, name, tag)) is not None:
        say(f"{uri}:{tag} is in the registry already ({digest}): reused")
        return f"{uri}@{digest}"
    _run(["docker", "build", "-f", dockerfile, *build_args, "-t", f"{uri}:{tag}", "."],
         dry_run=dry_run)  # fmt: skip
    _run(["docker", "push", f"{uri}:{tag}"], dry_run=dry_run)
    if dry_run:
        return f"{uri}@<digest of {tag}>"
    digest = _pushed(ecr, name, tag)
    if digest is None:
        raise SpotrainError(f"{uri}:{tag} was pushed but the registry does not list it: retry")
    return f"{uri}@{digest}"


def _login(ecr: Any, uri: str, dry_run: bool) -> None:
    if dry_run:
        return
    with aws_errors("the registry's login", "check your credentials may push to it"):
        token = ecr.get_authorization_token()["authorizationData"][0]
    user, password = base64.b64decode(token["authorizationToken"]).decode().split(":", 1)
    _run(["docker", "login", "--username", user, "--password-stdin", uri.split("/")[0]],
         dry_run=False, stdin=password)  # fmt: skip


def _copy_to_regions(env_name: str, home_uri: str, tag: str, digest: str, dry_run: bool) -> None:
    """The image tagged `tag` pushed to every other region's repository: a run's machines
    pull from their own region's. The same image has the same digest there."""
    for region in environment(env_name).replica_regions:
        ecr, name, uri = _repository(env_name, region)
        if (there := _pushed(ecr, name, tag)) is not None:
            if there != digest and not dry_run:
                raise SpotrainError(f"{uri}:{tag} holds {there}, not {digest}: tags are "
                                    "immutable; rebuild from a new commit")  # fmt: skip
            continue
        _login(ecr, uri, dry_run)
        _run(["docker", "tag", f"{home_uri}:{tag}", f"{uri}:{tag}"], dry_run=dry_run)
        _run(["docker", "push", f"{uri}:{tag}"], dry_run=dry_run)
        if not dry_run and _pushed(ecr, name, tag) != digest:
            raise SpotrainError(f"{uri}:{tag} was pushed but does not hold {digest}: retry")


def _build(args: argparse.Namespace) -> int:
    commit = _commit() if not args.dry_run else _commit_or_worktree()
    ecr, name, uri = _repository(args.environment)
    _login(ecr, uri, args.dry_run)
    trainer = _build_and_push(ecr, name, uri, f"trainer-{commit}", "images/Dockerfile", [],
                              args.dry_run)  # fmt: skip
    code = _build_and_push(ecr, name, uri, f"code-{commit}", "images/Dockerfile.code",
                           ["--build-arg", f"TRAINER_IMAGE={trainer}"], args.dry_run)  # fmt: skip
    _copy_to_regions(args.environment, uri, f"code-{commit}", code.rsplit("@", 1)[1],
                     args.dry_run)  # fmt: skip
    say(f"image: {code}\npin it in a run file (runs/{args.environment}/RUN.toml):\n"
        f'  image = "{code}"\nor bake the machine image with it: spotrain image bake '
        f"{args.environment} --image {code}")  # fmt: skip
    return 0


def _commit_or_worktree() -> str:
    try:
        return _commit()
    except SpotrainError as error:
        say(f"note: {error} (shown anyway: --dry-run)")
        return "<commit>"


def _bake(args: argparse.Namespace) -> int:
    if not args.image or not (is_digest_reference(args.image) or args.dry_run):
        raise SpotrainError("`spotrain image bake` needs --image REPOSITORY@sha256:DIGEST (what "
                            "`spotrain image build` printed): a machine image bakes one image, "
                            "named by its digest")  # fmt: skip
    config = environment(args.environment)
    copies = json.dumps(list(config.replica_regions), separators=(",", ":"))
    packer = ["packer", "build", "-var", f"environment={config.name}",
              "-var", f"region={config.primary_region}", "-var", f"copy_regions={copies}",
              "-var", f"trainer_image={args.image}", str(IMAGES)]  # fmt: skip
    _run(["packer", "init", str(IMAGES)], dry_run=args.dry_run)
    _run(packer, dry_run=args.dry_run)
    say(f"the machine image's id is in /spotrain/{config.name}/image-id in each of "
        f"{', '.join(config.region_names)}: machines the runs of {config.name} launch from now "
        "on boot it")  # fmt: skip
    return 0


def cmd_image(args: argparse.Namespace) -> int:
    return {"build": _build, "bake": _bake}[args.action](args)


def add_parsers(commands: Any) -> None:
    image = commands.add_parser(
        "image", help="build and push the trainer image with your code; bake the machine image"
    )
    image.add_argument("action", choices=["build", "bake"],
                       help="build: the trainer image and your code layered on it, pushed to "
                       "the environment's registry; bake: the machine image the fleet boots, "
                       "its id written to /spotrain/ENV/image-id")  # fmt: skip
    image.add_argument("environment", help="the environment (stacks/environments.py)")
    image.add_argument("--image", help="bake: the image `build` printed (REPOSITORY@sha256:...)")
    image.add_argument("--dry-run", action="store_true",
                       help="print the commands without running them")  # fmt: skip
    image.set_defaults(handler=cmd_image)
