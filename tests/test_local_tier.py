"""Light checkpoints on the work disk: sealed by their manifest, checked before use, and used
only when every machine has the same one and it descends from the published head."""

from __future__ import annotations

from pathlib import Path

from spotrain.trainer import local_tier


def light(root: Path, step: int, parent: str | None, *, seal: bool = True) -> Path:
    folder = root / f"step_{step:09d}"
    (folder / f"step_{step:09d}").mkdir(parents=True)
    (folder / f"step_{step:09d}" / "model.pt").write_bytes(b"weights %d" % step)
    (folder / "latest").write_text(f"step_{step:09d}")
    if seal:
        local_tier.seal(folder, step=step, parent=parent, world_size=2)
    return folder


def test_newest_sealed_and_intact_light_checkpoint_is_found(tmp_path: Path) -> None:
    light(tmp_path, 4, "run/step_000000002")
    light(tmp_path, 6, "run/step_000000002")
    light(tmp_path, 8, "run/step_000000002", seal=False)  # the process died while saving
    found = local_tier.newest(tmp_path)
    assert found is not None
    assert (found.step, found.parent, found.world_size) == (6, "run/step_000000002", 2)


def test_a_corrupt_light_checkpoint_is_passed_over(tmp_path: Path) -> None:
    light(tmp_path, 4, None)
    damaged = light(tmp_path, 6, None)
    (damaged / "step_000000006" / "model.pt").write_bytes(b"weights 7")  # same size, bit rot
    found = local_tier.newest(tmp_path)
    assert found is not None and found.step == 4
    (tmp_path / "step_000000004" / "latest").unlink()
    assert local_tier.newest(tmp_path) is None


def test_prune_keeps_the_given_step_and_newer(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        light(tmp_path, step, None)
    local_tier.prune(tmp_path, keep=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000000004", "step_000000006"]
    local_tier.prune(tmp_path, keep=None)
    assert list(tmp_path.iterdir()) == []


def test_light_step_is_used_only_when_every_machine_has_it_and_it_descends_from_the_head() -> None:
    head = "run/step_000000004"
    assert local_tier.usable_step([(6, head), (6, head)], 4, head) == 6
    assert local_tier.usable_step([(6, None)], None, None) == 6  # nothing published yet
    assert local_tier.usable_step([(6, head), None], 4, head) is None  # one machine lacks it
    assert local_tier.usable_step([(6, head), (5, head)], 4, head) is None  # they disagree
    # Another start published past this machine's lineage: never fork the run's history.
    assert local_tier.usable_step([(6, head)], 8, "run/step_000000008") is None
    assert local_tier.usable_step([(6, "run/step_000000002")], 4, head) is None
    assert local_tier.usable_step([(4, head)], 4, head) is None  # not newer than the head
    assert local_tier.usable_step([], None, None) is None
