"""Replaying a queue of runs against a capacity trace: what the environment's queue would have
done, tick by tick, with the decision the interruption handler runs (`core.admission.admit`),
so that a team sees what a ceiling, a budget or a priority buys before it sets one.

The queue file names the region, its vCPU ceilings per AWS quota, the teams (their GPU
shares and monthly budgets) and the runs (team, priority, submission hour, instance type and
machines, hours of training, and whether a deadline makes them unpreemptible), as an
environment and its run files do. Each tick of the replay:

1. The queue judges every submitted, unfinished run, those training holding their machines,
   with what each team has spent so far (`admit`; its rule 4 preempts lower priorities).
2. A run the queue now refuses while it trains was preempted: it publishes its checkpoint,
   stops, and waits, keeping its progress.
3. The market (the trace: how many spot machines can be had in that tick; unlimited without
   one) takes machines back from the runs that started last when it shrinks below what they
   hold: each goes back to the queue with its progress up to its last checkpoint (counted in
   the changeover it pays when it starts again).
4. Admitted runs start, in the queue's order, when the market has their whole gang (a
   partial gang is never billed: the handler releases one that does not come whole). A run
   that finishes within the tick is finishing: its machines are not counted against the
   ceilings, so the next run starts in the same tick, its changeover beside the finishing
   run's last minutes (a warm start), where the market has machines for both.
5. Every run that holds machines pays for them, spot, and trains for the tick, less the
   changeover (restart, restore and the work since its last checkpoint) each start costs.
"""

from __future__ import annotations

import math
import tomllib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from spotrain.core import prices
from spotrain.core.admission import Demand, Team, admit, asked
from spotrain.core.errors import CostInputError, read_text
from spotrain.core.gpu_types import INSTANCE_QUOTAS, MACHINES
from spotrain.cost.traces import Trace

MAX_TICKS = 200_000
"""The most ticks one replay walks (the queue is judged every tick)."""


@dataclass(frozen=True, kw_only=True)
class QueuedRun:
    """One run of the replay, as its run file would declare it."""

    name: str
    team: str = ""
    priority: int = 0
    submitted_h: float = 0.0
    instance_type: str
    machines: int
    work_h: float
    """Hours of training it needs on its gang, changeovers not counted."""
    deadline: bool = False
    """It has a deadline: never preempted (`admission` rule 4)."""


@dataclass(frozen=True, kw_only=True)
class QueueSetup:
    region: str
    ceilings: Mapping[str, int] = field(default_factory=dict)
    """vCPUs per quota key (`gpu_types.INSTANCE_QUOTAS`), as `RegionConfig.vcpu_ceilings`."""
    teams: tuple[Team, ...] = ()
    runs: tuple[QueuedRun, ...] = ()
    changeover_h: float = 0.25
    """What each start costs before it trains: restart, restore, the work since the last
    checkpoint."""


def load(path: str | Path) -> QueueSetup:
    """The queue file at `path` (TOML), or one CostInputError listing every problem."""
    fix = "see docs/cost.md (`spotrain cost queue`) for the file's form"
    text = read_text(path, "queue file", fix, CostInputError)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise CostInputError(f"queue file {path} is not TOML ({error}): {fix}") from None
    return parse(document, str(path))


def parse(document: Mapping[str, Any], where: str = "the queue file") -> QueueSetup:
    problems: list[str] = []
    known = {"region", "vcpu_ceilings", "teams", "runs", "changeover_minutes"}
    problems += [f"{key!r} is not a setting: use {', '.join(sorted(known))}"
                 for key in document if key not in known]  # fmt: skip
    region = document.get("region")
    if not isinstance(region, str) or not region:
        problems.append(f"region is {region!r}: name the region the runs train in, e.g. "
                        '"us-east-1"')  # fmt: skip
    ceilings = document.get("vcpu_ceilings", {})
    if not isinstance(ceilings, dict):
        problems.append("vcpu_ceilings must be a table of quota key = vCPUs")
        ceilings = {}
    for quota, vcpus in ceilings.items():
        if quota not in INSTANCE_QUOTAS:
            problems.append(f"vcpu_ceilings names {quota!r}: use one of "
                            f"{', '.join(sorted(INSTANCE_QUOTAS))}")  # fmt: skip
        if isinstance(vcpus, bool) or not isinstance(vcpus, int) or vcpus < 0:
            problems.append(f"vcpu_ceilings {quota!r} is {vcpus!r}: give 0 or more vCPUs")
    teams = tuple(_item(Team, t, f"teams[{i}]", problems)
                  for i, t in enumerate(document.get("teams", [])))  # fmt: skip
    for team in teams:
        problems += team.problems() if team is not None else []
    runs = tuple(_item(QueuedRun, r, f"runs[{i}]", problems)
                 for i, r in enumerate(document.get("runs", [])))  # fmt: skip
    names = [team.name for team in teams if team is not None]
    for run in (r for r in runs if r is not None):
        problems += _run_problems(run, names)
    if not runs:
        problems.append("no runs: add [[runs]] tables (name, instance_type, machines, work_h)")
    named = [r.name for r in runs if r is not None]
    if len(set(named)) < len(named):
        problems.append("two runs share a name: give each its own")
    changeover = document.get("changeover_minutes", 15.0)
    if not isinstance(changeover, int | float) or isinstance(changeover, bool) or changeover < 0:
        problems.append(f"changeover_minutes is {changeover!r}: give 0 or more minutes")
        changeover = 15.0
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise CostInputError(f"{where} has {len(problems)} problem(s):\n{lines}")
    return QueueSetup(region=str(region), ceilings=dict(ceilings), teams=teams,  # type: ignore[arg-type]
                      runs=runs, changeover_h=float(changeover) / 60)  # type: ignore[arg-type]  # fmt: skip


def _item(kind: type, value: Any, where: str, problems: list[str]) -> Any:
    """`kind` made of a table's known keys; each unknown key and missing one a problem."""
    if not isinstance(value, dict):
        problems.append(f"{where} is not a table")
        return None
    settings = {f.name for f in fields(kind)}
    problems += [f"{where}: {key!r} is not a setting: use {', '.join(sorted(settings))}"
                 for key in value if key not in settings]  # fmt: skip
    try:
        return kind(**{k: v for k, v in value.items() if k in settings})
    except TypeError as error:
        problems.append(f"{where}: {str(error).split('.__init__() ')[-1]}")
        return None


def _run_problems(run: QueuedRun, teams: Sequence[str]) -> list[str]:
    found = []
    if run.instance_type not in MACHINES:
        found.append(f"run {run.name!r}: instance_type {run.instance_type!r} is not a GPU type "
                     "spotrain knows (spotrain/core/gpu_types.py)")  # fmt: skip
    if isinstance(run.machines, bool) or not isinstance(run.machines, int) or run.machines < 1:
        found.append(f"run {run.name!r}: machines is {run.machines!r}: give 1 or more")
    if isinstance(run.priority, bool) or not isinstance(run.priority, int):
        found.append(f"run {run.name!r}: priority is {run.priority!r}: give a whole number "
                     "(higher goes first)")  # fmt: skip
    if not isinstance(run.deadline, bool):
        found.append(f"run {run.name!r}: deadline is {run.deadline!r}: give true or false")
    for label, value in (("work_h", run.work_h), ("submitted_h", run.submitted_h)):
        if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            found.append(f"run {run.name!r}: {label} is {value!r}: give 0 or more hours")
    if teams and run.team not in teams:
        found.append(f"run {run.name!r}: team {run.team!r} is not one of {', '.join(teams)}")
    return found


@dataclass
class RunOutcome:
    name: str
    team: str
    priority: int
    submitted_h: float
    machines: int
    started_h: float | None = None
    finished_h: float | None = None
    waited_h: float = 0.0
    """Submitted, unfinished and holding no machine (queued, preempted or reclaimed)."""
    held_machine_h: float = 0.0
    trained_h: float = 0.0
    cost_usd: float = 0.0
    preemptions: int = 0
    reclaims: int = 0


@dataclass(frozen=True)
class QueueOutcome:
    hours: float
    """How long the replay ran: until every run finished, or its end."""
    runs: tuple[RunOutcome, ...]
    machine_h_available: float | None
    """Machine-hours the market offered (None: no trace, unlimited)."""

    def by(self, key: str) -> dict[Any, dict[str, float]]:
        """Per team or per priority: runs, finished, mean and longest wait, cost."""
        groups: dict[Any, list[RunOutcome]] = defaultdict(list)
        for run in self.runs:
            groups[getattr(run, key)].append(run)
        return {value: {"runs": len(group), "finished": sum(r.finished_h is not None
                                                            for r in group),
                        "mean_wait_h": sum(r.waited_h for r in group) / len(group),
                        "longest_wait_h": max(r.waited_h for r in group),
                        "cost_usd": sum(r.cost_usd for r in group)}
                for value, group in sorted(groups.items())}  # fmt: skip

    @property
    def training_share(self) -> float:
        """Of the machine-hours paid for, the share that trained (the rest: changeovers)."""
        held = sum(r.held_machine_h for r in self.runs)
        trained = sum(r.trained_h * r.machines for r in self.runs)
        return trained / held if held else 0.0


@dataclass
class _Running:
    spec: QueuedRun
    outcome: RunOutcome
    price: float
    gpus: int
    vcpus: dict[str, int]
    progress_h: float = 0.0
    holding: bool = False
    since_tick: int = -1
    changeover_left_h: float = 0.0


def replay(
    setup: QueueSetup, market: Trace | None = None, *, hours: float | None = None,
    gap_s: float = 600.0, book: prices.PriceBook | None = None, warm_starts: bool = True,
) -> QueueOutcome:  # fmt: skip
    """The queue of `setup` replayed on `market` (its ticks; else ticks of `gap_s`) for
    `hours` (default: the trace's length, else until every run finishes or a year);
    `warm_starts=False` counts a finishing run's machines until it is done (what warm starts
    buy, compared)."""
    gap_s = market.gap_s if market is not None else gap_s
    gap_h = gap_s / 3600
    ticks = math.ceil((hours if hours is not None else market.hours if market else 8760) / gap_h)
    if ticks > MAX_TICKS:
        raise CostInputError(f"{ticks:,} ticks of {gap_s:g} s is over {MAX_TICKS:,}: give fewer "
                             "hours or longer ticks")  # fmt: skip
    book = book or prices.load()
    runs = [_start(spec, setup.region, book) for spec in setup.runs]
    teams = {team.name: team for team in setup.teams}
    spend: dict[str, float] = defaultdict(float)
    offered, replayed_h = 0.0, 0.0
    for tick in range(ticks):
        now_h = tick * gap_h
        if all(r.outcome.finished_h is not None for r in runs):
            break
        replayed_h = now_h + gap_h
        active = [r for r in runs if r.spec.submitted_h <= now_h and r.outcome.finished_h is None]
        available = market.available[tick % len(market.available)] if market else math.inf
        offered += available * gap_h if market else 0.0
        verdicts = admit([_demand(r, setup.region, gap_h if warm_starts else 0.0)
                          for r in active],
                         ceilings={setup.region: setup.ceilings}, teams=teams,
                         team_spend_usd=spend)  # fmt: skip
        for run in active:  # 2. preempted
            if run.holding and not verdicts[run.spec.name].admitted:
                run.holding, run.outcome.preemptions = False, run.outcome.preemptions + 1
        _reclaim(active, available)  # 3.
        held = sum(r.spec.machines for r in active if r.holding)
        for run in sorted(
            active, key=lambda r: (-r.spec.priority, r.spec.submitted_h, r.spec.name)
        ):  # 4. fmt: skip
            fits = held + run.spec.machines <= available
            if not run.holding and verdicts[run.spec.name].admitted and fits:
                run.holding, run.since_tick = True, tick
                run.changeover_left_h = setup.changeover_h
                if run.outcome.started_h is None:
                    run.outcome.started_h = now_h
                held += run.spec.machines
        for run in active:  # 5.
            if run.holding:
                spend[run.spec.team] += _train(run, now_h, gap_h)
            else:
                run.outcome.waited_h += gap_h
    return QueueOutcome(hours=replayed_h, runs=tuple(r.outcome for r in runs),
                        machine_h_available=offered if market else None)  # fmt: skip


def _start(spec: QueuedRun, region: str, book: prices.PriceBook) -> _Running:
    price = book.pool(spec.instance_type, region, otherwise="add it to the price book given "
                      "with --price-book").spot_price  # fmt: skip
    gpus, vcpus = asked([spec.instance_type], {"spot": spec.machines})
    outcome = RunOutcome(spec.name, spec.team, spec.priority, spec.submitted_h, spec.machines)
    return _Running(spec, outcome, price, gpus, vcpus)


def _demand(run: _Running, region: str, within_h: float) -> Demand:
    """The run as the queue sees it; one that finishes within `within_h` (this tick) is
    finishing (its final checkpoint publishing: `admission` rule 5), so the next run starts on
    its machines in the same tick where the market has them too."""
    spec = run.spec
    finishing = within_h > 0 and run.holding and (
        run.changeover_left_h + spec.work_h - run.progress_h <= within_h + 1e-9)  # fmt: skip
    return Demand(run=spec.name, region=region, team=spec.team, priority=spec.priority,
                  submitted_at=spec.submitted_h, gpus=run.gpus, vcpus=run.vcpus,
                  holding=run.holding, preemptible=not spec.deadline,
                  finishing=finishing)  # fmt: skip


def _reclaim(active: Sequence[_Running], available: float) -> None:
    """The market takes machines back from the runs that started last, whole gangs."""
    holding = sorted((r for r in active if r.holding), key=lambda r: (r.since_tick, r.spec.name))
    held = sum(r.spec.machines for r in holding)
    while held > available and holding:
        run = holding.pop()
        run.holding, run.outcome.reclaims = False, run.outcome.reclaims + 1
        held -= run.spec.machines


def _train(run: _Running, now_h: float, gap_h: float) -> float:
    """One tick on its machines: the changeover first, then training until the work is done
    (billed to the end of the work, not of the tick). What it cost."""
    spent_h = min(gap_h, run.changeover_left_h)
    run.changeover_left_h -= spent_h
    trained = min(gap_h - spent_h, run.spec.work_h - run.progress_h)
    run.progress_h += trained
    run.outcome.trained_h += trained
    used_h = spent_h + trained
    if run.progress_h >= run.spec.work_h - 1e-9:
        run.outcome.finished_h = now_h + used_h
        run.holding = False
    cost = used_h * run.spec.machines * run.price
    run.outcome.held_machine_h += used_h * run.spec.machines
    run.outcome.cost_usd += cost
    return cost
