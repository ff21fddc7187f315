"""`spotrain cost estimate`: the planner's figures for each run of an environment (its
`[planned]` work, desired machines, first instance type and deadline), and the change against
another version of the run files: a pull request's plan comment shows both, as Infracost does
for resources, but for the runs.

Same seed, same sampled traces on both sides: a change in the estimate comes from a change
in the environment or the prices, not from sampling."""

from __future__ import annotations

import datetime
import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from spotrain.core import gpu_types, prices, standing_cost
from spotrain.core.errors import CostInputError
from spotrain.cost import planner
from spotrain.cost.simulation import ON_DEMAND_ONLY

SAMPLES = 100
GIVE_A_BOOK = (
    "give a price book with its prices: `--price-book FILE` (docs/cost.md shows the format; "
    "examples/price-book.json is one, with made-up figures)"
)
"""What the estimate takes instead of the checked-in book: its prices are a run's inputs, as
reviewable as the run file, so they come in a file, not as flags."""
SEED = 0
RESTART_HOURS = 5 / 60
RECOVERY_HOURS = 1.0


@dataclass(frozen=True)
class Side:
    """One way to run it: mean over the sampled runs."""

    strategy: str
    cost_usd: float
    finish_h: float
    deadline_met: float

    @property
    def per_day_usd(self) -> float:
        return self.cost_usd / self.finish_h * 24 if self.finish_h > 0 else math.inf


@dataclass(frozen=True)
class Estimate:
    environment: str
    run: str
    machine_hours: float
    nodes: int
    pool: str
    """`<type> <region>`: the fleet's first instance type in its primary region."""
    deadline_h: float | None
    spot: Side | None
    """The cheapest of the blueprint's spot strategies that the planner recommends (or, when it
    recommends on-demand, the cheapest spot one)."""
    on_demand: Side | None
    recommended: str = ""
    problem: str | None = None
    """Why it could not be priced (then spot and on_demand are None)."""
    rate_source: str = ""
    prices_taken: str = ""
    mix_slowdown: float = 1.0
    """A run of mixed GPU models: how much longer its work takes at its slowest GPU than on
    its first type alone (the work is priced so); 1.0 for one model."""
    slowest_gpu: str = ""

    def as_json(self) -> dict[str, Any]:
        document = asdict(self)
        for name in ("spot", "on_demand"):
            side = getattr(self, name)
            if side is not None:
                document[name]["per_day_usd"] = side.per_day_usd
        return document


def estimate(
    environment: Any, run: Any, book: prices.PriceBook, *, samples: int = SAMPLES
) -> Estimate | None:
    """The planner's estimate of a run of the environment; None if it plans no work."""
    planned = run.planned
    if planned is None:
        return None
    instance_type, region = run.instance_types[0], environment.primary_region
    deadline = run.deadline
    deadline_h = deadline.deadline_h if deadline else None
    slowdown = gpu_types.mix_slowdown(run.instance_types)
    base = Estimate(
        environment=environment.name, run=run.name, machine_hours=planned.machine_hours,
        nodes=run.desired_size, pool=f"{instance_type} {region}",
        deadline_h=deadline_h, spot=None, on_demand=None, mix_slowdown=slowdown,
        slowest_gpu=gpu_types.slowest_gpu(run.instance_types) if slowdown > 1 else "",
    )  # fmt: skip
    try:
        pool = book.pool(instance_type, region, otherwise=GIVE_A_BOOK)
    except CostInputError as error:
        return replace(base, problem=str(error))
    if planned.interruptions_per_hour is not None:
        rate, source = planned.interruptions_per_hour, "planned.interruptions_per_hour"
    elif (advisor := book.advisor_for(instance_type, region)) and advisor.band:
        rate = planner.advisor_rate_per_hour(advisor.band)
        source = f"Spot Instance Advisor {advisor.band} ({advisor.taken_at})"
    else:
        return replace(base, problem=(
            f"no interruption rate for {instance_type} in {region}: set planned."
            "interruptions_per_hour, or add its Advisor band to the price book"))  # fmt: skip
    plan = planner.plan(planner.PlanInputs(
        work_h=planned.machine_hours * slowdown / run.desired_size,
        nodes=run.desired_size, deadline_h=deadline_h,
        checkpoint_s=planned.checkpoint_seconds, restart_h=RESTART_HOURS,
        interruptions_per_hour=rate, recovery_h=RECOVERY_HOURS,
        on_demand_price=pool.on_demand.usd_per_hour or 0.0, spot_price=pool.spot_price,
        samples=samples, seed=SEED,
    ))  # fmt: skip
    by_name = {s.strategy: s for s in plan.summaries}
    spot = by_name.get(plan.recommended) if plan.recommended != ON_DEMAND_ONLY else None
    if spot is None:
        spot = min((s for s in plan.summaries if s.strategy != ON_DEMAND_ONLY),
                   key=lambda s: s.mean_cost)  # fmt: skip

    def side(summary: Any) -> Side:
        return Side(
            summary.strategy, summary.mean_cost, summary.mean_finish_h, summary.deadline_met
        )

    return replace(
        base, spot=side(spot), on_demand=side(by_name[ON_DEMAND_ONLY]),
        recommended=plan.recommended, rate_source=source,
        prices_taken=f"{pool.oldest()} ({(_today() - pool.oldest()).days} days ago; "
                     f"{pool.on_demand.source})",
    )  # fmt: skip


def _today() -> datetime.date:
    return datetime.datetime.now(datetime.UTC).date()


# --- the comment -------------------------------------------------------------------------------
def _money(value: float) -> str:
    return f"${value:,.2f}" if math.isfinite(value) else "n/a"


def _change(now: float, before: float) -> str:
    if not (math.isfinite(now) and math.isfinite(before)):
        return "n/a"
    delta = now - before
    if abs(delta) < 0.005:
        return "no change"
    share = f" ({delta / before:+.1%})" if before else ""
    return f"{'+' if delta > 0 else '-'}${abs(delta):,.2f}{share}"


def standing(environment: Any) -> list[standing_cost.RegionStanding]:
    """What each region of the environment costs while nothing trains."""
    return standing_cost.standing(
        (region.name, len(region.availability_zones)) for region in environment.regions
    )


def standing_markdown(environment: Any) -> str:
    """The plan comment's section for the environment: what it costs with no run training,
    region by region (a region a run may move to pays it too)."""
    regions = standing(environment)
    lines = [
        f"#### Standing cost of environment `{environment.name}`: "
        f"{_money(sum(r.usd_per_month for r in regions))} a month with no run training",
        "",
        "| region | | interface endpoints | per day | per month |",
        "|---|---|---:|---:|---:|",
    ]
    for region in regions:
        role = "home" if region.home else "a run may move here"
        services = len(standing_cost.INTERFACE_ENDPOINT_SERVICES)
        lines.append(f"| {region.region} | {role} | {region.endpoints} ({services} x "
                     f"{region.zones} zones) | {_money(region.usd_per_hour * 24)} | "
                     f"{_money(region.usd_per_month)} |")  # fmt: skip
    lines.append(f"\nFrom {standing_cost.SOURCE}; bytes through the endpoints, storage and "
                 "logs are not counted (they scale with use).")  # fmt: skip
    return "\n".join(lines)


def markdown(
    head: Estimate | None, base: Estimate | None, *, base_note: str = "", run: str = ""
) -> str:
    """The plan comment's section for one run."""
    if head is None:
        return (
            f"#### Run estimate: `{run}`\nThe run plans no work: no estimate (add `[planned]` to "
            "its run file to see its cost in pull requests)."
        )
    deadline = f", deadline {head.deadline_h:g} h" if head.deadline_h else ""
    lines = [
        f"#### Run estimate: `{head.run}`, {head.machine_hours:,g} machine-hours of work on "
        f"{head.nodes} x {head.pool}{deadline}"
    ]
    if head.mix_slowdown > 1:
        lines.append(f"Mixed GPUs: every step runs at the slowest, {head.slowest_gpu}, so the "
                     f"work is priced at {head.mix_slowdown:.2f}x its machine-hours.")  # fmt: skip
    if head.problem or head.spot is None or head.on_demand is None:
        lines.append(f"Not priced: {head.problem}")
        return "\n".join(lines)
    comparable = base is not None and base.spot is not None and base.on_demand is not None
    lines += [
        "",
        "| | per day | to completion | finishes in | deadline met | change per day "
        "| change to completion |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    chosen = "recommended" if head.recommended == head.spot.strategy else "cheapest spot"
    rows = (
        (f"spot: {head.spot.strategy} ({chosen})", head.spot, base.spot if comparable else None),
        (f"on-demand only{' (recommended)' if head.recommended == ON_DEMAND_ONLY else ''}",
         head.on_demand, base.on_demand if comparable else None),
    )  # fmt: skip
    for label, now, before in rows:
        met = f"{now.deadline_met:.0%}" if head.deadline_h else "-"
        per_day = _change(now.per_day_usd, before.per_day_usd) if before else "new"
        change = _change(now.cost_usd, before.cost_usd) if before else "new"
        lines.append(f"| {label} | {_money(now.per_day_usd)} | {_money(now.cost_usd)} | "
                     f"{now.finish_h:,.1f} h | {met} | {per_day} | {change} |")  # fmt: skip
    if base is None:
        lines.append("\nAgainst the base branch: " + (base_note or "the base plans no work for "
                                                        "this run."))  # fmt: skip
    elif not comparable:
        lines.append(f"\nAgainst the base branch: the base was not priced ({base.problem}).")
    lines.append(
        f"\nPrices of {head.pool} taken {head.prices_taken}; interruptions from "
        f"{head.rate_source}; {SAMPLES} sampled traces, seed {SEED}, the same on both sides."
    )
    return "\n".join(lines)
