"""Datasets: `spotrain data prepare` turns text and JSONL into token shards in the store,
deterministically; each machine fetches them once, verified; training reads them as one
stream, so a run on a dataset has the losses of a run on the same tokens in one file, and
resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import training
from training import TINY_MODEL

from spotrain import cli
from spotrain.trainer import datasets
from spotrain.trainer.data import TokenFile, TokenStream, synthetic_corpus, write_token_file
from spotrain.trainer.storage import LocalStorage


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("text")
    (folder / "sums.txt").write_bytes(synthetic_corpus(30_000))
    notes = [{"text": f"note {i}: " + "spot capacity " * (i % 7), "id": i} for i in range(300)]
    (folder / "notes.jsonl").write_text("\n".join(json.dumps(n) for n in notes))
    return [folder / "sums.txt", folder / "notes.jsonl"]


def prepare(storage: LocalStorage, sources: list[Path], name: str, tmp_path: Path,
            **options: Any) -> datasets.DatasetManifest:  # fmt: skip
    return datasets.prepare(sources, storage=storage, name=name, scratch=tmp_path / name,
                            shard_tokens=7_000, **options).manifest  # fmt: skip


def stored(storage: LocalStorage, manifest: datasets.DatasetManifest) -> bytes:
    return b"".join(storage.get_bytes(s.key) for s in manifest.shards)


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_prepare_is_deterministic_and_keeps_every_document(
    tokenizer: str, sources: list[Path], tmp_path: Path
) -> None:
    storage = LocalStorage(tmp_path / "store")
    first = prepare(storage, sources, "first", tmp_path, tokenizer=tokenizer, vocab_size=600)
    again = prepare(storage, sources, "again", tmp_path, tokenizer=tokenizer, vocab_size=600,
                    workers=1)  # fmt: skip
    assert [s.sha256 for s in first.shards] == [s.sha256 for s in again.shards]
    assert first.documents == 1 + 300 and len(first.shards) > 1
    assert first.tokens == sum(s.tokens for s in first.shards)
    if tokenizer == "bytes":
        expected = sources[0].read_bytes() + b"\n\n" + b"".join(
            json.loads(line)["text"].encode() + b"\n\n"
            for line in sources[1].read_text().splitlines()
        )  # fmt: skip
        assert stored(storage, first) == expected
        assert (first.vocab_size, first.dtype) == (256, "uint8")
    else:
        from tokenizers import Tokenizer

        assert first.tokenizer["sha256"] == again.tokenizer["sha256"]
        bpe = Tokenizer.from_str(storage.get_bytes(first.tokenizer["key"]).decode())
        ids = np.frombuffer(stored(storage, first), dtype=first.dtype)
        assert first.vocab_size == bpe.get_vocab_size() and ids.max() < first.vocab_size
        assert bpe.decode(ids[:40].tolist()).startswith(sources[0].read_text()[:20])


def test_prepare_names_what_is_wrong_with_its_input(
    sources: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = ["--store", f"file://{tmp_path / 'store'}"]
    empty, binary, bad_jsonl = (tmp_path / n for n in ("empty.txt", "blob.bin", "bad.jsonl"))
    empty.write_text("  \n")
    binary.write_bytes(b"\x00\x01\xff\xfe")
    bad_jsonl.write_text('{"body": "no text field"}\n')
    for inputs, expected in [
        ([], "no input"),
        ([str(empty)], "holds no text"),
        ([str(binary)], "is not UTF-8 text"),
        ([str(bad_jsonl)], "name the field with --text-field"),
        ([str(tmp_path / "absent.txt")], "not files"),
    ]:
        assert cli.main(["data", "prepare", *inputs, *store, "--name", "broken"]) == 2
        assert expected in capsys.readouterr().err
    assert cli.main(["data", "prepare", str(bad_jsonl), *store, "--name", "fine",
                     "--text-field", "body"]) == 0  # fmt: skip
    capsys.readouterr()
    assert cli.main(["data", "prepare", str(sources[0]), *store, "--name", "fine"]) == 2
    assert "never overwritten; prepare under a new name" in capsys.readouterr().err
    assert cli.main(["data", "prepare", str(sources[0]), *store, "--name", "Fine!"]) == 2
    assert "dataset name 'Fine!' is not valid" in capsys.readouterr().err
    # Every problem at once: a bad name does not hide the inputs that are not there.
    assert cli.main(["data", "prepare", str(tmp_path / "absent.txt"), *store, "--name", "F!"]) == 2
    err = capsys.readouterr().err
    assert "2 problems" in err and "'F!' is not valid" in err and "absent.txt" in err
    assert not LocalStorage(tmp_path / "store").list("datasets/broken")


def test_each_machine_fetches_once_verified_and_reads_the_shards_as_one_stream(
    sources: list[Path], tmp_path: Path
) -> None:
    storage = LocalStorage(tmp_path / "store")
    manifest = prepare(storage, sources, "stream", tmp_path)
    disk = tmp_path / "disk"
    first = datasets.fetch(storage, manifest, disk)
    assert first.downloaded == len(manifest.shards)
    assert datasets.fetch(storage, manifest, disk).downloaded == 0  # kept for the next start
    stream = TokenStream(first.files).tokens
    whole = np.frombuffer(stored(storage, manifest), dtype=np.uint8)
    assert len(stream) == len(whole)
    boundary = manifest.shards[0].tokens
    for start, stop in [(0, 10), (boundary - 5, boundary + 5), (len(whole) - 3, len(whole))]:
        assert np.array_equal(stream[start:stop], whole[start:stop])
    one = TokenFile(write_token_file(tmp_path / "one", whole.tobytes())).tokens
    assert np.array_equal(one[boundary - 5 : boundary + 5], stream[boundary - 5 : boundary + 5])
    # A shard that is not what the manifest says is refused, and named.
    damaged = storage.root / manifest.shards[1].key
    damaged.write_bytes(b"x" * damaged.stat().st_size)
    with pytest.raises(datasets.DatasetError, match=r"shard_00001\.bin does not match"):
        datasets.fetch(storage, manifest, tmp_path / "another-disk")


@pytest.mark.integration
def test_a_run_on_a_dataset_has_the_losses_of_the_same_tokens_in_one_file_and_resumes(
    sources: list[Path], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    manifest = prepare(LocalStorage(store), sources, "corpus", tmp_path)
    base = {"run": "on-data", "store": f"file://{store}", "micro_batch": 4, "model": TINY_MODEL,
            "checkpoint_every": 2, "work_dir": str(tmp_path / "disk")}  # fmt: skip
    first = training.train({**base, "data": "dataset:corpus", "steps": 2}, tmp_path, "first")
    assert f"{len(manifest.shards)} fetched, 0 already on this disk" in first.output
    second = training.train({**base, "data": "dataset:corpus", "steps": 4}, tmp_path, "second")
    assert f"0 fetched, {len(manifest.shards)} already on this disk" in second.output
    assert "resumed on-data at step 2" in second.output
    one_file = write_token_file(tmp_path / "one", stored(LocalStorage(store), manifest))
    reference = training.train(
        {**base, "run": "reference", "data": str(one_file), "steps": 4,
         "work_dir": str(tmp_path / "ref-disk")}, tmp_path, "reference",
    )  # fmt: skip
    assert first.losses + second.losses == reference.losses
