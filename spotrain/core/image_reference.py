"""The images a run's machines train in: the environment's registry, and how a run names the
image it pins. One place for these facts: the run files, the stacks, `spotrain image` and
`run submit` all read them here.

A run pins its image by digest (`REPOSITORY@sha256:...`, what `spotrain image build` prints):
a tag can be moved, a digest names one image forever, so the image a run trains in changes
only with its run file, and the change shows in the run's plan. A run that pins none trains in
the image baked into the machine image (`BAKED_IMAGE`, `spotrain image bake`)."""

from __future__ import annotations

import re

BAKED_IMAGE = "spotrain-trainer:baked"
"""The name the machine image gives the image baked into it (images/spotrain.pkr.hcl, the
default of images/bootstrap.sh)."""

REGISTRY_PULL_ACTIONS = (
    "ecr:BatchGetImage",
    "ecr:GetDownloadUrlForLayer",
    "ecr:BatchCheckLayerAvailability",
)
"""What pulling an image from the registry calls, on its repository (Docker's credential
helper logs in with `ecr:GetAuthorizationToken`, which names no resource)."""

_DIGEST = re.compile(r"^(?P<repository>[^@\s]+)@sha256:[0-9a-f]{64}$")
_ECR_HOST = re.compile(r"^\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com$")


def image_repository_name(environment: str) -> str:
    """The environment's container repository (the trainer image and the user's code)."""
    return f"spotrain-{environment}/trainer"


def is_digest_reference(reference: str) -> bool:
    """Whether `reference` names one image by its digest (`REPOSITORY@sha256:<64 hex>`)."""
    return _DIGEST.match(reference) is not None


def repository_of(reference: str) -> str:
    """`HOST/NAME` of a digest reference (its registry's repository URI)."""
    found = _DIGEST.match(reference)
    if found is None:
        raise ValueError(f"{reference!r} is not a digest reference")
    return found["repository"]


def image_in_region(reference: str, region: str) -> str:
    """`reference` (a digest reference in the environment's registry) as the copy the
    registry replicated to `region` names it: the same repository and digest, that region's
    registry host."""
    host, _, rest = reference.partition("/")
    account, dkr, ecr, _, domain = host.split(".", 4)
    return f"{account}.{dkr}.{ecr}.{region}.{domain}/{rest}"


def run_image_problems(reference: str, environment: str) -> list[str]:
    """What is wrong with `reference` as the image a run of `environment` pins: it must name
    one image by digest, in the environment's own registry (the only one its machines may
    pull from)."""
    build = f"`spotrain image build {environment}` prints it"
    if not is_digest_reference(reference):
        return [
            f"image {reference!r} is not pinned by digest: give REPOSITORY@sha256:DIGEST "
            f"({build}); a tag can be moved, a digest names one image"
        ]
    host, _, name = repository_of(reference).partition("/")
    expected = image_repository_name(environment)
    if not _ECR_HOST.match(host) or name != expected:
        return [
            f"image {reference!r} is not in environment {environment}'s registry: the run's "
            f"machines pull only from ACCOUNT.dkr.ecr.REGION.amazonaws.com/{expected} "
            f"({build})"
        ]
    return []
