"""A run's published checkpoints as an operator handles them: list, show, verify, restore,
collect, quarantine, roll back, move to another region. No PyTorch: `spotrain checkpoints`
runs on the base install, and the Checkpointer, which trains, builds on this."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from spotrain.core.failover import MoveOrder
from spotrain.core.manifest import Manifest
from spotrain.core.run_epochs import Epoch, EpochId
from spotrain.trainer import checkpoint_store, restore_policy
from spotrain.trainer.catalog import (
    Catalog,
    CatalogEntry,
    CatalogError,
    DynamoCatalog,
    open_catalog,
)
from spotrain.trainer.storage import Storage, open_storage

Say = Callable[[str], None]

RESTORE_FOLDER = "restore"
"""Where in its work_dir a training start restores the run's checkpoint, and so where a
machine that moves the run (`fleet may-start`) leaves the checkpoint its move was checked on:
the restore then takes every piece from there instead of fetching it again."""


class RunCheckpoints:
    """One run's checkpoints in a store (and its catalog). A change that could race a writer
    (a restore that moves the head back, a rollback) takes the run's writer lease first."""

    def __init__(self, *, run: str, storage: Storage, catalog: Catalog,
                 lease_owner: str | None = None, say: Say | None = None) -> None:  # fmt: skip
        self.run, self.storage, self.catalog = run, storage, catalog
        self._tell: Say = say or (lambda message: print(message, flush=True))
        self._lease_owner = lease_owner or f"{os.uname().nodename}:{os.getpid()}"
        self._generation: int | None = None

    @classmethod
    def open(cls, *, run: str, store: str, catalog_table: str | None = None,
             kms_key_id: str | None = None, lease_owner: str | None = None,
             say: Say | None = None) -> RunCheckpoints:  # fmt: skip
        storage = open_storage(store, kms_key_id=kms_key_id)
        catalog = open_catalog(storage, run, table=catalog_table)
        return cls(run=run, storage=storage, catalog=catalog, lease_owner=lease_owner, say=say)

    @property
    def generation(self) -> int:
        """The run's writer lease, taken on first use: any older writer is fenced from now."""
        if self._generation is None:
            self._generation = self.catalog.acquire_lease(self._lease_owner)
        return self._generation

    def head(self) -> CatalogEntry | None:
        return self.catalog.head()

    def entries(self) -> list[CatalogEntry]:
        return self.catalog.entries()

    def entry_at(self, step: int | None) -> CatalogEntry:
        """The entry for `step` (the head if None), or a CatalogError saying what exists."""
        return checkpoint_store.entry_at(self.catalog, step)

    def manifest(self, entry: CatalogEntry) -> Manifest:
        return checkpoint_store.read_manifest(self.storage, entry.manifest_key)

    def restore_into(
        self, folder: Path, *, roll_back: bool = True
    ) -> checkpoint_store.RestoreReport:
        """An operator's restore into `folder`, by the training start's policy: when it falls
        back past proven damage it moves the head back too (taking the run's lease, so a writer
        still running stops before it publishes on top of a damaged head), unless not
        `roll_back`."""
        return self._restore_published(folder, roll_back=roll_back)

    def verify(self, entry: CatalogEntry, scratch: Path) -> tuple[Manifest, list[str]]:
        return checkpoint_store.verify(self.storage, entry.manifest_key, scratch)

    def collect_garbage(
        self, keep: int = checkpoint_store.MIN_KEEP
    ) -> checkpoint_store.CollectReport:
        """Remove superseded checkpoints beyond the newest `keep` (deletes: an operator's
        credentials; a fleet machine's role may not delete)."""
        return checkpoint_store.collect_garbage(
            storage=self.storage, catalog=self.catalog, run=self.run, keep=keep, say=self._tell
        )

    def quarantine(self, step: int, reason: str) -> None:
        self.catalog.quarantine(step, reason)

    def roll_back(self, step: int, reason: str) -> list[int]:
        """Make `step` the head again, fencing any writer still running."""
        return self.catalog.roll_back(step, self.generation, reason)

    def move_here(self, reason: str, into: Path) -> tuple[Epoch, list[tuple[int, str]]]:
        """Move the run to the region of this catalog's copy: claim the next epoch there from
        the newest checkpoint of the run's history whose every piece is in this store and
        verifies (a partial replica is passed over). Writers in the region the run leaves are
        fenced from then on. The check is a restore into `into` (emptied first of all but an
        earlier restore of the run, as a training start does), which it leaves there, so that
        the run's restore from `into` fetches none of it again. Returns the claim and (step,
        why) of each newer one passed over."""
        from spotrain.core.catalog_schema import STATUS_COMPLETE

        catalog = self._mover()
        head = catalog.head()
        newest_first = reversed(catalog.entries())
        last = head.step if head is not None else None
        history = [e for e in newest_first
                   if e.status == STATUS_COMPLETE and (last is None or e.step <= last)]  # fmt: skip
        passed_over: list[tuple[int, str]] = []
        checkpoint_store.keep_only_a_restore(into, self.run)
        for entry in history:
            try:
                checkpoint_store.fetch(self.storage, entry.manifest_key, into, run=self.run)
            except checkpoint_store.PROOF_OF_DAMAGE as why:
                passed_over.append((entry.step, str(why)))
                continue
            claim = catalog.claim_move(entry, by=f"{self._lease_owner}: {reason}")
            return claim, passed_over
        raise CatalogError(
            f"run {self.run!r} has no checkpoint whose every piece is in {self.storage.uri}: "
            "wait for replication to catch up (`spotrain checkpoints verify`), then move"
        )

    def follow_order(self, order: MoveOrder, into: Path) -> str:
        """Carry out a handler's move order when it applies to this region (`core.failover`),
        and say what happened (`move_here` restores the checkpoint into `into`). Several
        machines boot at once: one claims, the others find it claimed."""
        from spotrain.core import failover, run_epochs

        catalog = self._mover()
        here = catalog.region

        def current() -> EpochId | None:
            latest = run_epochs.current(catalog.chain())
            return latest.id if latest is not None else None

        why_not = failover.order_applies(order, current(), here)
        if why_not is not None:
            return f"no move: {why_not}"
        try:
            claim, passed_over = self.move_here(order.reason, into)
        except CatalogError:
            now = current()
            if now is None or now.region != here:
                raise
            return f"no move: another machine claimed it (epoch {now.number})"
        passed = "".join(f"; passed over step {step}: {why}" for step, why in passed_over)
        return (f"moved to {here} (epoch {claim.id.number}) from step {claim.base_step}, as "
                f"ordered: {order.reason}{passed}")  # fmt: skip

    def _mover(self) -> DynamoCatalog:
        """The catalog a move claims the run in (a move needs the table)."""
        if not isinstance(self.catalog, DynamoCatalog):
            raise CatalogError("a move claims the run in the catalog: give --catalog-table "
                               "(the table's copy in the region the run moves to)")  # fmt: skip
        return self.catalog

    def _accept(self, manifest: Manifest) -> None:
        """Refuse (raise) a checkpoint this restorer may not take; an operator takes any."""

    def _restore_published(
        self, folder: Path, *, roll_back: bool
    ) -> checkpoint_store.RestoreReport:
        """The restore policy, for a training start and an operator alike: the newest published
        checkpoint that verifies (found from the store's records while the catalog cannot be
        read), refused by `_accept`, and, when `roll_back`, the head moved back past the
        damaged ones it skipped (under the run's lease)."""
        parts = {"storage": self.storage, "catalog": self.catalog, "run": self.run}
        if roll_back:
            report = restore_policy.restore_as_writer(
                folder, **parts, generation=lambda: self.generation, accept=self._accept
            )
        else:
            report = restore_policy.restore(folder, **parts)
            self._accept(report.manifest)
        if report.catalog_unavailable:
            self._tell(f"catalog unavailable ({report.catalog_unavailable}); found "
                       "checkpoints from the store's records")  # fmt: skip
        for step, reason in report.skipped:
            self._tell(f"skipped checkpoint step {step}: {reason}")
        for note in report.notes:
            self._tell(f"damaged copy passed over (another copy served): {note}")
        if report.reused_bytes:
            self._tell(f"step {report.manifest.step}: {report.reused_bytes:,} bytes taken from "
                       f"{folder}'s earlier restore (a move's check), {report.fetched_bytes:,} "
                       "fetched")  # fmt: skip
        if report.rolled_back_from is not None:
            self._tell(f"head moved back from step {report.rolled_back_from} to "
                       f"{report.manifest.step}")  # fmt: skip
        return report
