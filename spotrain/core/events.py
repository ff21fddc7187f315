"""The events the interruption handler takes, named once: EventBridge's sources and detail types
(the construct's rules match them, the handler parses them, the rehearsals send them) and the
kind the events table records each as (the planner counts the warnings)."""

from __future__ import annotations

EC2_SOURCE = "aws.ec2"
"""Where EC2's spot warnings and rebalance recommendations come from."""
SCHEDULE_SOURCE = "aws.events"
"""Where a scheduled rule's events come from (the capacity check)."""

INTERRUPTION_WARNING_TYPE = "EC2 Spot Instance Interruption Warning"
REBALANCE_RECOMMENDATION_TYPE = "EC2 Instance Rebalance Recommendation"
SCHEDULED_TYPE = "Scheduled Event"

INTERRUPTION_WARNING = "interruption-warning"
REBALANCE_RECOMMENDATION = "rebalance-recommendation"
CAPACITY_CHECK = "capacity-check"

KIND_OF = {
    INTERRUPTION_WARNING_TYPE: INTERRUPTION_WARNING,
    REBALANCE_RECOMMENDATION_TYPE: REBALANCE_RECOMMENDATION,
    SCHEDULED_TYPE: CAPACITY_CHECK,
}
"""Each detail type the handler takes, and the kind it is recorded and acted on as."""
SOURCE_OF = {kind: SCHEDULE_SOURCE if kind == CAPACITY_CHECK else EC2_SOURCE
             for kind in KIND_OF.values()}  # fmt: skip
"""The source each kind must come from (anything else is not EC2's or the schedule's)."""
