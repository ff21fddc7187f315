"""A monthly cost budget for one environment with alerts to an encrypted SNS topic and e-mail.

Alerts fire at 50%, 80% and 100% of actual spend and at 100% of forecast spend. The budget
counts only resources carrying the environment's cost allocation tag.
"""

from __future__ import annotations

from dataclasses import dataclass

from spotrain.cdk import Construct, aws
from spotrain.constructs.policy import deny_insecure_transport, policy_document, statement
from spotrain.core import resource_names as names
from spotrain.core.errors import raise_if_problems

ALERT_THRESHOLDS: tuple[tuple[str, int], ...] = (
    ("ACTUAL", 50),
    ("ACTUAL", 80),
    ("ACTUAL", 100),
    ("FORECASTED", 100),
)


@dataclass(frozen=True, kw_only=True)
class BudgetAlertsProps:
    name: str
    """Budget and topic name."""
    monthly_limit_usd: float
    """Monthly budget in USD."""
    emails: tuple[str, ...]
    """Addresses that get every alert."""
    cost_filter_tag: tuple[str, str]
    """(tag key, value) that selects the environment's costs; must be an activated cost
    allocation tag."""
    kms_key_arn: str
    """Key that encrypts the topic; its policy must let budgets.amazonaws.com use it."""
    account_id: str
    """Account whose budget may publish to the topic."""

    def __post_init__(self) -> None:
        problems = []
        if not self.monthly_limit_usd > 0:
            problems.append(
                f"monthly_limit_usd is {self.monthly_limit_usd}: give a positive amount"
            )
        if not self.emails:
            problems.append("emails is empty: give at least one address")
        raise_if_problems("BudgetAlertsProps", problems)


class BudgetAlerts(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: BudgetAlertsProps) -> None:
        super().__init__(scope, id_)
        self.topic = aws.sns_topic.SnsTopic(
            self, "AlertTopic", name=f"{props.name}-alerts", kms_master_key_id=props.kms_key_arn
        )
        aws.sns_topic_policy.SnsTopicPolicy(
            self,
            "AlertTopicPolicy",
            arn=self.topic.arn,
            policy=policy_document(
                self,
                "AlertTopicPolicyDocument",
                [
                    statement(
                        "BudgetsPublish",
                        actions=["sns:Publish"],
                        resources=[self.topic.arn],
                        principals={"Service": ["budgets.amazonaws.com"]},
                        conditions=[("StringEquals", "aws:SourceAccount", [props.account_id])],
                    ),
                    deny_insecure_transport(["sns:Publish"], [self.topic.arn]),
                ],
            ),
        )
        for index, email in enumerate(props.emails):
            aws.sns_topic_subscription.SnsTopicSubscription(
                self,
                f"EmailSubscription{index}",
                topic_arn=self.topic.arn,
                protocol="email",
                endpoint=email,
            )
        tag_key, tag_value = props.cost_filter_tag
        self.budget = aws.budgets_budget.BudgetsBudget(
            self,
            "MonthlyBudget",
            name=names.monthly_budget(props.name),
            budget_type="COST",
            limit_amount=f"{props.monthly_limit_usd:.2f}",
            limit_unit="USD",
            time_unit="MONTHLY",
            cost_filter=[{"name": "TagKeyValue", "values": [f"user:{tag_key}${tag_value}"]}],
            notification=[
                aws.budgets_budget.BudgetsBudgetNotification(
                    comparison_operator="GREATER_THAN",
                    notification_type=kind,
                    threshold=percent,
                    threshold_type="PERCENTAGE",
                    subscriber_email_addresses=list(props.emails),
                    subscriber_sns_topic_arns=[self.topic.arn],
                )
                for kind, percent in ALERT_THRESHOLDS
            ],
        )
