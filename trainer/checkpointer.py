"""`Checkpointer`: everything a DeepSpeed training loop needs to survive preemption, in one object.

Created once per training process (after `deepspeed.init_distributed`, before the loop), it owns
the store, the run's catalog (chosen here and nowhere else), the run's writer lease, both tiers
(full checkpoints in the store, light ones on the machine's work disk), the checkpoint in flight,
the restore policy (newest good checkpoint, fallback past proven damage and the roll back that
follows it, the catalog-down rules, refusing a changed definition) and retention. A loop talks
to it through three calls:

    checkpointer = Checkpointer(run="llama-ft", store="s3://bucket", work_dir="/scratch")
    start = checkpointer.restore(engine)          # the step to continue from (0: a new run)
    for step in range(start, steps):
        ...                                       # forward, backward, engine.step()
        if checkpointer.after_step(step + 1, last=step + 1 == steps):
            break                                 # preempted: its checkpoint is published
    checkpointer.close()                          # publishes what is still in flight

What the script keeps besides the engine rides along: `restore(engine, state={...})` takes
objects with `state_dict()` and `load_state_dict()` (torchdata's `StatefulDataLoader`, whose
position, worker processes included, resumes at the next batch; a sampler; an EMA) and plain
dicts (an epoch counter), saves each rank's with every checkpoint and loads them back into the
same objects at a restore.

Saving is snapshot, then write: at a checkpoint every rank only copies its state into host
memory (`_Snapshots`, DeepSpeed's checkpoint engine replaced; pinned memory and non-blocking
copies on GPUs, then one synchronize) and training goes on. A background thread per rank then
serialises the snapshot to the work disk, hashing each byte once as it is written (SHA-256
for the content address, CRC32 for S3's transfer check), and uploads its files; when every
rank is done (they learn it in the per-step agreement), rank 0 publishes. At most one
checkpoint is in flight: its snapshot buffers are reused by the next one, so the memory cost is
one host copy of each rank's checkpoint state. A stop (SIGTERM, a spot notice) publishes the
checkpoint in flight and an emergency one of the current step before `after_step` says stop.

The `spotrain checkpoints` commands use the same object without a process group
(`restore_into`, `verify`, `collect_garbage`, ...), so an operator's restore rolls the head back
past proven damage exactly as a training start does.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from spotrain.core.catalog_schema import checkpoint_id, checkpoint_tag, run_name_problem
from spotrain.core.entry_point import COORDINATES
from spotrain.core.errors import SpotrainError, raise_if_problems
from spotrain.core.manifest import Manifest, Shard
from spotrain.trainer import checkpoint_store, failpoints, local_tier, membership, restore_policy
from spotrain.trainer.catalog import open_catalog
from spotrain.trainer.metrics_file import MetricsFile
from spotrain.trainer.preemption import Agreement, PreemptionFlag
from spotrain.trainer.process import (
    OnEvent,
    Place,
    Say,
    broadcast_from_rank0,
    ranks_per_machine,
    rng_state,
    say,
    set_rng_state,
)
from spotrain.trainer.restore_policy import refuse_changed_definition
from spotrain.trainer.run_checkpoints import RESTORE_FOLDER, RunCheckpoints
from spotrain.trainer.snapshot import (
    Staged,
    make_snapshot_engine,
    state_a_first_step_creates,
    stream_staged,
    write_staged,
)
from spotrain.trainer.spot_notice import SpotNoticeWatcher
from spotrain.trainer.storage import open_storage

_to_terminal = say


def code_version() -> str:
    from importlib.metadata import version

    libraries = {name: version(name) for name in ("spotrain", "torch", "deepspeed")}
    return ", ".join(f"{name} {number}" for name, number in libraries.items())


# ----------------------------------------------------------------------------- the script's state


@runtime_checkable
class Stateful(Protocol):
    """What `restore(state=...)` keeps besides a plain dict (torch.distributed.checkpoint's
    protocol of the same name)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def _state_file(rank: int) -> str:
    return f"script_state_rank{rank}.pt"


_POSITIONLESS_LOADERS = {
    "DataLoader": "torch's DataLoader keeps no position: make it torchdata's StatefulDataLoader, "
    "a drop-in (`from torchdata.stateful_dataloader import StatefulDataLoader`)",
    "DeepSpeedDataLoader": "the loader deepspeed.initialize(training_data=...) returns keeps no "
    "position: build torchdata's StatefulDataLoader over the same dataset instead (its micro "
    "batch, a DistributedSampler), as docs/training.md shows",
}
"""The loaders scripts commonly hand over, and what to give instead (by class name: neither
class is imported to ask)."""


def _state_problems(state: Mapping[str, Any]) -> list[str]:
    return [
        f"state[{name!r}] is a {type(value).__name__}: "
        + _POSITIONLESS_LOADERS.get(
            type(value).__name__,
            "give an object with state_dict() and load_state_dict() (a StatefulDataLoader, a "
            "sampler, a module) or a dict",
        )
        for name, value in state.items()
        if not isinstance(value, dict | Stateful) or not isinstance(name, str)
    ]


def _state_of(state: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value if isinstance(value, dict) else value.state_dict()
            for name, value in state.items()}  # fmt: skip


def _load_state(state: Mapping[str, Any], saved: dict[str, Any]) -> None:
    for name, value in state.items():
        if isinstance(value, dict):
            value.clear()
            value.update(saved[name])
        else:
            value.load_state_dict(saved[name])


# ----------------------------------------------------------------------------- the checkpointer


@dataclass(frozen=True)
class Restored:
    step: int
    world_size: int
    folder: Path
    """DeepSpeed checkpoint root holding the tag `step_<step>`."""
    from_light: bool = False
    """Restored from this machine's light checkpoint rather than from the store."""


@dataclass
class _InFlight:
    step: int
    root: Path
    work: Future[checkpoint_store.UploadReport]
    """This rank's write and upload of its snapshot."""
    stall_s: float
    """How long training waited for the snapshot."""
    began: float
    final: bool = False
    """The run's last step: published marked final, the run is done (its machines go)."""
    loss: float | None = None
    """The step's training loss, for the catalog record."""
    step_losses: list[tuple[int, float]] = field(default_factory=list)
    """Each step's loss since the checkpoint before, for the catalog record."""
    allocated_bytes: int = 0
    """Host buffers this rank's snapshot had to allocate (0 when they were warm)."""


class Checkpointer(RunCheckpoints):
    """See the module's docstring. Keyword-only settings, checked up front (one error lists
    every problem):

    run, store: the run's name (the key of everything it stores) and where checkpoints go
        (`s3://BUCKET[/PREFIX]` or `file:///PATH`); catalog_table and kms_key_id for S3 (the
        environment's outputs). work_dir: fast local disk (training only). On the fleet these
        and spot_notice_endpoint come from the environment (`COORDINATES`: SPOTRAIN_RUN,
        SPOTRAIN_STORE, ...; `spotrain train` sets them), so they need not be given; a value
        given wins.
    every, light_every: steps between full checkpoints (published) and light ones (this
        machine's disk only; None: none).
    definition, allow_definition_change: what makes the run the run (stored with each
        checkpoint); a start whose definition differs is refused unless the change is allowed.
    keep_last: collect superseded checkpoints after each publish, keeping this many (2 or
        more; needs credentials that may delete); None keeps all.
    spot_notice_endpoint, spot_notice_poll_seconds: the metadata service to watch for spot
        interruption notices and rebalance recommendations (on EC2 http://169.254.169.254).
    on_event(kind, **fields): called on rank 0 for "restored" (seconds to choose, fetch and
        verify; seconds DeepSpeed took to load), "published", "light" and "stopped".
    metrics_file: where rank 0 appends a JSON line for every step `after_step` is told of and
        every such event, as the trainer's own metrics file (`metrics_file.MetricsFile`):
        what `spotrain cost plan --metrics` reads to plan the run's checkpoint interval with a
        checkpoint's whole cost to training. None: no file.
    lease_owner, say: who takes the run's lease; where progress lines go (default: stdout).
    """

    training: ClassVar[Checkpointer | None] = None
    """This process's, once it restored: where a rank that dies reads its last words from."""

    def __init__(
        self,
        *,
        run: str | None = None,
        store: str | None = None,
        work_dir: str | None = None,
        catalog_table: str | None = None,
        kms_key_id: str | None = None,
        every: int = 50,
        light_every: int | None = None,
        definition: dict[str, Any] | None = None,
        allow_definition_change: bool = False,
        keep_last: int | None = None,
        spot_notice_endpoint: str | None = None,
        spot_notice_poll_seconds: float = 5.0,
        on_event: OnEvent | None = None,
        metrics_file: str | None = None,
        lease_owner: str | None = None,
        say: Say | None = None,
    ) -> None:
        given = {"run": run, "store": store, "work_dir": work_dir,
                 "catalog_table": catalog_table, "kms_key_id": kms_key_id,
                 "spot_notice_endpoint": spot_notice_endpoint}  # fmt: skip
        found = {name: value if value is not None else os.environ.get(COORDINATES[name]) or None
                 for name, value in given.items()}  # fmt: skip
        run, store, work_dir = found["run"], found["store"], found["work_dir"]
        catalog_table, kms_key_id = found["catalog_table"], found["kms_key_id"]
        spot_notice_endpoint = found["spot_notice_endpoint"]
        problems = [
            f"{name} is not given and {COORDINATES[name]} is not set: pass {name}=..., or start "
            "the script with `spotrain train` (on the fleet, the run's machines do), which sets it"
            for name in ("run", "store")
            if found[name] is None
        ]
        if run is not None and (run_problem := run_name_problem(run)):
            problems.append(f"run: {run_problem}")
        if every < 1:
            problems.append(f"every is {every}: checkpoint every 1 or more steps")
        if light_every is not None and light_every < 1:
            problems.append(f"light_every is {light_every}: use 1 or more, or None for none")
        if keep_last is not None and keep_last < checkpoint_store.MIN_KEEP:
            problems.append(
                f"keep_last is {keep_last}: keep at least {checkpoint_store.MIN_KEEP} complete "
                "checkpoints (so a damaged newest one has a fallback), or None to keep all"
            )
        raise_if_problems("checkpointer", problems)
        assert run is not None and store is not None  # no problems: both were found
        self.run, self.every, self.light_every, self.keep_last = run, every, light_every, keep_last
        self.work_dir = Path(work_dir) if work_dir else None
        self.definition, self.allow_definition_change = definition, allow_definition_change
        storage = open_storage(store, kms_key_id=kms_key_id)
        super().__init__(run=run, storage=storage, say=say or _to_terminal,
                         catalog=open_catalog(storage, run, table=catalog_table),
                         lease_owner=lease_owner)  # fmt: skip
        self._notice_endpoint, self._notice_poll = spot_notice_endpoint, spot_notice_poll_seconds
        self._metrics_path, self._metrics = metrics_file, MetricsFile(None)
        self._told = on_event or (lambda kind, **fields: None)
        self._step_began, self._began_publishing = time.perf_counter(), False
        """When the step `after_step` is told of next began, and whether a publish was in
        flight then: its line in the metrics file."""
        self._place: Place | None = None
        self._engine: Any = None
        self._snapshots: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._watcher: SpotNoticeWatcher | None = None
        self.preemption = PreemptionFlag()
        self.in_flight: _InFlight | None = None
        self._collecting: Future[None] | None = None
        self._known: dict[str, list[str]] | None = None
        """Objects of the newest checkpoint this process published, by digest: what the next
        upload checks for reuse (None: not read yet)."""
        self._parent_key: str | None = None
        self.parent: str | None = None
        """Id of the newest checkpoint this run published or resumed from."""
        self.status = "none yet"
        """One line for progress output: the newest checkpoint's state."""
        self.stopped_after: int | None = None
        """The step `after_step` stopped at (with its checkpoint published), if it did."""
        self.stop: membership.Stop | None = None
        """What this machine does now that the run stopped (stays and rejoins, or leaves)."""
        self._trained_a_step = False
        self.last_step: int | None = None
        """The newest step `after_step` was told of."""
        self._step_losses: list[tuple[int, float]] = []
        """The loss the loop gave with each step since the last checkpoint started."""
        self._state: dict[str, Any] = {}

    def _on_event(self, kind: str, **fields: Any) -> None:
        """An event on rank 0: into the metrics file, and to the script's `on_event`."""
        self._metrics.event(kind, **fields)
        self._told(kind, **fields)

    @property
    def place(self) -> Place:
        if self._place is None:
            self._place = Place.here()
        return self._place

    def _say(self, message: str) -> None:
        if self.place.rank == 0:
            self._tell(message)

    def _work(self, *parts: str) -> Path:
        if self.work_dir is None:
            raise SpotrainError("the checkpointer needs work_dir (fast local disk) to train")
        return self.work_dir.joinpath(*parts)

    # ------------------------------------------------------------------ training: restore

    def restore(self, engine: Any, *, state: Mapping[str, Any] | None = None) -> int:
        """Collective, once after `deepspeed.initialize`: load the run's newest good checkpoint
        into `engine` (weights, optimizer, schedule, every rank's random state) and into each
        of `state`'s objects (saved with every checkpoint from now on: see the module's
        docstring), and start watching for preemption. Returns the step to continue from (0
        for a new run)."""
        import torch.distributed as dist

        raise_if_problems("checkpointer", _state_problems(state or {}))
        self._state = dict(state or {})
        place = self.place
        Checkpointer.training = self
        if place.rank == 0:
            _ = self.generation  # fence any older start before reading the head
        self._engine = engine
        self._snapshots = engine.checkpoint_engine = make_snapshot_engine()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint")
        if place.leader:  # saves a killed start never published are of no use
            shutil.rmtree(self._work("save"), ignore_errors=True)
            self._work(membership.FIRST_STEP_MARKER).unlink(missing_ok=True)  # none trained yet
        began = time.perf_counter()
        restored = self._choose_and_fetch()
        fetched = time.perf_counter()
        start = 0
        if restored is not None:
            universal = restored.world_size != place.world
            # DeepSpeed reads this only while loading: a different data-parallel size loads the
            # universal format the store's copy was converted to.
            engine._config.load_universal_checkpoint = universal
            tag = checkpoint_tag(restored.step)
            _, client_state = engine.load_checkpoint(str(restored.folder), tag=tag)
            start = int(client_state["step"])
            self.parent = checkpoint_id(self.run, restored.step)
            if not universal:  # a different world has different ranks: their streams start afresh
                rng = torch.load(restored.folder / tag / f"rng_rank{place.rank}.pt",
                                 weights_only=False)  # fmt: skip
                set_rng_state(rng)
            self._restore_state(restored, universal)
            dist.barrier()
            loaded = time.perf_counter()  # every rank has loaded (the clean-up below is not)
            if place.leader:
                shutil.rmtree(self._work(RESTORE_FOLDER), ignore_errors=True)
            self._say(f"resumed {self.run} at step {start}"
                      + (" (light checkpoint)" if restored.from_light else ""))  # fmt: skip
            self.status = f"resumed from {self.parent}"
        if place.rank == 0:
            self._metrics = MetricsFile(self._metrics_path)
            if restored is not None:
                self._on_event("restored", step=start, light=restored.from_light,
                               fetch_s=fetched - began, load_s=loaded - fetched)  # fmt: skip
            self._metrics.event("started", step=start, world=place.world)
        self._warm_up()
        self._step_began, self._began_publishing = time.perf_counter(), self.uploading_here
        self.preemption.install()
        if self._notice_endpoint and place.leader:
            from spotrain.trainer.spot_notice import SpotNoticeWatcher

            self._watcher = SpotNoticeWatcher(
                self._notice_endpoint,
                on_interruption=self.preemption.request,
                on_rebalance=self.preemption.request_checkpoint,
                poll_seconds=self._notice_poll,
            ).start()
        return start

    def trained_definition(self) -> dict[str, Any] | None:
        """Collective: the definition the run's newest published checkpoint was trained with
        (None for a new run, or while the catalog cannot be read: the restore then refuses a
        changed definition as ever). Read before the engine is built, without the lease."""
        import torch.distributed as dist

        found: list[dict[str, Any] | None] = [None]
        if self.place.rank == 0:
            try:
                head = self.catalog.head()
                if head is not None:
                    manifest = checkpoint_store.read_manifest(self.storage, head.manifest_key)
                    found[0] = manifest.extra.get("config")
            except SpotrainError as error:  # the restore decides what an unreadable catalog means
                self._tell(f"the run's newest definition could not be read ({error})")
        dist.broadcast_object_list(found, src=0)
        return found[0]

    def _restore_state(self, restored: Restored, universal: bool) -> None:
        """Each rank loads the script's state its rank saved. On another number of ranks, rank
        r takes the state of rank r mod the old number (the universal format has no per-rank
        script state); a data loader's position then covers the batches of that rank."""
        if not self._state:
            return
        tag = checkpoint_tag(restored.step)
        saved_by = self.place.rank % restored.world_size
        path = (
            (restored.folder.parent if universal else restored.folder) / tag / _state_file(saved_by)
        )
        saved = torch.load(path, weights_only=False) if path.is_file() else {}
        missing = sorted(set(self._state) - set(saved))
        if missing:
            raise SpotrainError(
                f"run {self.run}'s checkpoint at step {restored.step} holds no state for "
                f"{', '.join(missing)} (it holds: {', '.join(sorted(saved)) or 'none'}): pass "
                "restore(state=...) the names the run saved with, or start a new run"
            )
        _load_state(self._state, saved)
        if universal:
            self._say(f"the script's state was saved by {restored.world_size} rank(s) and is "
                      f"loaded on {self.place.world}: rank r takes rank r mod "
                      f"{restored.world_size}'s")  # fmt: skip

    def _refuse_changed(self, trained: dict[str, Any] | None, step: int) -> None:
        if not self.allow_definition_change:
            refuse_changed_definition(self.run, trained, self.definition, step)

    def _choose_and_fetch(self) -> Restored | None:
        """Collective: every machine offers its newest light checkpoint; rank 0 uses it if it
        may, else picks the newest good published one (with fallback, moving the head back
        past what it skipped); every machine's leader fetches and verifies that one, and
        converts it to DeepSpeed's universal format when the world size changed (plain
        loading refuses a different data-parallel size)."""
        import torch.distributed as dist

        place = self.place
        folder = self._work(RESTORE_FOLDER)
        if place.leader:  # this machine's own scratch: whatever a crashed start left goes, but
            # a restore of this run (a move's check left it: its pieces are not fetched again)
            checkpoint_store.keep_only_a_restore(folder, self.run)
        chosen = torch.tensor([-1, 0, 0], dtype=torch.long)  # step, its world size, 1 if light
        manifest_of_chosen: list[str | None] = [None]
        light_root = self._work("light")
        light = local_tier.newest(light_root) if place.leader else None
        if light is not None and light.world_size != place.world:
            light = None  # written by another number of ranks: only the store's copy converts
        offers: list[Any] = [None] * place.world
        offer = (light.step, light.parent) if light else None
        dist.all_gather_object(offers, (place.leader, offer))
        if place.rank == 0:
            light_step = self._light_step_to_use([o for lead, o in offers if lead])
            if light_step is not None and light is not None:
                self._refuse_changed(light.config, light_step)
                chosen[0], chosen[1], chosen[2] = light_step, place.world, 1
        if place.rank == 0 and not chosen[2]:
            try:
                report = self._restore_published(folder, roll_back=True)
                chosen[0], chosen[1] = report.manifest.step, report.manifest.world_size
                manifest_of_chosen[0] = checkpoint_store.key_of(report.manifest)
            except checkpoint_store.NothingPublished:
                pass  # a new run
        broadcast_from_rank0(chosen)
        dist.broadcast_object_list(manifest_of_chosen, src=0)
        step, world_size, from_light = (int(v) for v in chosen)
        if place.leader:  # light checkpoints older than the one restored are of no more use
            local_tier.prune(light_root, keep=step if from_light else None)
        if step < 0:
            return None
        if from_light:
            self._say(f"restoring step {step} from this machine's light checkpoint (newer than "
                      "the published head, descended from it)")  # fmt: skip
            dist.barrier()
            return Restored(step, world_size, light_root / checkpoint_tag(step), from_light=True)
        self._parent_key = manifest_of_chosen[0]
        if place.leader and place.rank != 0:
            checkpoint_store.fetch(self.storage, str(manifest_of_chosen[0]), folder, run=self.run)
        tag = checkpoint_tag(step)
        if world_size != place.world:
            if place.leader:
                _convert_to_universal(folder, tag)
                self._tell(f"converted step {step} from {world_size} to {place.world} ranks")
            folder = folder / "universal"
        dist.barrier()
        return Restored(step, world_size, folder)

    def _light_step_to_use(self, offers: list[tuple[int, str | None] | None]) -> int | None:
        return restore_policy.light_step_to_use(self.catalog, self.run, offers)

    def _accept(self, manifest: Manifest) -> None:
        """A training start refuses a checkpoint trained with another definition."""
        self._refuse_changed(manifest.extra.get("config"), manifest.step)

    # ------------------------------------------------------------------ training: each step

    @property
    def uploading_here(self) -> bool:
        return self.in_flight is not None and not self.in_flight.work.done()

    def after_step(self, step: int, *, last: bool = False, loss: float | None = None) -> bool:
        """Collective, after every optimizer step (`step` steps done; `last`: the final one;
        `loss`: the step's training loss, which a checkpoint of it records in the catalog).
        Publishes the checkpoint in flight once every rank finished uploading it, takes the
        checkpoints that are due, and returns True when the run must stop (SIGTERM or a spot
        notice on any machine): its checkpoint of `step` is then published."""
        known = {} if loss is None or not math.isfinite(loss) else {"loss": float(loss)}
        self._metrics.step(step, step_s=time.perf_counter() - self._step_began,
                           publishing=self._began_publishing, **known)  # fmt: skip
        try:
            return self._after_step(step, last=last, loss=loss)
        finally:  # the next step begins: what its line says it began beside
            self._step_began, self._began_publishing = time.perf_counter(), self.uploading_here

    def _after_step(self, step: int, *, last: bool, loss: float | None) -> bool:
        self.last_step = step
        held = failpoints.hold(lambda: self.preemption.reason is not None)
        if held is not None and self.place.rank == 0:
            self._on_event("held", step=step, seconds=held)
        if loss is not None and math.isfinite(loss):
            self._step_losses.append((step, float(loss)))
        if not self._trained_a_step and self.place.leader and self.work_dir is not None:
            self._work(membership.FIRST_STEP_MARKER).touch()
        self._trained_a_step = True
        asked = self.preemption.checkpoint_reason
        agreed: Agreement = self.preemption.agree(self._engine.device,
                                                  uploading=self.uploading_here)  # fmt: skip
        if self.in_flight is not None and not agreed.uploading:
            self._finish()
        if agreed.checkpoint_now:
            self._say(f"checkpoint requested after step {step} ({asked or 'on another machine'})")
        if agreed.stop or agreed.checkpoint_now or last or step % self.every == 0:
            self._start(step, final=last, loss=loss)
        elif self.light_every and step % self.light_every == 0:
            self._save_light(step)
        if not agreed.stop:
            return False
        self._finish()
        reason = self.preemption.reason or "another rank was asked to stop"
        since = self.preemption.seconds_since_request()
        self._say(f"stopped after step {step} ({reason}); it is published"
                  + (f", {since:.1f} s after the notice" if since is not None else ""))  # fmt: skip
        if self.place.rank == 0:
            self._on_event("stopped", step=step, reason=reason, notice_to_published_s=since)
        self.stopped_after = step
        # Whether this machine stays (and meets the others again) or leaves: its process's
        # exit says so to torchrun (membership.exit_status).
        self.stop = membership.agree(self.preemption.reason, self.place.world)
        return True

    def last_words(self, error: BaseException) -> str:
        """One line for a rank dying of `error`: which rank, after which step, why it has no
        emergency checkpoint, and where the run resumes."""
        where = f"rank {self.place.rank} died after step {self.last_step}"
        if self.last_step is None:
            where = f"rank {self.place.rank} died before its first step"
        why = str(error).strip().splitlines()[0].strip().rstrip(".") if str(error).strip() else ""
        cause = f"{type(error).__name__}: {why}" if why else type(error).__name__
        if self.preemption.reason and self.stopped_after is None:
            lost = (f"while stopping ({self.preemption.reason}), before its emergency checkpoint "
                    "was published")  # fmt: skip
        else:
            lost = "with no emergency checkpoint (only a stop takes one)"
        resumes = f"the run resumes from {self.parent}" if self.parent else "the run starts over"
        return f"{where} {lost}: {cause}; {resumes}"

    def close(self) -> None:
        """Collective on the normal path: publish the checkpoint in flight, then stop the
        background work. After an error, call `abandon` instead (nothing is published)."""
        try:
            self._finish()
            if self._pool is not None:
                self._pool.shutdown(wait=True)  # retention after the last publish, too
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Stop watching and working without publishing (the loop failed)."""
        self._metrics.close()
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        if kind is None:
            self.close()
        else:
            self.abandon()

    # ------------------------------------------------------------------ training: saving

    def _snapshot(
        self, step: int, tier: str, *, uploading: bool = False, script_state: bool = True
    ) -> tuple[Path, list[Staged], list[Shard]]:
        """Collective: every rank copies its state of `step` into host memory (the script's
        own state too unless told not to). Returns the DeepSpeed checkpoint root, this rank's
        staged files, and (rank 0, when `uploading`) the small files DeepSpeed wrote directly
        (its recovery script), described for the upload."""
        import torch.distributed as dist

        failpoints.saving(step)
        tag = checkpoint_tag(step)
        root = self._work(tier, tag)
        # The definition rides along, so a checkpoint says what trained it.
        state = {"step": step, "config": self.definition}
        self._snapshots.tier = tier
        self._engine.save_checkpoint(str(root), tag=tag, client_state=state, save_latest=False)
        self._snapshots.save(rng_state(), str(root / tag / f"rng_rank{self.place.rank}.pt"))
        if self._state and script_state:
            self._snapshots.save(_state_of(self._state),
                                 str(root / tag / _state_file(self.place.rank)))  # fmt: skip
        staged = self._snapshots.take()
        direct: list[Shard] = []
        if uploading and self.place.rank == 0 and any(p.is_file() for p in root.rglob("*")):
            direct = checkpoint_store.describe_folder(root)  # before any rank writes its snapshot
        dist.barrier()
        return root, staged, direct

    def _collect_after_publish(self) -> None:
        try:
            self.collect_garbage(self.keep_last or checkpoint_store.MIN_KEEP)
        except SpotrainError as error:  # retention can wait; training goes on
            self._tell(f"superseded checkpoints not collected this time: {error}")

    def _warm_up(self) -> None:
        """Collective: a snapshot thrown away, so the host buffers are allocated (and their
        pages touched) before training, and even the first checkpoint's stall is only a copy."""
        for tier in ("save", "light") if self.light_every else ("save",):
            # Not the script's state: a StatefulDataLoader asked for its state before the
            # script iterates it builds its iterator then, with the sampler's epoch as it is
            # now, before the script's set_epoch (a resumed epoch would replay an old order).
            root, staged, _ = self._snapshot(0, tier, script_state=False)
            del staged
            if self.place.leader:
                shutil.rmtree(root, ignore_errors=True)
            # The state the first step creates (Adam's moments: two thirds of ZeRO's optimizer
            # state) is not there yet: its buffers would be allocated, and pinned, by the first
            # checkpoint, in training's time (3.7 s of a 1B model's first stall on an H100).
            self._snapshots.reserve(tier, state_a_first_step_creates(self._engine.optimizer))

    def _start(self, step: int, *, final: bool = False, loss: float | None = None) -> None:
        """Collective: snapshot `step` and start writing and uploading it in the background
        (`final`: the run's last step; `loss`: its training loss)."""
        if final:
            self._announce_finishing(step)
        if self.in_flight is not None:
            if self.in_flight.step == step:
                self.in_flight.final = self.in_flight.final or final
                self.in_flight.loss = loss if loss is not None else self.in_flight.loss
                return
            self._finish()
        began = time.perf_counter()
        if self._collecting is not None:
            # Collection ends before any rank's next upload begins (the snapshot's barrier), so
            # it never deletes an old piece an upload is about to reuse.
            self._collecting.result()
            self._collecting = None
        root, staged, direct = self._snapshot(step, "save", uploading=True)
        stall = time.perf_counter() - began
        if self.place.rank == 0:
            failpoints.hit("after-snapshot")
        assert self._pool is not None
        work = self._pool.submit(self._write_and_upload, root, staged, direct)
        self.in_flight = _InFlight(step, root, work, stall, began, final, loss,
                                   self._step_losses, self._snapshots.allocated_bytes)  # fmt: skip
        self._step_losses = []
        self.status = f"step {step} uploading"

    def _announce_finishing(self, step: int) -> None:
        """Rank 0, before the final checkpoint's snapshot: the queue may start the next runs on
        these machines while it publishes (`catalog.announce_finishing`). Failing to say so
        costs only that warm start: said, never raised."""
        if self.place.rank != 0:
            return
        try:
            self.catalog.announce_finishing(step)
        except SpotrainError as error:
            self._say(f"the final checkpoint's announcement failed ({error}): the next run in "
                      "the queue starts when it is published instead of meanwhile")  # fmt: skip

    def _write_and_upload(
        self, root: Path, staged: list[Staged], direct: list[Shard]
    ) -> checkpoint_store.UploadReport:
        if self._known is None:  # resumed: the pieces of the checkpoint this run came from
            self._known = {}
            if self._parent_key is not None:
                try:
                    parent = checkpoint_store.read_manifest(self.storage, self._parent_key)
                    self._known = checkpoint_store.known_pieces(parent.shards)
                except SpotrainError:
                    pass  # reuse is then found piece by piece, as addresses turn out taken
        uploader = checkpoint_store.PieceUploader(storage=self.storage, run=self.run,
                                            known=self._known)  # fmt: skip
        try:
            shards = stream_staged(staged, root, uploader)
            for shard in direct:
                uploader.put_file(root, shard)
        except BaseException:
            uploader.abandon()
            raise
        return uploader.finish(shards + direct)

    def _save_light(self, step: int) -> None:
        """Collective: a light checkpoint of `step` on this machine's work disk; the leader
        seals it (hashes every file) in the background, after any upload in flight."""
        import torch.distributed as dist

        began = time.perf_counter()
        root, staged, _ = self._snapshot(step, "light")
        write_staged(staged, root)
        dist.barrier()
        # Descends from the checkpoint in flight if there is one: once published it is the head.
        parent = checkpoint_id(self.run, self.in_flight.step) if self.in_flight else self.parent
        if self.place.leader and self._pool is not None:
            self._pool.submit(self._seal_light, root, step, parent, self.place.world,
                              self.definition)  # fmt: skip
        if self.place.rank == 0:
            self._on_event("light", step=step, stall_s=time.perf_counter() - began)

    @staticmethod
    def _seal_light(root: Path, step: int, parent: str | None, world: int,
                    definition: dict[str, Any] | None) -> None:  # fmt: skip
        local_tier.seal(root, step=step, parent=parent, world_size=world, config=definition)
        local_tier.prune(root.parent, keep=step)
        failpoints.hit("after-light-seal", step=step)

    def _finish(self) -> None:
        """Collective: wait for every rank's upload of the checkpoint in flight, then publish
        it. Raises on every rank if any upload or the publish failed."""
        import torch.distributed as dist

        flight, self.in_flight = self.in_flight, None
        if flight is None:
            return
        mine: checkpoint_store.UploadReport | str
        try:
            mine = flight.work.result()
        except Exception as error:  # reported on every rank below
            mine = f"upload of step {flight.step} failed: {error}"
        everyone: list[Any] = [None] * self.place.world
        dist.all_gather_object(everyone, mine)
        outcome: list[str | None] = [None]
        if self.place.rank == 0:
            outcome[0] = self._commit(flight, everyone)
        dist.broadcast_object_list(outcome, src=0)
        if self.place.leader:
            shutil.rmtree(flight.root, ignore_errors=True)
        if outcome[0] is not None:
            self.status = f"step {flight.step} failed"
            raise SpotrainError(outcome[0])
        self.parent = checkpoint_id(self.run, flight.step)
        self.status = f"step {flight.step} published"
        self._known = checkpoint_store.known_pieces(s for report in everyone for s in report.shards)
        if self.keep_last is not None and self.place.rank == 0 and self._pool is not None:
            self._collecting = self._pool.submit(self._collect_after_publish)

    def _commit(self, flight: _InFlight, reports: list[Any]) -> str | None:
        """Rank 0: publish the union of every rank's shards; the error, if any."""
        errors = [r for r in reports if isinstance(r, str)]
        if errors:
            return "; ".join(errors)
        shards: dict[str, Shard] = {}
        for report in reports:
            for shard in report.shards:
                if shards.setdefault(shard.name, shard).sha256 != shard.sha256:
                    return f"ranks wrote different files named {shard.name} at step {flight.step}"
        # Its new bytes too: what replication sends to every other region (the cost report).
        timings = {"stall_s": round(flight.stall_s, 3),
                   "upload_s": round(time.perf_counter() - flight.began, 3),
                   "machines": self.place.world // ranks_per_machine(),
                   "uploaded_bytes": sum(r.uploaded_bytes for r in reports)}  # fmt: skip
        try:
            checkpoint_store.commit(
                list(shards.values()), storage=self.storage, catalog=self.catalog,
                generation=self.generation, run=self.run, step=flight.step,
                world_size=self.place.world, zero_stage=self._engine.zero_optimization_stage(),
                config_hash=_definition_hash(self.definition), code_version=code_version(),
                parent=self.parent, config=self.definition, timings=timings, final=flight.final,
                loss=flight.loss, step_losses=flight.step_losses,
                just_stored={key for report in reports for key in report.stored_keys},
            )  # fmt: skip
        except SpotrainError as error:
            return str(error)
        sent = sum(r.uploaded_bytes for r in reports)
        reused = sum(r.reused_bytes for r in reports)
        took = time.perf_counter() - flight.began
        cold = (f" ({flight.allocated_bytes:,} bytes of host buffers allocated in it)"
                if flight.allocated_bytes else "")  # fmt: skip
        self._tell(f"published step {flight.step}: {sent:,} bytes sent, {reused:,} reused; "
                   f"training stalled {flight.stall_s:.2f} s{cold}, published {took:.1f} s "
                   "after the save")  # fmt: skip
        self._on_event("published", step=flight.step, uploaded_bytes=sent, reused_bytes=reused,
                       stall_s=flight.stall_s, save_to_published_s=took,
                       allocated_bytes=flight.allocated_bytes)  # fmt: skip
        return None


def _definition_hash(definition: dict[str, Any] | None) -> str:
    import json

    text = json.dumps(definition or {}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _convert_to_universal(folder: Path, tag: str) -> None:
    from types import SimpleNamespace

    from deepspeed.checkpoint import ds_to_universal

    output = folder / "universal" / tag
    shutil.rmtree(output, ignore_errors=True)
    ds_to_universal.main(
        SimpleNamespace(
            input_folder=str(folder / tag),
            output_folder=str(output),
            num_extract_workers=1,
            num_merge_workers=1,
            keep_temp_folder=False,
            strict=True,
            inject_missing_state=True,
        )
    )
