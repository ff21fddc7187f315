"""Which of an environment's runs may have machines now, when they compete for its GPUs: the
queue's decision, pure (no AWS call). The handler's scheduled check judges the whole queue with
it once a check (`runtime/run_queue.py`), and `run list` shows what it judged.

AWS limits each account per region by vCPU quotas per instance class and market
(`gpu_types.INSTANCE_QUOTAS`); the environment sets a ceiling on each (`ceilings`, vCPUs per
region and quota), and its teams a share of GPUs and a monthly budget in dollars (`Team`).
Every run asks for the machines its groups start at (`Demand`). `admit` decides, in order:

1. A run that holds machines keeps them (taking them back is preemption's, which publishes
   the run's checkpoint first): what it holds is counted before any waiting run is looked at.
2. Waiting runs are taken in priority order (highest first), then by submission (earliest
   first; a run whose gang did not come whole in time is back in the queue as if submitted
   at its release, behind the runs that waited before it, as Kueue requeues a workload by its
   eviction time), then by name. Each one that fits is admitted and what it takes is counted before
   the next is looked at; one that does not fit waits, with its place among the waiting and
   the first reason, and keeps nothing for itself: a later run that fits starts meanwhile
   (Kueue's best-effort FIFO), so GPUs never sit idle behind a run that cannot start. (A large
   run is not starved by small ones for long: its priority lets it preempt them.)
3. A run fits when all of these hold:
   a. its team is one of the environment's (when the environment names teams);
   b. its team has spent less than its monthly budget (the run ledgers' sum this month);
   c. every quota it asks from has room under the region's ceiling: what holding and
      admitted runs take, plus what it asks, is at most the ceiling (a quota with no ceiling
      set is the account's own business: nothing is counted against it);
   d. its team stays within its GPU share, or the GPUs over it are idle in other teams'
      shares (borrowed: the run says so; a team gets its share back by preemption, never by
      the borrower being stopped unpublished).
4. A waiting run that does not fit may take the machines of holding runs of lower priority
   (preemption): the preemptible ones, lowest priority first and then the latest submitted,
   are set aside one at a time until it fits; those it does not need after all are kept, and
   if it cannot fit with every one set aside, none is preempted. A preempted run waits in the
   queue like any other: its machines are scaled in, so each publishes its emergency
   checkpoint first (SIGTERM, as for a cancel), nothing runs so nothing is billed, and it
   resumes from that checkpoint when the queue admits it again.
   A run with a deadline is not preemptible: the deadline policy keeps its promise by paying
   for on-demand when spot is short, and a preemption of unknown length would make its owner
   pay, or miss the deadline, for another run's priority. Its priority still orders it.
5. Warm starts: a holding run that is finishing (its last step trained, its final checkpoint
   being published: `run_lifecycle.Lifecycle.finishing`) keeps its machines until its final
   publish takes them, but they are not counted: the next runs are admitted onto them, so
   their machines boot and meet while it publishes and the GPUs do not sit idle between runs.
   The account's own quota still counts them where it is read (`account_room`'s `leaving`):
   they exist until they leave, and AWS refuses a launch beyond its quota. A finishing run is
   never preempted: it is about to give its machines up.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace

from spotrain.core.gpu_types import MACHINES, quota_key, vcpus


@dataclass(frozen=True, kw_only=True)
class Team:
    """A team of the environment: its share of the GPUs and its monthly budget."""

    name: str
    gpus: int
    """GPUs its runs may hold at once without borrowing."""
    monthly_budget_usd: float | None = None
    """What its runs may spend in a calendar month (their ledgers); None: no budget."""

    def problems(self) -> list[str]:
        found = []
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 0:
            found.append(f"team {self.name!r} has gpus = {self.gpus!r}: give a whole number, "
                         "0 or more")  # fmt: skip
        budget = self.monthly_budget_usd
        number = isinstance(budget, int | float) and not isinstance(budget, bool)
        if budget is not None and not (number and budget > 0):
            found.append(f"team {self.name!r} has monthly_budget_usd = {budget}: give a "
                         "positive amount in USD, or leave it out for no budget")  # fmt: skip
        return found


@dataclass(frozen=True, kw_only=True)
class Demand:
    """What one run asks for: where, for whom, how urgently, and how much."""

    run: str
    region: str
    """Where it trains (its current epoch's region; home before it starts)."""
    team: str = ""
    priority: int = 0
    """Higher goes first."""
    submitted_at: float = 0.0
    gpus: int
    """GPUs its machines carry, at the sizes its groups start at."""
    vcpus: Mapping[str, int] = field(default_factory=dict)
    """vCPUs it asks from each quota (`gpu_types.INSTANCE_QUOTAS` key), at those sizes."""
    holding: bool = False
    """It holds machines now: it keeps them (rule 1), unless preempted (rule 4)."""
    preemptible: bool = True
    """A run with a deadline is not (rule 4)."""
    finishing: bool = False
    """It holds machines that are publishing its final checkpoint (rule 5)."""


def asked(instance_types: Iterable[str], machines: Mapping[str, int]) -> tuple[int, dict[str, int]]:
    """The GPUs and the vCPUs per quota of a run's machines: `machines` per market (spot,
    on-demand), of the run's types (known types, which all carry as many GPUs; the vCPUs of the
    largest, as any of them may come)."""
    types = list(instance_types)
    gpus_each = MACHINES[types[0]].gpus
    vcpus_each = max(vcpus(t) for t in types)
    wanted: dict[str, int] = defaultdict(int)
    for market, count in machines.items():
        for quota in {quota_key(t, market) for t in types}:
            wanted[quota] = max(wanted[quota], count * vcpus_each)
    return gpus_each * sum(machines.values()), {q: n for q, n in wanted.items() if n}


@dataclass(frozen=True)
class Verdict:
    """Whether a run may have machines now, and why not."""

    admitted: bool
    reason: str
    place: int | None = None
    """Its place among the waiting runs, from 1 (None: admitted)."""
    borrowed_gpus: int = 0
    """GPUs it holds beyond its team's share, idle in other teams' shares."""
    preempted_by: str | None = None
    """A holding run preempted this time: the run that takes its machines."""


Ceilings = Mapping[str, Mapping[str, int]]
"""Per region, vCPUs per quota key: the most the environment's runs may hold."""


def admit(
    demands: Iterable[Demand], *, ceilings: Ceilings, teams: Mapping[str, Team],
    team_spend_usd: Mapping[str, float],
) -> dict[str, Verdict]:  # fmt: skip
    """Every run's verdict (rules 1-5 above)."""
    used: dict[tuple[str, str], int] = defaultdict(int)  # (region, quota) -> vCPUs
    team_gpus: dict[str, int] = defaultdict(int)
    verdicts: dict[str, Verdict] = {}

    def take(demand: Demand) -> None:
        for quota, count in demand.vcpus.items():
            used[demand.region, quota] += count
        team_gpus[demand.team] += demand.gpus

    def give_back(demand: Demand) -> None:
        for quota, count in demand.vcpus.items():
            used[demand.region, quota] -= count
        team_gpus[demand.team] -= demand.gpus

    def why_not(demand: Demand) -> str | None:
        return _why_not(demand, used, team_gpus, ceilings, teams, team_spend_usd)

    in_order = sorted(demands, key=lambda d: (-d.priority, d.submitted_at, d.run))
    for demand in (d for d in in_order if d.holding and d.finishing):  # rule 5
        verdicts[demand.run] = Verdict(True, "finishing: its final checkpoint is publishing; "
                                       "the next runs start on its machines")  # fmt: skip
    holders = [d for d in in_order if d.holding and not d.finishing]
    for demand in holders:
        take(demand)
        borrowed = _over_share(demand, team_gpus, teams)
        verdicts[demand.run] = Verdict(True, "holds its machines", borrowed_gpus=borrowed)
    for demand in (d for d in in_order if not d.holding):
        reason = why_not(demand)
        if reason is not None:  # rule 4: preemptible holders of lower priority, last first
            victims = [h for h in reversed(holders) if h.preemptible
                       and h.priority < demand.priority and verdicts[h.run].admitted]  # fmt: skip
            for victim in _set_aside(demand, victims, take, give_back, why_not):
                verdicts[victim.run] = Verdict(
                    False, f"preempted by run {demand.run} (priority {demand.priority} over "
                    f"its {victim.priority}): its machines publish their checkpoint and leave; "
                    "it resumes from it when the queue admits it again",
                    preempted_by=demand.run)  # fmt: skip
                reason = None
        if reason is None:
            take(demand)
            borrowed = _over_share(demand, team_gpus, teams)
            said = f"admitted, borrowing {borrowed} idle GPU(s) of other teams" if borrowed \
                else "admitted"  # fmt: skip
            verdicts[demand.run] = Verdict(True, said, borrowed_gpus=borrowed)
        else:
            verdicts[demand.run] = Verdict(False, reason)
    waiting = [d.run for d in in_order if not verdicts[d.run].admitted]
    return {run: replace(v, place=None if v.admitted else waiting.index(run) + 1)
            for run, v in verdicts.items()}  # fmt: skip


def _set_aside(
    demand: Demand, victims: list[Demand], take: Callable[[Demand], None],
    give_back: Callable[[Demand], None], why_not: Callable[[Demand], str | None],
) -> list[Demand]:  # fmt: skip
    """Rule 4: the fewest of `victims` (in the order given) whose machines let `demand` fit,
    given back; none (all restored) when even all of them would not."""
    aside: list[Demand] = []
    for victim in victims:
        give_back(victim)
        aside.append(victim)
        if why_not(demand) is None:
            break
    else:
        for victim in aside:
            take(victim)
        return []
    for victim in list(reversed(aside[:-1])):  # keep those it does not need after all
        take(victim)
        if why_not(demand) is None:
            aside.remove(victim)
        else:
            give_back(victim)
    return aside


def _why_not(
    demand: Demand, used: Mapping[tuple[str, str], int], team_gpus: Mapping[str, int],
    ceilings: Ceilings, teams: Mapping[str, Team], team_spend_usd: Mapping[str, float],
) -> str | None:  # fmt: skip
    """The first of rule 3's conditions the run fails, said with what would change it."""
    team = teams.get(demand.team)
    if teams and team is None:
        return (f"team {demand.team!r} is not one of the environment's teams "
                f"({', '.join(sorted(teams))}): set the run's team to one of them")  # fmt: skip
    if team is not None and team.monthly_budget_usd is not None:
        spent = team_spend_usd.get(team.name, 0.0)
        if spent >= team.monthly_budget_usd:
            return (f"team {team.name} spent ${spent:,.2f} of its ${team.monthly_budget_usd:,.2f} "
                    "monthly budget: it waits for the next month or a larger budget")  # fmt: skip
    region_ceilings = ceilings.get(demand.region, {})
    for quota, asked in sorted(demand.vcpus.items()):
        ceiling = region_ceilings.get(quota)
        if ceiling is not None and used.get((demand.region, quota), 0) + asked > ceiling:
            free = max(0, ceiling - used.get((demand.region, quota), 0))
            return (f"needs {asked} vCPUs of {quota} in {demand.region}, {free} of its ceiling "
                    f"{ceiling} free: it starts when runs there finish, or with a higher "
                    "ceiling (and AWS quota)")  # fmt: skip
    if team is not None:
        over = team_gpus.get(team.name, 0) + demand.gpus - team.gpus
        idle = sum(max(0, t.gpus - team_gpus.get(t.name, 0)) for t in teams.values()
                   if t.name != team.name)  # fmt: skip
        if over > idle:
            return (f"team {team.name} holds {team_gpus.get(team.name, 0)} of its {team.gpus} "
                    f"GPUs and the run needs {demand.gpus}; other teams have {idle} idle to "
                    "lend: it starts when the team's runs finish or others' GPUs free")  # fmt: skip
    return None


def _over_share(demand: Demand, team_gpus: Mapping[str, int], teams: Mapping[str, Team]) -> int:
    """GPUs of this run beyond its team's share, the team's runs counted so far included."""
    team = teams.get(demand.team)
    if team is None:
        return 0
    return max(0, min(demand.gpus, team_gpus.get(team.name, 0) - team.gpus))


def account_room(
    quota_vcpus: int, usage_vcpus: int | None, held_vcpus: int, leaving_vcpus: int = 0
) -> int:
    """The vCPUs of an AWS quota the environment's runs may be admitted to at once: the quota,
    less what the rest of the account uses of it (its usage, less what the runs hold; unknown
    usage counts as none), less what finishing runs hold until their machines leave
    (`leaving_vcpus`, part of `held_vcpus`: rule 5 counts them nowhere else)."""
    others = max(0, (usage_vcpus or 0) - held_vcpus)
    return max(0, quota_vcpus - others - leaving_vcpus)


def tightest(*ceilings: Ceilings) -> dict[str, dict[str, int]]:
    """Per region and quota, the lowest of the ceilings given (the environment's own, what
    the account leaves free)."""
    merged: dict[str, dict[str, int]] = defaultdict(dict)
    for ceiling in ceilings:
        for region, quotas in ceiling.items():
            for quota, most in quotas.items():
                merged[region][quota] = min(most, merged[region].get(quota, most))
    return dict(merged)


@dataclass(frozen=True, kw_only=True)
class QueuePolicy:
    """What the queue is judged by: the environment's teams and its ceilings per region, and
    whether the account's own quotas count too. The stacks hand it to the handler as JSON
    (`HandlerSettings.queue_policy`)."""

    teams: tuple[Team, ...] = ()
    ceilings: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Per region, vCPUs per quota key."""
    account_quotas: bool = False
    """Also hold the runs under what each region's AWS quotas leave free (Service Quotas,
    and their usage in CloudWatch's AWS/Usage), read at every check."""

    @property
    def limits_nothing(self) -> bool:
        """No team, no ceiling, no quota read: every run is admitted (the handler need not
        ask)."""
        return not self.teams and not any(self.ceilings.values()) and not self.account_quotas

    @property
    def teams_by_name(self) -> dict[str, Team]:
        return {team.name: team for team in self.teams}

    def to_json(self) -> str:
        document: dict[str, object] = {
            "teams": [asdict(t) for t in self.teams],
            "ceilings": {r: dict(c) for r, c in self.ceilings.items()}}  # fmt: skip
        if self.account_quotas:
            document["account_quotas"] = True
        return json.dumps(document, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> QueuePolicy:
        """The policy in `text` (a ValueError, TypeError or KeyError says what is wrong)."""
        document = json.loads(text)
        return cls(
            teams=tuple(Team(**team) for team in document.get("teams", [])),
            ceilings={str(region): {str(q): int(n) for q, n in quotas.items()}
                      for region, quotas in document.get("ceilings", {}).items()},
            account_quotas=bool(document.get("account_quotas", False)),
        )  # fmt: skip
