"""`spotrain cost plan`: what a run will cost on each strategy before it starts, and how often
it should checkpoint.

- The checkpoint interval that minimises expected waste: Young's first-order optimum
  sqrt(2 * delta * M) with Daly's higher-order correction (J. T. Daly, "A higher order estimate
  of the optimum checkpoint interval for restart dumps", FGCS 2006):
  T = sqrt(2 delta M) * (1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9) - delta  for delta < 2M,
  else T = M; delta is the time a checkpoint costs the run, M the gang's mean time between
  interruptions.
- Expected cost, wall time, goodput and the chance to meet the deadline per strategy, by Monte
  Carlo over interruption traces generated from the pool's rate (seeded), replayed by
  `simulation` (the interruption handler's own policy function included).
- Interruption rates: the run's own history when it has some, else the Spot Instance Advisor's
  frequency bucket, read as the middle of its band per month (">20%" as 25%).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from spotrain.core.catalog_schema import OCCURRED_AT_KEY, POOL_KEY
from spotrain.core.errors import CostInputError, read_text
from spotrain.core.events import INTERRUPTION_WARNING
from spotrain.core.prices import ADVISOR_BANDS
from spotrain.cost import simulation, traces
from spotrain.cost.simulation import Job, Summary

HOURS_PER_MONTH = 730.0
WASTE_WARNING_RATIO = 1.5
"""A configured interval that wastes this many times the optimum's waste is warned about."""
DEADLINE_CONFIDENCE = 0.95
"""A strategy is recommended only if it meets the deadline in this share of sampled runs."""


def advisor_rate_per_hour(bucket: str) -> float:
    """Interruptions per instance-hour read from an Advisor band (a monthly share)."""
    if bucket not in ADVISOR_BANDS:
        raise CostInputError(
            f"interruption frequency {bucket!r} is not an Advisor band: use one "
            f"of {', '.join(ADVISOR_BANDS)}"
        )
    return -math.log(1 - ADVISOR_BANDS[bucket]) / HOURS_PER_MONTH


def daly_interval(checkpoint_cost: float, mtbf: float) -> float:
    """Daly's optimum compute time between checkpoints (same unit as the inputs)."""
    if not checkpoint_cost > 0 or not mtbf > 0:
        raise CostInputError(
            f"checkpoint cost {checkpoint_cost} and MTBF {mtbf} must both be positive"
        )
    if math.isinf(mtbf):
        return math.inf
    if checkpoint_cost >= 2 * mtbf:
        return mtbf
    ratio = checkpoint_cost / (2 * mtbf)
    return (
        math.sqrt(2 * checkpoint_cost * mtbf) * (1 + math.sqrt(ratio) / 3 + ratio / 9)
        - checkpoint_cost
    )


def expected_waste(interval: float, checkpoint_cost: float, mtbf: float) -> float:
    """First-order share of time lost: checkpoints (delta / T) and re-done work (T / 2M)."""
    return checkpoint_cost / interval + (interval / (2 * mtbf) if math.isfinite(mtbf) else 0.0)


@dataclass(frozen=True)
class Savings:
    on_demand_cost: float
    spot_cost: float

    @property
    def saved(self) -> float:
        return 1 - self.spot_cost / self.on_demand_cost


def spot_savings(
    *, work_h: float, lost_h: float, on_demand_price: float, spot_price: float, nodes: int = 1
) -> Savings:
    """The bill on on-demand against spot, where `lost_h` of the work is lost to interruptions
    and re-run on on-demand."""
    return Savings(
        on_demand_cost=work_h * on_demand_price * nodes,
        spot_cost=(work_h * spot_price + lost_h * on_demand_price) * nodes,
    )


@dataclass(frozen=True, kw_only=True)
class PlanInputs:
    work_h: float
    """Hours of the gang's compute (no checkpoints, no interruptions)."""
    nodes: int
    deadline_h: float | None
    checkpoint_s: float
    """delta: the training one checkpoint costs the run (its stall, and the steps slowed beside
    its background publish where the metrics measure them)."""
    restart_h: float
    """Restart + restore after a move; the work since the last checkpoint is added."""
    interruptions_per_hour: float
    """Per instance."""
    recovery_h: float
    """How long spot stays gone after it was taken."""
    on_demand_price: float
    spot_price: float
    step_s: float | None = None
    """Seconds per training step (gives the interval in steps)."""
    checkpoint_every: int | None = None
    """The run's configured interval in steps (checked against the optimum)."""
    samples: int = 200
    seed: int = 0
    gap_s: float = 300.0


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    mtbf_h: float
    """The gang's mean time between interruptions."""
    interval_s: float
    """Daly's optimum compute time between checkpoints."""
    interval_steps: int | None
    used_interval_s: float
    """The interval the estimates assume (the configured one when given)."""
    changeover_h: float
    summaries: list[Summary]
    recommended: str
    why: str
    warnings: list[str] = field(default_factory=list)


def plan(inputs: PlanInputs) -> Plan:
    if inputs.samples < 1:
        raise CostInputError(f"samples is {inputs.samples}: use 1 or more")
    if not inputs.checkpoint_s > 0:
        raise CostInputError(
            f"the checkpoint cost is {inputs.checkpoint_s} s: give the seconds "
            "of training a checkpoint costs (the run's metrics have them)"
        )
    if inputs.step_s is not None and not inputs.step_s > 0:
        raise CostInputError(f"the step time is {inputs.step_s} s: give a positive number")
    rate = inputs.interruptions_per_hour * inputs.nodes
    mtbf_h = 1 / rate if rate > 0 else math.inf
    interval_s = daly_interval(inputs.checkpoint_s, mtbf_h * 3600)
    warnings = []
    used_s = interval_s
    if inputs.checkpoint_every is not None and inputs.step_s is not None:
        used_s = inputs.checkpoint_every * inputs.step_s
        if math.isfinite(interval_s):
            ratio = expected_waste(used_s, inputs.checkpoint_s, mtbf_h * 3600) / expected_waste(
                interval_s, inputs.checkpoint_s, mtbf_h * 3600
            )
            if ratio > WASTE_WARNING_RATIO:
                warnings.append(
                    f"checkpoint_every {inputs.checkpoint_every} ({used_s / 60:.1f} min) wastes "
                    f"{ratio:.1f}x the optimum's time: set checkpoint_every to "
                    f"{max(1, round(interval_s / inputs.step_s))}"
                )
    if math.isinf(used_s):  # no interruptions expected: one checkpoint at the end
        used_s = inputs.work_h * 3600
    changeover_h = inputs.restart_h + used_s / 2 / 3600
    job = Job(
        first_start_h=inputs.restart_h,  # nothing to lose yet
        work_h=inputs.work_h * (1 + inputs.checkpoint_s / used_s),
        deadline_h=inputs.deadline_h,
        changeover_h=changeover_h,
        nodes=inputs.nodes,
        on_demand_price=inputs.on_demand_price,
        spot_price=inputs.spot_price,
    )
    horizon = 1.5 * (inputs.deadline_h or 3 * inputs.work_h)
    sampled = traces.generate_many(
        inputs.samples, seed=inputs.seed, hours=horizon,
        interruptions_per_hour=inputs.interruptions_per_hour, recovery_h=inputs.recovery_h,
        capacity=inputs.nodes, gap_s=inputs.gap_s,
    )  # fmt: skip
    summaries = [simulation.summarise(o) for o in simulation.replay(job, sampled).values()]
    recommended, why = recommend(summaries, has_deadline=inputs.deadline_h is not None)
    steps = None
    if inputs.step_s is not None and math.isfinite(interval_s):
        steps = max(1, round(interval_s / inputs.step_s))
    return Plan(
        inputs,
        mtbf_h,
        interval_s,
        steps,
        used_s,
        changeover_h,
        summaries,
        recommended,
        why,
        warnings,
    )


class Compared(Protocol):
    """What `recommend` weighs of a strategy's runs: a `simulation.Summary`, or a replay
    across regions' (`cli/simulate_regions.py`)."""

    @property
    def strategy(self) -> str: ...

    @property
    def mean_cost(self) -> float: ...

    @property
    def mean_finish_h(self) -> float: ...

    @property
    def deadline_met(self) -> float: ...


def recommend(
    summaries: Sequence[Compared], *, has_deadline: bool, plannable: bool = False
) -> tuple[str, str]:
    """The cheapest strategy that meets the deadline often enough (or at all, without one),
    among those the handler runs. `simulation.MARKOV` is one of them only when `plannable`: it
    was replayed on what the environment saw before the run, as `run deadline-plan` plans it
    (learning from scratch, as it does without that history, the handler never decides); then
    the reason says how to have the handler run it."""
    runs = simulation.STRATEGIES + ((simulation.MARKOV,) if plannable else ())
    summaries = [s for s in summaries if s.strategy in runs] or list(summaries)
    strategy, why = _cheapest_safe(summaries, has_deadline)
    if strategy == simulation.MARKOV:
        why += (
            "; the handler runs it once the run is planned with that history: `spotrain run "
            "deadline-plan ENV RUN --spot-history FILE...`"
        )
    return strategy, why


def _cheapest_safe(summaries: Sequence[Compared], has_deadline: bool) -> tuple[str, str]:
    if not has_deadline:
        finishing = [s for s in summaries if math.isfinite(s.mean_finish_h)] or list(summaries)
        best = min(finishing, key=lambda s: s.mean_cost)
        return best.strategy, "the cheapest expected cost (no deadline)"
    safe = [s for s in summaries if s.deadline_met >= DEADLINE_CONFIDENCE]
    if safe:
        best = min(safe, key=lambda s: s.mean_cost)
        return best.strategy, (
            f"the cheapest expected cost that meets the deadline in "
            f"{best.deadline_met:.0%} of sampled runs"
        )
    best = max(summaries, key=lambda s: (s.deadline_met, -s.mean_cost))
    return best.strategy, (
        f"no strategy meets the deadline in {DEADLINE_CONFIDENCE:.0%} of "
        f"runs; this one does most often ({best.deadline_met:.0%})"
    )


def history_rates(events: Sequence[dict[str, Any]], now: float) -> dict[tuple[str, str], float]:
    """Interruption warnings per hour of each (instance type, region) in a run's recorded
    events (the events table's items), over the time since its oldest event (at least an
    hour). A pool that held several machines at once counts each one's warning: the rate is
    then an upper bound of the per-instance rate, the cautious side for a plan."""
    warnings: dict[tuple[str, str], int] = {}
    oldest = now
    for item in events:
        at = item.get(OCCURRED_AT_KEY)
        if not isinstance(at, str):
            continue
        oldest = min(oldest, datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp())
        pool = str(item.get(POOL_KEY, ""))
        if item.get("kind") != INTERRUPTION_WARNING or "#" not in pool:
            continue
        instance_type, zone = pool.split("#", 1)
        key = (instance_type, zone[:-1])  # us-east-1a -> us-east-1
        warnings[key] = warnings.get(key, 0) + 1
    hours = max(1.0, (now - oldest) / 3600)
    return {key: count / hours for key, count in warnings.items()}


def _amount(value: Any) -> bool:
    """A duration or a byte count a metrics line can hold: a finite number, 0 or more."""
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value >= 0
    )


@dataclass(frozen=True)
class Measured:
    """What a run's metrics file says about its speed and its checkpoints."""

    step_s: float | None
    """Median seconds per step."""
    checkpoint_s: float | None
    """Seconds of training a checkpoint cost: where the steps say when they ended, all the time
    between them beyond as many quiet steps, per checkpoint (its stall, the steps slowed beside
    its background publish, its commit; `checkpoint_training_cost`); else the median stall."""
    steps: int
    checkpoints: int
    checkpoint_bytes: float | None = None
    """Median bytes a published checkpoint sent (its changed chunks: what replication copies)."""


def measured(path: str) -> Measured:
    """Read a metrics file (`metrics_file` of the training configuration)."""
    import json
    import statistics

    step_times, stalls, sent, records = [], [], [], []
    text = read_text(path, "the metrics file", "give the run's metrics_file", CostInputError)
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue  # a line cut short by a kill
        if not isinstance(record, dict):
            continue  # not a line the trainer writes
        records.append(record)
        if _amount(record.get("step_s")) and "event" not in record:
            step_times.append(float(record["step_s"]))
        if record.get("event") == "published" and _amount(record.get("stall_s")):
            stalls.append(float(record["stall_s"]))
        if record.get("event") == "published" and _amount(record.get("uploaded_bytes")):
            sent.append(float(record["uploaded_bytes"]))
    stall = statistics.median(stalls) if stalls else None
    whole = checkpoint_training_cost(records)
    return Measured(
        step_s=statistics.median(step_times) if step_times else None,
        checkpoint_s=max(whole, stall or 0.0) if whole is not None else stall,
        steps=len(step_times),
        checkpoints=len(stalls),
        checkpoint_bytes=statistics.median(sent) if sent else None,
    )


def _is_step(value: Any) -> bool:
    """A step number as trainers write it: JSON `true` is a bool to Python, and bools are ints."""
    return isinstance(value, int) and not isinstance(value, bool)


def checkpoint_training_cost(records: list[dict[str, Any]]) -> float | None:
    """Seconds of training each checkpoint cost, from the steps' end times (`at`) and whether
    a publish was in flight as each began (`publishing`): the stall is only the part the loop
    waits for, and the steps that run beside the background publish share the host with it
    (on one H200 a checkpoint stalled 0.27 s and cost at least 9.6 s, bench/gpu.md). Every
    gap between two consecutive steps of one start counts; a quiet gap (its step and the one
    before it began with nothing publishing) is the pace without checkpoints, and what all the
    gaps took beyond as many quiet ones is shared among the checkpoints saved after a step
    that another step followed (an emergency one, after the last, costs no step). None where
    the file does not say (a trainer before `at`, no quiet step, no such checkpoint)."""
    import statistics

    gaps: list[tuple[float, bool]] = []
    followed: set[int] = set()
    last: dict[str, Any] | None = None
    for record in records:
        if "event" in record:
            if record["event"] == "started":
                last = None  # a new start: its first step follows a restart, not a step
            continue
        if not (_amount(record.get("at")) and isinstance(record.get("publishing"), bool)
                and _is_step(record.get("step"))):  # fmt: skip
            last = None
            continue
        if last is not None and record.get("step") == last["step"] + 1:
            quiet = not record["publishing"] and not last["publishing"]
            gaps.append((float(record["at"]) - float(last["at"]), quiet))
            followed.add(last["step"])
        last = record
    published = (r.get("step") for r in records if r.get("event") == "published")
    saved = {step for step in published if _is_step(step)} & followed
    quiet_gaps = [gap for gap, quiet in gaps if quiet]
    if not saved or not quiet_gaps:
        return None
    pace = statistics.median(quiet_gaps)
    return max(0.0, sum(gap - pace for gap, _ in gaps)) / len(saved)
