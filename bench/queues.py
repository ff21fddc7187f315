"""Queue figures: what a ceiling, a priority and a team's budget buy, replayed with the queue's
own decision (`spotrain cost queue`, `core/admission.py`) on generated workloads and markets.

    .venv/bin/python bench/queues.py           # writes bench/queues.md

Each scenario replays the same seeded week of runs (three teams, a fifth of the runs urgent,
gangs of 1 to 4 p5.48xlarge machines) on the same seeded spot markets, and changes one thing.
Deterministic: the figures change only when the workload, the markets or the decision do.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from spotrain.core.admission import Team
from spotrain.cost import queue_replay, traces
from spotrain.cost.queue_replay import QueuedRun, QueueSetup

HERE = Path(__file__).parent
REGION, INSTANCE = "us-east-1", "p5.48xlarge"
VCPUS, GPUS = 192, 8  # one p5.48xlarge
WEEK_H = 168.0
WORKLOADS = 12
"""Seeded weeks of runs; every figure is a mean over them."""
RUNS_A_WEEK = 45
URGENT_SHARE = 0.2
TEAMS = ("vision", "speech", "language")
CEILING = 8
"""Machines the account's spot P quota holds: each team's share is a third of it."""
MARKET = {"interruptions_per_hour": 0.03, "recovery_h": 3.0, "capacity": 10, "gap_s": 600.0}
"""Spot p5.48xlarge machines to be had: ten slots, each lost about once a day for hours."""
REPLAY_H = 3 * WEEK_H
"""Long enough for a week's submissions to finish."""


def workload(seed: int) -> tuple[QueuedRun, ...]:
    """A week of runs: Poisson submissions, gangs of 1, 2 or 4 machines, 2 to 20 hours."""
    rng = random.Random(seed)
    runs, now = [], 0.0
    for index in range(RUNS_A_WEEK):
        now += rng.expovariate(RUNS_A_WEEK / WEEK_H)
        urgent = rng.random() < URGENT_SHARE
        runs.append(QueuedRun(
            name=f"r{index:02d}", team=rng.choice(TEAMS), priority=5 if urgent else 0,
            submitted_h=round(now, 2), instance_type=INSTANCE,
            machines=rng.choice((1, 2, 2, 4)), work_h=round(rng.uniform(2, 20), 1),
        ))  # fmt: skip
    return tuple(runs)


def setup(runs: tuple[QueuedRun, ...], *, ceiling: int = CEILING,
          budgets: dict[str, float] | None = None) -> QueueSetup:  # fmt: skip
    share = ceiling * GPUS // len(TEAMS)
    teams = tuple(
        Team(name=name, gpus=share, monthly_budget_usd=(budgets or {}).get(name)) for name in TEAMS
    )
    return QueueSetup(region=REGION, ceilings={"spot/P5": ceiling * VCPUS}, teams=teams,
                      runs=runs, changeover_h=0.25)  # fmt: skip


def no_priorities(runs: tuple[QueuedRun, ...]) -> tuple[QueuedRun, ...]:
    return tuple(dataclasses.replace(run, priority=0) for run in runs)


def urgent_with_deadlines(runs: tuple[QueuedRun, ...]) -> tuple[QueuedRun, ...]:
    """Every run has a deadline: none may be preempted."""
    return tuple(dataclasses.replace(run, deadline=True) for run in runs)


SCENARIOS: dict[str, tuple[Callable[[tuple[QueuedRun, ...]], QueueSetup], bool]] = {
    "as declared (8 machines, priorities)": (lambda runs: setup(runs), True),
    "no priorities": (lambda runs: setup(no_priorities(runs)), True),
    "no preemption (every run has a deadline)": (
        lambda runs: setup(urgent_with_deadlines(runs)), True),
    "ceiling 6 machines": (lambda runs: setup(runs, ceiling=6), True),
    "ceiling 10 machines": (lambda runs: setup(runs, ceiling=10), True),
    "language's budget $6,000 a month": (
        lambda runs: setup(runs, budgets={"language": 6_000}), True),
    "a market that never runs out": (lambda runs: setup(runs), False),
    "no warm starts": (lambda runs: setup(runs), True),
}  # fmt: skip
"""Each scenario's queue from a workload, and whether the spot market limits it."""


def figures(outcomes: list[queue_replay.QueueOutcome], urgent: list[set[str]]) -> dict[str, float]:
    """Means over the workloads; `urgent` names each workload's urgent runs as declared (a
    scenario may have taken their priority away)."""

    def mean(value: Callable[[queue_replay.QueueOutcome], float]) -> float:
        return statistics.fmean(value(o) for o in outcomes)

    def wait(outcome: queue_replay.QueueOutcome, key: str, value: object) -> float:
        return outcome.by(key).get(value, {"mean_wait_h": 0.0})["mean_wait_h"]

    def waited(index: int, were_urgent: bool) -> float:
        runs = [r for r in outcomes[index].runs if (r.name in urgent[index]) == were_urgent]
        return statistics.fmean(r.waited_h for r in runs) if runs else 0.0

    def used(outcome: queue_replay.QueueOutcome) -> float:
        held = sum(r.held_machine_h for r in outcome.runs)
        return held / outcome.machine_h_available if outcome.machine_h_available else 0.0

    return {
        "finished": mean(lambda o: sum(r.finished_h is not None for r in o.runs) / len(o.runs)),
        "wait urgent": statistics.fmean(waited(i, True) for i in range(len(outcomes))),
        "wait normal": statistics.fmean(waited(i, False) for i in range(len(outcomes))),
        **{f"wait {team}": mean(lambda o, t=team: wait(o, "team", t)) for team in TEAMS},
        "longest wait": mean(lambda o: max(r.waited_h for r in o.runs)),
        "preemptions": mean(lambda o: sum(r.preemptions for r in o.runs)),
        "reclaims": mean(lambda o: sum(r.reclaims for r in o.runs)),
        "training share": mean(lambda o: o.training_share),
        "market used": mean(used),
        "cost": mean(lambda o: sum(r.cost_usd for r in o.runs)),
    }


def main() -> int:
    started = time.monotonic()
    workloads = [workload(seed) for seed in range(WORKLOADS)]
    urgent = [{run.name for run in runs if run.priority > 0} for runs in workloads]
    markets = [traces.generate(hours=REPLAY_H, seed=1000 + seed, **MARKET)  # type: ignore[arg-type]
               for seed in range(WORKLOADS)]  # fmt: skip
    rows = {}
    for name, (make, limited) in SCENARIOS.items():
        outcomes = [queue_replay.replay(make(runs), market if limited else None, hours=REPLAY_H,
                                        warm_starts=name != "no warm starts")
                    for runs, market in zip(workloads, markets, strict=True)]  # fmt: skip
        rows[name] = figures(outcomes, urgent)
    took = time.monotonic() - started
    offered = statistics.fmean(statistics.fmean(m.available) for m in markets)
    lines = [
        "# Queue: what a ceiling, a priority and a budget buy",
        "",
        "Made by `.venv/bin/python bench/queues.py` (deterministic: seeded workloads and "
        f"markets), {took:.0f} s on a {os.cpu_count()}-core {platform.machine()} with Python "
        f"{sys.version.split()[0]}. Each row replays the same {WORKLOADS} seeded weeks of "
        f"{RUNS_A_WEEK} runs ({len(TEAMS)} teams, {URGENT_SHARE:.0%} of runs at priority 5, "
        f"gangs of 1, 2 or 4 {INSTANCE} machines, 2 to 20 hours of training each, a changeover "
        "of 15 minutes at every start) with the queue's own decision (`core/admission.py`, as "
        "`spotrain cost queue` replays it), on the same seeded spot markets "
        f"({MARKET['capacity']} slots, each lost {MARKET['interruptions_per_hour']:g} times an "
        f"hour and gone {MARKET['recovery_h']:g} h on average: {offered:.1f} machines on offer "
        f"on average), for {REPLAY_H:.0f} hours. The account's ceiling is {CEILING} machines "
        f"unless the row says otherwise; each team's share is a third of it and a team may "
        "borrow what the others leave idle. Figures are means over the weeks; waits in hours "
        "(submitted and holding no machine), cost in USD at the checked-in book's spot price.",
        "",
        "| scenario | finished | wait, urgent | wait, normal | "
        + " | ".join(f"wait, {t}" for t in TEAMS)
        + " | longest wait | preemptions | reclaims | training share | market used | cost |",
        "|---" * (10 + len(TEAMS)) + "|",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['finished']:.0%} | {row['wait urgent']:.1f} | "
            f"{row['wait normal']:.1f} | "
            + " | ".join(f"{row[f'wait {t}']:.1f}" for t in TEAMS)
            + f" | {row['longest wait']:.1f} | {row['preemptions']:.1f} | {row['reclaims']:.1f} | "
            f"{row['training share']:.1%} | "
            + (f"{row['market used']:.0%}" if row["market used"] else "-")
            + f" | ${row['cost']:,.0f} |"
        )
    lines += ["", *reading(rows), ""]
    (HERE / "queues.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


def reading(rows: dict[str, dict[str, float]]) -> list[str]:
    """What the table says, from its own figures."""
    base, flat = rows["as declared (8 machines, priorities)"], rows["no priorities"]
    fixed = rows["no preemption (every run has a deadline)"]
    small, large = rows["ceiling 6 machines"], rows["ceiling 10 machines"]
    budget = rows["language's budget $6,000 a month"]
    cold = rows["no warm starts"]
    return [
        "How to read it:",
        "",
        f"- Priority buys urgency: urgent runs wait {base['wait urgent']:.1f} h against "
        f"{flat['wait urgent']:.1f} h when every run is equal, and the others "
        f"{base['wait normal']:.1f} h against {flat['wait normal']:.1f} h. Preemption is part of "
        f"it: without it (every run unpreemptible) urgent runs wait {fixed['wait urgent']:.1f} h.",
        f"- A preemption costs its run a changeover: the share of paid machine-hours that "
        f"trained is {base['training share']:.1%} with preemption and "
        f"{fixed['training share']:.1%} without.",
        f"- The ceiling buys waiting time: at 6 machines a run waits {small['wait normal']:.1f} h "
        f"(normal priority), at 8 {base['wait normal']:.1f} h, at 10 {large['wait normal']:.1f} h; "
        "the work, and so its cost, hardly changes: a ceiling moves when runs train, not what "
        "they pay.",
        f"- A budget holds a team's runs back once it is spent: language's runs wait "
        f"{budget['wait language']:.1f} h with $6,000 a month against {base['wait language']:.1f}"
        f" h without: once the month's budget is spent its runs wait for the next month, so "
        f"{budget['finished']:.0%} of all runs finish within the replay's {REPLAY_H / WEEK_H:.0f} "
        f"weeks. The other teams wait {budget['wait vision']:.1f} and "
        f"{budget['wait speech']:.1f} h "
        f"(against {base['wait vision']:.1f} and {base['wait speech']:.1f}).",
        f"- A ceiling above what the market holds buys reclaims: at 10 machines (the market "
        f"offers {MARKET['capacity']} slots, fewer while some are gone) the runs started last "
        f"are reclaimed {large['reclaims']:.1f} times in a week's runs against "
        f"{base['reclaims']:.1f} at 8, and each reclaim is a changeover paid.",
        f"- Warm starts (the next run admitted onto a finishing run's machines, its changeover "
        f"beside that run's last minutes) take normal waits from {cold['wait normal']:.1f} h to "
        f"{base['wait normal']:.1f} h here; the replay's ticks are 10 minutes, so it can show "
        "at most a tick a start.",
    ]


if __name__ == "__main__":
    raise SystemExit(main())
