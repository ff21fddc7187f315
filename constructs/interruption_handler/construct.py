"""EventBridge rules for spot interruption warnings and rebalance recommendations, feeding the
handler Lambda, with a dead-letter queue, retries, an encrypted log group and a role that may
only write the events table.

The Lambda zip is built here in Python at synth time, byte-for-byte reproducible (fixed
timestamps and permissions, sorted entries), so `source_code_hash` changes only when the code
does.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import spotrain.catalog_schema
from spotrain.cdk import AssetType, Construct, TerraformAsset, TerraformResourceLifecycle, aws
from spotrain.constructs.interruption_handler import handler as handler_module
from spotrain.constructs.policy import assume_role_policy, policy_document, statement
from spotrain.errors import raise_if_problems

HANDLED_EVENTS = {
    "InterruptionWarning": "EC2 Spot Instance Interruption Warning",
    "RebalanceRecommendation": "EC2 Instance Rebalance Recommendation",
}
_ZIP_TIMESTAMP = (1980, 1, 1, 0, 0, 0)


def build_handler_zip() -> bytes:
    """The deployment package: the handler and the catalog schema it imports."""
    files = {
        "interruption_handler.py": Path(handler_module.__file__).read_bytes(),
        "spotrain/__init__.py": b"",
        "spotrain/catalog_schema.py": Path(spotrain.catalog_schema.__file__).read_bytes(),
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIMESTAMP)
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, files[name], compresslevel=9)
    return buffer.getvalue()


@dataclass(frozen=True, kw_only=True)
class InterruptionHandlerProps:
    name: str
    """Function, role, queue and rule name prefix."""
    events_table_arn: str
    """Table the handler records events in."""
    events_table_name: str
    """Its name, passed to the handler."""
    kms_key_arn: str
    """Key for the log group, queue and function environment."""
    account_id: str
    """Account of the role's trust guard."""
    log_retention_days: int
    """Retention of the function's log group."""
    event_retention_days: int = 90
    """Days an event record is kept (table TTL)."""
    emulator_drift_tolerance: bool = False
    """Local cloud only: ignore dead-letter config drift the emulator reports on every read."""

    def __post_init__(self) -> None:
        problems = []
        if len(self.name) > 50:
            problems.append(f"name {self.name!r} is over 50 characters: Lambda names are limited")
        if self.event_retention_days < 1:
            problems.append("event_retention_days must be 1 or more")
        raise_if_problems("InterruptionHandlerProps", problems)


class InterruptionHandler(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: InterruptionHandlerProps) -> None:
        super().__init__(scope, id_)
        self.dead_letter_queue = aws.sqs_queue.SqsQueue(
            self,
            "DeadLetterQueue",
            name=f"{props.name}-dlq",
            kms_master_key_id=props.kms_key_arn,
            message_retention_seconds=14 * 86400,
        )
        log_group = aws.cloudwatch_log_group.CloudwatchLogGroup(
            self,
            "LogGroup",
            name=f"/aws/lambda/{props.name}",
            retention_in_days=props.log_retention_days,
            kms_key_id=props.kms_key_arn,
        )
        role = aws.iam_role.IamRole(
            self,
            "Role",
            name=props.name,
            assume_role_policy=assume_role_policy(
                self, "Trust", "lambda.amazonaws.com", source_account=props.account_id
            ),
        )
        aws.iam_role_policy.IamRolePolicy(
            self,
            "Policy",
            role=role.id,
            name="record-interruptions",
            policy=policy_document(
                self,
                "PolicyDocument",
                [
                    statement(
                        "WriteOwnLogs",
                        actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                        resources=[f"{log_group.arn}:*"],
                    ),
                    statement(
                        "RecordEvents",
                        actions=["dynamodb:PutItem"],
                        resources=[props.events_table_arn],
                    ),
                    statement(
                        "DeadLetter",
                        actions=["sqs:SendMessage"],
                        resources=[self.dead_letter_queue.arn],
                    ),
                    statement(
                        "UseKey",
                        actions=["kms:Decrypt", "kms:GenerateDataKey"],
                        resources=[props.kms_key_arn],
                    ),
                    # Describe and X-Ray calls do not support resource-level permissions.
                    statement(
                        "LookUpInstancePool", actions=["ec2:DescribeInstances"], resources=["*"]
                    ),
                    statement(
                        "Trace",
                        actions=["xray:PutTraceSegments", "xray:PutTelemetryRecords"],
                        resources=["*"],
                    ),
                ],
            ),
        )
        package = build_handler_zip()
        self.package_sha256 = hashlib.sha256(package).digest()
        staging = Path(tempfile.mkdtemp(prefix="spotrain-lambda-")) / "interruption_handler.zip"
        staging.write_bytes(package)
        asset = TerraformAsset(self, "Package", path=str(staging), type=AssetType.FILE)
        self.function = aws.lambda_function.LambdaFunction(
            self,
            "Function",
            function_name=props.name,
            role=role.arn,
            runtime="python3.12",
            handler="interruption_handler.handle",
            filename=asset.path,
            source_code_hash=base64.b64encode(self.package_sha256).decode(),
            timeout=30,
            memory_size=256,
            reserved_concurrent_executions=20,
            dead_letter_config={"target_arn": self.dead_letter_queue.arn},
            tracing_config={"mode": "Active"},
            kms_key_arn=props.kms_key_arn,
            environment={
                "variables": {
                    "EVENTS_TABLE": props.events_table_name,
                    "EVENT_RETENTION_DAYS": str(props.event_retention_days),
                }
            },
            depends_on=[log_group],
            lifecycle=(
                TerraformResourceLifecycle(ignore_changes=["dead_letter_config"])
                if props.emulator_drift_tolerance
                else None
            ),
        )
        self.rules = {}
        for rule_id, detail_type in HANDLED_EVENTS.items():
            rule = aws.cloudwatch_event_rule.CloudwatchEventRule(
                self,
                f"{rule_id}Rule",
                name=f"{props.name}-{rule_id}",
                description=f"Send '{detail_type}' events to the interruption handler",
                event_pattern=json.dumps({"source": ["aws.ec2"], "detail-type": [detail_type]}),
            )
            aws.cloudwatch_event_target.CloudwatchEventTarget(
                self,
                f"{rule_id}Target",
                rule=rule.name,
                arn=self.function.arn,
                retry_policy={"maximum_event_age_in_seconds": 3600, "maximum_retry_attempts": 8},
                dead_letter_config={"arn": self.dead_letter_queue.arn},
            )
            aws.lambda_permission.LambdaPermission(
                self,
                f"{rule_id}Permission",
                statement_id=f"AllowEventBridge{rule_id}",
                action="lambda:InvokeFunction",
                function_name=self.function.function_name,
                principal="events.amazonaws.com",
                source_arn=rule.arn,
            )
            self.rules[rule_id] = rule
        aws.sqs_queue_policy.SqsQueuePolicy(
            self,
            "DeadLetterQueuePolicy",
            queue_url=self.dead_letter_queue.url,
            policy=policy_document(
                self,
                "DeadLetterQueuePolicyDocument",
                [
                    statement(
                        "EventBridgeDeadLetters",
                        actions=["sqs:SendMessage"],
                        resources=[self.dead_letter_queue.arn],
                        principals={"Service": ["events.amazonaws.com"]},
                        conditions=[
                            ("ArnEquals", "aws:SourceArn", [r.arn for r in self.rules.values()])
                        ],
                    ),
                    statement(
                        "DenyInsecureTransport",
                        effect="Deny",
                        actions=["sqs:*"],
                        resources=[self.dead_letter_queue.arn],
                        principals={"AWS": ["*"]},
                        conditions=[("Bool", "aws:SecureTransport", ["false"])],
                    ),
                ],
            ),
        )
