"""A run's cost report (`spotrain cost report`): what it spent against on-demand, how much of
the paid machine time trained steps that stayed, what each preemption cost, and what the
checkpoints cost.

Its sources are the ones the run leaves anyway: the spend ledger and its history (the
interruption handler's checks, `spend_ledger`), the interruption marks of the run's fleet
state, and the checkpoint catalog (each checkpoint's step, lease generation, publish time,
parent and `timings`). A preemption's figures are estimates from those: the steps the
stopped start had reached when warned (its last checkpoint, plus the steps its pace fits
between that checkpoint and the warning when none was published after it), the step the next
start resumed from (its first checkpoint's parent), and when it trained again (its first
checkpoint's publish time less its upload and the steps since the resume at its pace). A move
between regions is estimated alike from its claim: the destination's first checkpoint, its
base, and the steps its origin had published beyond that base. Replication sent each
checkpoint's new bytes (`timings`) from the region that published it to every other region
of the environment, at AWS's rate for the pair (`core.inter_region`); a move sends nothing
more.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from spotrain.core import inter_region, run_epochs
from spotrain.core.catalog_schema import (
    CHECKPOINT_PREFIX,
    INSTANCE_PREFIX,
    INSTANCE_STATUS_INTERRUPTING,
    LINEAGE_KEY,
    LOSS_KEY,
    SORT_KEY,
    STATUS_COLLECTED,
    STATUS_COMPLETE,
    STATUS_FENCED,
    STEP_LOSSES_KEY,
    TIMINGS_KEY,
    query_items,
    run_key,
)
from spotrain.core.fleet_state import SPOT_WARNING_LEAD_S
from spotrain.core.run_epochs import read_head
from spotrain.core.spend_ledger import CapNotice, Ledger, SpendPoint
from spotrain.cost.report import save_figure


@dataclass(frozen=True)
class Checkpoint:
    step: int
    generation: int
    published_at: float
    parent_step: int | None
    status: str = STATUS_COMPLETE
    stall_s: float | None = None
    upload_s: float | None = None
    machines: int | None = None
    loss: float | None = None
    """The training loss at its step, when the loop gave it (`after_step(..., loss=)`)."""
    step_losses: tuple[tuple[int, float], ...] = ()
    """The loss of each step trained since the checkpoint before (STEP_LOSSES_KEY)."""
    epoch: int = 0
    """The epoch that wrote it (`run_epochs`: 0 until the run moves)."""
    sent_bytes: int | None = None
    """Its new bytes (the pieces it did not share with the checkpoint before): what
    replication sent to each other region; None: not recorded (an older trainer)."""

    @property
    def start(self) -> Start:
        """The trainer start that published it: its lease generation in its epoch (each
        epoch's leases count from 1 again), in the order the starts ran."""
        return self.epoch, self.generation


Start = tuple[int, int]


@dataclass(frozen=True)
class Interruption:
    at: float
    instance_id: str
    pool: str


@dataclass(frozen=True)
class Preemption:
    at: float
    instances: tuple[str, ...]
    pools: tuple[str, ...]
    reached_step: int | None
    """The step the stopped start had reached when warned (estimated)."""
    resumed_from: int | None
    """None: the run has not started again (yet)."""
    resumed_at: float | None
    cost_usd: float | None
    """Machine time of the lost steps and of the wait, at the run's mean price."""

    @property
    def steps_lost(self) -> int | None:
        if self.reached_step is None or self.resumed_from is None:
            return None
        return max(0, self.reached_step - self.resumed_from)

    @property
    def time_to_resume_s(self) -> float | None:
        return None if self.resumed_at is None else self.resumed_at - self.at


@dataclass(frozen=True)
class Move:
    """The run moved between regions: its epoch claimed in `to_region` at `at`, from
    checkpoint `from_step` of `from_region`."""

    at: float
    from_region: str
    to_region: str
    from_step: int | None
    steps_lost: int | None
    """What its origin had published beyond the move's base (not replicated in time)."""
    resumed_at: float | None
    """When the destination trained again (estimated; None: no checkpoint there yet)."""
    cost_usd: float | None
    """Its changeover (the claim to training again) and the lost steps' machine time, at the
    run's mean price."""

    @property
    def time_to_resume_s(self) -> float | None:
        return None if self.resumed_at is None else self.resumed_at - self.at


@dataclass(frozen=True)
class RunReport:
    run: str
    ledger: Ledger
    points: list[SpendPoint]
    notices: list[CapNotice]
    head_step: int
    steps_per_hour: float | None
    paid_s: float
    productive_s: float | None
    """Machine time that trained the steps of the head's lineage (stalls not counted)."""
    checkpoints: int
    """In the head's lineage."""
    stall_s: float
    """Machine time training waited for those checkpoints."""
    mean_stall_s: float | None
    mean_upload_s: float | None
    preemptions: list[Preemption]
    notes: list[str] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    replicated_bytes: int | None = None
    """Every checkpoint's new bytes, each sent to every other region; None: none recorded."""
    replication_usd: float | None = None
    """What that cost at AWS's rates (None: the environment's regions were not given, or a
    pair's rate is not known)."""

    @property
    def goodput(self) -> float | None:
        if self.productive_s is None or not self.paid_s:
            return None
        return self.productive_s / self.paid_s

    @property
    def saved_usd(self) -> float:
        return self.ledger.on_demand_usd - self.ledger.spend_usd

    def as_json(self) -> dict[str, Any]:
        document = asdict(self)
        document.update(goodput=self.goodput, saved_usd=self.saved_usd,
                        saved=self.ledger.saved)  # fmt: skip
        for preemption, found in zip(self.preemptions, document["preemptions"], strict=True):
            found.update(steps_lost=preemption.steps_lost,
                         time_to_resume_s=preemption.time_to_resume_s)  # fmt: skip
        for move, found in zip(self.moves, document["moves"], strict=True):
            found.update(time_to_resume_s=move.time_to_resume_s)
        return document


# --- the figures -------------------------------------------------------------------------------
def _pace(checkpoints: list[Checkpoint]) -> dict[Start | None, float]:
    """Seconds per step of each start (lease generation), between its consecutive checkpoints;
    under None, over all starts."""
    sums: dict[Start | None, list[float]] = {}
    ordered = sorted(checkpoints, key=lambda c: c.step)
    for before, after in pairwise(ordered):
        took, steps = after.published_at - before.published_at, after.step - before.step
        if before.start != after.start or took <= 0 or steps <= 0:
            continue
        for key in (after.start, None):
            total = sums.setdefault(key, [0.0, 0.0])
            total[0], total[1] = total[0] + took, total[1] + steps
    return {key: seconds / steps for key, (seconds, steps) in sums.items()}


def _lineage(checkpoints: list[Checkpoint], head_step: int) -> list[Checkpoint]:
    """The head and its ancestors, oldest first (what the run's result is made of)."""
    by_step = {c.step: c for c in checkpoints if c.status in (STATUS_COMPLETE, STATUS_COLLECTED)}
    chain, step = [], head_step
    while step in by_step and len(chain) <= len(by_step):
        chain.append(by_step[step])
        parent = by_step[step].parent_step
        if parent is None:
            break
        step = parent
    return chain[::-1]


def _running_at(at: float, checkpoints: list[Checkpoint]) -> Start | None:
    """The start that was training at `at`: the one that published last
    before it, else the first to publish within the warning's two minutes (its emergency
    checkpoint); None if neither."""
    before = [c for c in checkpoints if c.published_at <= at]
    if before:
        return max(before, key=lambda c: c.published_at).start
    notice = [c for c in checkpoints if at < c.published_at <= at + SPOT_WARNING_LEAD_S]
    return min(notice, key=lambda c: c.published_at).start if notice else None


def _preemptions(
    interruptions: Iterable[Interruption], checkpoints: list[Checkpoint],
    pace: dict[Start | None, float], price_per_machine_s: float | None,
) -> list[Preemption]:  # fmt: skip
    """One per start that a warning ended: warnings to several machines of one start within
    one notice's two minutes count once."""
    groups: list[tuple[Start | None, list[Interruption]]] = []
    for warning in sorted(interruptions, key=lambda i: i.at):
        start = _running_at(warning.at, checkpoints)
        if (
            groups
            and groups[-1][0] == start
            and (warning.at - groups[-1][1][0].at <= SPOT_WARNING_LEAD_S)
        ):
            groups[-1][1].append(warning)
        else:
            groups.append((start, [warning]))
    found = []
    for stopped, warnings in groups:
        at = warnings[0].at
        own = [c for c in checkpoints if c.start == stopped]
        last = max(own, key=lambda c: c.step) if own else None
        reached, machines = None, 1
        if last is not None:
            machines = last.machines or 1
            per_step = pace.get(stopped) or pace.get(None)
            reached = last.step
            if last.published_at < at and per_step:  # no checkpoint after the warning
                reached += int((at - last.published_at) / per_step)
        later = [c for c in checkpoints
                 if c.start > (stopped if stopped is not None else (-1, -1))
                 and c.published_at > at]  # fmt: skip
        resumed_from = resumed_at = cost = None
        if later:
            resumed_gen = min(c.start for c in later)
            first = min((c for c in later if c.start == resumed_gen), key=lambda c: c.step)
            resumed_from = first.parent_step or 0
            per_step = pace.get(resumed_gen) or pace.get(None) or 0.0
            trained_again = (first.published_at - (first.upload_s or 0.0)
                             - (first.step - resumed_from) * per_step)  # fmt: skip
            resumed_at = max(at, trained_again)
            if price_per_machine_s is not None and reached is not None:
                lost_s = max(0, reached - resumed_from) * (pace.get(stopped) or per_step)
                cost = (lost_s + resumed_at - at) * machines * price_per_machine_s
        found.append(Preemption(
            at=at, instances=tuple(w.instance_id for w in warnings),
            pools=tuple(sorted({w.pool for w in warnings})), reached_step=reached,
            resumed_from=resumed_from, resumed_at=resumed_at, cost_usd=cost,
        ))  # fmt: skip
    return found


def _moves(
    epochs: Sequence[run_epochs.Epoch], checkpoints: list[Checkpoint],
    pace: dict[Start | None, float], price_per_machine_s: float | None,
) -> list[Move]:  # fmt: skip
    """One per epoch after the first: from its base's region to its own."""
    found = []
    for epoch in epochs:
        if epoch.base is None or not epoch.claimed_at:
            continue
        at = _instant(epoch.claimed_at)
        origin = [c.step for c in checkpoints
                  if c.epoch == epoch.base.number and c.published_at <= at]  # fmt: skip
        lost = None if epoch.base_step is None or not origin else max(
            0, max(origin) - epoch.base_step)  # fmt: skip
        arrived = [c for c in checkpoints if c.epoch == epoch.id.number
                   and c.status != STATUS_FENCED]  # fmt: skip
        resumed_at = cost = None
        if arrived:
            first = min(arrived, key=lambda c: c.step)
            per_step = pace.get(first.start) or pace.get(None) or 0.0
            since = first.step - (first.parent_step or epoch.base_step or 0)
            resumed_at = max(at, first.published_at - (first.upload_s or 0.0) - since * per_step)
            if price_per_machine_s is not None:
                lost_s = (lost or 0) * per_step
                cost = (lost_s + resumed_at - at) * (first.machines or 1) * price_per_machine_s
        found.append(Move(at=at, from_region=epoch.base.region, to_region=epoch.id.region,
                          from_step=epoch.base_step, steps_lost=lost, resumed_at=resumed_at,
                          cost_usd=cost))  # fmt: skip
    return found


def _replication(
    checkpoints: list[Checkpoint], epochs: Sequence[run_epochs.Epoch], regions: Sequence[str]
) -> tuple[int | None, float | None]:
    """Every checkpoint's new bytes, and what sending each from the region that published it
    to every other region of the environment cost (None: not known)."""
    recorded = [c for c in checkpoints if c.sent_bytes is not None]
    if not recorded:
        return None, None
    sent = sum(c.sent_bytes or 0 for c in recorded)
    if len(regions) < 2:
        return sent, 0.0 if regions else None
    region_of = {e.id.number: e.id.region for e in epochs}
    usd = 0.0
    for checkpoint in recorded:
        sender = region_of.get(checkpoint.epoch, regions[0])
        for other in (r for r in regions if r != sender):
            rate = inter_region.usd_per_gb(sender, other)
            if rate is None:
                return sent, None
            usd += (checkpoint.sent_bytes or 0) / 1e9 * rate
    return sent, usd


def _of_history(checkpoints: list[Checkpoint], notes: list[str]) -> list[Checkpoint]:
    """The checkpoints of the run's history. A writer of a region the run had moved away from
    may have trained on: its time is paid (the ledger counts it), its checkpoints are FENCED,
    no progress, and set no pace (noted when there are any)."""
    fenced = [c.step for c in checkpoints if c.status == STATUS_FENCED]
    if fenced:
        notes.append(f"{len(fenced)} checkpoint(s) published after the run moved on by a writer "
                     f"it had left (steps {', '.join(map(str, fenced))}): fenced, not "
                     "counted")  # fmt: skip
    return [c for c in checkpoints if c.status != STATUS_FENCED]


def build(
    run: str, *, ledger: Ledger, points: list[SpendPoint], notices: list[CapNotice],
    checkpoints: list[Checkpoint] | None, head_step: int, interruptions: list[Interruption],
    epochs: Sequence[run_epochs.Epoch] = (), regions: Sequence[str] = (),
) -> RunReport:  # fmt: skip
    """The report from what the run left; `checkpoints` None: no catalog was given; `epochs`
    its claims (its moves); `regions` its environment's (empty: not given, replication is
    not priced)."""
    notes = []
    paid_s = sum(figures["seconds"] for figures in ledger.per_pool.values())
    priced_s = paid_s - ledger.unpriced_seconds
    price_per_machine_s = ledger.spend_usd / priced_s if priced_s > 0 else None
    if ledger.as_of is None:
        notes.append("no spend counted yet: the interruption handler's capacity check counts "
                     "it every 5 minutes once the run's machines are up")  # fmt: skip
    if ledger.unpriced_seconds:
        notes.append(f"{ledger.unpriced_seconds / 3600:.2f} machine-hours have no price in the "
                     "account's price sources and are not in the dollars")  # fmt: skip
    if checkpoints is None:
        notes.append("no checkpoint catalog given (--catalog-table): goodput, preemptions and "
                     "checkpoint overhead need it")  # fmt: skip
        return RunReport(run, ledger, points, notices, 0, None, paid_s, None, 0, 0.0, None, None,
                         [], notes)  # fmt: skip
    everything, checkpoints = checkpoints, _of_history(checkpoints, notes)
    newest = max((c.published_at for c in checkpoints), default=None)
    if ledger.as_of is not None and newest is not None and ledger.as_of < newest:
        notes.append(f"spend is counted to {_when(ledger.as_of)} UTC, before the run's last "
                     f"checkpoint ({_when(newest)} UTC): the machine time after it is not in "
                     "these figures yet; the next capacity check counts it (every 5 minutes, "
                     "terminated machines included)")  # fmt: skip
    pace = _pace(checkpoints)
    lineage = _lineage(checkpoints, head_step)
    productive = 0.0 if lineage else None
    stall_total, stalls, uploads = 0.0, [], []
    previous = 0
    for checkpoint in lineage:
        machines = checkpoint.machines or 1
        per_step = pace.get(checkpoint.start) or pace.get(None)
        start = checkpoint.parent_step if checkpoint.parent_step is not None else previous
        if per_step is None or productive is None:
            productive = None
        else:
            productive += (checkpoint.step - start) * per_step * machines
        if checkpoint.stall_s is not None:
            stalls.append(checkpoint.stall_s)
            stall_total += checkpoint.stall_s * machines
        if checkpoint.upload_s is not None:
            uploads.append(checkpoint.upload_s)
        previous = checkpoint.step
    if productive is not None:
        productive = max(0.0, productive - stall_total)
    if lineage and len(stalls) < len(lineage):
        notes.append(f"{len(lineage) - len(stalls)} checkpoint(s) recorded no timings "
                     "(published by an older trainer): their stalls are not counted")  # fmt: skip
    if lineage and productive is None:
        notes.append("too few checkpoints in one start to measure the run's pace: no goodput")
    preemptions = _preemptions(interruptions, checkpoints, pace, price_per_machine_s)
    if any(p.resumed_from is None for p in preemptions):
        notes.append("a preempted start has not been followed by another one yet")
    replicated, replication_usd = _replication(everything, epochs, regions)
    if replicated is not None and replication_usd is None:
        notes.append("replication is not priced: " + (
            "give the run's --environment (its regions)" if not regions
            else "a pair of the environment's regions has no known rate"))  # fmt: skip
    return RunReport(
        run=run, ledger=ledger, points=points, notices=notices, head_step=head_step,
        steps_per_hour=3600 / pace[None] if pace.get(None) else None, paid_s=paid_s,
        productive_s=productive, checkpoints=len(lineage), stall_s=stall_total,
        mean_stall_s=sum(stalls) / len(stalls) if stalls else None,
        mean_upload_s=sum(uploads) / len(uploads) if uploads else None,
        preemptions=preemptions, notes=notes,
        moves=_moves(epochs, everything, pace, price_per_machine_s),
        replicated_bytes=replicated, replication_usd=replication_usd,
    )  # fmt: skip


# --- reading what the run left -----------------------------------------------------------------
def _instant(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def read_interruptions(events: Any, run: str) -> list[Interruption]:
    """The run's machines the interruption handler marked as warned (fleet state)."""
    return [
        Interruption(_instant(item.get("warned_at") or item["updated_at"]),
                     item[SORT_KEY].removeprefix(INSTANCE_PREFIX), str(item.get("pool", "unknown")))
        for item in query_items(events, run_key(run), INSTANCE_PREFIX)
        if item.get("status") == INSTANCE_STATUS_INTERRUPTING and item.get("updated_at")
    ]  # fmt: skip


def read_checkpoints(
    catalog: Any, run: str, chain: list[run_epochs.Epoch] | None = None
) -> tuple[list[Checkpoint], int]:
    """The run's checkpoint records and its head's step (0: nothing published); one that is
    not part of the run's history (a stale writer's, after a move) is FENCED. `chain`: its
    epochs, when the caller has read them already."""
    chain = run_epochs.read_chain(catalog, run) if chain is None else chain
    head = read_head(catalog, run, chain)
    counted = run_epochs.in_history(chain)
    found = []
    for item in query_items(catalog, run_key(run), CHECKPOINT_PREFIX):
        timings = item.get(TIMINGS_KEY) or {}
        parent = item.get(LINEAGE_KEY)
        key, step = str(item[SORT_KEY]), int(item["step"])
        status = str(item.get("status", STATUS_COMPLETE))
        if not counted(key, step):
            status = STATUS_FENCED
        found.append(Checkpoint(
            step=int(item["step"]), generation=int(item.get("generation", 0)),
            published_at=_instant(item["created_at"]),
            parent_step=int(str(parent).rsplit("_", 1)[1]) if parent else None,
            status=status,
            stall_s=float(timings["stall_s"]) if "stall_s" in timings else None,
            upload_s=float(timings["upload_s"]) if "upload_s" in timings else None,
            machines=int(timings["machines"]) if "machines" in timings else None,
            loss=float(item[LOSS_KEY]) if LOSS_KEY in item else None,
            step_losses=tuple((int(s), float(v))
                              for s, v in json.loads(str(item.get(STEP_LOSSES_KEY) or "[]"))),
            epoch=run_epochs.written_by(key, step, chain).number,
            sent_bytes=int(timings["uploaded_bytes"]) if "uploaded_bytes" in timings else None,
        ))  # fmt: skip
    return found, int(head["step"]) if head else 0


# --- showing it --------------------------------------------------------------------------------
def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"


def render(report: RunReport) -> str:
    ledger = report.ledger
    lines = [f"run {report.run}: cost report"]
    if ledger.as_of is not None:
        lines += [
            f"  spend               ${ledger.spend_usd:,.2f}; ${ledger.on_demand_usd:,.2f} on "
            f"on-demand prices: ${report.saved_usd:,.2f} saved ({ledger.saved:.0%}), counted "
            f"to {_when(ledger.as_of)} UTC",
            f"  paid machine time   {report.paid_s / 3600:,.2f} h in {len(ledger.per_pool)} "
            "pool(s)",
            *(f"    {pool:<36} {f['seconds'] / 3600:8.2f} h  ${f['spend_usd']:,.2f}"
              for pool, f in sorted(ledger.per_pool.items())),
        ]  # fmt: skip
    if report.goodput is not None and report.productive_s is not None:
        lines.append(
            f"  goodput             {report.goodput:.0%} ({report.productive_s / 3600:,.2f} "
            f"machine-hours trained the head's {report.head_step} steps, of "
            f"{report.paid_s / 3600:,.2f} paid)"
        )
    if report.steps_per_hour:
        lines.append(f"  pace                {report.steps_per_hour:,.0f} steps/h (between "
                     "checkpoints of one start)")  # fmt: skip
    if report.checkpoints:
        line = f"  checkpoints         {report.checkpoints} in the head's lineage"
        if report.mean_stall_s is not None:
            line += (f"; training stalled {_duration(report.mean_stall_s)} each "
                     f"({report.stall_s:,.1f} machine-s in all)")  # fmt: skip
        if report.mean_upload_s is not None:
            line += f", save to published {_duration(report.mean_upload_s)} on average"
        lines.append(line)
    if report.preemptions or report.productive_s is not None:
        lines.append(f"  preemptions         {len(report.preemptions)}")
    for p in report.preemptions:
        lost = "unknown" if p.steps_lost is None else str(p.steps_lost)
        resumed = (
            "not resumed yet" if p.resumed_from is None
            else f"resumed from step {p.resumed_from} after {_duration(p.time_to_resume_s)}"
        )  # fmt: skip
        cost = "" if p.cost_usd is None else f", cost ${p.cost_usd:,.2f}"
        lines.append(
            f"    {_when(p.at)} {', '.join(p.instances)} ({', '.join(p.pools)}): steps lost "
            f"{lost} (had reached {p.reached_step}), {resumed}{cost}"
        )
    if report.moves:
        lines.append(f"  moves               {len(report.moves)}")
    for m in report.moves:
        lost = "unknown" if m.steps_lost is None else str(m.steps_lost)
        resumed = ("not trained there yet" if m.resumed_at is None
                   else f"trained again after {_duration(m.time_to_resume_s)}")  # fmt: skip
        cost = "" if m.cost_usd is None else f", cost ${m.cost_usd:,.2f}"
        lines.append(f"    {_when(m.at)} {m.from_region} -> {m.to_region} from step "
                     f"{m.from_step}: steps lost {lost}, {resumed}{cost}; nothing sent (its "
                     "checkpoint was replicated)")  # fmt: skip
    if report.replicated_bytes is not None:
        usd = ("" if report.replication_usd is None
               else f": ${report.replication_usd:,.2f}")  # fmt: skip
        lines.append(f"  replication         {report.replicated_bytes / 1e9:,.3f} GB of new "
                     f"checkpoint bytes, each sent to every other region{usd}")  # fmt: skip
    if ledger.cap_usd is not None:
        sent = ", ".join(f"{n.percent}% at {_when(n.at)}" for n in report.notices) or "none"
        share = ledger.spend_usd / ledger.cap_usd
        lines.append(
            f"  cap                 ${ledger.cap_usd:,.2f}: {share:.0%} spent"
            f"{'; HELD' if ledger.held else ''}; notices: {sent}"
        )
    lines += [f"  note: {note}" for note in report.notes]
    return "\n".join(lines)


def plot(report: RunReport, path: Path) -> None:
    """Spend and its on-demand equivalent over time, preemptions and cap notices marked."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt
    from matplotlib import dates

    def at(seconds: float) -> datetime:
        return datetime.fromtimestamp(seconds, UTC)

    figure, axes = plt.subplots(figsize=(7.5, 4.2), layout="constrained")
    times = [at(p.at) for p in report.points]
    # Each point is the total a check counted; between checks the money accrues steadily.
    axes.plot(times, [p.on_demand_usd for p in report.points], marker=".",
              label="on-demand equivalent")  # fmt: skip
    axes.plot(times, [p.spend_usd for p in report.points], marker=".", label="spend")
    for index, p in enumerate(report.preemptions):
        axes.axvline(at(p.at), color="tab:red", linestyle="--", linewidth=1,
                     label="preemption" if index == 0 else None)  # fmt: skip
    if report.notices:
        axes.scatter([at(n.at) for n in report.notices], [n.spend_usd for n in report.notices],
                     marker="^", s=60, color="black", zorder=3, label="cap notice")  # fmt: skip
        for notice in report.notices:
            axes.annotate(f"{notice.percent}%", (at(notice.at), notice.spend_usd),
                          textcoords="offset points", xytext=(4, 6), fontsize=8)  # fmt: skip
    if report.ledger.cap_usd is not None:
        axes.axhline(report.ledger.cap_usd, color="gray", linestyle=":", label="cap")
    locator = dates.AutoDateLocator(tz=UTC)
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator, tz=UTC))
    axes.set_xlabel("time (UTC)")
    axes.set_ylabel("USD so far")
    axes.set_ylim(bottom=0)
    axes.set_title(f"run {report.run}: spend against on-demand", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    save_figure(figure, path)


def plot_progress(
    run: str, checkpoints: list[Checkpoint], interruptions: list[Interruption], path: Path
) -> list[str]:
    """`spotrain run status --plot`: the run's loss and throughput over its steps, from what
    the trainer records with each checkpoint (step, loss, the loss of each step since the one
    before, when published), with each restart
    (a start resuming from its parent's step) and each preemption (the handler's warning, at
    the step the run had reached) marked. The legend's entries are returned."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    published = sorted(checkpoints, key=lambda c: c.step)
    figure, (loss_axes, pace_axes) = plt.subplots(
        2, 1, figsize=(7.5, 5.6), sharex=True, layout="constrained"
    )
    with_loss = [c for c in published if c.loss is not None]
    # A step trained again after a restart: the later start's loss (starts only grow).
    each_step = dict(pair for c in sorted(published, key=lambda c: (c.start, c.step))
                     for pair in c.step_losses)  # fmt: skip
    if each_step:
        steps = sorted(each_step)
        loss_axes.plot(steps, [each_step[s] for s in steps], linewidth=0.8, alpha=0.7,
                       color="tab:gray", label="loss at each step")  # fmt: skip
    if with_loss:
        loss_axes.plot([c.step for c in with_loss], [c.loss for c in with_loss], marker=".",
                       linestyle="none" if each_step else "-",
                       label="loss at each checkpoint")  # fmt: skip
    else:
        loss_axes.text(0.5, 0.5, "no loss recorded: pass loss= to Checkpointer.after_step",
                       ha="center", va="center", transform=loss_axes.transAxes,
                       fontsize=9)  # fmt: skip
    pace = [(after.step,
             3600 * (after.step - before.step) / (after.published_at - before.published_at))
            for before, after in pairwise(published)
            if after.start == before.start and after.published_at > before.published_at
            and after.step > before.step]  # fmt: skip
    if pace:
        pace_axes.plot(*zip(*pace, strict=True), marker=".", color="tab:green",
                       label="steps per hour (between checkpoints of one start)")  # fmt: skip
    starts: dict[Start, Checkpoint] = {}
    for checkpoint in published:
        starts.setdefault(checkpoint.start, checkpoint)
    restarts = sorted({c.parent_step for c in list(starts.values())[1:] if c.parent_step})
    preempted = [p.reached_step for p in _preemptions(interruptions, published,
                                                      _pace(published), None)
                 if p.reached_step is not None]  # fmt: skip
    for axes in (loss_axes, pace_axes):  # named once, in the upper legend
        named = axes is loss_axes
        for index, step in enumerate(restarts):
            label = "restart (resumed from)" if named and index == 0 else None
            axes.axvline(step, color="tab:blue", linestyle=":", linewidth=1, label=label)
        for index, step in enumerate(preempted):
            label = "preemption" if named and index == 0 else None
            axes.axvline(step, color="tab:red", linestyle="--", linewidth=1, label=label)
        axes.grid(alpha=0.3)
    loss_axes.set_ylabel("training loss")
    loss_axes.set_title(f"run {run}: {len(published)} checkpoints, {len(restarts)} restart(s), "
                        f"{len(preempted)} preemption(s)", fontsize=10)  # fmt: skip
    pace_axes.set_ylabel("steps per hour")
    pace_axes.set_xlabel("step")
    pace_axes.set_ylim(bottom=0)
    entries = []
    for axes in (loss_axes, pace_axes):
        if axes.get_legend_handles_labels()[1]:
            entries += [t.get_text() for t in axes.legend(fontsize=8).get_texts()]
    save_figure(figure, path)
    return entries
