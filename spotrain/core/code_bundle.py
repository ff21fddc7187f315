"""A run's code, pinned by its content: the repository that declares a run with an entry point
(the folder above its `runs/`) packed as one gzipped tar whose SHA-256 names it.

`spotrain run submit` packs the repository (the files git tracks, or every file outside
hidden, build and environment folders when it is not a git checkout), stores the bundle under
the run's prefix, written once (`bundle_key`), and names it in the stored entry point
(`entry_point.code = "sha256:..."`); each machine's `spotrain train` fetches it, checks the
digest and unpacks it into its work folder, where the ranks run the script. So an ML engineer's
code never has to be copied into the blueprint's checkout, and every machine of a submission
runs the same bytes. The same repository packs to the same bytes (sorted names, no times or
owners), so submitting unchanged code stores nothing new.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import subprocess
import tarfile
from pathlib import Path, PurePosixPath

from spotrain.core.catalog_schema import run_prefix
from spotrain.core.errors import SpotrainError

MAX_BUNDLE_BYTES = 256 * 2**20
"""A code bundle larger than this is refused: data goes in datasets (`spotrain data prepare`),
not with the code."""

DIGEST_PREFIX = "sha256:"

_SKIPPED_FOLDERS = frozenset({"__pycache__", "node_modules", "cdktf.out", "build", "dist"})


def bundle_key(run: str, digest: str) -> str:
    """Where a run's code bundle is stored (under the run's prefix: its machines may read it,
    never write it)."""
    return f"{run_prefix(run)}/code/{digest.removeprefix(DIGEST_PREFIX)}.tar.gz"


def code_files(root: Path) -> list[str]:
    """The repository's files, relative to `root`, sorted: what git tracks there and what it
    would track (untracked, not ignored), else every file; either way, an untracked file in a
    hidden, cache, build or virtual-environment folder (`.spotrain/`, `cdktf.out/`) is left
    out."""

    def git(*flags: str) -> list[str]:
        listed = subprocess.run(["git", "ls-files", "-z", *flags], cwd=root,
                                capture_output=True, check=True)  # fmt: skip
        return [n for n in listed.stdout.decode().split("\0") if n and (root / n).is_file()]

    try:
        tracked = git("--cached")
        others = git("--others", "--exclude-standard")
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: the folder as it is
        tracked = []
        others = [path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file()]
    return sorted({*tracked, *(n for n in others if not _skipped(root, root / n))})


def _skipped(root: Path, path: Path) -> bool:
    """In a hidden, cache or build folder, or a virtual environment."""
    folders = path.relative_to(root).parents
    return any(
        folder.name.startswith(".") or folder.name in _SKIPPED_FOLDERS
        or (root / folder / "pyvenv.cfg").exists()
        for folder in folders if folder.name
    )  # fmt: skip


def pack(root: Path) -> tuple[bytes, str]:
    """The repository at `root` as one reproducible gzipped tar, and its digest
    (`sha256:HEX`)."""
    buffer = io.BytesIO()
    total = 0
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=6) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name in code_files(root):
            path = root / name
            data = path.read_bytes()
            total += len(data)
            if total > MAX_BUNDLE_BYTES:
                raise SpotrainError(
                    f"the code in {root} is over {MAX_BUNDLE_BYTES // 2**20} MiB (at {name}): "
                    "keep data and checkpoints out of the repository (git ignores them), or "
                    "prepare data with `spotrain data prepare`"
                )
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if path.stat().st_mode & 0o111 else 0o644
            tar.addfile(info, io.BytesIO(data))
    bundle = buffer.getvalue()
    return bundle, DIGEST_PREFIX + hashlib.sha256(bundle).hexdigest()


def unpack(bundle: bytes, digest: str, folder: Path) -> None:
    """Check `bundle` against `digest` and unpack it into `folder` (created); a bundle that
    does not match, or names a path outside the folder, is refused."""
    found = DIGEST_PREFIX + hashlib.sha256(bundle).hexdigest()
    if found != digest:
        raise SpotrainError(f"the run's code bundle is damaged: its digest is {found}, the "
                            f"run names {digest}; submit the run again (`spotrain run "
                            "submit`)")  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        for member in tar.getmembers():
            path = PurePosixPath(member.name)
            if not member.isfile() or path.is_absolute() or ".." in path.parts:
                raise SpotrainError(f"the run's code bundle holds {member.name!r}, which is not "
                                    "a file inside it: submit the run again")  # fmt: skip
        tar.extractall(folder, filter="data")
