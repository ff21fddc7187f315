"""Budget: the environment's monthly cost budget and its alert topic."""

from __future__ import annotations

from spotrain.cdk import Construct, TerraformOutput
from spotrain.constructs.budget_alerts import BudgetAlerts, BudgetAlertsProps
from spotrain.constructs.encryption_key import EncryptionKey, EncryptionKeyProps
from spotrain.core import resource_names as names
from spotrain.stacks.base import EnvironmentStack, resource_name
from spotrain.stacks.config import EnvironmentConfig


class BudgetStack(EnvironmentStack):
    def __init__(self, scope: Construct, *, config: EnvironmentConfig) -> None:
        super().__init__(scope, "budget", config=config)
        key = EncryptionKey(
            self,
            "AlertKey",
            props=EncryptionKeyProps(
                alias=f"spotrain-{config.name}-alerts",
                description=f"spotrain {config.name}: budget alert topic",
                account_id=self.account_id,
                region=config.primary_region,
                service_principals=("budgets.amazonaws.com",),
                deletion_window_days=7 if config.is_local else 30,
            ),
        )
        self.alerts = BudgetAlerts(
            self,
            "Budget",
            props=BudgetAlertsProps(
                name=resource_name(config, names.BUDGET_SUFFIX),
                monthly_limit_usd=config.monthly_budget_usd,
                emails=config.alert_emails,
                cost_filter_tag=("spotrain:environment", config.name),
                kms_key_arn=key.arn,
                account_id=self.account_id,
            ),
        )
        TerraformOutput(self, "budget", value=self.alerts.budget.name)
        TerraformOutput(self, "alert_topic", value=self.alerts.topic.arn)
