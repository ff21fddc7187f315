"""Compliant / non-compliant pairs for every security property the blueprint claims."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import security_rules as rules
from helpers import load_stack

ENVIRONMENTS = ("local", "dev", "prod")
PARTS = ("storage", "catalog", "network", "budget", "interruptions")
RUNS = ("local-run-demo", "local-run-second", "dev-run-gpt-small", "prod-run-gpt-large")
STACKS = [f"{env}-{part}" for env in ENVIRONMENTS for part in PARTS] + list(RUNS)


@pytest.mark.parametrize("rule", sorted(rules.RULES))
def test_every_stack_complies(synth_dir: Path, rule: str) -> None:
    violations = {
        name: found for name in STACKS if (found := rules.RULES[rule](load_stack(synth_dir, name)))
    }
    assert violations == {}


def first(stack: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(iter(stack["resource"][kind].values()))


def _public_bucket(s: dict[str, Any]) -> None:
    first(s, "aws_s3_bucket_public_access_block")["restrict_public_buckets"] = False


def _unencrypted_bucket(s: dict[str, Any]) -> None:
    del s["resource"]["aws_s3_bucket_server_side_encryption_configuration"]


def _unversioned_bucket(s: dict[str, Any]) -> None:
    first(s, "aws_s3_bucket_versioning")["versioning_configuration"]["status"] = "Suspended"


def _plain_http_bucket(s: dict[str, Any]) -> None:
    for document in s["data"]["aws_iam_policy_document"].values():
        document["statement"] = [
            st for st in document["statement"] if st.get("sid") != "DenyInsecureTransport"
        ]


def _unrotated_key(s: dict[str, Any]) -> None:
    first(s, "aws_kms_key")["enable_key_rotation"] = False


def _imdsv1(s: dict[str, Any]) -> None:
    first(s, "aws_launch_template")["metadata_options"]["http_tokens"] = "optional"


def _unrecoverable_table(s: dict[str, Any]) -> None:
    first(s, "aws_dynamodb_table")["point_in_time_recovery"]["enabled"] = False


def _plain_log_group(s: dict[str, Any]) -> None:
    del first(s, "aws_cloudwatch_log_group")["kms_key_id"]


def _wildcard_policy(s: dict[str, Any]) -> None:
    for document in s["data"]["aws_iam_policy_document"].values():
        for statement in document["statement"]:
            if statement.get("sid") == "RecordEventsAndFleetState":
                statement["resources"] = ["*"]


def _unconditioned_key_grant(s: dict[str, Any]) -> None:
    """A service statement whose condition was dropped."""
    for document in s["data"]["aws_iam_policy_document"].values():
        for grant in document["statement"]:
            if grant.get("sid") == "EventBridgeDeadLetters":
                del grant["condition"]


def _public_subnet(s: dict[str, Any]) -> None:
    first(s, "aws_subnet")["map_public_ip_on_launch"] = True


BREAKAGES: dict[str, tuple[str, Callable[[dict[str, Any]], None]]] = {
    "buckets_block_public_access": ("local-storage", _public_bucket),
    "buckets_are_encrypted": ("local-storage", _unencrypted_bucket),
    "buckets_are_versioned": ("local-storage", _unversioned_bucket),
    "bucket_policies_require_tls": ("local-storage", _plain_http_bucket),
    "kms_keys_rotate": ("local-storage", _unrotated_key),
    "instances_require_imdsv2": ("local-run-demo", _imdsv1),
    "tables_are_encrypted_and_recoverable": ("local-catalog", _unrecoverable_table),
    "queues_topics_and_logs_are_encrypted": ("local-interruptions", _plain_log_group),
    "iam_policies_are_scoped": ("local-interruptions", _wildcard_policy),
    "no_public_network_paths": ("local-network", _public_subnet),
    "key_policies_grant_only_the_account_and_conditioned_services": (
        "dev-storage",
        _unconditioned_key_grant,
    ),
}


def test_every_rule_has_a_non_compliant_case() -> None:
    assert set(BREAKAGES) == set(rules.RULES)


@pytest.mark.parametrize("rule", sorted(BREAKAGES))
def test_rule_flags_a_broken_stack(synth_dir: Path, rule: str) -> None:
    stack_name, breakage = BREAKAGES[rule]
    stack = rules.copy(load_stack(synth_dir, stack_name))
    assert rules.RULES[rule](stack) == []
    breakage(stack)
    assert rules.RULES[rule](stack) != []
