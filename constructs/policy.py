"""IAM policy documents as data sources, so plans show readable JSON and checkov can read them."""

from __future__ import annotations

from typing import Any

from spotrain.cdk import Construct, aws


def statement(
    sid: str,
    *,
    actions: list[str],
    resources: list[str],
    effect: str = "Allow",
    principals: dict[str, list[str]] | None = None,
    conditions: list[tuple[str, str, list[str]]] | None = None,
) -> dict[str, Any]:
    """One statement; `principals` maps a principal type to identifiers, conditions are
    (test, variable, values) triples."""
    result: dict[str, Any] = {
        "sid": sid,
        "effect": effect,
        "actions": actions,
        "resources": resources,
    }
    if principals:
        result["principals"] = [
            {"type": kind, "identifiers": ids} for kind, ids in sorted(principals.items())
        ]
    if conditions:
        result["condition"] = [
            {"test": test, "variable": variable, "values": values}
            for test, variable, values in conditions
        ]
    return result


def leading_keys(*partitions: str) -> tuple[str, str, list[str]]:
    """Condition: a DynamoDB request touches only items under these partition keys (every item
    of it; `*` matches any run of characters)."""
    return ("ForAllValues:StringLike", "dynamodb:LeadingKeys", list(partitions))


def via_services(*services: str) -> list[str]:
    """`kms:ViaService` values: the key is usable through these services, in any region, and
    not by calling KMS directly."""
    return [f"{service}.*.amazonaws.com" for service in services]


def deny_insecure_transport(actions: list[str], resources: list[str]) -> dict[str, Any]:
    """The statement every resource policy carries: refuse requests not made over TLS."""
    return statement(
        "DenyInsecureTransport",
        effect="Deny",
        actions=actions,
        resources=resources,
        principals={"AWS": ["*"]},
        conditions=[("Bool", "aws:SecureTransport", ["false"])],
    )


def policy_document(scope: Construct, id_: str, statements: list[dict[str, Any]]) -> str:
    """Return the rendered JSON of a policy document data source."""
    document = aws.data_aws_iam_policy_document.DataAwsIamPolicyDocument(
        scope, id_, statement=statements
    )
    return str(document.json)


def assume_role_policy(
    scope: Construct, id_: str, service: str, *, source_account: str | None
) -> str:
    """Trust policy for one AWS service. `source_account` adds the confused-deputy guard for
    services that send aws:SourceAccount (Lambda, S3, flow logs); EC2 does not send it."""
    conditions = (
        [("StringEquals", "aws:SourceAccount", [source_account])] if source_account else None
    )
    return policy_document(
        scope,
        id_,
        [
            statement(
                "TrustService",
                actions=["sts:AssumeRole"],
                resources=[],
                principals={"Service": [service]},
                conditions=conditions,
            )
        ],
    )


def policy_json(statements: list[dict[str, Any]]) -> str:
    """The same statements as an IAM policy document, for a resource made outside Terraform
    (a test's bucket on the local cloud holds the policy the construct deploys)."""
    import json

    def one(grant: dict[str, Any]) -> dict[str, Any]:
        document: dict[str, Any] = {
            "Sid": grant["sid"], "Effect": grant["effect"], "Action": grant["actions"],
            "Resource": grant["resources"],
        }  # fmt: skip
        if "principals" in grant:
            document["Principal"] = {p["type"]: p["identifiers"] for p in grant["principals"]}
        conditions: dict[str, dict[str, list[str]]] = {}
        for condition in grant.get("condition", []):
            conditions.setdefault(condition["test"], {})[condition["variable"]] = condition[
                "values"
            ]
        if conditions:
            document["Condition"] = conditions
        return document

    return json.dumps({"Version": "2012-10-17", "Statement": [one(g) for g in statements]})
