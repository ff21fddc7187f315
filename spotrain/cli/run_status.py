"""What `spotrain run list|status` reads about a run: where its environment keeps it (tables,
groups, bucket, declarations, in its primary region), and its status gathered from them: its
phase, the head checkpoint and its loss, the step of its steps, machines, spend, pace, ETA
against its deadline, crashes and last interruption."""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from spotrain.cli.arguments import environment, reach_fix
from spotrain.cli.output import json_text, say
from spotrain.cli.regions import region_answers
from spotrain.core.deadline_policy import instant
from spotrain.core.errors import SpotrainError
from spotrain.core.fleet_state import RunState


@dataclass(frozen=True)
class Where:
    """The environment's tables and Auto Scaling, in its primary region; its runs' groups in
    every region (`autoscaling_in`)."""

    events: Any
    catalog: Any
    autoscaling: Any
    ssm: Any
    bucket: str
    """The checkpoint bucket in the primary region."""
    environment: str
    region: str
    regions: tuple[str, ...] = ()
    """Every region of the environment, home first (empty: home only)."""
    autoscaling_in: Any = None
    """Auto Scaling client of a region, made on first use (None: home's only)."""
    buckets: Mapping[str, str] = field(default_factory=dict)
    """The checkpoint bucket of each region (empty: home's only)."""

    def bucket_in(self, region: str | None) -> str:
        """The checkpoint bucket of `region` (home's when None or not known)."""
        return self.buckets.get(region or self.region, self.bucket)

    def autoscaling_of(self, region: str) -> Any:
        if region == self.region or self.autoscaling_in is None:
            return self.autoscaling
        return self.autoscaling_in(region)


@dataclass(frozen=True)
class RunStatus:
    run: str
    phase: str
    why: str
    step: int | None
    """The published head's step (None: nothing published yet)."""
    final: bool
    machines: dict[str, int]
    """In service, per group."""
    sizes: dict[str, str]
    """min..desired..max per group."""
    spend_usd: float
    on_demand_usd: float
    cap_usd: float | None
    crashes: int
    last_interruption: str | None
    queued: str | None = None
    """Its place and why it waits in the environment's queue (the handler's last check)."""
    steps: int | None = None
    """The run's training steps, from its newest stored configuration."""
    loss: float | None = None
    """The training loss at the head's step."""
    head_at: str | None = None
    """When the head was published."""
    head_manifest: str | None = None
    """The head's manifest, in the checkpoint bucket."""
    steps_per_hour: float | None = None
    """Between checkpoints of one trainer start (None until there are two)."""
    eta: str | None = None
    """When it finishes at that pace (ISO 8601, UTC), while it trains."""
    finish_by: str | None = None
    """Its declared deadline."""
    decided_by: str | None = None
    """With a deadline: the policy the handler decides it by (its plan, or outage fill)."""
    last_crash: str | None = None
    """The newest crash since the run's release: instance, exit and the trainer's reason."""
    leaving: int = 0
    """Machines still stopping (their emergency checkpoint), not in service any more."""
    trains_in: str | None = None
    """The region its current epoch claimed (None: it never trained)."""
    epoch: int = 0
    """Its current epoch: how many times it moved between regions."""
    moved_from_step: int | None = None
    """The checkpoint its current epoch started from (None in epoch 0)."""


def where_of(env_name: str, *, from_a_region_that_answers: bool = False) -> Where:
    """Where environment `env_name` keeps its runs: home's tables, bucket and declarations,
    and every region's groups. `from_a_region_that_answers`: while home does not answer, the
    first region that does (its copies of the global tables), and only the regions that
    answer (each one that does not said on stderr): `run status` and `list` in an outage."""
    from spotrain.core import aws_clients
    from spotrain.core import resource_names as names
    from spotrain.core.catalog_schema import CHECKPOINTS_TABLE_SUFFIX, EVENTS_TABLE_SUFFIX

    config = environment(env_name)
    events = names.environment_resource(config.name, EVENTS_TABLE_SUFFIX)
    regions = tuple(config.region_names)
    if from_a_region_that_answers:
        regions = tuple(r for r in regions if region_answers(events, r))
        if not regions:
            raise SpotrainError(f"no region of environment {env_name} answers "
                                f"({', '.join(config.region_names)}): an outage, or no "
                                f"connection from here; try again later, or "
                                f"{reach_fix(env_name)}")  # fmt: skip
    region = regions[0]
    dynamodb = aws_clients.resource("dynamodb", region)
    clients: dict[str, Any] = {}

    def autoscaling_in(where: str) -> Any:
        if where not in clients:
            clients[where] = aws_clients.client("autoscaling", where)
        return clients[where]

    return Where(
        events=dynamodb.Table(events),
        catalog=dynamodb.Table(names.environment_resource(config.name, CHECKPOINTS_TABLE_SUFFIX)),
        autoscaling=autoscaling_in(region),
        ssm=aws_clients.client("ssm", region),
        bucket=names.checkpoint_bucket(config.bucket_prefix, region),
        environment=config.name,
        region=region,
        regions=regions,
        autoscaling_in=autoscaling_in,
        buckets={r: names.checkpoint_bucket(config.bucket_prefix, r) for r in config.region_names},
    )


def run_groups(where: Where, run: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """The environment's groups tagged with a run (`run`'s only, if given), by run, from every
    region (each group's `Region` says which)."""
    from spotrain.core.catalog_schema import ENVIRONMENT_TAG, RUN_TAG

    wanted = {"Name": f"tag:{RUN_TAG}", "Values": [run]} if run else {
        "Name": "tag-key", "Values": [RUN_TAG]}  # fmt: skip
    of_the_environment = {"Name": f"tag:{ENVIRONMENT_TAG}", "Values": [where.environment]}
    by_run: dict[str, list[dict[str, Any]]] = {}
    for region in where.regions or (where.region,):
        pages = where.autoscaling_of(region).get_paginator("describe_auto_scaling_groups")
        for page in pages.paginate(Filters=[of_the_environment, wanted]):
            for group in page["AutoScalingGroups"]:
                tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
                by_run.setdefault(tags[RUN_TAG], []).append({**group, "Region": region})
    return by_run


def in_service(group: dict[str, Any]) -> int:
    return sum(i.get("LifecycleState") == "InService" for i in group.get("Instances", []))


def _leaving(group: dict[str, Any]) -> int:
    return sum(str(i.get("LifecycleState", "")).startswith("Terminating")
               for i in group.get("Instances", []))  # fmt: skip


def _why_not_training(
    phase: str, state: RunState, held: bool, stored: dict[str, Any] | None
) -> str:  # fmt: skip
    from spotrain.core import run_lifecycle

    if state.failed:
        return "held after repeated crashes (`spotrain fleet reset-crashes`)"
    if held:
        return "held at its spend cap (`spotrain fleet release --max-spend-usd N`)"
    if phase == run_lifecycle.WAITING:
        return ("submitted: the handler's next capacity check (every 5 minutes) starts its "
                "groups" if stored else
                "no training configuration stored (`spotrain run submit` or `spotrain config "
                "put`)")  # fmt: skip
    if phase == run_lifecycle.IDLE:
        return (
            "its groups want no machine though nothing holds it (scaled to 0 by hand?): "
            "`spotrain fleet scale --group GROUP --desired N` gives them capacity back"
        )
    return ""


def _stored_configuration(where: Where, run: str) -> dict[str, Any] | None:
    """The run's newest stored configuration (None if none is readable)."""
    from spotrain.core import aws_clients
    from spotrain.trainer import run_config
    from spotrain.trainer.storage import open_storage

    s3 = aws_clients.client("s3", where.region)  # the bucket's (home's, or in an outage)
    try:
        return dict(
            run_config.newest(open_storage(f"s3://{where.bucket}", client=s3), run).document
        )
    except SpotrainError:
        return None


def _total_steps(document: dict[str, Any] | None) -> int | None:
    """The steps of a stored configuration, or of its entry point (None if it says none)."""
    try:
        return int(document.get("entry_point", document)["steps"]) if document else None
    except (KeyError, TypeError, ValueError):
        return None


def _eta(step: int, steps: int | None, per_hour: float | None) -> str | None:
    import datetime

    if steps is None or not per_hour or step >= steps:
        return None
    then = time.time() + (steps - step) / per_hour * 3600
    return datetime.datetime.fromtimestamp(then, datetime.UTC).isoformat(timespec="minutes")


@dataclass(frozen=True)
class _Standing:
    """What decides a run's phase (a few reads), before the details of its status."""

    lifecycle: Any
    state: Any
    ledger: Any
    head: Any
    machines: dict[str, int]
    phase: str


def _standing(where: Where, run: str, groups: list[dict[str, Any]]) -> _Standing:
    from spotrain.core import fleet_state, run_lifecycle, spend_ledger

    lifecycle = run_lifecycle.read(where.events, run)
    state = fleet_state.run_state(where.events, run)
    ledger = spend_ledger.read(where.events, run)
    head = run_lifecycle.published_head(where.catalog, run)
    machines = {g["AutoScalingGroupName"]: in_service(g) for g in groups}
    phase = run_lifecycle.phase(
        lifecycle, failed=state.failed, over_cap=ledger.held,
        in_service=sum(machines.values()), published=head is not None,
        desired=sum(int(g["DesiredCapacity"]) for g in groups) if groups else None,
        queued=state.queued is not None,
    )  # fmt: skip
    return _Standing(lifecycle, state, ledger, head, machines, phase)


def stopped(where: Where, run: str) -> bool:
    """The run is finished, cancelled, held or failed, and none of its machines is in service."""
    from spotrain.core.run_lifecycle import CANCELLED, FAILED, FINISHED, HELD

    standing = _standing(where, run, run_groups(where, run).get(run, []))
    return standing.phase in (CANCELLED, FAILED, FINISHED, HELD) and not any(
        standing.machines.values())  # fmt: skip


def status_of(where: Where, run: str, groups: list[dict[str, Any]]) -> RunStatus:
    from spotrain.cli.run_plan import declared_deadline
    from spotrain.core import fleet_state, run_epochs, run_lifecycle
    from spotrain.core.deadline_policy import read_throughput

    it = _standing(where, run, groups)
    state, ledger, head, phase = it.state, it.ledger, it.head, it.phase
    step, final = (head.step, head.final) if head is not None else (None, False)
    # When each machine was warned (a spot notice's own time is the stop, two minutes on).
    marks = sorted(fleet_state.instances(where.events, run), key=_warned_at)
    stored = _stored_configuration(where, run)
    holds = it.lifecycle.why_stopped or state.failed or ledger.held  # whatever the queue says
    queued = state.waiting_reason if stored and not holds else None  # waiting, or preempted
    why = it.lifecycle.why_stopped or queued or _why_not_training(phase, state, ledger.held, stored)
    steps = _total_steps(stored)
    epoch = run_epochs.current(chain := run_epochs.read_chain(where.catalog, run))
    per_hour = read_throughput(where.catalog, run, chain) if head is not None else None
    finish_by, decided_by = declared_deadline(where, run)
    return RunStatus(
        run=run, phase=phase, why=why, step=step, final=final, machines=it.machines,
        queued=queued,
        sizes={g["AutoScalingGroupName"]: f"{g['MinSize']}..{g['DesiredCapacity']}.."
               f"{g['MaxSize']}" for g in groups},
        spend_usd=round(ledger.spend_usd, 2), on_demand_usd=round(ledger.on_demand_usd, 2),
        cap_usd=ledger.cap_usd, crashes=state.crashes,
        last_crash=_last_crash(where, run) if state.crashes else None,
        last_interruption=(f"{marks[-1]['sk'].split('#', 1)[1]} "
                           f"{fleet_state.shown_status(marks[-1])}, warned at "
                           f"{_warned_at(marks[-1])}"
                           if marks else None),
        steps=steps, loss=head.loss if head else None, head_at=head.created_at if head else None,
        # Where the run trains holds its head (its writer's, or the base its move verified).
        head_manifest=(f"s3://{where.bucket_in(epoch.id.region if epoch else None)}/"
                       f"{head.manifest}" if head else None),
        steps_per_hour=round(per_hour, 1) if per_hour else None,
        eta=_eta(step or 0, steps, per_hour) if phase == run_lifecycle.TRAINING else None,
        finish_by=finish_by, decided_by=decided_by, leaving=sum(_leaving(g) for g in groups),
        trains_in=epoch.id.region if epoch else None, epoch=epoch.id.number if epoch else 0,
        moved_from_step=epoch.base_step if epoch else None,
    )  # fmt: skip


def _warned_at(mark: dict[str, Any]) -> str:
    return str(mark.get("warned_at") or mark.get("updated_at"))


def _last_crash(where: Where, run: str) -> str | None:
    from spotrain.core import fleet_state

    crash = fleet_state.last_crash(where.events, run)
    return fleet_state.crash_line(crash) if crash is not None else None


def line(status: RunStatus) -> str:
    machines = sum(status.machines.values())
    step = "-" if status.step is None else str(status.step)
    step += f"/{status.steps}" if status.steps is not None else ""
    step += " (final)" if status.final else ""
    loss = f"loss {status.loss:.4f}" if status.loss is not None else "loss -"
    cap = f" of ${status.cap_usd:,.2f}" if status.cap_usd is not None else ""
    return (f"{status.run:<24} {status.phase:<10} step {step:<16} {loss:<12} machines "
            f"{machines:<3} ${status.spend_usd:,.2f}{cap}")  # fmt: skip


def show(status: RunStatus, args: argparse.Namespace) -> int:
    """`run status`: one run's status, as text or JSON (`--json`)."""
    if args.json:
        say(json_text(asdict(status)))
        return 0
    say(line(status) + (f": {status.why}" if status.why else ""))
    for name, count in status.machines.items():
        say(f"  {name:<44} {count} in service (min..desired..max {status.sizes[name]})")
    if status.leaving:
        say(f"  {status.leaving} machine(s) leaving: publishing their emergency checkpoint")
    say(
        f"  spend ${status.spend_usd:,.2f} (on-demand equivalent ${status.on_demand_usd:,.2f}); "
        f"{status.crashes} crash(es); last interruption: {status.last_interruption or 'none'}"
    )
    if status.last_crash:
        say(f"  last crash: {status.last_crash}")
    if status.epoch:
        say(f"  trains in {status.trains_in} (epoch {status.epoch}, moved there from step "
            f"{status.moved_from_step}): writers elsewhere are fenced")  # fmt: skip
    if status.step is not None:
        loss = f", loss {status.loss:.4f}" if status.loss is not None else ""
        say(f"  head: step {status.step}{loss}, published {status.head_at}: "
            f"{status.head_manifest}")  # fmt: skip
    pace = (f"{status.steps_per_hour:,.0f} steps/h" if status.steps_per_hour
            else "pace unknown until two checkpoints of one start")  # fmt: skip
    eta = f"; ETA {status.eta}" if status.eta else ""
    late = status.eta is not None and status.finish_by is not None and (
        instant(status.eta) > instant(status.finish_by))  # fmt: skip
    deadline = (f"; deadline {status.finish_by}{' (late at this pace)' if late else ''}, "
                f"decided by {status.decided_by}" if status.finish_by else "")  # fmt: skip
    say(f"  {pace}{eta}{deadline}")
    return 0


def undeployed(where: Where, env: str, run: str, cap_usd: float | None) -> RunStatus:
    """A run declared but not deployed: never yet (`declared`), or no longer (`retired`, with
    what its ledger says it cost)."""
    from spotrain.core import spend_ledger

    spent = spend_ledger.read(where.events, run)
    retired = spent.as_of is not None
    why = (f"its stack was retired; `spotrain run submit {env} {run}` deploys it again"
           if retired else f"its stack is not deployed: `spotrain run submit {env} {run}` (or "
           "merging its pull request) deploys it")  # fmt: skip
    return RunStatus(run=run, phase="retired" if retired else "declared", why=why, step=None,
                     final=False, machines={}, sizes={}, spend_usd=round(spent.spend_usd, 2),
                     on_demand_usd=round(spent.on_demand_usd, 2), cap_usd=cap_usd, crashes=0,
                     last_interruption=None)  # fmt: skip


def settle_spend(where: Where, run: str) -> Any:
    """The run's machine time since the last capacity check, counted now (terminated machines
    included); its ledger as it then stands."""
    from spotrain.core import aws_clients, prices, spend_ledger
    from spotrain.core.handler_settings import EVENT_RETENTION_DAYS

    return spend_ledger.count(
        where.events, run, regions=[where.region],
        ec2_for=lambda region: aws_clients.client("ec2", region),
        pricing=aws_clients.client("pricing", prices.PRICE_LIST_REGION),
        now=time.time(), retention_days=EVENT_RETENTION_DAYS,
    ).ledger  # fmt: skip
