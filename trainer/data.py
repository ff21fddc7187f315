"""Training data: pre-tokenized token files read through a memory map, and a sampler whose
whole state is one integer, so a restored run draws exactly the batches it would have drawn.
Each step draws one global batch that the ranks split, so the stream of sequences does not
depend on how many ranks there are (2 ranks x 4 sequences see what 1 rank x 8 sees).

Tokens are bytes (vocabulary 256): no tokenizer to download, and any text can be a corpus.
`synthetic_corpus` writes a deterministic, learnable text (sums written out in words and
digits) so a fresh machine can train without fetching data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from spotrain.core.errors import SpotrainError

if TYPE_CHECKING:  # a rank's batches are tensors; what checks a run before it starts is not
    import torch

ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _words(n: int) -> str:
    if n < 20:
        return ONES[n]
    tens, ones = divmod(n, 10)
    return TENS[tens] + (f"-{ONES[ones]}" if ones else "")


def synthetic_corpus(size_bytes: int, seed: int = 0) -> bytes:
    """Sentences like 'twelve plus seven is nineteen (12+7=19).', reproducible from the seed."""
    rng = np.random.default_rng(seed)
    parts, total = [], 0
    while total < size_bytes:
        a, b = (int(v) for v in rng.integers(0, 50, size=2))
        sentence = f"{_words(a)} plus {_words(b)} is {_words(a + b)} ({a}+{b}={a + b}).\n"
        parts.append(sentence)
        total += len(sentence)
    return "".join(parts).encode()[:size_bytes]


def write_token_file(path: Path, data: bytes) -> Path:
    """Write bytes as a token file (`.bin`) with its description (`.json`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".bin").write_bytes(data)
    path.with_suffix(".json").write_text(
        json.dumps({"dtype": "uint8", "vocab_size": 256, "tokens": len(data)})
    )
    return path.with_suffix(".bin")


class DataError(SpotrainError):
    """The training data is missing, malformed, or does not fit the model."""


class TokenFile:
    """A token file opened as a read-only memory map: nothing is loaded up front."""

    def __init__(self, path: Path) -> None:
        meta_path = path.with_suffix(".json")
        if not path.is_file() or not meta_path.is_file():
            raise DataError(
                f"token file {path} (with {meta_path.name} beside it) not found: check `data` "
                "in the training configuration, or create it with "
                "spotrain.trainer.data.write_token_file"
            )
        try:
            meta = json.loads(meta_path.read_text())
            self.vocab_size = int(meta["vocab_size"])
            dtype = np.dtype(meta["dtype"])
            expected = int(meta["tokens"])
            if dtype.kind != "u" or self.vocab_size < 1:
                raise ValueError(f"dtype {dtype} / vocab_size {self.vocab_size}")
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise DataError(
                f"{meta_path} does not describe a token file ({error}): it needs dtype "
                "(an unsigned integer type), vocab_size and tokens, as write_token_file writes"
            ) from error
        if path.stat().st_size % dtype.itemsize or path.stat().st_size == 0:
            raise DataError(f"{path} is empty or not a whole number of {dtype} tokens")
        self.tokens = np.memmap(path, dtype=dtype, mode="r")
        if len(self.tokens) != expected:
            raise DataError(
                f"{path} holds {len(self.tokens)} tokens, its description says {expected}: "
                "write the file and its description again"
            )

    def problems_with(self, *, context: int, vocab_size: int) -> list[str]:
        """What keeps a model of this context and vocabulary from training on the file."""
        return fit_problems(self.vocab_size, len(self.tokens), context=context,
                            vocab_size=vocab_size)  # fmt: skip


def fit_problems(data_vocab: int, tokens: int, *, context: int, vocab_size: int) -> list[str]:
    """What keeps a model of this context and vocabulary from training on data with this
    vocabulary and this many tokens."""
    problems = []
    if data_vocab > vocab_size:
        problems.append(
            f"the data has {data_vocab} token ids but model.vocab_size is {vocab_size}: set "
            f"model.vocab_size to at least {data_vocab}, or leave it out to take the data's"
        )
    if tokens <= context + 1:
        problems.append(
            f"the data holds {tokens} tokens, too few for context {context}: use more data or "
            "a shorter model.context"
        )
    return problems


class _Concatenated:
    """Several token arrays read as one: indexing by a slice that crosses a boundary joins
    the pieces (only slices are needed: the sampler reads windows)."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts
        self.starts = np.cumsum([0] + [len(p) for p in parts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, window: slice) -> Any:
        start, stop, _ = window.indices(len(self))
        pieces = []
        index = int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < stop:
            part, offset = self.parts[index], start - int(self.starts[index])
            piece = part[offset : offset + (stop - start)]
            pieces.append(piece)
            start += len(piece)
            index += 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


class TokenStream:
    """A dataset's token files (shards, in order) read as one stream of tokens; one file reads
    exactly as a TokenFile does."""

    def __init__(self, paths: list[Path]) -> None:
        files = [TokenFile(p) for p in paths]
        if not files:
            raise DataError("no token files to read")
        self.vocab_size = max(f.vocab_size for f in files)
        self.tokens: Any = files[0].tokens if len(files) == 1 else _Concatenated(
            [f.tokens for f in files]
        )  # fmt: skip


@dataclass(frozen=True)
class Sampler:
    """Batch `index` depends only on (seed, index): the data position saved in a checkpoint is
    the next index, and restoring it replays the same stream."""

    data: TokenFile | TokenStream
    context: int
    micro_batch: int
    seed: int

    def batch(self, index: int, rank: int = 0, world: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank `rank`'s share (`micro_batch` sequences) of global batch `index`."""
        rng = np.random.default_rng([self.seed, index])
        limit = len(self.data.tokens) - self.context - 1
        if limit <= 0:
            raise ValueError(
                f"corpus of {len(self.data.tokens)} tokens is shorter than context {self.context}"
            )
        starts = rng.integers(0, limit, size=self.micro_batch * world)
        mine = starts[rank * self.micro_batch : (rank + 1) * self.micro_batch]
        rows = np.stack([self.data.tokens[s : s + self.context + 1] for s in mine]).astype(np.int64)
        import torch

        chunk = torch.from_numpy(rows)
        return chunk[:, :-1], chunk[:, 1:]
