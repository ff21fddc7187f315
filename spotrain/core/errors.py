"""Errors a spotrain user can hit. Each message says what was wrong and what to do.

SpotrainError
├── ConfigError        bad environment or training configuration, construct props (lists
│                      every problem)
├── LocalCloudError    the local cloud cannot start, is not running, or did not answer
├── TerraformError     a terraform command failed (names the stack and the command to rerun)
├── CostInputError     inputs to a cost estimate that describe no run, or prices it lacks
├── TraceError         a spot availability trace that is not the format (cost/traces.py)
├── RehearsalFailed    a rehearsal's story went wrong (tools/rehearsal.py)
├── PlanReplaced       another deadline plan was stored for the run meanwhile
│                      (core/deadline_plan.py)
└── the trainer's own, documented where they are raised:
    ├── StorageError (ObjectMissing, AlreadyExists)                 trainer/storage.py
    ├── CatalogError (StaleWriter)                                  trainer/catalog.py
    ├── ManifestError                                               core/manifest.py
    ├── RestoreError (NothingPublished, StoreUnreadable),
    │   DamagedCheckpoint, DestinationError                         trainer/checkpoint_store.py
    ├── ConfigChanged                                               trainer/restore_policy.py
    ├── DataError                                                   trainer/data.py
    └── DatasetError                                                trainer/datasets.py
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class SpotrainError(Exception):
    """Base of every error spotrain raises on purpose."""


class ConfigError(SpotrainError, ValueError):
    """The configuration has problems; the message lists every one and how to fix it."""

    def __init__(self, subject: str, problems: list[str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{subject} has {len(problems)} problem(s):\n{lines}")


class LocalCloudError(SpotrainError):
    """The local cloud is not in the state the command needs."""


class TerraformError(SpotrainError):
    """A terraform command failed."""


class CostInputError(SpotrainError, ValueError):
    """Inputs to a cost estimate that describe no run, or prices it lacks (names the fix)."""


REGION_VARIABLE = "AWS_DEFAULT_REGION"
"""What boto3 reads for the region (with `region` in the AWS config file); it does not read
AWS_REGION, which only Lambda's runtime and the AWS CLI v2 honour."""


def no_region_fix() -> str:
    """How to give boto3 a region, said for this shell: the variable that works, and the one
    that was set in vain."""
    import os

    fix = f"export {REGION_VARIABLE}=<region> (or set `region` in ~/.aws/config)"
    if os.environ.get("AWS_REGION") and not os.environ.get(REGION_VARIABLE):
        fix = (f"export {REGION_VARIABLE}=$AWS_REGION: boto3 does not read AWS_REGION, which "
               "is set here")  # fmt: skip
    return fix


def does_not_answer(error: BaseException) -> bool:
    """An AWS call's error that says its region did not answer (no connection, a timeout, or
    5xx after botocore's retries: an outage), not that it answered no (credentials, a missing
    resource: something to fix)."""
    from botocore.exceptions import ClientError, ConnectionError, ConnectTimeoutError

    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return isinstance(status, int) and status >= 500
    return isinstance(error, ConnectionError | ConnectTimeoutError)


def outage_fix(error: BaseException, region: str | None = None) -> str | None:
    """What to do when `error` says the region asked did not answer (an outage, not a refusal):
    work from another region of the environment. None for any other error. `region`: the one
    the failed call went to (its client's), which may not be the shell's: a store's bucket is
    in its own region; without it, the shell's is named."""
    import os

    if not does_not_answer(error):
        return None
    region = (region or os.environ.get(REGION_VARIABLE) or os.environ.get("AWS_REGION")
              or "its region")  # fmt: skip
    return (f"{region} does not answer: during a region outage point the command at another "
            "region of the environment (export AWS_DEFAULT_REGION=<region>, with that region's "
            "store: `spotrain run env ENV RUN` prints REPLICA_REGION and REPLICA_STORE), as "
            "runbooks/region-down.md does")  # fmt: skip


def raise_if_problems(subject: str, problems: list[str]) -> None:
    if problems:
        raise ConfigError(subject, problems)


@contextmanager
def aws_errors(what: str, fix: str) -> Iterator[None]:
    """An AWS refusal as one line that names what was asked and what to check."""
    from botocore.exceptions import BotoCoreError, ClientError, NoRegionError

    try:
        yield
    except NoRegionError as error:
        raise SpotrainError(f"{what}: no AWS region: {no_region_fix()}") from error
    except (ClientError, BotoCoreError) as error:
        raise SpotrainError(f"{what}: {error}; {outage_fix(error) or fix}") from error


def read_text(
    path: str | Path, what: str, fix: str, error: type[SpotrainError] = SpotrainError
) -> str:
    """A file a user handed in, or one `error` naming it, what is wrong and `fix`."""
    try:
        return Path(path).read_text()
    except OSError as failure:
        reason = failure.strerror or str(failure)
        raise error(f"{what} {path} cannot be read ({reason}): {fix}") from None
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not text (UTF-8): {fix}") from None


def read_json(
    path: str | Path, what: str, fix: str, error: type[SpotrainError] = SpotrainError
) -> Any:
    """`read_text`, decoded as JSON (the same one error when it is not)."""
    text = read_text(path, what, fix, error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as failure:
        raise error(
            f"{what} {path} is not JSON ({failure.msg} at line {failure.lineno}): {fix}"
        ) from None
    except RecursionError:
        raise error(f"{what} {path} is not JSON this reads (nested too deeply): {fix}") from None


def json_kind(value: Any) -> str:
    """How a decoded JSON value is called in messages: an array, a string, a number..."""
    kinds = {list: "an array", str: "a string", bool: "true or false", dict: "an object"}
    if value is None:
        return "null"
    return kinds.get(type(value), "a number" if isinstance(value, int | float) else "a value")
