"""Security properties the blueprint claims, as checks over synthesized Terraform JSON.

Each rule takes a stack and returns its violations. The tests run every rule on every stack
(compliant) and on a deliberately broken copy (non-compliant), so a rule that cannot fail is
caught as surely as a stack that breaks a rule.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from spotrain.constructs.spot_fleet_iam import SESSION_MANAGER_AGENT_ACTIONS

Stack = dict[str, Any]


def _resources(stack: Stack, kind: str) -> dict[str, dict[str, Any]]:
    return stack.get("resource", {}).get(kind, {})


def _buckets_lacking(stack: Stack, kind: str, holds: Callable[[dict[str, Any]], bool]) -> list[str]:
    """Buckets that no resource of `kind` satisfying `holds` configures."""
    covered = {
        str(body["bucket"]).split(".")[1]
        for body in _resources(stack, kind).values()
        if holds(body)
    }
    return [b for b in _resources(stack, "aws_s3_bucket") if b not in covered]


def buckets_block_public_access(stack: Stack) -> list[str]:
    flags = ("block_public_acls", "block_public_policy", "ignore_public_acls",
             "restrict_public_buckets")  # fmt: skip
    lacking = _buckets_lacking(
        stack,
        "aws_s3_bucket_public_access_block",
        lambda body: all(body.get(flag) is True for flag in flags),
    )
    return [f"bucket {b} has no full public access block" for b in lacking]


def buckets_are_encrypted(stack: Stack) -> list[str]:
    def encrypts(body: dict[str, Any]) -> bool:
        default = body["rule"][0]["apply_server_side_encryption_by_default"]
        return default["sse_algorithm"] in ("aws:kms", "AES256")

    kind = "aws_s3_bucket_server_side_encryption_configuration"
    return [
        f"bucket {b} has no default encryption" for b in _buckets_lacking(stack, kind, encrypts)
    ]


def buckets_are_versioned(stack: Stack) -> list[str]:
    def enabled(body: dict[str, Any]) -> bool:
        return bool(body["versioning_configuration"]["status"] == "Enabled")

    lacking = _buckets_lacking(stack, "aws_s3_bucket_versioning", enabled)
    return [f"bucket {b} is not versioned" for b in lacking]


def bucket_policies_require_tls(stack: Stack) -> list[str]:
    documents = stack.get("data", {}).get("aws_iam_policy_document", {})
    with_tls = set()
    for body in _resources(stack, "aws_s3_bucket_policy").values():
        document = documents[str(body["policy"]).split(".")[2]]
        for statement in document["statement"]:
            conditions = statement.get("condition", [])
            if statement.get("effect") == "Deny" and any(
                c["variable"] == "aws:SecureTransport" and c["values"] == ["false"]
                for c in conditions
            ):
                with_tls.add(str(body["bucket"]).split(".")[1])
    return [
        f"bucket {b} accepts plain HTTP"
        for b in _resources(stack, "aws_s3_bucket")
        if b not in with_tls
    ]


def kms_keys_rotate(stack: Stack) -> list[str]:
    return [
        f"key {name} does not rotate or has no explicit policy"
        for name, body in _resources(stack, "aws_kms_key").items()
        if body.get("enable_key_rotation") is not True or not body.get("policy")
    ]


def instances_require_imdsv2(stack: Stack) -> list[str]:
    problems = []
    for name, body in _resources(stack, "aws_launch_template").items():
        metadata = body.get("metadata_options", {})
        if metadata.get("http_tokens") != "required":
            problems.append(f"launch template {name} allows IMDSv1")
        if int(metadata.get("http_put_response_hop_limit", 2)) > 1:
            problems.append(f"launch template {name} lets containers reach IMDS")
        for mapping in body.get("block_device_mappings", []):
            if str(mapping.get("ebs", {}).get("encrypted")) != "true":
                problems.append(f"launch template {name} has an unencrypted volume")
    return problems


def tables_are_encrypted_and_recoverable(stack: Stack) -> list[str]:
    problems = []
    for name, body in _resources(stack, "aws_dynamodb_table").items():
        sse = body.get("server_side_encryption", {})
        if not (sse.get("enabled") is True and sse.get("kms_key_arn")):
            problems.append(f"table {name} is not encrypted with a customer-managed key")
        if body.get("point_in_time_recovery", {}).get("enabled") is not True:
            problems.append(f"table {name} has no point-in-time recovery")
    return problems


def queues_topics_and_logs_are_encrypted(stack: Stack) -> list[str]:
    problems = []
    for kind, attribute in (
        ("aws_sns_topic", "kms_master_key_id"),
        ("aws_sqs_queue", "kms_master_key_id"),
        ("aws_cloudwatch_log_group", "kms_key_id"),
    ):
        for name, body in _resources(stack, kind).items():
            if not body.get(attribute):
                problems.append(f"{kind} {name} is not encrypted with a customer-managed key")
    return problems


# Actions AWS does not scope to resources; every other Allow must name its resources.
UNSCOPED_ACTIONS = {  # actions without resource-level permissions
    "autoscaling:DescribeAutoScalingGroups",
    "dynamodb:ListStreams",
    *SESSION_MANAGER_AGENT_ACTIONS,  # its channels and messages name no resource
    "ec2:DescribeInstances",
    "ec2:DescribeSpotPriceHistory",
    "ec2:GetSpotPlacementScores",
    "pricing:GetProducts",
    "cloudwatch:PutMetricData",  # scoped by its namespace instead (cloudwatch:namespace)
    "cloudwatch:GetMetricStatistics",
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
}


def iam_policies_are_scoped(stack: Stack) -> list[str]:
    documents = stack.get("data", {}).get("aws_iam_policy_document", {})
    used = {
        str(b["policy"]).split(".")[2] for b in _resources(stack, "aws_iam_role_policy").values()
    }
    problems = []
    for name in sorted(used):
        for statement in documents[name]["statement"]:
            if statement.get("effect", "Allow") != "Allow":
                continue
            if any(a == "*" or a.endswith(":*") for a in statement["actions"]):
                problems.append(f"policy {name} allows a wildcard action")
            if "*" in statement["resources"] and not set(statement["actions"]) <= UNSCOPED_ACTIONS:
                problems.append(
                    f"policy {name} statement {statement.get('sid')} allows any resource"
                )
    return problems


def no_public_network_paths(stack: Stack) -> list[str]:
    problems = [f"internet gateway {n}" for n in _resources(stack, "aws_internet_gateway")]
    problems += [
        f"subnet {name} assigns public addresses"
        for name, body in _resources(stack, "aws_subnet").items()
        if body.get("map_public_ip_on_launch") is not False
    ]
    for name, body in _resources(stack, "aws_security_group").items():
        for rule in body.get("ingress", []) + body.get("egress", []):
            if "0.0.0.0/0" in (rule.get("cidr_blocks") or []):
                problems.append(f"security group {name} is open to the internet")
    return problems


KEY_SERVICE_CONDITIONS = ("aws:SourceAccount", "aws:SourceArn", "kms:EncryptionContext:")
KEY_MANAGEMENT = ("kms:*", "kms:Create", "kms:Put", "kms:Delete", "kms:Disable",
                  "kms:ScheduleKeyDeletion", "kms:Update", "kms:Revoke")  # fmt: skip


def key_policies_grant_only_the_account_and_conditioned_services(stack: Stack) -> list[str]:
    """The shape checkov-skips.yaml relies on for CKV_AWS_109/111/356: in every key policy
    only the account root is granted without a condition (IAM then decides); a service is
    granted only under a source or encryption-context condition and never key management;
    no other principal is granted anything."""
    documents = stack.get("data", {}).get("aws_iam_policy_document", {})
    problems = []
    for name, key in _resources(stack, "aws_kms_key").items():
        document = documents[str(key["policy"]).split(".")[2]]
        for grant in document["statement"]:
            if grant.get("effect", "Allow") != "Allow":
                continue
            sid = grant.get("sid", "?")
            for principal in grant.get("principals", []):
                kind, identifiers = principal["type"], principal["identifiers"]
                if kind == "AWS" and all(str(i).endswith(":root") for i in identifiers):
                    continue
                conditioned = any(
                    str(c["variable"]).startswith(KEY_SERVICE_CONDITIONS)
                    for c in grant.get("condition", [])
                )
                manages = [a for a in grant["actions"] if str(a).startswith(KEY_MANAGEMENT)]
                if kind != "Service":
                    problems.append(f"key {name} statement {sid} grants {kind} {identifiers}")
                elif not conditioned:
                    problems.append(f"key {name} statement {sid} grants {identifiers} "
                                    "without a source or encryption-context condition")  # fmt: skip
                elif manages:
                    problems.append(f"key {name} statement {sid} lets {identifiers} {manages}")
    return problems


RULES: dict[str, Callable[[Stack], list[str]]] = {
    rule.__name__: rule
    for rule in (
        buckets_block_public_access,
        buckets_are_encrypted,
        buckets_are_versioned,
        bucket_policies_require_tls,
        kms_keys_rotate,
        key_policies_grant_only_the_account_and_conditioned_services,
        instances_require_imdsv2,
        tables_are_encrypted_and_recoverable,
        queues_topics_and_logs_are_encrypted,
        iam_policies_are_scoped,
        no_public_network_paths,
    )
}


def copy(stack: Stack) -> Stack:
    return json.loads(json.dumps(stack))
