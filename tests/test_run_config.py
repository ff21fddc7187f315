"""The run's definition lives in the store, not in the image: `spotrain config put|get|history`
keeps versions where the fleet reads them, and a start refuses a definition that differs from
the one its checkpoint was trained with unless the change is declared intended."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from spotrain import cli
from spotrain.trainer.engine import ConfigChanged, TrainConfig, refuse_unintended_change


def config(**changes: object) -> TrainConfig:
    base = TrainConfig(run="defined", store="file:///store", data="/data/a.bin", steps=10,
                       work_dir="/work", micro_batch=4)  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def test_only_what_defines_the_run_counts_as_a_change() -> None:
    trained = config().definition(world_size=2)
    # Where it runs, how long, how often it saves, what it prints: not the run's definition.
    moved = config(
        store="s3://replica", catalog_table="t", kms_key_id="k", work_dir="/other", steps=99,
        checkpoint_every=7, light_every=2, data="/elsewhere/a.bin", metrics_file="m.jsonl",
        log_every=1, spot_notice_endpoint="http://imds",
    )  # fmt: skip
    refuse_unintended_change(moved, trained, world_size=2, step=5)
    # Half the ranks with twice the micro batch: the same global batch, the same data order.
    refuse_unintended_change(config(micro_batch=8), trained, world_size=1, step=5)
    with pytest.raises(ConfigChanged) as refused:
        refuse_unintended_change(config(learning_rate=1e-3, seed=3), trained, world_size=1,
                                 step=5)  # fmt: skip
    message = str(refused.value)
    for change in ("learning_rate: 0.0003 -> 0.001", "seed: 0 -> 3", "global_batch: 8 -> 4"):
        assert change in message
    allowed = config(learning_rate=1e-3, allow_config_change=True)
    refuse_unintended_change(allowed, trained, world_size=2, step=5)


def test_config_put_keeps_every_version_and_get_returns_the_newest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = ["--store", f"file://{tmp_path / 'store'}"]
    path = tmp_path / "train.json"
    document = {"run": "defined", "store": "file:///x", "data": "/d.bin", "steps": 5,
                "work_dir": "/w"}  # fmt: skip
    path.write_text(json.dumps(document))
    assert cli.main(["config", "put", str(path), *store]) == 0
    assert cli.main(["config", "put", str(path), *store, "--set", "learning_rate=0.001"]) == 0
    assert "runs/defined/config/" in capsys.readouterr().out
    assert cli.main(["config", "history", *store, "--run", "defined"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert len(listing) == 2 and listing[-1].endswith("<- machines use this one")
    got = tmp_path / "got.json"
    assert cli.main(["config", "get", *store, "--run", "defined", "--to", str(got)]) == 0
    from spotrain.trainer.train import load_config  # the newest version, complete, as it loads

    assert load_config(got).learning_rate == 0.001
    path.write_text(json.dumps({**document, "steps": 0}))
    assert cli.main(["config", "put", str(path), *store]) == 2  # checked before it is stored
    assert "train at least 1 step" in capsys.readouterr().err
    assert cli.main(["config", "history", *store, "--run", "defined"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert cli.main(["config", "get", *store, "--run", "undefined", "--to", "x"]) == 2
    assert "store one with `spotrain config put CONFIG" in capsys.readouterr().err


def test_submitting_the_same_configuration_again_stores_no_copy(tmp_path: Path) -> None:
    """`run submit` stores the run's configuration unless its newest version is that one: a
    second submit of an unchanged run adds nothing to its history; a changed one is stored."""
    from spotrain.cli.data import checked_configuration, store_configuration
    from spotrain.trainer import run_config
    from spotrain.trainer.storage import open_storage

    store = f"file://{tmp_path / 'store'}"
    storage = open_storage(store)
    path = tmp_path / "train.json"
    document = {"run": "submitted", "store": store, "data": "/d.bin", "steps": 5, "work_dir": "/w"}
    path.write_text(json.dumps(document))
    first = store_configuration(storage, checked_configuration(path, [], store), unless_newest=True)
    again = store_configuration(storage, checked_configuration(path, [], store), unless_newest=True)
    assert again.key == first.key and len(run_config.history(storage, "submitted")) == 1
    path.write_text(json.dumps({**document, "steps": 6}))
    changed = store_configuration(
        storage, checked_configuration(path, [], store), unless_newest=True
    )
    assert changed.key != first.key and len(run_config.history(storage, "submitted")) == 2


def test_a_run_without_a_global_batch_keeps_the_one_it_started_with() -> None:
    trained = config().definition(world_size=2)  # started on 2 ranks of 4 sequences
    on_one = config().with_global_batch(trained, world_size=1)
    assert on_one.global_batch == 8 and on_one.passes(1) == (4, 2)  # 2 passes of 4 a step
    refuse_unintended_change(on_one, trained, world_size=1, step=5)  # the same run
    assert config().with_global_batch(None, world_size=3).global_batch == 12  # a new run
    assert config(global_batch=6).with_global_batch(trained, 1).global_batch == 6  # given wins
    assert config(global_batch=12, micro_batch=5).passes(1) == (4, 3)  # equal passes, <= 5
    assert config(global_batch=12, micro_batch=5).passes(4) == (3, 1)
