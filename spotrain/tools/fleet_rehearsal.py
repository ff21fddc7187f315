"""The fleet rehearsal: one run on several machines booted from what `deploy local` created.

1. prepare a dataset with `spotrain data prepare` into the deployed bucket, and store the
   run's configuration there with `spotrain config put`;
2. the handler's capacity check starts the deployed fleet group (deployed empty) now that the
   configuration is stored; scale it to 3 and play each of its instances on this host
   (`spotrain.localcloud.machines`): the deployed launch template's user data, then
   bootstrap.sh; the on-demand one claims the coordinator role, the spot ones find it in the
   fleet state, and all three train the run together and publish into the deployed catalog;
3. send one spot machine its interruption notice (the metadata service, and the EventBridge
   event to the deployed handler's code): every rank checkpoints after the same step, the
   machine leaves and marks itself reclaimed, the other two re-form the group and go on;
4. the Auto Scaling group replaces the reclaimed instance; the replacement boots and joins
   the running group, which checkpoints and re-forms with three machines again (the run is
   held after a step while the machines it waits for boot: `failpoints.hold`);
5. report steps lost, notice to published, time to re-form and to join, every step's loss
   against one process that trained the same run uninterrupted with the same global batch,
   and the fleet's spend (the handler's scheduled check at the start, after the reclaim and
   at the end, priced by the local cloud's price book);
6. once the run publishes its final step, the catalog's stream reaches the deployed handler
   (run by the local cloud from the deployed zip), which takes the groups to 0: no machine in
   service after the next check, and the ledger stays where it is.

Run by `spotrain rehearse --fleet`, and by the tests on their own deployment.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotrain.core.capacity import ON_DEMAND, SPOT
from spotrain.localcloud import control
from spotrain.localcloud.machines import (
    LocalMachine,
    deployed_user_data,
    in_service,
    on_demand_first,
)
from spotrain.tools.rehearsal import (
    Phase,
    RehearsalFailed,
    Trainer,
    deliver_capacity_check,
    deliver_interruption,
    prices_from,
    spend_line,
)
from spotrain.trainer.failpoints import HOLD_VARIABLE

MACHINES = 3
# Tiny, so three machines share a laptop's cores. The run is held (failpoints.hold) while the
# machines it waits for boot, first the three, then the replacement: however fast this host
# boots them, the replacement joins with steps to go (about 40 of them).
MODEL = {"context": 32, "layers": 2, "heads": 2, "width": 64}
STEPS = 80
GLOBAL_BATCH = 6  # splits over 3 and 2 machines alike
CHECKPOINT_EVERY = 25
INTERRUPT_AFTER_STEP = 15
JOIN_AFTER_STEPS = 5
"""Steps the smaller group trains before the replacement boots."""
LOSS_TOLERANCE = 1e-5
"""Relative: a group of another size sums the same batch in another order."""
DATASET = "rehearsal-corpus"
FINISH_WAIT_S = 60
"""How long the catalog's stream may take to reach the handler after the final publish."""
TIMEOUT_S = 600


@dataclass(frozen=True)
class Finish:
    """What became of the fleet once the run published its final step."""

    by_stream: bool
    """The catalog's stream told the deployed handler (before any capacity check)."""
    seconds: float
    """From the last machine's exit to the run marked finished."""
    in_service: int
    """Machines in service after the next capacity check."""
    ledger_usd: tuple[float, float]
    """The spend ledger one and two checks after the finish."""


@dataclass
class FleetReport:
    run: str
    launch_template: str
    machines: dict[str, str]
    """instance id -> what became of it"""
    worlds: list[tuple[int, int]]
    """(first step, machines) of every group the run formed, in order"""
    reclaimed_stop: int
    reclaimed_resume: int
    notice_to_published_s: float
    reform_s: float
    join_stop: int
    join_resume: int
    join_s: float
    handler: dict[str, Any]
    crashes: int
    head_step: int
    max_loss_difference: float
    steps_compared: int
    finish: Finish
    spend: str = "not counted"
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def finish_seen_by(self) -> str:
        return "the catalog stream" if self.finish.by_stream else "the capacity check"

    def render(self) -> str:
        sizes = " -> ".join(f"{n} (from step {s})" for s, n in self.worlds)
        lines = [
            "fleet rehearsal report",
            f"  machines                      {len(self.machines)} from the deployed launch "
            f"template {self.launch_template}",
            *(f"    {instance:<28}{fate}" for instance, fate in self.machines.items()),
            f"  groups the run formed         {sizes}",
            f"  steps lost to the reclaim     {self.reclaimed_stop - self.reclaimed_resume} "
            f"(stopped after step {self.reclaimed_stop}, resumed from step "
            f"{self.reclaimed_resume})",
            f"  notice to published           {self.notice_to_published_s:.1f} s",
            f"  re-formed without it          {self.reform_s:.1f} s (published to the smaller "
            "group's start)",
            f"  handler                       {self.handler['decision']}: "
            f"{self.handler['reason']}",
            f"  replacement joined            {self.join_s:.1f} s after it booted; steps lost "
            f"{self.join_stop - self.join_resume}",
            f"  crashes counted               {self.crashes}",
            f"  published head                step {self.head_step}",
            f"  losses                        {self.steps_compared} steps, each within "
            f"{self.max_loss_difference:.1e} (relative) of the uninterrupted run's",
            f"  after the final step          {self.finish_seen_by} marked the run finished "
            f"{self.finish.seconds:.1f} s after the last exit; "
            f"{self.finish.in_service} machine(s) in service after the next check; ledger "
            f"${self.finish.ledger_usd[0]:,.4f} then ${self.finish.ledger_usd[1]:,.4f}",
            f"  spend                         {self.spend}",
            *(f"  PROBLEM: {p}" for p in self.problems),
        ]  # fmt: skip
        return "\n".join(lines)


class FleetRehearsal:
    def __init__(
        self, work: Path, *, say: Callable[[str], None] = print, price_book: Path | None = None
    ) -> None:
        # price_book: the prices the local cloud answers with (None: the snapshot).
        self.work, self.say, self.price_book = work, say, price_book
        self.machines: list[LocalMachine] = []
        self._hold = work / "hold"
        """While this file exists the run's ranks wait after each step (failpoints.hold)."""

    def run(self, *, keep_cloud: bool, port: int = control.DEFAULT_PORT) -> FleetReport:
        """Deploy `local` (starting the local cloud if needed), then `story`."""
        from spotrain.tools.rehearsal import Rehearsal, local_cloud

        with local_cloud(port=port, keep_cloud=keep_cloud, say=self.say) as cloud:
            self.say(f"[1/5] local cloud at {cloud.endpoint}; deploying the `local` environment")
            corpus = self._corpus()
            reference = self._start_reference(corpus)  # alongside the deploy
            outputs = Rehearsal(self.work, say=self.say).deploy(cloud.endpoint)
            return self.story(cloud, outputs, corpus=corpus, reference=reference)

    def story(
        self, cloud: control.RunningCloud, outputs: dict[str, Any], *,
        corpus: Path | None = None, reference: tuple[Phase, Trainer] | None = None,
    ) -> FleetReport:  # fmt: skip
        """The rehearsal on a deployed `local` environment (`outputs`: its stacks' outputs and
        its configuration under "config")."""
        corpus = corpus or self._corpus()
        if reference is None:
            reference = self._start_reference(corpus)
        try:
            with prices_from(self.price_book):
                return self._story(cloud, outputs, corpus, reference)
        finally:
            self._hold.unlink(missing_ok=True)  # a rehearsal that failed holding leaves none
            for machine in self.machines:
                machine.stop()
            reference[1].stop()

    # --- the story -----------------------------------------------------------------------
    def _story(
        self, cloud: control.RunningCloud, outputs: dict[str, Any], corpus: Path,
        reference: tuple[Phase, Trainer],
    ) -> FleetReport:  # fmt: skip
        from spotrain.core import fleet_state
        from spotrain.trainer.catalog import DynamoCatalog
        from spotrain.trainer.storage import LocalStorage

        config = outputs["config"]
        region, run = config.primary_region, outputs["run"].name
        bucket, group = outputs["checkpoint_bucket"], outputs["fleet_group"]
        aws_env = control.aws_environment(cloud.endpoint, region)
        dynamodb = control.client("dynamodb", cloud.endpoint, region)
        catalog = DynamoCatalog(outputs["checkpoint_catalog_table"], run, LocalStorage(self.work),
                                client=dynamodb)  # fmt: skip
        if catalog.head() is not None:
            raise RehearsalFailed(
                f"run `{run}` already has checkpoints on this local cloud (an earlier "
                "rehearsal's): stop it with `spotrain local down` and rehearse again"
            )
        self.say(f"[2/5] dataset and configuration for run `{run}` into s3://{bucket}")
        self._cli(["data", "prepare", str(corpus), "--store", f"s3://{bucket}",
                   "--name", DATASET, "--shard-tokens", "40000"], aws_env)  # fmt: skip
        metrics = Phase("fleet", self.work / "fleet.jsonl")
        definition = {
            "run": run, "store": f"s3://{bucket}", "data": f"dataset:{DATASET}",
            "work_dir": "/set/by/each/machine", "model": MODEL, "steps": STEPS,
            "global_batch": GLOBAL_BATCH, "checkpoint_every": CHECKPOINT_EVERY,
            "log_every": 50, "seed": 11, "spot_notice_poll_seconds": 0.2,
            "metrics_file": str(metrics.metrics),  # one host: whichever machine is rank 0
        }  # fmt: skip
        (self.work / "fleet-run.json").write_text(json.dumps(definition))
        self._cli(["config", "put", str(self.work / "fleet-run.json"),
                   "--store", f"s3://{bucket}"], aws_env)  # fmt: skip

        autoscaling = control.client("autoscaling", cloud.endpoint, region)
        ec2 = control.client("ec2", cloud.endpoint, region)

        def check() -> dict[str, Any]:
            return deliver_capacity_check(cloud, outputs["handler_function"], region, run)

        # The groups were deployed empty: the handler's check starts them now that the run's
        # configuration is stored (and the spend ledger starts counting their time).
        started = check()
        if not in_service(autoscaling, group)[0]:
            raise RehearsalFailed(f"the capacity check did not start {group}: "
                                  f"{started['decision']}: {started['reason']}")  # fmt: skip
        self._indented(f"capacity check: {started['decision']}: {started['reason']}")
        # Three machines rather than the declared two, as `spotrain fleet scale` asks.
        autoscaling.set_desired_capacity(
            AutoScalingGroupName=group, DesiredCapacity=MACHINES, HonorCooldown=False
        )
        members, launch_template = in_service(autoscaling, group)
        if len(members) < MACHINES:
            raise RehearsalFailed(f"{group} has {len(members)} instances, not {MACHINES}")
        user_data = deployed_user_data(ec2, launch_template)
        port = control.free_port()
        self._hold.touch()
        self.say(f"[3/5] {MACHINES} instances of the group {group} boot from the launch "
                 f"template {launch_template}: one on-demand (the run's coordinator), the "
                 "others spot")  # fmt: skip
        # Each on the market EC2 launched it on: the on-demand one coordinates.
        for member, market in on_demand_first(ec2, members[:MACHINES]):
            self._boot(member, market, user_data, aws_env, port,
                       outputs["run"].instance_types[0], launch_template)  # fmt: skip
        if [m.lifecycle for m in self.machines] != [ON_DEMAND] + [SPOT] * (MACHINES - 1):
            raise RehearsalFailed(
                f"{group} launched {[m.lifecycle for m in self.machines]}, not one on-demand "
                "machine and spot ones (its on-demand base capacity is 1)"
            )
        coordinator, reclaimed = self.machines[0], self.machines[-1]
        # The notice waits for the group of all three: on a busy host a machine may boot after
        # the first rendezvous closed, and torchrun admits it at the next one. Until then the
        # run is held (each machine's first group after its first step).
        self._wait(lambda: _trained_as_one_group(metrics, MACHINES, 0), metrics)
        self._hold.unlink()
        self._wait(lambda: _trained_as_one_group(metrics, MACHINES, INTERRUPT_AFTER_STEP),
                   metrics)  # fmt: skip

        self.say(f"[4/5] spot interruption notice for {reclaimed.instance_id}")
        noticed_at = time.time()
        reclaimed.announce_interruption()
        handled = deliver_interruption(cloud, outputs["handler_function"],
                                       reclaimed.instance_id, region, self._indented)  # fmt: skip
        reclaimed_code = reclaimed.wait(timeout=TIMEOUT_S)
        reclaimed.stop()
        # EC2 takes the instance back; the group launches a replacement.
        autoscaling.terminate_instance_in_auto_scaling_group(
            InstanceId=reclaimed.instance_id, ShouldDecrementDesiredCapacity=False
        )
        check()  # the reclaimed machine's time ends with it
        stopped = [e for e in metrics.events("stopped") if e["at"] >= noticed_at]
        if not stopped:
            raise RehearsalFailed(
                f"no checkpoint on the notice: {reclaimed.instance_id} exited {reclaimed_code}; "
                f"the end of its boot log ({reclaimed.root}/boot.log):\n"
                + "\n".join(reclaimed.output.splitlines()[-15:])
            )
        reclaim_stop = int(stopped[-1]["step"])
        self._wait(lambda: max(metrics.losses(), default=0) >= reclaim_stop + JOIN_AFTER_STEPS,
                   metrics)  # fmt: skip

        known = {m.instance_id for m in self.machines}
        replacement = next(
            (m for m in in_service(autoscaling, group)[0] if m["InstanceId"] not in known), None
        )
        if replacement is None:
            raise RehearsalFailed(f"{group} launched no replacement for the reclaimed instance")
        self.say(f"[5/5] the group's replacement {replacement['InstanceId']} boots and joins "
                 "(the run is held meanwhile)")  # fmt: skip
        self._hold.touch()
        joined_at = time.time()
        [(_, market)] = on_demand_first(ec2, [replacement])
        joiner = self._boot(replacement, market, user_data, aws_env, port,
                            outputs["run"].instance_types[0], launch_template)  # fmt: skip
        self._wait(lambda: _trained_as_one_group(metrics, MACHINES, 0), metrics)
        self._hold.unlink()
        codes = {m.instance_id: m.wait(timeout=TIMEOUT_S) for m in self.machines
                 if m is not reclaimed}  # fmt: skip
        codes[reclaimed.instance_id] = reclaimed_code

        reference_phase, reference_trainer = reference
        reference_trainer.finish()
        table = control.resource("dynamodb", cloud.endpoint, region).Table(outputs["events_table"])
        finish = self._after_the_finish(table, run, check,
                                        lambda: len(in_service(autoscaling, group)[0]))  # fmt: skip
        head = catalog.head()
        return self._report(
            run=run, launch_template=launch_template, metrics=metrics,
            expected=reference_phase.losses(), codes=codes, reclaimed=reclaimed,
            coordinator=coordinator, joiner=joiner, noticed_at=noticed_at, joined_at=joined_at,
            handled=handled, finish=finish,
            crashes=fleet_state.run_state(table, run).crashes,
            head_step=head.step if head else 0,
            spend=spend_line(cloud, outputs["events_table"], region, run),
        )  # fmt: skip

    def _report(
        self, *, run: str, launch_template: str, metrics: Phase, expected: dict[int, float],
        codes: dict[str, int], reclaimed: LocalMachine, coordinator: LocalMachine,
        joiner: LocalMachine, noticed_at: float, joined_at: float, handled: dict[str, Any],
        finish: Finish, crashes: int,
        head_step: int,
        spend: str,
    ) -> FleetReport:  # fmt: skip
        problems = []
        starts = metrics.events("started")
        while starts and int(starts[0]["world"]) < MACHINES:  # formed before the last booted
            starts.pop(0)
        stops = [s for s in metrics.events("stopped") if starts and s["at"] >= starts[0]["at"]]
        worlds = [(int(s["step"]), int(s["world"])) for s in starts]
        if [n for _, n in worlds] != [MACHINES, MACHINES - 1, MACHINES]:
            problems.append(f"the run formed groups of {[n for _, n in worlds]} machines, not "
                            f"{MACHINES}, then {MACHINES - 1}, then {MACHINES}")  # fmt: skip
        if len(stops) < 2 or len(starts) < 3:
            raise RehearsalFailed(f"the run stopped {len(stops)} and started {len(starts)} "
                                  f"times; see the boot logs under {self.work}")  # fmt: skip
        trained = metrics.losses()
        if sorted(trained) != sorted(expected):
            problems.append(f"steps trained {min(trained)}..{max(trained)} ({len(trained)}) "
                            f"differ from the uninterrupted run's ({len(expected)})")  # fmt: skip
        differences = [abs(trained[s] - expected[s]) / abs(expected[s])
                       for s in expected if s in trained]  # fmt: skip
        worst = max(differences, default=float("inf"))
        if worst > LOSS_TOLERANCE:
            problems.append(f"losses differ from the uninterrupted run's by up to {worst:.1e}")
        fates = {}
        for machine in self.machines:
            code = codes.get(machine.instance_id)
            part = ("coordinator, " if machine is coordinator
                    else "replacement, " if machine is joiner else "")  # fmt: skip
            role = part + machine.lifecycle
            if machine is reclaimed:
                fate = "reclaimed: left after its emergency checkpoint, counted as preempted"
                if "preempted" not in machine.output:
                    problems.append(f"{machine.instance_id}'s exit was not counted as preempted")
            else:
                fate = f"finished (exit {code})"
                if code != 0:
                    problems.append(f"{machine.instance_id} exited {code}; see {machine.root}")
            fates[machine.instance_id] = f"{role}: {fate}"
        if crashes:
            problems.append(f"{crashes} crash(es) counted for run {run}")
        if head_step != STEPS:
            problems.append(f"the catalog's head is step {head_step}, not {STEPS}")
        if finish.in_service:
            problems.append(f"{finish.in_service} machine(s) still in service after the run "
                            "finished and the next capacity check")  # fmt: skip
        if finish.ledger_usd[0] != finish.ledger_usd[1]:
            problems.append(f"the ledger grew after the finish: ${finish.ledger_usd[0]:.4f} -> "
                            f"${finish.ledger_usd[1]:.4f}")  # fmt: skip
        reclaim_stop, join_stop = stops[0], stops[1]
        return FleetReport(
            run=run, launch_template=launch_template, machines=fates, worlds=worlds,
            reclaimed_stop=int(reclaim_stop["step"]), reclaimed_resume=int(starts[1]["step"]),
            notice_to_published_s=float(reclaim_stop["at"]) - noticed_at,
            reform_s=float(starts[1]["at"]) - float(reclaim_stop["at"]),
            join_stop=int(join_stop["step"]), join_resume=int(starts[2]["step"]),
            join_s=float(starts[2]["at"]) - joined_at, handler=handled, crashes=crashes,
            head_step=head_step, max_loss_difference=worst, steps_compared=len(differences),
            finish=finish, spend=spend, problems=problems,
        )  # fmt: skip

    def _after_the_finish(
        self, table: Any, run: str, check: Callable[[], dict[str, Any]],
        in_service: Callable[[], int],
    ) -> Finish:  # fmt: skip
        """The run published its final step: the catalog's stream reaches the deployed handler
        (run by the local cloud from the deployed zip), which takes the groups to 0; then two
        capacity checks, between which the ledger must not move."""
        from spotrain.core import run_lifecycle, spend_ledger

        exited = time.monotonic()
        waited_until = exited + FINISH_WAIT_S
        while run_lifecycle.read(table, run).finished_step is None:
            if time.monotonic() > waited_until:
                break
            time.sleep(0.2)
        by_stream = run_lifecycle.read(table, run).finished_step is not None
        took = time.monotonic() - exited
        self.say(f"      run {run} finished: its groups go to 0 "
                 f"({'catalog stream' if by_stream else 'not seen on the stream'})")  # fmt: skip
        check()
        first = spend_ledger.read(table, run).spend_usd
        remaining = in_service()
        check()
        return Finish(by_stream=by_stream, seconds=took, in_service=remaining,
                      ledger_usd=(first, spend_ledger.read(table, run).spend_usd))  # fmt: skip

    # --- helpers -------------------------------------------------------------------------
    def _indented(self, message: str) -> None:
        self.say(f"      {message.strip()}")

    def _cli(self, argv: list[str], aws_env: dict[str, str] | None = None) -> None:
        """`spotrain ARGV` as a user runs it: its own process, the local cloud's settings."""
        import os
        import subprocess
        import sys

        done = subprocess.run(
            [sys.executable, "-m", "spotrain.cli", *argv], capture_output=True, text=True,
            env={**os.environ, **(aws_env or {})}, timeout=TIMEOUT_S,
        )  # fmt: skip
        if done.returncode != 0:
            raise RehearsalFailed(f"`spotrain {' '.join(argv)}` failed: "
                                  f"{(done.stderr or done.stdout).strip()[-2000:]}")  # fmt: skip

    def _corpus(self) -> Path:
        from spotrain.trainer.data import synthetic_corpus

        corpus = self.work / "corpus.txt"
        if not corpus.exists():
            corpus.parent.mkdir(parents=True, exist_ok=True)
            corpus.write_bytes(synthetic_corpus(120_000))
        return corpus

    def _start_reference(self, corpus: Path) -> tuple[Phase, Trainer]:
        """One process, the whole global batch, the same dataset prepared into a folder."""
        import os
        import sys

        store = f"file://{self.work / 'uninterrupted-store'}"
        self._cli(["data", "prepare", str(corpus), "--store", store, "--name", DATASET,
                   "--shard-tokens", "40000"])  # fmt: skip
        phase = Phase("uninterrupted", self.work / "uninterrupted.jsonl")
        fields = {
            "run": "uninterrupted", "store": store, "data": f"dataset:{DATASET}", "model": MODEL,
            "steps": STEPS, "micro_batch": GLOBAL_BATCH, "checkpoint_every": STEPS,
            "seed": 11, "metrics_file": str(phase.metrics),
            "work_dir": str(self.work / "uninterrupted-work"),
        }  # fmt: skip
        path = self.work / "uninterrupted.json"
        path.write_text(json.dumps(fields))
        command = [sys.executable, "-m", "spotrain.cli", "train", str(path),
                   "--nproc-per-node", "1"]  # fmt: skip
        return phase, Trainer(command, dict(os.environ), self.work / "uninterrupted.log", None)

    def _boot(
        self, member: dict[str, Any], lifecycle: str, user_data: str, aws_env: dict[str, str],
        port: int, default_type: str, launch_template: str,
    ) -> LocalMachine:  # fmt: skip
        machine = LocalMachine.of_member(
            member, lifecycle=lifecycle, root=self.work / "machines", user_data=user_data,
            aws_env=aws_env, rdzv_port=port, default_type=default_type,
            launch_template=launch_template,
            settings={"SPOTRAIN_RDZV_LAST_CALL": "10", HOLD_VARIABLE: str(self._hold)},
        )  # fmt: skip
        self.machines.append(machine)
        self._indented(f"{machine.instance_id} ({lifecycle}) boots")
        return machine.start()

    def _wait(self, condition: Callable[[], bool], metrics: Phase) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while not condition():
            if not any(m.running() for m in self.machines):
                raise RehearsalFailed(f"every machine stopped; see their boot logs under "
                                      f"{self.work / 'machines'}")  # fmt: skip
            if time.monotonic() > deadline:
                raise RehearsalFailed(f"no progress in {TIMEOUT_S} s; see {metrics.metrics}")
            time.sleep(0.2)


def _trained_as_one_group(metrics: Phase, machines: int, steps: int) -> bool:
    """Whether the run's latest start formed a group of `machines` and has trained `steps`
    steps since."""
    records = metrics.records()  # one read of the file for both questions
    starts = [r for r in records if r.get("event") == "started"]
    if not starts or int(starts[-1]["world"]) != machines:
        return False
    trained = max((r["step"] for r in records if "loss" in r), default=0)
    return trained >= int(starts[-1]["step"]) + steps
