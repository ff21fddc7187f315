"""EventBridge rules for spot interruption warnings, rebalance recommendations and a scheduled
capacity check, feeding the handler Lambda, with a dead-letter queue, retries, an encrypted
log group and notice topic, and a role that may only touch the events table, the
environment's runs' instances and Auto Scaling groups, the topic and the queue. The handler
serves every run of its environment: each run's stack declares the run
(`spotrain.core.capacity.RunDeclaration`).

The Lambda's code is the `runtime/` folder beside this file (it imports only the core; nothing
here imports it). Its zip is built here in Python at synth time, byte-for-byte reproducible
(fixed timestamps and permissions, sorted entries), so `source_code_hash` changes only when
the code does.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import spotrain.core
from spotrain.cdk import (
    AssetType,
    Construct,
    TerraformAsset,
    TerraformResourceLifecycle,
    aws,
    forget_without_destroying,
)
from spotrain.constructs.interruption_handler.iam import handler_statements
from spotrain.constructs.policy import (
    assume_role_policy,
    deny_insecure_transport,
    policy_document,
    statement,
)
from spotrain.core import handler_settings
from spotrain.core.errors import raise_if_problems
from spotrain.core.events import (
    EC2_SOURCE,
    INTERRUPTION_WARNING_TYPE,
    REBALANCE_RECOMMENDATION_TYPE,
)

HANDLED_EVENTS = {
    "InterruptionWarning": INTERRUPTION_WARNING_TYPE,
    "RebalanceRecommendation": REBALANCE_RECOMMENDATION_TYPE,
}
_ZIP_TIMESTAMP = (1980, 1, 1, 0, 0, 0)


RUNTIME_FOLDER = Path(__file__).parent / "runtime"
RUNTIME_PACKAGE = f"{__package__}.runtime"
HANDLER_ENTRY = f"{RUNTIME_PACKAGE}.entry.handle"
"""The function's handler: the runtime's entry, imported from the zip's root."""


def build_handler_zip() -> bytes:
    """The deployment package: the runtime folder and the core floor, each whole (standard
    library and boto3 only; the core's data files included), under their package paths, with
    the empty packages above them."""
    files: dict[str, bytes] = {}
    core = Path(spotrain.core.__file__).parent
    for folder, package in ((RUNTIME_FOLDER, RUNTIME_PACKAGE), (core, spotrain.core.__name__)):
        path = package.replace(".", "/")
        files.update({f"{path}/{p.name}": p.read_bytes() for p in sorted(folder.iterdir())
                      if p.suffix in (".py", ".json")})  # fmt: skip
        parts = path.split("/")
        for depth in range(1, len(parts)):
            files.setdefault("/".join(parts[:depth]) + "/__init__.py", b"")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIMESTAMP)
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, files[name], compresslevel=9)
    return buffer.getvalue()


@functools.cache
def _staging() -> tempfile.TemporaryDirectory[str]:
    """Where the package waits for the app's synth, which copies it into each handler stack (the
    asset is read then, not when the construct is made): one folder a process, removed when the
    process ends, so that no synth leaves a package behind in the temporary folder."""
    return tempfile.TemporaryDirectory(prefix="spotrain-lambda-")


def rule_name(handler_name: str, rule_id: str) -> str:
    return f"{handler_name}-{rule_id}"


def rule_arns(handler_name: str, region: str, account_id: str) -> str:
    """An ARN pattern that matches every EventBridge rule of the handler named so."""
    return f"arn:aws:events:{region}:{account_id}:rule/{rule_name(handler_name, '*')}"


@dataclass(frozen=True, kw_only=True)
class InterruptionHandlerProps:
    name: str
    """Function, queue, topic, log group and rule name prefix (regional names)."""
    role_name: str | None = None
    """The role's name (IAM names are global: a handler of another region than home's needs
    its own); None: `name`."""
    events_table_arn: str
    """Table the handler records events in."""
    events_table_name: str
    """Its name, passed to the handler."""
    kms_key_arn: str
    """Key for the log group, queue and function environment."""
    account_id: str
    """Account of the role's trust guard and the dead-letter queue's own ARN."""
    region: str
    """Region of the handler: the groups it scales and the instances it tags are there, and
    its environment's runs declare themselves to it there."""
    environment: str
    """The environment whose runs it serves: the groups it may scale are tagged
    `spotrain:environment` with it, and named with `group_name_prefix`."""
    group_name_prefix: str
    """What every run's group of the environment is named with (`spotrain-<env>-`)."""
    alert_emails: tuple[str, ...]
    """Who hears of interruptions and capacity moves (notice topic subscriptions)."""
    log_retention_days: int
    """Retention of the function's log group."""
    event_retention_days: int = handler_settings.EVENT_RETENTION_DAYS
    """Days an event record is kept (table TTL)."""
    hot_pool_threshold: int = handler_settings.HOT_POOL_THRESHOLD
    """Interruptions in the window that make a pool hot (its capacity moves elsewhere)."""
    rate_window_minutes: int = handler_settings.RATE_WINDOW_MINUTES
    """Window over which a pool's interruptions are counted."""
    on_demand_deadline_minutes: int = handler_settings.ON_DEMAND_DEADLINE_MINUTES
    """How long the run may lack spot capacity before the on-demand group covers it."""
    capacity_check_minutes: int = handler_settings.CAPACITY_CHECK_MINUTES
    """How often the scheduled capacity check runs."""
    gang_timeout_minutes: int = handler_settings.GANG_TIMEOUT_MINUTES
    """How long a run's gang may take to come whole before the machines that came are
    released rather than kept idle."""
    failover_after_checks: int = handler_settings.FAILOVER_AFTER_CHECKS
    """Checks in a row a run's region must fail to answer before the next region moves it."""
    catalog_stream_arn: str | None = None
    """Stream of the checkpoint catalog table: the handler alarms when a run's head moves back
    without a roll back, or a complete checkpoint's record is rewritten or removed."""
    checkpoints_table_arn: str | None = None
    """The checkpoint catalog: whether a run's final step is published, and with a deadline
    its progress."""
    checkpoints_table_name: str | None = None
    config_bucket_name: str | None = None
    """The bucket the run's training configuration is stored in: the run's groups start once
    one is there (None: at the first capacity check)."""
    config_bucket_arn: str | None = None
    queue_policy: str | None = None
    """The environment's teams and vCPU ceilings (`admission.QueuePolicy.to_json`): runs that
    do not fit wait. None: nothing limits the runs."""
    emulator_drift_tolerance: bool = False
    """Local cloud only: ignore dead-letter config drift the emulator reports on every read."""

    def __post_init__(self) -> None:
        problems = []
        if len(self.name) > 50:
            problems.append(f"name {self.name!r} is over 50 characters: Lambda names are limited")
        if self.role_name is not None and len(self.role_name) > 64:
            problems.append(f"role_name {self.role_name!r} is over 64 characters, IAM's limit: "
                            "give the environment a shorter name")  # fmt: skip
        if self.event_retention_days < 1:
            problems.append("event_retention_days must be 1 or more")
        for field_name in (
            "hot_pool_threshold",
            "rate_window_minutes",
            "capacity_check_minutes",
            "gang_timeout_minutes",
            "failover_after_checks",
        ):
            if getattr(self, field_name) < 1:
                problems.append(f"{field_name} must be 1 or more")
        if self.on_demand_deadline_minutes < 0:
            problems.append("on_demand_deadline_minutes must be 0 or more")
        if (self.config_bucket_name is None) != (self.config_bucket_arn is None):
            problems.append("give config_bucket_name and config_bucket_arn together")
        if not self.group_name_prefix.startswith("spotrain-"):
            problems.append(f"group_name_prefix {self.group_name_prefix!r} must start with "
                            "'spotrain-' (the fleets' names)")  # fmt: skip
        raise_if_problems("InterruptionHandlerProps", problems)


class InterruptionHandler(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: InterruptionHandlerProps) -> None:
        super().__init__(scope, id_)
        self.rules = self._rules(props)
        log_group = self._queue_topic_and_logs(props)
        role = aws.iam_role.IamRole(
            self,
            "Role",
            name=props.role_name or props.name,
            assume_role_policy=assume_role_policy(
                self, "Trust", "lambda.amazonaws.com", source_account=props.account_id
            ),
        )
        policy = aws.iam_role_policy.IamRolePolicy(
            self,
            "Policy",
            role=role.id,
            name="record-interruptions",
            policy=policy_document(
                self,
                "PolicyDocument",
                handler_statements(
                    props, log_group_arn=log_group.arn, topic_arn=self.topic.arn,
                    dead_letter_queue_arn=self.dead_letter_queue.arn,
                ),
            ),
        )  # fmt: skip
        self.function = self._function(props, role, log_group)
        if props.catalog_stream_arn is not None:
            aws.lambda_event_source_mapping.LambdaEventSourceMapping(
                self,
                "CatalogStreamMapping",
                event_source_arn=props.catalog_stream_arn,
                function_name=self.function.arn,
                # From the oldest record the stream keeps (24 h): no change goes unread.
                starting_position="TRIM_HORIZON",
                batch_size=100,
                maximum_retry_attempts=8,
                bisect_batch_on_function_error=True,
                destination_config={"on_failure": {"destination_arn": self.dead_letter_queue.arn}},
                depends_on=[policy],  # Lambda checks the role's stream access at creation
            )
        self._targets(props)

    def _queue_topic_and_logs(self, props: InterruptionHandlerProps) -> Any:
        """The dead-letter queue and notice topic (kept as attributes), and the function's log
        group."""
        # The queue's policy is its own attribute, not a queue policy resource: the provider
        # waits about 26 s for a queue's attributes to settle after each change, so a separate
        # policy made every deploy and destroy wait twice. Its ARN is written out, as the
        # queue's own cannot be referenced from its attributes. Environments deployed with the
        # separate resource keep the policy it set, which the queue's attribute then matches:
        # destroying that resource on upgrade would delete it.
        forget_without_destroying(self, "DeadLetterQueuePolicy", "aws_sqs_queue_policy")
        name = f"{props.name}-dlq"
        arn = f"arn:aws:sqs:{props.region}:{props.account_id}:{name}"
        self.dead_letter_queue = aws.sqs_queue.SqsQueue(
            self,
            "DeadLetterQueue",
            name=name,
            kms_master_key_id=props.kms_key_arn,
            message_retention_seconds=14 * 86400,
            policy=policy_document(
                self,
                "DeadLetterQueuePolicyDocument",
                [
                    statement(
                        "EventBridgeDeadLetters",
                        actions=["sqs:SendMessage"],
                        resources=[arn],
                        principals={"Service": ["events.amazonaws.com"]},
                        conditions=[
                            ("ArnEquals", "aws:SourceArn", [r.arn for r in self.rules.values()])
                        ],
                    ),
                    deny_insecure_transport(["sqs:*"], [arn]),
                ],
            ),
        )
        log_group = aws.cloudwatch_log_group.CloudwatchLogGroup(
            self,
            "LogGroup",
            name=f"/aws/lambda/{props.name}",
            retention_in_days=props.log_retention_days,
            kms_key_id=props.kms_key_arn,
        )
        self.topic = aws.sns_topic.SnsTopic(
            self, "NoticeTopic", name=f"{props.name}-notices", kms_master_key_id=props.kms_key_arn
        )
        aws.sns_topic_policy.SnsTopicPolicy(
            self,
            "NoticeTopicPolicy",
            arn=self.topic.arn,
            policy=policy_document(
                self,
                "NoticeTopicPolicyDocument",
                [deny_insecure_transport(["sns:Publish"], [self.topic.arn])],
            ),
        )
        for index, email in enumerate(props.alert_emails):
            aws.sns_topic_subscription.SnsTopicSubscription(
                self, f"NoticeSubscription{index}", topic_arn=self.topic.arn, protocol="email",
                endpoint=email,
            )  # fmt: skip
        return log_group

    def _function(self, props: InterruptionHandlerProps, role: Any, log_group: Any) -> Any:
        package = build_handler_zip()
        self.package_sha256 = hashlib.sha256(package).digest()
        staging = Path(_staging().name) / self.package_sha256.hex() / "interruption_handler.zip"
        staging.parent.mkdir(exist_ok=True)
        staging.write_bytes(package)
        asset = TerraformAsset(self, "Package", path=str(staging), type=AssetType.FILE)
        return aws.lambda_function.LambdaFunction(
            self,
            "Function",
            function_name=props.name,
            role=role.arn,
            runtime="python3.12",
            handler=HANDLER_ENTRY,
            filename=asset.path,
            source_code_hash=base64.b64encode(self.package_sha256).decode(),
            timeout=30,
            memory_size=256,
            reserved_concurrent_executions=20,
            dead_letter_config={"target_arn": self.dead_letter_queue.arn},
            tracing_config={"mode": "Active"},
            kms_key_arn=props.kms_key_arn,
            environment={
                "variables": handler_settings.HandlerSettings(
                    events_table=props.events_table_name,
                    event_retention_days=props.event_retention_days,
                    environment=props.environment,
                    alert_topic_arn=self.topic.arn,
                    dead_letter_queue_url=self.dead_letter_queue.url,
                    hot_pool_threshold=props.hot_pool_threshold,
                    rate_window_minutes=props.rate_window_minutes,
                    on_demand_deadline_minutes=props.on_demand_deadline_minutes,
                    capacity_check_minutes=props.capacity_check_minutes,
                    gang_timeout_minutes=props.gang_timeout_minutes,
                    failover_after_checks=props.failover_after_checks,
                    checkpoints_table=props.checkpoints_table_name,
                    config_bucket=props.config_bucket_name,
                    queue_policy=props.queue_policy,
                ).to_environment()
            },
            depends_on=[log_group],
            lifecycle=(
                TerraformResourceLifecycle(ignore_changes=["dead_letter_config"])
                if props.emulator_drift_tolerance
                else None
            ),
        )

    def _rules(self, props: InterruptionHandlerProps) -> dict[str, Any]:
        """The warning, recommendation and schedule rules (their targets: `_targets`)."""
        rules = {}
        rule_settings: dict[str, dict[str, str]] = {
            rule_id: {
                "description": f"Send '{detail_type}' events to the interruption handler",
                "event_pattern": json.dumps({"source": [EC2_SOURCE], "detail-type": [detail_type]}),
            }
            for rule_id, detail_type in HANDLED_EVENTS.items()
        }
        rule_settings["CapacityCheck"] = {
            "description": "Cover a spot shortfall with on-demand after the deadline, and back",
            "schedule_expression": f"rate({props.capacity_check_minutes} minutes)",
        }
        for rule_id, settings in rule_settings.items():
            rules[rule_id] = aws.cloudwatch_event_rule.CloudwatchEventRule(
                self, f"{rule_id}Rule", name=rule_name(props.name, rule_id), **settings
            )
        return rules

    def _targets(self, props: InterruptionHandlerProps) -> None:
        """Each rule targets the function, its undelivered events to the dead-letter queue."""
        for rule_id, rule in self.rules.items():
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
