"""The local cloud's account quotas for GPU instances, as Service Quotas and CloudWatch's
AWS/Usage answer them on AWS (moto knows only a few VPC quotas, and publishes no usage).

`GetServiceQuota` for EC2's five GPU quotas (`gpu_types.INSTANCE_QUOTAS`) answers with the
value set for the region (`spotrain local fault quota REGION KEY VCPUS`, kept with the faults;
`DEFAULT_VCPUS` otherwise) and names its usage metric as AWS does: `ResourceCount` in
AWS/Usage with the dimensions Service EC2, Type Resource, Resource vCPU and the quota's Class.
`GetMetricStatistics` for that metric answers with what runs now: the vCPUs of the region's
pending and running instances that count against the quota (their type's class and market),
one datapoint at the request's end.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from spotrain.core.capacity import ON_DEMAND, SPOT
from spotrain.core.gpu_types import INSTANCE_QUOTAS, MACHINES, quota_key, vcpus
from spotrain.localcloud import faults

DEFAULT_VCPUS = 4096
"""A quota no one set: room for a few of the largest GPU machines of each class."""
EC2_SPOT = "spot"
"""EC2's `InstanceLifecycle` of a spot machine (an on-demand one has none)."""

_BY_CODE = {quota.code: quota for quota in INSTANCE_QUOTAS.values()}


def usage_class(key: str) -> str:
    """The AWS/Usage `Class` of a quota key ("spot/P5" -> "P5/Spot")."""
    market, kind = key.split("/", 1)
    return f"{kind.split()[0]}/{'Spot' if market == SPOT else 'OnDemand'}"


def quota(region: str, account: str, code: str) -> dict[str, Any] | None:
    """What Service Quotas answers for EC2 quota `code` in `region` (None: not a GPU quota)."""
    found = _BY_CODE.get(code)
    if found is None:
        return None
    value = faults.current().vcpu_quotas.get(f"{region}/{found.key}", DEFAULT_VCPUS)
    return {
        "ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
        "QuotaArn": f"arn:aws:servicequotas:{region}:{account}:ec2/{code}",
        "QuotaCode": code, "QuotaName": found.name, "Value": float(value), "Unit": "None",
        "Adjustable": True, "GlobalQuota": False,
        "UsageMetric": {
            "MetricNamespace": "AWS/Usage", "MetricName": "ResourceCount",
            "MetricDimensions": {"Service": "EC2", "Type": "Resource", "Resource": "vCPU",
                                 "Class": usage_class(found.key)},
            "MetricStatisticRecommendation": "Maximum",
        },
    }  # fmt: skip


def usage(ec2_backend: Any, usage_class_name: str) -> int:
    """vCPUs of the region's pending and running instances counted in `usage_class_name`."""
    total = 0
    for reservation in ec2_backend.reservations.values():
        for instance in reservation.instances:
            live = instance.state in ("pending", "running")
            if not live or instance.instance_type not in MACHINES:
                continue  # gone, or not a GPU machine: no GPU quota counts it
            market = SPOT if instance.lifecycle == EC2_SPOT else ON_DEMAND
            if usage_class(quota_key(instance.instance_type, market)) == usage_class_name:
                total += vcpus(instance.instance_type)
    return total


def install() -> None:
    """Service Quotas answers for the GPU quotas; AWS/Usage for their usage."""
    from moto.cloudwatch.responses import CloudWatchResponse
    from moto.core.responses import ActionResult
    from moto.ec2.models import ec2_backends
    from moto.servicequotas.models import ServiceQuotasBackend

    get_quota = ServiceQuotasBackend.get_service_quota

    def get_service_quota(self: ServiceQuotasBackend, service_code: str,
                          quota_code: str) -> dict[str, Any]:  # fmt: skip
        answer = quota(self.region_name, self.account_id, quota_code) \
            if service_code == "ec2" else None  # fmt: skip
        return answer if answer is not None else get_quota(self, service_code, quota_code)

    statistics = CloudWatchResponse.get_metric_statistics

    def get_metric_statistics(self: CloudWatchResponse) -> Any:
        dimensions = {d["Name"]: d["Value"] for d in self._get_param("Dimensions", [])}
        if (self._get_param("Namespace"), dimensions.get("Service"),
                dimensions.get("Resource")) != ("AWS/Usage", "EC2", "vCPU"):  # fmt: skip
            return statistics(self)
        backend = ec2_backends[self.current_account][self.region]
        end: datetime = self._get_param("EndTime")
        counted = usage(backend, dimensions.get("Class", ""))
        return ActionResult({"Label": self._get_param("MetricName"), "Datapoints": [
            {"Timestamp": end, "Maximum": float(counted), "Unit": "None"}]})  # fmt: skip

    ServiceQuotasBackend.get_service_quota = get_service_quota  # type: ignore[method-assign]
    CloudWatchResponse.get_metric_statistics = get_metric_statistics  # type: ignore[method-assign]
