"""Datasets in the store: text turned into token shards once, by `spotrain data prepare`, and
fetched by every machine of the fleet before it trains.

Layout (`datasets/<name>/` in the store, written once, never overwritten; the name is the
dataset's identity):
- `shard_<n>.bin`: tokens, little-endian, of the manifest's dtype;
- `tokenizer.json`: the byte-pair tokenizer, when the dataset uses one;
- `manifest.json`: written last (its presence is the dataset): the tokenizer (kind,
  vocabulary size, file and digest), dtype, every shard's key, token count, size and SHA-256,
  and the sources (name, size, SHA-256).

Preparing is deterministic: sources are read in the order given, documents in file order,
and the same text gives the same shards, byte for byte (a byte-pair tokenizer is trained with
one thread). Documents are joined by an end-of-document token (`\\n\\n` for byte tokens,
`<|endoftext|>` for byte pairs). A machine fetches the shards to its work disk in parallel,
checks each SHA-256, and keeps them for its next start (`verified.json` beside them), so a
restart on the same disk fetches nothing. Training reads the shards as one stream of tokens:
the sampler's exact-resume guarantee holds unchanged.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spotrain.core.catalog_schema import dataset_prefix, run_name_problem
from spotrain.core.errors import SpotrainError
from spotrain.trainer.storage import AlreadyExists, Storage, digests_of, open_storage

FORMAT_VERSION = 1
TOKENIZERS = ("bytes", "bpe")
BYTES_SEPARATOR = b"\n\n"
END_OF_TEXT = "<|endoftext|>"
DATASET_SCHEME = "dataset:"
"""`data: "dataset:NAME"` names a dataset in the run's own store."""
_FETCH_WORKERS = 8


class DatasetError(SpotrainError):
    """A dataset is missing, malformed, or its files do not verify; or the input to prepare
    one is unusable."""


@dataclass(frozen=True)
class ShardEntry:
    key: str
    tokens: int
    size: int
    sha256: str
    crc32: str


@dataclass(frozen=True)
class DatasetManifest:
    name: str
    tokenizer: dict[str, Any]
    """kind (bytes | bpe), vocab_size, and for bpe: key and sha256 of tokenizer.json."""
    dtype: str
    documents: int
    tokens: int
    shards: tuple[ShardEntry, ...]
    sources: tuple[dict[str, Any], ...]
    created_at: str
    format_version: int = FORMAT_VERSION

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer["vocab_size"])

    def to_json(self) -> bytes:
        document = asdict(self)
        return json.dumps(document, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> DatasetManifest:
        try:
            document = json.loads(data)
            if document.get("format_version") != FORMAT_VERSION:
                raise ValueError(f"format {document.get('format_version')} is not {FORMAT_VERSION}")
            document["shards"] = tuple(ShardEntry(**s) for s in document["shards"])
            document["sources"] = tuple(document["sources"])
            manifest = cls(**document)
            np.dtype(manifest.dtype)
            return manifest
        except (TypeError, KeyError, ValueError, AttributeError) as error:
            raise DatasetError(
                f"dataset manifest {where} is not one spotrain wrote ({error}): prepare the "
                "dataset again under a new name"
            ) from error


def manifest_key(name: str) -> str:
    return f"{dataset_prefix(name)}/manifest.json"


# --- preparing ------------------------------------------------------------------------------
def _documents(path: Path, text_field: str) -> Iterator[str]:
    """The documents of one source: a JSONL file's `text_field` values, or a text file."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise DatasetError(f"{path} cannot be read: {error}") from error
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DatasetError(
            f"{path} is not UTF-8 text (byte {error.start}): give text files or JSONL"
        ) from error
    if "\x00" in text:
        raise DatasetError(f"{path} holds NUL bytes: it looks binary, not text")
    if path.suffix != ".jsonl":
        if text.strip():
            yield text
        return
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            value = record[text_field]
        except (ValueError, KeyError, TypeError):
            raise DatasetError(
                f"{path}:{number} is not a JSON object with a {text_field!r} string: fix the "
                "line, or name the field with --text-field"
            ) from None
        if not isinstance(value, str):
            raise DatasetError(f"{path}:{number}: {text_field!r} is not a string")
        if value.strip():
            yield value


def _encode_source(args: tuple[str, str, str | None]) -> tuple[bytes, int]:
    """Worker: one source's tokens, each document followed by the end-of-document token, and
    how many documents it held."""
    path, text_field, tokenizer_json = args
    documents = list(_documents(Path(path), text_field))
    if tokenizer_json is None:
        return b"".join(d.encode("utf-8") + BYTES_SEPARATOR for d in documents), len(documents)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    end = tokenizer.token_to_id(END_OF_TEXT)
    ids: list[int] = []
    for document in documents:
        ids += tokenizer.encode(document).ids
        ids.append(end)
    dtype = _dtype_for(tokenizer.get_vocab_size())
    return np.asarray(ids, dtype=dtype).tobytes(), len(documents)


def _dtype_for(vocab_size: int) -> np.dtype[Any]:
    return np.dtype(
        np.uint8 if vocab_size <= 256 else np.uint16 if vocab_size <= 65536 else np.uint32
    )


def train_bpe(sources: Sequence[Path], vocab_size: int, text_field: str) -> str:
    """A byte-level byte-pair tokenizer trained on the sources; its JSON."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one thread: the same merges every time
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(
        (d for path in sources for d in _documents(path, text_field)), trainer=trainer
    )
    return str(tokenizer.to_str())


@dataclass(frozen=True)
class PrepareReport:
    manifest: DatasetManifest
    uploaded_bytes: int


def prepare(
    sources: Sequence[Path], *, storage: Storage, name: str, tokenizer: str = "bytes",
    vocab_size: int = 8192, text_field: str = "text", shard_tokens: int = 64 * 1024 * 1024,
    workers: int = 2, scratch: Path, progress: Callable[[int], None] | None = None,
) -> PrepareReport:  # fmt: skip
    """Tokenize `sources` into shards of `shard_tokens` tokens and store them as dataset
    `name`. `progress` is called with the number of sources done so far."""
    problems = []
    if problem := run_name_problem(name, "dataset"):
        problems.append(f"--name: {problem}")
    if tokenizer not in TOKENIZERS:
        problems.append(f"tokenizer {tokenizer!r}: use one of {', '.join(TOKENIZERS)}")
    if tokenizer == "bpe" and not 256 < vocab_size <= 1_000_000:
        problems.append(f"vocab size {vocab_size}: use more than 256 (the bytes) for bpe")
    if shard_tokens < 1 or workers < 1:
        problems.append("shard tokens and workers must be 1 or more")
    if not sources:
        problems.append("no input: give text files (.txt, .md, ...) or JSONL files (.jsonl)")
    missing = [str(p) for p in sources if not p.is_file()]
    if missing:
        problems.append(f"not files: {', '.join(missing)}: give files that exist (a folder's "
                        "with a wildcard, e.g. corpus/*.txt)")  # fmt: skip
    if len(problems) == 1:
        raise DatasetError(f"cannot prepare the dataset: {problems[0]}")
    if problems:
        raise DatasetError(f"cannot prepare the dataset, {len(problems)} problems:\n"
                           + "\n".join(f"  - {problem}" for problem in problems))  # fmt: skip
    if storage.exists(manifest_key(name)):
        raise DatasetError(
            f"dataset {name!r} exists in {storage.uri}: datasets are never overwritten; "
            "prepare under a new name"
        )
    tokenizer_json, vocab_size_ = None, 256
    if tokenizer == "bpe":
        from tokenizers import Tokenizer

        tokenizer_json = train_bpe(sources, vocab_size, text_field)
        vocab_size_ = Tokenizer.from_str(tokenizer_json).get_vocab_size()
    dtype = _dtype_for(vocab_size_)
    scratch.mkdir(parents=True, exist_ok=True)
    writer = _ShardWriter(scratch, dtype, shard_tokens)
    documents = 0
    with ProcessPoolExecutor(workers) as pool:  # map keeps the sources' order
        jobs = [(str(p), text_field, tokenizer_json) for p in sources]
        for done, (tokens, count) in enumerate(pool.map(_encode_source, jobs), 1):
            writer.add(tokens)
            documents += count
            if progress is not None:
                progress(done)
    files = writer.close()
    if documents == 0 or not files:
        raise DatasetError("the input holds no text: nothing to train on")
    uploaded = 0
    shards = []
    for file in files:
        digests = digests_of(file)
        key = f"{dataset_prefix(name)}/{file.name}"
        uploaded += _put_once(storage, file, key, digests.crc32)
        shards.append(ShardEntry(key, digests.size // dtype.itemsize, digests.size,
                                 digests.sha256, digests.crc32))  # fmt: skip
    described: dict[str, Any] = {"kind": tokenizer, "vocab_size": vocab_size_}
    if tokenizer_json is not None:
        path = scratch / "tokenizer.json"
        path.write_text(tokenizer_json)
        described |= {"key": f"{dataset_prefix(name)}/tokenizer.json",
                      "sha256": digests_of(path).sha256}  # fmt: skip
        uploaded += _put_once(storage, path, described["key"], digests_of(path).crc32)
    manifest = DatasetManifest(
        name=name, tokenizer=described, dtype=dtype.name, documents=documents,
        tokens=sum(s.tokens for s in shards), shards=tuple(shards),
        sources=tuple({"name": p.name, "bytes": p.stat().st_size,
                       "sha256": digests_of(p).sha256} for p in sources),
        created_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )  # fmt: skip
    storage.put_bytes(manifest_key(name), manifest.to_json())
    return PrepareReport(manifest, uploaded)


def _put_once(storage: Storage, path: Path, key: str, crc32: str) -> int:
    """Upload, or accept what an interrupted earlier prepare of the same name left there if
    it holds the same bytes. Returns the bytes sent."""
    try:
        storage.put_file(path, key, crc32=crc32)
        return path.stat().st_size
    except AlreadyExists:
        stored = storage.stat(key)
        if stored is None or stored.crc32 != crc32:
            raise DatasetError(
                f"{storage.uri}/{key} exists with other bytes: an earlier prepare of this name "
                "used other input; prepare under a new name"
            ) from None
        return 0


class _ShardWriter:
    """Cuts a stream of tokens into files of `shard_tokens` tokens."""

    def __init__(self, folder: Path, dtype: np.dtype[Any], shard_tokens: int) -> None:
        self.folder, self.itemsize = folder, dtype.itemsize
        self.limit = shard_tokens * dtype.itemsize
        self.files: list[Path] = []
        self._out: Any = None
        self._written = 0

    def add(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._out is None or self._written == self.limit:
                self._next()
            take = min(len(view), self.limit - self._written)
            self._out.write(view[:take])
            self._written += take
            view = view[take:]

    def _next(self) -> None:
        if self._out is not None:
            self._out.close()
        path = self.folder / f"shard_{len(self.files):05d}.bin"
        self.files.append(path)
        self._out = path.open("wb")
        self._written = 0

    def close(self) -> list[Path]:
        if self._out is not None:
            self._out.close()
        return [f for f in self.files if f.stat().st_size > 0]


# --- reading on a machine -------------------------------------------------------------------
def is_dataset(data: str) -> bool:
    return data.startswith(DATASET_SCHEME) or "://" in data


def dataset_name(data: str) -> str | None:
    """The dataset `data` names (its identity: datasets are never overwritten), or None for a
    token file on this machine."""
    if not is_dataset(data):
        return None
    if data.startswith(DATASET_SCHEME):
        return data.removeprefix(DATASET_SCHEME)
    return data.rstrip("/").rpartition("/")[2]


def locate(data: str, store: str, *, kms_key_id: str | None = None) -> tuple[Storage, str]:
    """The store and name of the dataset `data` names: `dataset:NAME` in the run's store, or
    a URI of its folder (`s3://BUCKET/datasets/NAME`, `file:///PATH/datasets/NAME`)."""
    if data.startswith(DATASET_SCHEME):
        return open_storage(store, kms_key_id=kms_key_id), data.removeprefix(DATASET_SCHEME)
    root, marker, name = data.rstrip("/").rpartition(f"/{dataset_prefix('')}")
    if not marker or not name or "/" in name:
        raise DatasetError(
            f"data {data!r} names no dataset: write dataset:NAME (in the run's store) or the "
            "dataset's folder, s3://BUCKET/datasets/NAME"
        )
    return open_storage(root or "/", kms_key_id=kms_key_id), name


def read_manifest(storage: Storage, name: str) -> DatasetManifest:
    from spotrain.trainer.storage import ObjectMissing

    try:
        data = storage.get_bytes(manifest_key(name))
    except ObjectMissing:
        raise DatasetError(
            f"dataset {name!r} is not in {storage.uri} (or its preparation never finished): "
            f"prepare it with `spotrain data prepare --store {storage.uri} --name {name} "
            "TEXT_FILES...`"
        ) from None
    return DatasetManifest.from_json(data, f"{storage.uri}/{manifest_key(name)}")


@dataclass(frozen=True)
class Fetched:
    files: list[Path]
    """The local shard files, in order, each with its token-file description beside it."""
    downloaded: int
    """Shards downloaded now; the others were on this disk, verified by an earlier start."""


def fetch(storage: Storage, manifest: DatasetManifest, folder: Path) -> Fetched:
    """Every shard on this disk under `folder`, each verified once (kept for later starts)."""
    folder.mkdir(parents=True, exist_ok=True)
    ledger = folder / "verified.json"
    try:
        verified = json.loads(ledger.read_text())
    except (OSError, ValueError):
        verified = {}
    downloaded: list[Path] = []

    def fetch_one(shard: ShardEntry) -> Path:
        local = folder / shard.key.rsplit("/", 1)[-1]
        if (
            verified.get(local.name) == shard.sha256
            and local.is_file()
            and (local.stat().st_size == shard.size)
        ):
            return local
        downloaded.append(local)
        got = storage.get_file(shard.key, local)
        if got.sha256 != shard.sha256 or got.size != shard.size:
            local.unlink(missing_ok=True)
            raise DatasetError(
                f"{storage.uri}/{shard.key} does not match the dataset's manifest (sha256 "
                f"{got.sha256[:12]}...): the dataset is damaged; prepare it again under a new name"
            )
        return local

    with ThreadPoolExecutor(_FETCH_WORKERS) as pool:
        files = list(pool.map(fetch_one, manifest.shards))
    for local, shard in zip(files, manifest.shards, strict=True):
        verified[local.name] = shard.sha256
        description = {"dtype": manifest.dtype, "vocab_size": manifest.vocab_size,
                       "tokens": shard.tokens}  # fmt: skip
        local.with_suffix(".json").write_text(json.dumps(description))
    partial = ledger.with_suffix(".partial")
    partial.write_text(json.dumps(verified))
    os.replace(partial, ledger)
    return Fetched(files, len(downloaded))
