"""Item schema shared by the catalog tables (stacks), the trainer and the interruption handler.

docs/catalog.md explains the access patterns; this module is the single source of the names.
It has no dependencies so it can ship inside the interruption handler's Lambda zip.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

_RUN_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def run_name_problem(name: object, kind: str = "run") -> str | None:
    """Why `name` cannot name a run (or a dataset), or None. A run's name goes into bucket
    keys, catalog keys, IAM conditions and tags, so it is kept to what all of them accept."""
    if isinstance(name, str) and _RUN_NAME.match(name):
        return None
    return (
        f"{kind} name {name!r} is not valid: use 1-63 lowercase letters, digits or '-', "
        "starting with a letter or digit (e.g. 'gpt-small')"
    )


# --- the checkpoint bucket's layout --------------------------------------------------------
RUNS_PREFIX = "runs"
"""What runs write: written once, never overwritten (the buckets' policies refuse it)."""


def run_prefix(run_name: str) -> str:
    """Everything a run writes to the bucket is under this prefix (IAM scopes machines to it)."""
    return f"{RUNS_PREFIX}/{run_name}"


def configs_prefix(run_name: str) -> str:
    """Versions of the run's training configuration (`spotrain config put`), oldest first by
    key; the handler starts a run's machines once one is there."""
    return f"{run_prefix(run_name)}/config/"


DATASETS_PREFIX = "datasets"
"""Prepared datasets, shared by runs: machines may read them, never write."""


def dataset_prefix(name: str) -> str:
    return f"{DATASETS_PREFIX}/{name}"


PARTITION_KEY = "pk"
SORT_KEY = "sk"


def query_items(table: Any, partition: str, sort_prefix: str, **options: Any) -> list[Any]:
    """Every item of `partition` whose sort key starts with `sort_prefix`, all pages, in sort
    key order (a boto3 Table; its resource has no paginator). `options`: more Query
    parameters (a projection, ConsistentRead)."""
    names = {"#pk": PARTITION_KEY, "#sk": SORT_KEY, **options.pop("ExpressionAttributeNames", {})}
    query: dict[str, Any] = {
        "KeyConditionExpression": "#pk = :pk AND begins_with(#sk, :prefix)",
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": {":pk": partition, ":prefix": sort_prefix},
        **options,
    }
    items: list[Any] = []
    while True:
        page = table.query(**query)
        items += page["Items"]
        if "LastEvaluatedKey" not in page:
            return items
        query["ExclusiveStartKey"] = page["LastEvaluatedKey"]


# --- checkpoint catalog -------------------------------------------------------------------
CHECKPOINTS_TABLE_SUFFIX = "checkpoints"
LINEAGE_INDEX = "lineage"
LINEAGE_KEY = "parent"
"""Lineage index: partition `parent` (the parent checkpoint's id), sort `sk`."""

TIMINGS_KEY = "timings"
"""A checkpoint's cost to the run: `stall_s` (training waited), `upload_s` (save to published),
`machines` (that uploaded it); read by `spotrain cost report`."""

HEAD_SORT_KEY = "HEAD"
"""The run's head item: the latest complete checkpoint, moved only by a conditional write."""
LEASE_SORT_KEY = "LEASE"
"""The run's writer lease: generation numbers fence off stale writers."""
FINISHING_SORT_KEY = "FINISHING"
"""The trainer's announcement that it is publishing its final checkpoint (`step`, `epoch`,
`region`, `at`): the catalog's stream tells the interruption handler, whose queue starts the
next runs on the machines meanwhile (a warm start, `admission` rule 5). Not history: written
again by a run that finishes again."""

LOSS_KEY = "loss"
"""On a checkpoint's record: the training loss of its step, as the loop gave it to the
`Checkpointer` (absent if it gave none); `spotrain run status` shows the head's."""

STEP_LOSSES_KEY = "step_losses"
"""On a checkpoint's record: the loss of each step the loop trained since the checkpoint before
it in the same start, a JSON list of `[step, loss]` (at most STEP_LOSSES_AT_MOST, evenly
thinned); `spotrain run status --plot` draws them. Steps trained after a run's last checkpoint
and lost to a stop are in no record: the run trained them again."""

STEP_LOSSES_AT_MOST = 1000
"""A record stays far below DynamoDB's 400 KB item limit at any checkpoint interval."""

FINAL_KEY = "final"
"""On a checkpoint's record: it is the run's last step (the trainer finished the run); the
interruption handler then takes the run's machines away."""

STATUS_COMPLETE = "COMPLETE"
STATUS_QUARANTINED = "QUARANTINED"
STATUS_ROLLED_BACK = "ROLLED_BACK"
"""Newer than a checkpoint the run was rolled back to: never restored, kept as history."""
STATUS_COLLECTED = "COLLECTED"
"""Superseded and garbage-collected: the item stays as history, the data is gone."""
STATUS_FENCED = "FENCED"
"""Never stored: how a reader shows a checkpoint that is not part of the run's history (a stale
writer published it after the run moved to another region; `run_epochs`)."""


def run_key(run_name: str) -> str:
    return f"RUN#{run_name}"


FOREIGN_EVENTS_KEY = "FOREIGN#events"
"""Where the handler counts events about machines of no run of its environment (the rules see
every spot warning of the account and region)."""


CHECKPOINT_PREFIX = "CKPT#"


def checkpoint_sort_key(step: int) -> str:
    """Step-padded so a query over `CKPT#` returns checkpoints in step order."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"{CHECKPOINT_PREFIX}{step:012d}"


def checkpoint_tag(step: int) -> str:
    """A checkpoint's folder name: its DeepSpeed tag and its prefix in the bucket."""
    return f"step_{step:09d}"


def checkpoint_id(run_name: str, step: int) -> str:
    return f"{run_name}/{checkpoint_tag(step)}"


# --- interruption events ------------------------------------------------------------------
EVENTS_TABLE_SUFFIX = "events"
POOL_INDEX = "by-pool"
POOL_KEY = "pool"
OCCURRED_AT_KEY = "occurred_at"
EXPIRES_AT_KEY = "expires_at"
"""TTL attribute (epoch seconds) of event items."""
EVENT_SORT_KEY = "EVENT"


def event_key(event_id: str) -> str:
    return f"EVENT#{event_id}"


RUN_TAG = "spotrain:run"
"""Every machine, group and volume of a run carries it: the handler takes only its run's events,
may tag and scale only its run's machines, and the ledger counts them."""
ENVIRONMENT_TAG = "spotrain:environment"
"""The environment every resource of it carries (a cost-allocation key; the handler acts only
on what carries its own)."""
INTERRUPTION_TAG = "spotrain:interruption"
"""The tag the interruption handler puts on a machine it was warned about (kind@time)."""

UNKNOWN_POOL = "unknown"
"""The pool of an instance whose type or zone is not known (one already gone)."""


def pool_key(instance_type: str, availability_zone: str) -> str:
    """A spot capacity pool: instance type x availability zone."""
    return f"{instance_type}#{availability_zone}"


def handler_state_key(run_name: str) -> str:
    """Partition of what the interruption handler keeps about a run's capacity
    (`RUN_STATE_SORT_KEY`, `failover_sort_key`): the handler and operators write it, machines
    only read it. Not under the run's key, which a machine may update for its coordinator claim
    and its own marks: a machine could otherwise rewrite its run's held sizes, its place in the
    queue, its spot record or a move order."""
    return f"HANDLER#{run_name}"


RUN_STATE_SORT_KEY = "STATE"
"""Under `handler_state_key`: `short_since` (epoch seconds the run has been short of spot
capacity), `held_sizes`, `queued`, `spot_record(s)`, `gang_asked`; under `FOREIGN_EVENTS_KEY`:
`foreign_events`; under `lifecycle_key`: the run's lifecycle."""
FAILOVER_PREFIX = "FAILOVER#"


def failover_sort_key(region: str) -> str:
    """Region `region`'s handler's failover state for the run (`silent`, `move_order`): an item
    per region, written by that region's handler alone, so the events table's replication (last
    writer wins, item by item) never mixes two regions' writes (`core/failover.py`)."""
    return f"{FAILOVER_PREFIX}{region}"


def deadline_plan_key(run_name: str) -> str:
    """Partition of the run's deadline plan (`core/deadline_plan.py`): operators write it
    (`spotrain run deadline-plan`), the handler reads it, machines neither. Not under the run's
    key, which a machine may update: a machine could otherwise steer its own run's choice of
    spot and on-demand."""
    return f"DEADLINE_PLAN#{run_name}"


DEADLINE_PLAN_HEADER_SORT_KEY = "HEADER"
"""The run's deadline plan's header: what it was solved for, its id and where each of its
parts starts."""
DEADLINE_PLAN_PART_PREFIX = "PART#"


def deadline_plan_part_prefix(plan_id: str) -> str:
    """What the sort keys of plan `plan_id`'s parts begin with."""
    return f"{DEADLINE_PLAN_PART_PREFIX}{plan_id}#"


def deadline_plan_part_sort_key(plan_id: str, first_tick: int) -> str:
    """A part of plan `plan_id`: its slices from `first_tick` ticks left up (a new plan's parts
    never overwrite the old one's, which a check may be reading)."""
    return f"{deadline_plan_part_prefix(plan_id)}{first_tick:07d}"


COORDINATOR_SORT_KEY = "COORDINATOR"
"""The run's coordinator: `address`, `port`, `instance_id`, `heartbeat_at` (epoch seconds);
the machines of a run meet at its rendezvous (torchrun c10d)."""
INSTANCE_STATUS_INTERRUPTING = "INTERRUPTING"
INSTANCE_STATUS_REBALANCING = "REBALANCING"


INSTANCE_PREFIX = "INSTANCE#"


def instance_sort_key(instance_id: str) -> str:
    return f"{INSTANCE_PREFIX}{instance_id}"


STAMP_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
"""Times in keys and marks: fixed-width UTC text, so they compare and sort as time does."""


def stamp(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime(STAMP_FORMAT)


# A run's crashes and their releases live under keys of their own, so IAM can let machines add
# crash records (PutItem) without letting them release their own run: only an operator writes
# a release, and a release forgives the crashes recorded before it (it stores their count).
def crashes_key(run_name: str) -> str:
    """Partition of the run's crash records (`crash_sort_key`)."""
    return f"CRASHES#{run_name}"


def crash_sort_key(at: float, instance_id: str, nonce: str) -> str:
    """`CRASH#<time>#<instance>#<nonce>`: `instance_id`, `code`, `at`, and `reason` when the
    trainer left one."""
    return f"CRASH#{stamp(at)}#{instance_id}#{nonce}"


def releases_key(run_name: str) -> str:
    """Partition of the run's releases (`release_sort_key`)."""
    return f"RELEASES#{run_name}"


def release_sort_key(at: float) -> str:
    """`RELEASE#<time>`: `forgiven` (the crashes it forgave), `released_by`, `at`."""
    return f"RELEASE#{stamp(at)}"


# A run's spend lives under a key of its own too: the interruption handler writes it, machines
# may not (a machine that could rewrite its run's spend could slip past its cap).
LEDGER_SORT_KEY = "LEDGER"
"""`as_of` (epoch seconds counted up to), `spend_usd`, `on_demand_usd` (the same machine time
at on-demand prices), `per_pool` (seconds, spend and on-demand equivalent per pool and market),
`unpriced_seconds` (machine time of pools without a price), `behind` (regions that did not
answer a check: the time their machines are counted up to); the cap's state: `cap_usd`,
`notified` (percentages of the cap already announced), `held` (spend reached the cap: the run
may not start, its groups are at 0)."""


def spend_key(run_name: str) -> str:
    """Partition of the run's spend ledger."""
    return f"SPEND#{run_name}"


SPEND_POINT_PREFIX = "AT#"
"""The ledger as each check left it (`spend_usd`, `on_demand_usd`), for the report's figure."""
CAP_NOTICE_PREFIX = "NOTICE#"
"""A cap notice the handler sent (`percent`, `spend_usd`, `cap_usd`)."""


def spend_point_sort_key(as_of: float) -> str:
    """`AT#<as_of>`, zero-padded epoch milliseconds so a query returns points in time order."""
    return f"{SPEND_POINT_PREFIX}{round(as_of * 1000):015d}"


def cap_notice_sort_key(at: float, percent: int) -> str:
    return f"{CAP_NOTICE_PREFIX}{round(at * 1000):015d}#{percent:03d}"


def lifecycle_key(run_name: str) -> str:
    """Partition of the run's lifecycle (`RUN_STATE_SORT_KEY`: `started_at`, `finished_step`,
    `finished_at`, `cancelled_at`, `cancelled_by`): the handler and operators write it,
    machines only read it (a machine may not start, or keep going, a run that was stopped)."""
    return f"LIFECYCLE#{run_name}"


def caps_key(run_name: str) -> str:
    """Partition of the run's spend cap raises (`cap_sort_key`): operators write them
    (`spotrain fleet release`), the handler reads them, machines neither."""
    return f"CAPS#{run_name}"


def cap_sort_key(at: float) -> str:
    """`CAP#<time>`: `max_spend_usd`, `raised_by`, `at`."""
    return f"CAP#{stamp(at)}"
