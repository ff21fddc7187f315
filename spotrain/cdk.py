"""The one place that imports CDK for Terraform and its AWS provider bindings.

Constructs and stacks import `App`, `TerraformStack`, ... and the provider bindings (`aws`)
from here, so moving to the community fork of CDKTF changes this module and the pins only.

`aws.<submodule>` loads a single provider submodule on first use. The bindings package's own
`__init__` imports all ~2,100 submodules (14-26 s a process); we register the package without
running that `__init__` and import only what the blueprint uses. The synthesized JSON is the
same either way (tests/test_cdk_seam.py holds us to that).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

# jsii prints a multi-line end-of-life banner on every start under node 20, the node this
# project runs on; the runtime starts on the first cdktf import below, so this must come first.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from cdktf import (
    App,
    AssetType,
    Fn,
    S3Backend,
    TerraformAsset,
    TerraformDataSource,
    TerraformOutput,
    TerraformResource,
    TerraformResourceLifecycle,
    TerraformStack,
    Testing,
)

from constructs import Construct

PROVIDER_PACKAGE = "cdktf_cdktf_provider_aws"

__all__ = [
    "PROVIDER_PACKAGE",
    "App",
    "AssetType",
    "Construct",
    "Fn",
    "S3Backend",
    "TerraformAsset",
    "TerraformDataSource",
    "TerraformOutput",
    "TerraformResource",
    "TerraformResourceLifecycle",
    "TerraformStack",
    "Testing",
    "aws",
    "forget_without_destroying",
]


def _register_provider_package() -> None:
    """Put the bindings package in sys.modules without executing its __init__."""
    if PROVIDER_PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(PROVIDER_PACKAGE)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(
            f"{PROVIDER_PACKAGE} is not installed: run `make setup` (it installs the pinned "
            "cdktf-cdktf-provider-aws)."
        )
    sys.modules[PROVIDER_PACKAGE] = importlib.util.module_from_spec(spec)


class _ProviderBindings:
    """Attribute access `aws.s3_bucket` imports `cdktf_cdktf_provider_aws.s3_bucket` on demand."""

    def __getattr__(self, submodule: str) -> ModuleType:
        if submodule.startswith("__"):
            raise AttributeError(submodule)
        _register_provider_package()
        module = importlib.import_module(f"{PROVIDER_PACKAGE}.{submodule}")
        setattr(self, submodule, module)
        return module


aws = _ProviderBindings()


def forget_without_destroying(scope: Construct, id_: str, resource_type: str) -> None:
    """Let Terraform forget the `resource_type` that `scope` once made as `id_`, leaving the
    real object in place: an environment deployed before a resource left the configuration
    keeps what it made (a `removed` block with `destroy = false`; Terraform 1.7 and later).

    The address is the one CDKTF gave the old resource, allocated from the same construct path;
    the empty construct left at that path reserves it, so nothing new takes it."""
    stack = TerraformStack.of(scope)
    address = f"{resource_type}.{stack._allocate_logical_id(Construct(scope, id_).node)}"
    removed: list[dict[str, Any]] = stack.__dict__.setdefault("_forgotten", [])
    removed.append({"from": address, "lifecycle": {"destroy": False}})
    stack.add_override("removed", removed)
