"""A run's spend at each capacity check: its ledger moved to now (`spend_ledger.count`), the
spend published as CloudWatch metrics, and judged against the run's cap (notices at 50, 80
and 100%, each kept for the run's report; at 100% the capacity policy holds the run)."""

from __future__ import annotations

from typing import Any

from spotrain.constructs.interruption_handler.runtime import aws, clients
from spotrain.constructs.interruption_handler.runtime.settings import Settings
from spotrain.core import prices as price_book
from spotrain.core import spend_ledger
from spotrain.core.resource_names import METRIC_NAMESPACE


def update_ledger(
    settings: Settings, table: Any, now: float
) -> tuple[dict[str, Any], spend_ledger.Ledger | None]:
    """Count the run's machine time since the ledger's as_of, and publish the spend; what was
    done, and the ledger as it stands."""
    run, declaration = settings.run, settings.declaration
    if declaration is None:
        return {}, None
    counted = spend_ledger.count(
        table, run, regions=declaration.regions, ec2_for=clients.by_region("ec2"),
        pricing=clients.client("pricing", price_book.PRICE_LIST_REGION), now=now,
        retention_days=settings.handler.event_retention_days,
    )  # fmt: skip
    ledger = counted.ledger
    if counted.already_counted:
        return {"counted": False, "as_of": ledger.as_of, "why": "already counted"}, ledger
    if not counted.written:
        return {"counted": False, "why": "another check counted this time first"}, ledger
    clients.client("cloudwatch").put_metric_data(
        Namespace=METRIC_NAMESPACE,
        MetricData=[
            {"MetricName": name, "Dimensions": [{"Name": "Run", "Value": run}],
             "Value": value, "Unit": "None"}
            for name, value in (("RunSpendUSD", ledger.spend_usd),
                                ("RunOnDemandEquivalentUSD", ledger.on_demand_usd))
        ],
    )  # fmt: skip
    return {"counted": True, "as_of": ledger.as_of, "spend_usd": round(ledger.spend_usd, 4),
            "on_demand_usd": round(ledger.on_demand_usd, 4), "machines": counted.machines,
            "unpriced_seconds": ledger.unpriced_seconds}, ledger  # fmt: skip


def judge_spend(
    settings: Settings, table: Any, ledger: spend_ledger.Ledger, now: float
) -> spend_ledger.Ledger:
    """Announce the percentages of the run's cap its spend newly reached (and keep each notice
    for the run's report); the ledger with its cap and judgement (`held`: it reached the
    cap)."""
    run = settings.run
    declared_cap = settings.declaration.max_spend_usd if settings.declaration else None
    cap = spend_ledger.current_cap(table, run, declared_cap)
    check = spend_ledger.judge(ledger, cap)
    judged = check.ledger
    if (judged.cap_usd, judged.notified, judged.held) != (
        ledger.cap_usd, ledger.notified, ledger.held,
    ):  # fmt: skip
        spend_ledger.save_cap_state(table, run, judged)
    for percent in check.crossed:
        assert cap is not None
        notice = spend_ledger.CapNotice(now, percent, ledger.spend_usd, cap)
        spend_ledger.record_notice(table, run, notice, settings.handler.event_retention_days)
        aws.notify(settings.handler.alert_topic_arn, f"spotrain: run {run} spent {percent}% of "
                   "its cap", {
                       "run": run, "percent": percent, "spend_usd": round(ledger.spend_usd, 2),
                       "cap_usd": cap, "held": judged.held,
                   })  # fmt: skip
    return judged
