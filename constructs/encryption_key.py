"""A customer-managed KMS key with rotation on, an explicit key policy and an alias."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spotrain.cdk import Construct, aws
from spotrain.constructs.policy import policy_document, statement
from spotrain.core.errors import raise_if_problems


@dataclass(frozen=True, kw_only=True)
class EncryptionKeyProps:
    alias: str
    """Alias without the `alias/` prefix, e.g. `spotrain-dev-checkpoints`."""
    description: str
    """What the key protects (shown in the console)."""
    account_id: str
    """Account that owns the key; its IAM policies govern every other use of the key."""
    region: str
    """Region the key lives in (used for service principals such as logs.<region>)."""
    service_principals: tuple[str, ...] = ()
    """Services that encrypt with the key on the account's behalf (sns, budgets, logs, ...)."""
    dead_letter_rules: tuple[str, ...] = ()
    """EventBridge rules (ARN patterns) whose dead letters go to a queue encrypted with this
    key: EventBridge itself must be able to encrypt them, or they are lost."""
    deletion_window_days: int = 30
    """Waiting period before a scheduled deletion takes effect (7-30)."""
    provider: Any = None
    """AwsProvider of the key's region; None uses the stack's default provider."""

    def __post_init__(self) -> None:
        problems = []
        if not 7 <= self.deletion_window_days <= 30:
            problems.append(
                f"deletion_window_days is {self.deletion_window_days}: KMS accepts 7 to 30"
            )
        if self.alias.startswith("alias/") or not self.alias:
            problems.append(f"alias {self.alias!r}: give the name without the 'alias/' prefix")
        raise_if_problems("EncryptionKeyProps", problems)


class EncryptionKey(Construct):
    """KMS key whose policy lets the account's IAM govern use, plus the listed services."""

    def __init__(self, scope: Construct, id_: str, *, props: EncryptionKeyProps) -> None:
        super().__init__(scope, id_)
        account_root = f"arn:aws:iam::{props.account_id}:root"
        statements = [
            statement(
                "AccountAdministersKeyThroughIam",
                actions=["kms:*"],
                resources=["*"],
                principals={"AWS": [account_root]},
            )
        ]
        for service in props.service_principals:
            if service.startswith("logs."):
                # CloudWatch Logs sends the log group ARN as encryption context, not SourceAccount.
                guard = (
                    "ArnLike",
                    "kms:EncryptionContext:aws:logs:arn",
                    [f"arn:aws:logs:{props.region}:{props.account_id}:log-group:*"],
                )
            else:
                guard = ("StringEquals", "aws:SourceAccount", [props.account_id])
            service_label = "".join(p.capitalize() for p in service.split(".")[0].split("-"))
            statements.append(
                statement(
                    f"ServiceUse{service_label}",
                    actions=[
                        "kms:Encrypt*",
                        "kms:Decrypt*",
                        "kms:ReEncrypt*",
                        "kms:GenerateDataKey*",
                        "kms:Describe*",
                    ],
                    resources=["*"],
                    principals={"Service": [service]},
                    conditions=[guard],
                )
            )
        if props.dead_letter_rules:
            statements.append(
                statement(
                    "EventBridgeDeadLetters",
                    actions=["kms:GenerateDataKey", "kms:Decrypt"],
                    resources=["*"],
                    principals={"Service": ["events.amazonaws.com"]},
                    conditions=[("ArnLike", "aws:SourceArn", list(props.dead_letter_rules))],
                )
            )
        self.key = aws.kms_key.KmsKey(
            self,
            "Key",
            description=props.description,
            enable_key_rotation=True,
            deletion_window_in_days=props.deletion_window_days,
            policy=policy_document(self, "KeyPolicy", statements),
            provider=props.provider,
        )
        self.alias = aws.kms_alias.KmsAlias(
            self,
            "Alias",
            name=f"alias/{props.alias}",
            target_key_id=self.key.key_id,
            provider=props.provider,
        )

    @property
    def arn(self) -> str:
        return str(self.key.arn)
