"""The restore policy, in one place, for a training start and an operator alike: which
checkpoint a run continues from (the newest published one that verifies, passing over proven
damage; found from the store's records while the catalog cannot be read; a machine's light
checkpoint when it is newer than the published head and descends from it), what happens to the
head after a fallback (moved back under the run's lease), and when a checkpoint is refused
(trained with another definition, unless the change is declared intended). The mechanics
(fetching, verifying, the catalog's writes) are in checkpoint_store, catalog and local_tier."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotrain.core import catalog_schema as schema
from spotrain.core.catalog_schema import checkpoint_id
from spotrain.core.errors import SpotrainError
from spotrain.core.manifest import Manifest
from spotrain.trainer import local_tier
from spotrain.trainer.catalog import Catalog, CatalogError, StoreCatalog
from spotrain.trainer.checkpoint_store import (
    PROOF_OF_DAMAGE,
    NothingPublished,
    RestoreError,
    RestoreReport,
    StoreUnreadable,
    fetch,
)
from spotrain.trainer.storage import Storage, StorageError


class ConfigChanged(SpotrainError):
    """The run's checkpoint was trained with another definition, and the change was not
    declared intended."""


def definition_changes(trained: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The fields whose values differ between the definition a checkpoint was trained with and
    the one starting now, as `field: old -> new`."""
    changes = []
    for name in sorted(set(trained) | set(now)):
        if trained.get(name) != now.get(name):
            changes.append(f"{name}: {trained.get(name)!r} -> {now.get(name)!r}")
    return changes


def refuse_changed_definition(
    run: str, trained: dict[str, Any] | None, now: dict[str, Any] | None, step: int
) -> None:
    """Raise if the checkpoint at `step` was trained with another definition than `now`."""
    if trained is None or now is None:
        return
    changes = definition_changes(trained, now)
    if changes:
        listed = "".join(f"\n  - {change}" for change in changes)
        raise ConfigChanged(
            f"run {run!r}: its checkpoint at step {step} was trained with another "
            f"configuration:{listed}\nset allow_config_change=true to continue with the new "
            "values, or start again with the old ones; nothing was changed"
        )


def restore(destination: Path, *, storage: Storage, catalog: Catalog, run: str) -> RestoreReport:
    """Restore the newest published checkpoint that verifies, passing over any proven damaged.
    If the catalog cannot be read, the checkpoints are found from the store's records."""
    unavailable = None
    try:
        entries, head = catalog.entries(), catalog.head()
    except CatalogError as error:
        if isinstance(catalog, StoreCatalog):
            raise
        unavailable = str(error)
        fallback = StoreCatalog(storage, run)
        entries, head = fallback.entries(), fallback.head()
    candidates = [e for e in entries if e.status == schema.STATUS_COMPLETE]
    if head is not None:  # never restore past the published head (a newer one may be torn)
        candidates = [e for e in candidates if e.step <= head.step]
    skipped: list[tuple[int, str]] = []
    for entry in sorted(candidates, key=lambda e: e.step, reverse=True):
        try:
            fetched = fetch(storage, entry.manifest_key, destination, run=run)
        except PROOF_OF_DAMAGE as error:
            skipped.append((entry.step, str(error)))
            continue
        except StorageError as error:
            raise StoreUnreadable(
                f"run {run!r}: checkpoint step {entry.step} could not be read from "
                f"{storage.uri}, and nothing shows it is damaged ({error}). Nothing was passed "
                "over or rolled back; check that the store is reachable and that these "
                "credentials may read it, then start again"
            ) from error
        return RestoreReport(
            manifest=fetched.manifest,
            skipped=skipped,
            catalog_unavailable=unavailable,
            head_step=head.step if head else None,
            notes=fetched.notes,
            fetched_bytes=fetched.fetched_bytes,
            reused_bytes=fetched.reused_bytes,
        )
    if not skipped:
        raise NothingPublished(f"run {run!r} has no complete checkpoint in {storage.uri}")
    reasons = "; ".join(f"step {s}: {r}" for s, r in skipped)
    raise RestoreError(
        f"run {run!r} has no restorable checkpoint ({reasons}); check the store with "
        "`spotrain checkpoints verify`, restore the replica region's copy, or start afresh "
        "under a new run name"
    )


def restore_as_writer(
    destination: Path, *, storage: Storage, catalog: Catalog, run: str,
    generation: int | Callable[[], int], accept: Callable[[Manifest], None] | None = None,
) -> RestoreReport:  # fmt: skip
    """`restore` for the run's lease holder: after passing over damaged checkpoints it moves
    the catalog's head back to the one restored (fenced by the lease), or this run could never
    publish until it passed the damaged one again, and nobody restores that one again. Not when
    the catalog could not be read: its head is left for when it can. `generation`: the lease,
    or how to take it (an operator takes it only when the head must move). `accept` may refuse
    the restored checkpoint (by raising) before anything in the catalog changes."""
    report = restore(destination, storage=storage, catalog=catalog, run=run)
    if accept is not None:
        accept(report.manifest)
    if report.fell_back and not report.catalog_unavailable:
        why = "; ".join(reason for _, reason in report.skipped) or "not complete"
        lease = generation if isinstance(generation, int) else generation()
        catalog.roll_back(report.manifest.step, lease, f"a restore fell back past it: {why}")
        report.rolled_back_from = report.head_step
    return report


def light_step_to_use(
    catalog: Catalog, run: str, offers: list[tuple[int, str | None] | None]
) -> int | None:
    """The light checkpoint every machine can restore (each offers its newest: step, parent),
    if it is newer than the published head and descends from it; None to restore from the
    store (also when the head cannot be read: descent cannot be checked then)."""
    if not any(offers):
        return None
    try:
        head = catalog.head()
    except CatalogError:
        return None
    head_id = checkpoint_id(run, head.step) if head else None
    return local_tier.usable_step(offers, head.step if head else None, head_id)
