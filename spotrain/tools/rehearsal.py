"""The rehearsal: the whole story of a spot run on the local cloud, in one command.

1. bring up the local cloud and deploy the `local` environment; store the environment run's
   configuration, so the handler's capacity check starts the run's fleet (deployed empty);
2. train a small GPT on CPU, checkpointing to the local S3 with the DynamoDB catalog;
3. announce a spot interruption (the local IMDS endpoint, and the EventBridge event to the
   deployed handler's code with its deployed configuration): the trainer publishes an
   emergency checkpoint and exits, the handler records, marks and requeues;
4. restart: the run resumes from the published checkpoint;
5. take the primary region down and move the run to the replica region (its catalog copy
   claims the run's next epoch from a checkpoint whose every piece replicated), then finish
   there, fenced;
6. report steps lost, notice-to-published seconds, restore seconds, bytes uploaded against a
   full upload of every checkpoint, the final loss against an uninterrupted run's, and the
   spend of the deployed fleet's machines over the story (the handler's scheduled capacity
   check, run at the start and the end, priced by the local cloud's price book).

Run by `spotrain rehearse` (and `make local`).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotrain.core import events
from spotrain.core.errors import SpotrainError
from spotrain.localcloud import control

# Small enough for a laptop CPU, big enough that a step outlasts the notice poll several times.
MODEL = {"context": 64, "layers": 4, "heads": 4, "width": 128}
STEPS = 30
INTERRUPT_AFTER_STEP = 6
REGION_LOSS_AT_STEP = 20
CHECKPOINT_EVERY = 5
TRAINER_TIMEOUT_S = 600
# Lines of the trainer's output worth showing while it runs.
SHOWN = ("step ", "published", "stopped", "restored", "resum", "spot ", "rolled", "no checkpoint")


class RehearsalFailed(SpotrainError):
    """A step of the rehearsal did not do what it must."""


@dataclass
class Phase:
    name: str
    metrics: Path

    def records(self) -> list[dict[str, Any]]:
        if not self.metrics.exists():
            return []
        return [json.loads(line) for line in self.metrics.read_text().splitlines() if line]

    def losses(self) -> dict[int, float]:
        return {r["step"]: r["loss"] for r in self.records() if "loss" in r}

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("event") == kind]


@dataclass(frozen=True)
class Report:
    steps: int
    stopped_at: int
    resumed_from: int
    notice_to_published_s: float
    replica_step: int
    primary_head_step: int
    restore_s: float
    uploaded_bytes: int
    full_bytes: int
    final_loss: float
    reference_loss: float
    max_loss_difference: float
    handler: dict[str, Any]
    spend: str = "not counted"
    move: str = "not measured"
    """The move to the replica region: how soon the run trained there, and what it sent."""

    @property
    def steps_lost(self) -> int:
        return self.stopped_at - self.resumed_from

    @property
    def committed_work_lost(self) -> int:
        return self.primary_head_step - self.replica_step

    def render(self) -> str:
        identical = self.max_loss_difference == 0.0
        lines = [
            "rehearsal report",
            f"  steps lost to preemption      {self.steps_lost} (stopped at step "
            f"{self.stopped_at}, resumed from step {self.resumed_from})",
            f"  notice to published           {self.notice_to_published_s:.1f} s",
            f"  handler                       {self.handler['decision']}: "
            f"{self.handler['reason']}",
            f"  committed work lost           {self.committed_work_lost} steps (primary head "
            f"{self.primary_head_step}, replica restored step {self.replica_step})",
            f"  restore from replica region   {self.restore_s:.1f} s (every shard checked)",
            f"  move                          {self.move}",
            f"  bytes uploaded vs full        {self.uploaded_bytes:,} of {self.full_bytes:,} "
            f"({self.uploaded_bytes / max(self.full_bytes, 1):.0%}; unchanged shards reused)",
            f"  final loss (step {self.steps})         {self.final_loss:.6f} vs uninterrupted "
            f"{self.reference_loss:.6f}: "
            + ("identical at every step" if identical
               else f"differs by up to {self.max_loss_difference:.2e}"),
            f"  spend                         {self.spend}",
        ]  # fmt: skip
        return "\n".join(lines)

    @property
    def passed(self) -> bool:
        return (
            self.steps_lost == 0
            and self.committed_work_lost == 0
            and (self.max_loss_difference == 0.0)
        )


class Rehearsal:
    def __init__(
        self, work: Path, *, say: Callable[[str], None] = print, price_book: Path | None = None
    ) -> None:
        # price_book: the prices the local cloud answers with (None: the snapshot).
        self.work, self.say, self.price_book = work, say, price_book

    # --- the steps -----------------------------------------------------------------------
    def run(self, *, keep_cloud: bool, port: int = control.DEFAULT_PORT) -> Report:
        """Deploy `local` (starting the local cloud if needed), then `story`."""
        with local_cloud(port=port, keep_cloud=keep_cloud, say=self.say) as cloud:
            self.say(f"[1/6] local cloud at {cloud.endpoint}; deploying the `local` environment")
            with self._reference_run() as reference:  # alongside the deploy
                outputs = self.deploy(cloud.endpoint)
                return self.story(cloud, outputs, reference=reference)

    def story(
        self, cloud: control.RunningCloud, outputs: dict[str, Any], *,
        reference: tuple[Phase, Trainer] | None = None, run: str | None = None,
    ) -> Report:  # fmt: skip
        """Steps 2 to 6 on a deployed `local` environment (`outputs`: its stacks' outputs and
        its configuration under "config"); `run` defaults to the environment's."""
        try:
            with prices_from(self.price_book):
                if reference is not None:
                    return self._story(cloud, outputs, reference, run)
                with self._reference_run() as started:
                    return self._story(cloud, outputs, started, run)
        finally:
            control.set_faults(regions_down=[], replication_pending=[])

    def deploy(self, endpoint: str) -> dict[str, Any]:
        """Apply the `local` environment; its stacks' outputs, and its configuration under
        "config"."""
        from spotrain.tools import deploy

        config = deploy.local_environment_ready(endpoint)
        out = self.work / "cdktf.out"
        deploy.synth(out, local_endpoint=endpoint, only=config.name)
        began = time.monotonic()
        deployment = deploy.Deployment(config=config, outdir=out, log=self._indented)
        results = deployment.apply()
        outputs = deploy.outputs_of(config, results)
        self.say(f"      {sum(len(r.resources) for r in results)} resources applied in "
                 f"{time.monotonic() - began:.0f} s")  # fmt: skip
        return outputs

    def _story(
        self,
        cloud: control.RunningCloud,
        outputs: dict[str, Any],
        reference: tuple[Phase, Trainer],
        run: str | None,
    ) -> Report:
        from spotrain.localcloud.imds import LocalMetadataService

        config = outputs["config"]
        primary, replica = config.region_names[:2]
        keys = {
            region: control.client("kms", cloud.endpoint, region).describe_key(KeyId=alias)[
                "KeyMetadata"
            ]["Arn"]
            for region, alias in outputs["key_aliases"].items()
        }
        replica_bucket = outputs["checkpoint_buckets"][replica]
        run = run or outputs["run"].name
        settings = {**self._settings(), "run": run}
        # The fleet is deployed empty: as a user does, store the environment run's
        # configuration; the handler's capacity check then starts the run's groups, and its
        # checks count the fleet's machine time from there.
        self._store_configuration(cloud, outputs, {**settings, "run": outputs["run"].name,
                                                   "steps": STEPS}, keys[primary])  # fmt: skip
        deliver_capacity_check(cloud, outputs["handler_function"], primary)
        instance = self._fleet_instance(cloud, outputs["fleet_group"], primary)
        on_primary = {
            **settings,
            "store": f"s3://{outputs['checkpoint_bucket']}",
            "catalog_table": outputs["checkpoint_catalog_table"],
            "kms_key_id": keys[primary],
        }
        self.say(f"[2/6] training run `{run}` on CPU: {STEPS} steps, checkpoints every "
                 f"{CHECKPOINT_EVERY} to s3://{outputs['checkpoint_bucket']}")  # fmt: skip
        first = Phase("first", self.work / "first.jsonl")
        with LocalMetadataService(instance_id=instance, availability_zone=f"{primary}b") as imds:
            trainer = self._start(first, {**on_primary, "steps": REGION_LOSS_AT_STEP,
                                          "spot_notice_endpoint": imds.endpoint,
                                          "spot_notice_poll_seconds": 0.2},
                                  region=primary)  # fmt: skip
            self._wait_for(trainer, lambda: max(first.losses(), default=0) >= INTERRUPT_AFTER_STEP)
            self.say(f"[3/6] spot interruption notice for {instance} (IMDS, and the "
                     "EventBridge event to the handler)")  # fmt: skip
            imds.announce_interruption()
            handled = deliver_interruption(
                cloud, outputs["handler_function"], instance, primary, self._indented
            )
            trainer.finish()
        # EC2 takes the instance back (its spend ends with it); the group launches another.
        autoscaling = control.client("autoscaling", cloud.endpoint, primary)
        autoscaling.terminate_instance_in_auto_scaling_group(
            InstanceId=instance, ShouldDecrementDesiredCapacity=False
        )
        stopped = first.events("stopped")
        if not stopped:
            raise RehearsalFailed(f"the trainer did not stop on the notice; see {trainer.log}")
        stopped_at = int(stopped[-1]["step"])
        self.say("[4/6] restarting: the run resumes from the published checkpoint")
        second = Phase("second", self.work / "second.jsonl")
        self._start(second, {**on_primary, "steps": REGION_LOSS_AT_STEP}, region=primary).finish()
        resumed_from = min(second.losses()) - 1
        head_step = int(second.events("published")[-1]["step"])
        self.say(f"[5/6] primary region {primary} down; the run moves to the replica region "
                 f"{replica}")  # fmt: skip
        control.set_faults(regions_down=[primary])
        down_at = time.time()
        replica_step, restore_s = self._move_to_replica(
            cloud, replica_bucket, replica, run, outputs["checkpoint_catalog_table"]
        )
        on_replica = {
            **settings, "store": f"s3://{replica_bucket}", "kms_key_id": keys[replica],
            "catalog_table": outputs["checkpoint_catalog_table"], "steps": STEPS,
        }  # fmt: skip
        third = Phase("third", self.work / "third.jsonl")
        self._start(third, on_replica, region=replica).finish()
        self.say("[6/6] finished; the primary region is back; comparing with the uninterrupted "
                 "run")  # fmt: skip
        control.set_faults(regions_down=[])
        # The spend so far, counted by the handler of the region the environment's run trains
        # in now (it keeps the run's ledger): the replica's once this story moved that run.
        trains_in = replica if run == outputs["run"].name else primary
        deliver_capacity_check(cloud, outputs["handler_function"], trains_in)
        reference_phase, reference_trainer = reference
        reference_trainer.finish()
        combined = {**first.losses(), **second.losses(), **third.losses()}
        expected = reference_phase.losses()
        if sorted(combined) != sorted(expected):
            raise RehearsalFailed(
                f"steps trained {sorted(combined)} differ from the uninterrupted run's "
                f"{sorted(expected)}"
            )
        published = first.events("published") + second.events("published")
        at_home = sum(int(p["uploaded_bytes"]) for p in published)
        published += third.events("published")
        uploaded = sum(int(p["uploaded_bytes"]) for p in published)
        reused = sum(int(p["reused_bytes"]) for p in published)
        return Report(
            steps=STEPS, stopped_at=stopped_at, resumed_from=resumed_from,
            notice_to_published_s=float(stopped[-1]["notice_to_published_s"]),
            replica_step=replica_step, primary_head_step=head_step, restore_s=restore_s,
            uploaded_bytes=uploaded, full_bytes=uploaded + reused,
            final_loss=combined[STEPS], reference_loss=expected[STEPS],
            max_loss_difference=max(abs(combined[s] - expected[s]) for s in expected),
            handler=handled,
            spend=spend_line(cloud, outputs["events_table"], trains_in, outputs["run"].name),
            move=move_line(primary, replica, float(third.events("restored")[0]["at"]) - down_at,
                           at_home),
        )  # fmt: skip

    # --- helpers -------------------------------------------------------------------------
    def _indented(self, message: str) -> None:
        self.say(f"      {message.strip()}")

    def _settings(self) -> dict[str, Any]:
        from spotrain.trainer.data import synthetic_corpus, write_token_file

        corpus = self.work / "data" / "corpus.bin"
        if not corpus.exists():
            corpus = write_token_file(corpus.with_suffix(""), synthetic_corpus(200_000))
        return {
            "run": "rehearsal", "data": str(corpus), "model": MODEL,
            "checkpoint_every": CHECKPOINT_EVERY, "micro_batch": 4, "log_every": 5, "seed": 7,
        }  # fmt: skip

    def _store_configuration(
        self, cloud: control.RunningCloud, outputs: dict[str, Any], fields: dict[str, Any],
        key: str,
    ) -> None:  # fmt: skip
        """`spotrain config put`: the run's training configuration, checked, into its bucket."""
        from dataclasses import asdict

        from spotrain.trainer import run_config
        from spotrain.trainer.storage import open_storage
        from spotrain.trainer.train import load_config

        region = outputs["config"].primary_region
        store = f"s3://{outputs['checkpoint_bucket']}"
        path = self.work / "fleet-configuration.json"
        path.write_text(json.dumps({**fields, "store": store, "work_dir": "/set/by/each/machine"}))
        storage = open_storage(store, kms_key_id=key,
                               client=control.client("s3", cloud.endpoint, region))  # fmt: skip
        stored = run_config.put(storage, asdict(load_config(path)))
        self._indented(f"run {fields['run']}'s configuration stored as {stored.key}")

    def _fleet_instance(self, cloud: control.RunningCloud, group: str, region: str) -> str:
        from spotrain.localcloud.machines import in_service

        autoscaling = control.client("autoscaling", cloud.endpoint, region)
        instances, _ = in_service(autoscaling, group)
        if not instances:
            raise RehearsalFailed(f"the fleet group {group} launched no instance")
        return str(instances[-1]["InstanceId"])

    def _move_to_replica(
        self, cloud: control.RunningCloud, bucket: str, region: str, run: str, table: str
    ) -> tuple[int, float]:
        """`spotrain checkpoints move` in the replica region (the catalog's copy there claims
        the run's next epoch from a checkpoint whose every piece replicated, checked by
        restoring it where the training start restores), then the restore that start makes
        (which fetches none of it again), timed together."""
        from spotrain.trainer import restore_policy
        from spotrain.trainer.catalog import DynamoCatalog
        from spotrain.trainer.run_checkpoints import RunCheckpoints
        from spotrain.trainer.storage import open_storage

        storage = open_storage(
            f"s3://{bucket}", client=control.client("s3", cloud.endpoint, region)
        )
        there = control.client("dynamodb", cloud.endpoint, region)
        catalog = DynamoCatalog(table, run, storage, client=there)
        target = self.work / "replica-restore"
        began = time.perf_counter()
        claim, passed_over = RunCheckpoints(run=run, storage=storage, catalog=catalog).move_here(
            "the rehearsal's primary region is down", target
        )
        report = restore_policy.restore(target, storage=storage, catalog=catalog, run=run)
        took = time.perf_counter() - began
        shutil.rmtree(target, ignore_errors=True)
        self.say(f"      moved to {region} (epoch {claim.id.number}); restored step "
                 f"{report.manifest.step} from s3://{bucket} in {took:.1f} s "
                 f"({len(report.manifest.shards)} shards verified, {report.reused_bytes:,} "
                 f"bytes taken from the move's check, {report.fetched_bytes:,} fetched again); "
                 f"passed over: {[step for step, _ in passed_over] or 'none'}")  # fmt: skip
        return report.manifest.step, took

    def _config_file(self, phase: Phase, fields: dict[str, Any]) -> Path:
        path = self.work / f"{phase.name}.json"
        work_dir = self.work / f"{phase.name}-work"
        path.write_text(
            json.dumps({**fields, "metrics_file": str(phase.metrics), "work_dir": str(work_dir)})
        )
        return path

    def _start(
        self, phase: Phase, fields: dict[str, Any], *, region: str, shown: bool = True
    ) -> Trainer:
        command = [sys.executable, "-m", "spotrain.cli", "train",
                   str(self._config_file(phase, fields)), "--nproc-per-node", "1"]  # fmt: skip
        env = {**os.environ, "AWS_REGION": region, "AWS_DEFAULT_REGION": region}
        return Trainer(command, env, self.work / f"{phase.name}.log",
                       self._indented if shown else None)  # fmt: skip

    def _wait_for(self, trainer: Trainer, condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + TRAINER_TIMEOUT_S
        while not condition():
            if trainer.process.poll() is not None:
                raise RehearsalFailed(f"training ended early; see {trainer.log}")
            if time.monotonic() > deadline:
                trainer.process.kill()
                raise RehearsalFailed(f"training made no progress; see {trainer.log}")
            time.sleep(0.2)

    @contextmanager
    def _reference_run(self) -> Iterator[tuple[Phase, Trainer]]:
        """The same run without interruptions, on a local folder, alongside the deploy."""
        phase = Phase("uninterrupted", self.work / "uninterrupted.jsonl")
        fields = {**self._settings(), "steps": STEPS,
                  "store": str(self.work / "uninterrupted-store")}  # fmt: skip
        trainer = self._start(phase, fields, region="us-east-1", shown=False)
        try:
            yield phase, trainer
        finally:
            trainer.stop()


class Trainer:
    """`spotrain train` in a child process; its output goes to a log, chosen lines to `show`."""

    def __init__(
        self, command: list[str], env: dict[str, str], log: Path,
        show: Callable[[str], None] | None,
    ) -> None:  # fmt: skip
        self.log, self.show = log, show
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._copy, daemon=True)
        self._reader.start()

    def _copy(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout, self.log.open("w") as log:
            for line in self.process.stdout:
                log.write(line)
                said = line.removeprefix("[spotrain] ")
                if self.show is not None and said != line and said.startswith(SHOWN):
                    self.show(said)

    def stop(self) -> None:
        """Kill it if it still runs (a rehearsal that failed half-way)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join(timeout=10)

    def finish(self) -> None:
        try:
            self.process.wait(timeout=TRAINER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(timeout=10)
        if self.process.returncode != 0:
            raise RehearsalFailed(f"training exited with {self.process.returncode}; see {self.log}")


@contextmanager
def local_cloud(
    *, port: int, keep_cloud: bool, say: Callable[[str], None]
) -> Iterator[control.RunningCloud]:
    """The running local cloud, or one started for the rehearsal (and stopped after it unless
    `keep_cloud`); this process's AWS settings point at it."""
    started_here = control.status() is None
    # The rehearsal delivers each capacity check at the moment its story needs it: a cloud it
    # starts keeps no time of its own.
    cloud = control.up(port=port, schedule_speedup=0)
    os.environ.update(control.aws_environment(cloud.endpoint, "us-east-1"))
    try:
        yield cloud
    finally:
        if started_here and not keep_cloud:
            control.down()
            say("local cloud stopped (pass --keep-cloud to leave it running)")
        elif started_here:  # kept: its schedules run again, as `spotrain local up` runs them
            control.set_schedule_speedup(1.0)
            say("local cloud kept running; its schedules run at AWS's pace (`spotrain local up "
                "--schedule-speedup N` changes it)")  # fmt: skip


def deliver_interruption(
    cloud: control.RunningCloud, function_name: str, instance: str, region: str,
    say: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    """The spot interruption warning for `instance`, delivered twice (EventBridge delivers at
    least once) to the deployed handler's code with the deployed function's configuration
    (the emulator stores Lambdas but cannot run them)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    event = {
        "version": "0", "id": f"rehearsal-{instance}-{int(time.time())}",
        "detail-type": events.INTERRUPTION_WARNING_TYPE, "source": events.EC2_SOURCE,
        "account": "123456789012", "time": now, "region": region,
        "resources": [f"arn:aws:ec2:{region}:123456789012:instance/{instance}"],
        "detail": {"instance-id": instance, "instance-action": "terminate"},
    }  # fmt: skip
    result, again = _deployed_handler(cloud, function_name, region, event, times=2)
    for refusal in ("rejected", "ignored"):
        if refusal in result:
            raise RehearsalFailed(f"the handler {refusal} the interruption: {result[refusal]}")
    say(f"handler: recorded={result['recorded']} (redelivery recorded={again['recorded']}), "
        f"pool {result['pool']}, {result['decision']}: {result['reason']}")  # fmt: skip
    return result


def deliver_capacity_check(
    cloud: control.RunningCloud, function_name: str, region: str, run: str | None = None
) -> dict[str, Any]:
    """The scheduled capacity check (every 5 minutes in a deployment) delivered to the
    deployed handler's code with the deployed function's configuration: it checks every run
    of the environment and moves each run's spend ledger over its machines' time so far,
    priced by the local cloud's price book. Every run's result, or `run`'s."""
    event = {
        "version": "0", "id": f"rehearsal-check-{time.time_ns()}",
        "detail-type": events.SCHEDULED_TYPE, "source": events.SCHEDULE_SOURCE,
        "account": "123456789012",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "region": region,
        "resources": [f"arn:aws:events:{region}:123456789012:rule/capacity-check"], "detail": {},
    }  # fmt: skip
    (result,) = _deployed_handler(cloud, function_name, region, event)
    if "rejected" in result:
        raise RehearsalFailed(f"the handler rejected the capacity check: {result['rejected']}")
    if run is None:
        return result
    if run not in result["runs"]:
        raise RehearsalFailed(f"the handler's capacity check does not know run {run}: it "
                              f"checked {sorted(result['runs'])} (is the run's stack "
                              "deployed?)")  # fmt: skip
    return result["runs"][run]


def _deployed_handler(
    cloud: control.RunningCloud, function_name: str, region: str, event: dict[str, Any],
    *, times: int = 1,
) -> list[dict[str, Any]]:  # fmt: skip
    """`event` handled `times` times by the deployed function: its zip, its configuration,
    invoked through the local cloud's Lambda API."""
    client = control.client("lambda", cloud.endpoint, region)
    results = []
    for _ in range(times):
        answer = client.invoke(FunctionName=function_name, Payload=json.dumps(event).encode(),
                               LogType="Tail")  # fmt: skip
        payload = answer["Payload"].read().decode()
        if answer.get("FunctionError"):
            log = base64.b64decode(answer.get("LogResult", "")).decode(errors="replace")
            raise RehearsalFailed(f"the deployed handler {function_name} failed: {payload} "
                                  f"{log[-2000:]}")  # fmt: skip
        results.append(json.loads(payload))
    return results


@contextmanager
def prices_from(book: Path | None) -> Iterator[None]:
    """The local cloud answers prices from `book` meanwhile (None: the snapshot, as always)."""
    if book is None:
        yield
        return
    control.set_price_book(book)
    try:
        yield
    finally:
        control.set_price_book(None)


def move_line(primary: str, replica: str, resumed_after_s: float, replicated_bytes: int) -> str:
    """What the move cost: how long after the region went down the run had restored in the
    replica region, and what its checkpoints sent there before (replication sends each piece
    once, as it is published: the move itself sends nothing), at AWS's inter-region rate."""
    from spotrain.core import inter_region

    rate = inter_region.usd_per_gb(primary, replica)
    sent = f"{replicated_bytes:,} bytes of checkpoints replicated to {replica} before it"
    priced = f" (${replicated_bytes / 1e9 * rate:,.6f} at ${rate}/GB)" if rate is not None else ""
    return (
        f"restored in {replica} {resumed_after_s:.1f} s after {primary} went down (on this "
        f"host: a fleet adds its machines' boot); {sent}{priced}, nothing sent by the move"
    )


def spend_line(cloud: control.RunningCloud, events_table: str, region: str, run: str) -> str:
    """The run's spend as the handler's checks counted it, for a rehearsal's report."""
    from spotrain.core import spend_ledger

    table = control.resource("dynamodb", cloud.endpoint, region).Table(events_table)
    ledger = spend_ledger.read(table, run)
    hours = sum(f["seconds"] for f in ledger.per_pool.values()) / 3600
    if ledger.as_of is None:
        return "not counted (no capacity check ran)"
    if ledger.unpriced_seconds and not ledger.on_demand_usd:
        return (
            f"not priced: {hours:.3f} machine-hours of run {run}'s fleet have no price in the "
            "price book (`spotrain prices refresh`, or rehearse with --price-book)"
        )
    line = (
        f"${ledger.spend_usd:,.4f} for {hours:.3f} machine-hours of run {run}'s fleet; "
        f"${ledger.on_demand_usd:,.4f} on on-demand prices ({ledger.saved:.0%} saved)"
    )
    if ledger.unpriced_seconds:
        line += (
            f"; {ledger.unpriced_seconds / 3600:.3f} h unpriced: the price book has no price "
            "for them (`spotrain prices refresh`, or rehearse with --price-book)"
        )
    return line
