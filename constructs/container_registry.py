"""The environment's container registry: where `spotrain image build` pushes the trainer image
and the user's code layered on it. Tags are immutable (a tag names one image forever, and runs
pin a digest anyway), every push is scanned, images are encrypted with the environment's key,
and untagged images (a rebuilt tag's predecessors, layers no image names) expire."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from spotrain.cdk import Construct, aws
from spotrain.core.errors import raise_if_problems

_NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")


@dataclass(frozen=True, kw_only=True)
class ContainerRegistryProps:
    name: str
    """Repository name, e.g. `spotrain-dev/trainer`."""
    kms_key_arn: str
    """Key the images are encrypted with (the environment's data key)."""
    untagged_expire_days: int = 14
    """Untagged images older than this are removed."""
    force_delete: bool = False
    """Destroy the repository with its images (the local cloud only)."""
    provider: Any = None
    """AwsProvider of the repository's region; None uses the stack's default provider."""

    def __post_init__(self) -> None:
        problems = []
        if not 2 <= len(self.name) <= 256 or not _NAME.match(self.name):
            problems.append(
                f"name {self.name!r} is not a repository name: lowercase letters, digits and "
                "._- between them, / between parts (e.g. 'spotrain-dev/trainer')"
            )
        if self.untagged_expire_days < 1:
            problems.append(f"untagged_expire_days is {self.untagged_expire_days}: 1 or more")
        raise_if_problems("ContainerRegistryProps", problems)


class ContainerRegistry(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: ContainerRegistryProps) -> None:
        super().__init__(scope, id_)
        self.repository = aws.ecr_repository.EcrRepository(
            self,
            "Repository",
            name=props.name,
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration=aws.ecr_repository.EcrRepositoryImageScanningConfiguration(
                scan_on_push=True
            ),
            encryption_configuration=[
                aws.ecr_repository.EcrRepositoryEncryptionConfiguration(
                    encryption_type="KMS", kms_key=props.kms_key_arn
                )
            ],
            force_delete=props.force_delete,
            provider=props.provider,
        )
        aws.ecr_lifecycle_policy.EcrLifecyclePolicy(
            self,
            "Lifecycle",
            repository=self.repository.name,
            policy=json.dumps({"rules": [{
                "rulePriority": 1,
                "description": "untagged images expire",
                "selection": {"tagStatus": "untagged", "countType": "sinceImagePushed",
                              "countUnit": "days", "countNumber": props.untagged_expire_days},
                "action": {"type": "expire"},
            }]}),
            provider=props.provider,
        )  # fmt: skip

    @property
    def url(self) -> str:
        return str(self.repository.repository_url)
