"""What the account's AWS quotas leave free for the environment's runs, per region: each GPU
quota a run asks from (`gpu_types.INSTANCE_QUOTAS`) read from Service Quotas, and its usage
from the CloudWatch metric Service Quotas names for it (AWS/Usage, the highest value of the
last 15 minutes), less what the runs themselves hold, and what finishing runs hold until
their machines leave (`admission.account_room`). Read once a
check, for the environments that ask (`QueuePolicy.account_quotas`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from spotrain.constructs.interruption_handler.runtime import clients
from spotrain.core import admission
from spotrain.core.gpu_types import INSTANCE_QUOTAS

USAGE_WINDOW = timedelta(minutes=15)
"""How far back a quota's usage is read (AWS/Usage is published every minute)."""


def free_of_quotas(demands: Iterable[admission.Demand], now: datetime) -> admission.Ceilings:
    """Per region the runs train in, vCPUs per quota they ask from that the account leaves
    them."""
    asked: dict[str, set[str]] = defaultdict(set)
    held: dict[tuple[str, str], int] = defaultdict(int)
    leaving: dict[tuple[str, str], int] = defaultdict(int)
    for demand in demands:
        asked[demand.region] |= set(demand.vcpus)
        if demand.holding:
            for quota, vcpus in demand.vcpus.items():
                held[demand.region, quota] += vcpus
                leaving[demand.region, quota] += vcpus if demand.finishing else 0
    quotas_in = clients.by_region("service-quotas")
    metrics_in = clients.by_region("cloudwatch")
    room: dict[str, dict[str, int]] = {}
    for region, keys in sorted(asked.items()):
        room[region] = {}
        for key in sorted(keys):
            quota = quotas_in(region).get_service_quota(
                ServiceCode="ec2", QuotaCode=INSTANCE_QUOTAS[key].code)["Quota"]  # fmt: skip
            usage = _usage(metrics_in(region), quota.get("UsageMetric"), now)
            room[region][key] = admission.account_room(
                int(quota["Value"]), usage, held[region, key], leaving[region, key]
            )
    return room


def _usage(cloudwatch: Any, metric: dict[str, Any] | None, now: datetime) -> int | None:
    """The quota's usage (the metric's highest value in the window), None when Service Quotas
    names no metric or it has no value there."""
    if not metric:
        return None
    answer = cloudwatch.get_metric_statistics(
        Namespace=metric["MetricNamespace"], MetricName=metric["MetricName"],
        Dimensions=[{"Name": k, "Value": v} for k, v in metric.get("MetricDimensions", {}).items()],
        StartTime=now - USAGE_WINDOW, EndTime=now, Period=60, Statistics=["Maximum"],
    )  # fmt: skip
    points = answer.get("Datapoints", [])
    return int(max(p["Maximum"] for p in points)) if points else None
