"""Checkpoint cost for a ~100M-parameter GPT (14 layers, width 768), on the local cloud: S3
(KMS-only bucket) and the DynamoDB catalog over HTTPS on loopback, as in the tests.

    .venv/bin/python bench/checkpoint.py        # writes bench/checkpoint.md (about 5 minutes)

Compared in one run, on the same machine and endpoint:
- spotrain: `spotrain train` (1 rank, ZeRO-2, fp32) checkpointing every 2 steps: the training
  loop stalls only while the checkpointer copies the state into host memory; serialising
  (hashed as it is written), uploading and publishing run in the background. Then a spot
  interruption notice from a local metadata service: notice -> emergency checkpoint published.
- naive: what most training scripts do, `torch.save` of model + optimizer state and then
  `upload_file` of that one file, both on the training loop's time.
- raw multipart: the same bytes, one file, uploaded with parallel multipart parts and nothing
  else (no hashing, no verification, no catalog), and as parallel 4 MiB PUTs: the faster is
  the transport's ceiling here; and the checkpointer's own upload of that file (digests
  known), training idle.
- the in-memory snapshot: one copy of spotrain's checkpoint bytes into warm host buffers.
- restore: `restore_policy.restore` (catalog lookup, parallel download, SHA-256 of every piece)
  vs raw parallel downloads of the same objects, as many at once.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the local cloud's bucket and table, as tests make them

MODEL = {"context": 128, "layers": 14, "heads": 12, "width": 768}
REGION = "us-east-1"
BUCKET, TABLE = "bench-checkpoints", "bench-catalog"


def records(metrics: Path) -> list[dict[str, Any]]:
    return (
        [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    )


def run_spotrain(
    work: Path, store: dict[str, str], env: dict[str, str], corpus: str
) -> dict[str, Any]:
    from spotrain.localcloud.imds import LocalMetadataService

    metrics = work / "metrics.jsonl"
    with LocalMetadataService() as imds:
        config = {"run": "bench", "data": corpus, "steps": 1000, "checkpoint_every": 2,
                  "micro_batch": 2, "model": MODEL, "work_dir": str(work / "work"),
                  "metrics_file": str(metrics), "log_every": 1,
                  "spot_notice_endpoint": imds.endpoint, "spot_notice_poll_seconds": 0.5,
                  **store}  # fmt: skip
        path = work / "bench.json"
        path.write_text(json.dumps(config))
        process = subprocess.Popen(
            [sys.executable, "-m", "spotrain.cli", "train", str(path), "--nproc-per-node", "1"],
            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        while sum(r.get("event") == "published" for r in records(metrics)) < 2:
            if process.poll() is not None:
                raise SystemExit(process.stdout.read() if process.stdout else "training failed")
            time.sleep(0.5)
        noticed_after = [r["step"] for r in records(metrics) if "loss" in r][-1]
        imds.announce_interruption()
        output, _ = process.communicate(timeout=600)
    if process.returncode != 0:
        raise SystemExit(output[-5000:])
    found = records(metrics)
    steps = [r for r in found if "loss" in r]
    published = [r for r in found if r.get("event") == "published"]
    stopped = next(r for r in found if r.get("event") == "stopped")
    return {"steps": steps, "published": published, "stopped": stopped,
            "noticed_after": noticed_after}  # fmt: skip


def naive_save(work: Path, s3: Any, key_id: str) -> dict[str, float]:
    """torch.save of the whole state, then upload_file: both stall the training loop."""
    import torch

    from spotrain.trainer.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, **MODEL))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    x = torch.randint(0, 256, (2, MODEL["context"]))
    model(x, x).backward()
    optimizer.step()  # the optimizer now holds its state, as in training
    path = work / "naive.pt"
    started = time.perf_counter()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    saved = time.perf_counter()
    encryption = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": key_id}
    s3.upload_file(str(path), BUCKET, "naive/state.pt", ExtraArgs=encryption)
    uploaded = time.perf_counter()
    return {"bytes": path.stat().st_size, "save_s": saved - started, "path": str(path),
            "upload_s": uploaded - saved, "stall_s": uploaded - started}  # fmt: skip


def transfer_config(*, download: bool = False) -> Any:
    """The storage seam's multipart settings, for the raw comparisons."""
    from spotrain.trainer.storage import S3Storage

    return S3Storage(BUCKET, "").transfer_config(download=download)


def raw_client(endpoint: str) -> Any:
    """The raw comparisons' S3 client: a checksum only where S3 requires one (botocore's
    default adds a CRC32 trailer to every upload, which the endpoint must then decode) and a
    connection for each of the 16 requests in flight: the transport alone, its ceiling."""
    from botocore.config import Config

    from spotrain.localcloud import control

    bare = Config(request_checksum_calculation="when_required", max_pool_connections=32)
    return control.client("s3", endpoint, REGION, config=bare)


def raw_multipart(path: Path, s3: Any, key_id: str) -> float:
    encryption = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": key_id}
    started = time.perf_counter()
    s3.upload_file(
        str(path), BUCKET, "raw/state.pt", Config=transfer_config(), ExtraArgs=encryption
    )
    return time.perf_counter() - started


def raw_puts(path: Path, s3: Any, key_id: str) -> float:
    """The same bytes as parallel single PUTs of the checkpoint's largest piece (16 in flight,
    as the checkpointer sends them), read into memory before the clock starts."""
    from spotrain.core.manifest import CHUNK_BYTES
    from spotrain.trainer.checkpoint_store import PIECE_WORKERS

    data = path.read_bytes()
    pieces = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)]
    encryption = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": key_id}
    started = time.perf_counter()
    with ThreadPoolExecutor(PIECE_WORKERS) as pool:
        list(pool.map(lambda item: s3.put_object(Bucket=BUCKET, Key=f"raw/piece-{item[0]}",
                                                 Body=item[1], **encryption),
                      enumerate(pieces)))  # fmt: skip
    return time.perf_counter() - started


def snapshot_seconds(size: int) -> float:
    """The in-memory snapshot of `size` bytes: one copy into host buffers already allocated
    (as the checkpointer reuses them), the floor of any stall."""
    import torch

    source = torch.ones(size // 4, dtype=torch.float32)
    buffer = torch.empty_like(source)
    buffer.copy_(source)  # touch every page once, as the previous checkpoint did
    started = time.perf_counter()
    buffer.copy_(source)
    return time.perf_counter() - started


def serialise_seconds(size: int) -> dict[str, float]:
    """The serialising thread alone (its chunks taken at once, nothing hashed or sent) on
    `size` bytes of tensors: as torch.save writes by default, a CRC32 of every record for the
    zip's directory, and as the checkpointer writes, without it. Where the uploaders have
    cores to hash in parallel, this thread is what a publish waits for."""
    from concurrent.futures import Future

    import torch

    from spotrain.core.manifest import chunk_of
    from spotrain.trainer import snapshot

    class TakeAtOnce:
        def put_bytes(self, data: bytes) -> Future[Any]:
            taken: Future[Any] = Future()
            taken.set_result(chunk_of(b""))  # a stand-in: the bytes are not hashed
            return taken

    state = {f"part{i}": torch.ones(size // 4 // 4, dtype=torch.float32) for i in range(4)}
    staged = [snapshot.Staged(Path("bench/optim_states.pt"), state)]
    timed: dict[str, list[float]] = {"with": [], "without": []}
    for _ in range(3):  # each way's best of three, alternating: the floor, not the allocator's
        for name, times in timed.items():
            started = time.perf_counter()
            if name == "with":
                torch.save(state, snapshot.HashingWriter(hand_over=TakeAtOnce().put_bytes))
            else:
                snapshot.stream_staged(staged, Path("bench"), TakeAtOnce())  # type: ignore[arg-type]
            times.append(time.perf_counter() - started)
    return {name: min(times) for name, times in timed.items()}


def idle_upload_seconds(path: Path, key_id: str) -> float:
    """The checkpointer's upload of one file whose digests were taken while it was written
    (content address, conditional write, full-object CRC32, the store's checksum read back),
    with training idle: its piece uploader as a run's first checkpoint uses it (no parent's
    pieces to reuse, so each piece is written at once, not looked up first)."""
    from spotrain.trainer import checkpoint_store
    from spotrain.trainer.storage import S3Storage

    storage = S3Storage(BUCKET, "", kms_key_id=key_id)  # its own client, as a machine's
    shards = checkpoint_store.describe_folder(path.parent)  # not timed: taken while writing
    started = time.perf_counter()
    uploader = checkpoint_store.PieceUploader(storage=storage, run="idle", known={})
    for shard in shards:
        uploader.put_file(path.parent, shard)
    uploader.finish(shards)
    return time.perf_counter() - started


FROZEN_BLOCKS = MODEL["layers"] // 2
PAGE = 4096


def changed_bytes(old: Path, new: Path) -> int:
    """Bytes in 4 KiB pages that differ between two versions of a file."""
    import numpy as np

    a, b = np.fromfile(old, dtype=np.uint8), np.fromfile(new, dtype=np.uint8)
    if a.size != b.size:
        return int(b.size)
    pages = -(-a.size // PAGE)
    pad = pages * PAGE - a.size
    a, b = np.pad(a, (0, pad)), np.pad(b, (0, pad))
    differs = (a.reshape(pages, PAGE) != b.reshape(pages, PAGE)).any(axis=1)
    return int(differs.sum()) * PAGE


def frozen_finetune(work: Path, key_id: str, s3: Any, env: dict[str, str]) -> dict[str, Any]:
    """A fine-tuning run in this process (one rank, ZeRO-2): the embeddings and the first half
    of the blocks frozen, a checkpoint every step through the Checkpointer. Compares what each
    checkpoint sent with the bytes that changed since the previous one."""
    import socket

    import deepspeed
    import torch

    from spotrain.trainer import checkpoint_store
    from spotrain.trainer.checkpointer import Checkpointer
    from spotrain.trainer.model import GPT, GPTConfig
    from spotrain.trainer.process import init_distributed
    from spotrain.trainer.storage import S3Storage

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(env)  # the local cloud, as for the trainer's processes
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")  # fmt: skip
    init_distributed()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, **MODEL))
    frozen = [model.tokens, model.positions, *model.blocks[:FROZEN_BLOCKS]]
    for module in frozen:
        module.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(trainable, lr=3e-4),
        config={"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
                "steps_per_print": 10**9},
    )  # fmt: skip
    published: list[dict[str, Any]] = []
    checkpointer = Checkpointer(
        run="finetune", store=f"s3://{BUCKET}", kms_key_id=key_id, work_dir=str(work / "ft"),
        every=1, on_event=lambda kind, **fields: published.append(fields)
        if kind == "published" else None,
    )  # fmt: skip
    checkpointer.restore(engine)
    steps = 4
    for step in range(steps):
        x = torch.randint(
            0, 256, (2, MODEL["context"]), generator=torch.Generator().manual_seed(step)
        )
        engine.backward(engine(x, x))
        engine.step()
        checkpointer.after_step(step + 1, last=step + 1 == steps)
    checkpointer.close()
    storage = S3Storage(BUCKET, "", kms_key_id=key_id, client=s3)
    entries = {e.step: e for e in checkpointer.entries()}
    folders = {}
    for step in (steps - 1, steps):
        folders[step] = work / f"ft-restored-{step}"
        checkpoint_store.fetch(storage, entries[step].manifest_key, folders[step], run="finetune")
    old_tag, new_tag = (f"step_{step:09d}" for step in (steps - 1, steps))
    changed = sum(
        changed_bytes(folders[steps - 1] / path.relative_to(folders[steps]).as_posix()
                      .replace(new_tag, old_tag), path)
        for path in folders[steps].rglob("*") if path.is_file() and not path.name.startswith(".")
    )  # fmt: skip
    frozen_params = sum(p.numel() for module in frozen for p in module.parameters())
    return {"published": published, "changed": changed, "frozen_params": frozen_params,
            "params": sum(p.numel() for p in model.parameters())}  # fmt: skip


def restore_times(work: Path, s3: Any, dynamodb: Any, key_id: str) -> dict[str, float]:

    from spotrain.trainer import checkpoint_store, restore_policy
    from spotrain.trainer.catalog import DynamoCatalog
    from spotrain.trainer.storage import S3Storage

    storage = S3Storage(BUCKET, "", kms_key_id=key_id, client=s3)
    catalog = DynamoCatalog(TABLE, "bench", storage, client=dynamodb)
    started = time.perf_counter()
    report = restore_policy.restore(
        work / "restored", storage=storage, catalog=catalog, run="bench"
    )
    ours = time.perf_counter() - started
    keys = list(dict.fromkeys(p.keys[0] for s in report.manifest.shards for p in s.pieces))
    config = transfer_config(download=True)
    raw_dir = work / "raw-download"
    raw_dir.mkdir()
    started = time.perf_counter()
    with ThreadPoolExecutor(checkpoint_store.PIECE_WORKERS) as pool:  # as many as the restore
        list(pool.map(lambda k: s3.download_file(BUCKET, k, str(raw_dir / k.rsplit("/", 1)[1]),
                                                  Config=config), keys))  # fmt: skip
    raw = time.perf_counter() - started
    return {"restore_s": ours, "raw_download_s": raw, "bytes": report.manifest.total_bytes,
            "step": report.manifest.step}  # fmt: skip


def main() -> None:
    from helpers import create_catalog_table, kms_only_bucket

    from spotrain.localcloud import control
    from spotrain.trainer.data import synthetic_corpus, write_token_file

    work = Path(tempfile.mkdtemp(prefix="spotrain-bench-"))
    os.environ["SPOTRAIN_HOME"] = str(work / "home")
    cloud = control.up(port=0)
    try:
        s3 = control.client("s3", cloud.endpoint, REGION)
        dynamodb = control.client("dynamodb", cloud.endpoint, REGION)
        key_id = kms_only_bucket(s3, control.client("kms", cloud.endpoint, REGION), BUCKET)
        create_catalog_table(dynamodb, TABLE)
        corpus = str(write_token_file(work / "corpus", synthetic_corpus(2_000_000)))
        env = control.aws_environment(cloud.endpoint, REGION)
        os.environ.update(env)  # the store's own clients here reach the local cloud as there
        store = {"store": f"s3://{BUCKET}", "catalog_table": TABLE, "kms_key_id": key_id}
        ours = run_spotrain(work, store, env, corpus)
        naive = naive_save(work, s3, key_id)
        raw_s3 = raw_client(cloud.endpoint)
        raw = {"multipart": raw_multipart(Path(naive["path"]), raw_s3, key_id),
               "puts": raw_puts(Path(naive["path"]), raw_s3, key_id)}  # fmt: skip
        naive_only = work / "naive-only"
        naive_only.mkdir()
        Path(naive["path"]).rename(naive_only / "naive.pt")
        naive["idle_upload_s"] = idle_upload_seconds(naive_only / "naive.pt", key_id)
        restore = restore_times(work, s3, dynamodb, key_id)
        finetune = frozen_finetune(work, key_id, s3, env)
    finally:
        control.down()
    write_report(ours, naive, raw, restore, finetune)
    shutil.rmtree(work, ignore_errors=True)


def write_report(ours: dict[str, Any], naive: dict[str, float], raw: dict[str, float],
                 restore: dict[str, float], finetune: dict[str, Any]) -> None:  # fmt: skip
    import torch

    step_s = sorted(r["tokens_per_s"] for r in ours["steps"])[len(ours["steps"]) // 2]
    tokens_per_step = 2 * MODEL["context"]
    step_seconds = tokens_per_step / step_s
    first = ours["published"][0]
    full_bytes = first["uploaded_bytes"] + first["reused_bytes"]
    upload_s = [p["save_to_published_s"] - p["stall_s"] for p in ours["published"]]
    stall = [p["stall_s"] for p in ours["published"]]
    mb = 1024 * 1024
    snapshot_s = snapshot_seconds(full_bytes)
    serialise_s = serialise_seconds(full_bytes)
    raw_s = min(raw.values())  # the faster way to move these bytes here: the ceiling
    raw_bandwidth = naive["bytes"] / raw_s
    steady = sorted(stall[1:] or stall)[len(stall[1:] or stall) // 2]
    notice_s = ours["stopped"]["notice_to_published_s"]
    emergency = next(p for p in ours["published"] if p["step"] == ours["stopped"]["step"])
    emergency_s = emergency["save_to_published_s"]
    lines = [
        "# Checkpoint benchmark",
        "",
        f"Command: `.venv/bin/python bench/checkpoint.py` — {platform.machine()}, "
        f"{os.cpu_count()} CPU cores, no GPU, Python {platform.python_version()}, "
        f"torch {torch.__version__}; local cloud (moto over HTTPS on loopback), one rank, "
        f"ZeRO-2 fp32, model {MODEL} (~99M parameters).",
        "",
        "## Training-loop stall per checkpoint",
        "",
        "| | bytes | stall (s) | stall / training step |",
        "|---|---:|---:|---:|",
        f"| spotrain (snapshot to memory; serialise, hash, upload in the background) | "
        f"{full_bytes / mb:,.0f} MiB | {steady:.2f} (median; max {max(stall):.2f} of "
        f"{len(stall)}) | {steady / step_seconds:.2f} |",
        f"| naive (`torch.save` + `upload_file`) | {naive['bytes'] / mb:,.0f} MiB | "
        f"{naive['stall_s']:.2f} | {naive['stall_s'] / step_seconds:.1f} |",
        f"| one copy of spotrain's bytes into warm host buffers | {full_bytes / mb:,.0f} MiB | "
        f"{snapshot_s:.2f} | {snapshot_s / step_seconds:.2f} |",
        "",
        f"Naive stall / spotrain stall: **{naive['stall_s'] / max(stall):.1f}x** at the worst "
        f"(target 20x). Spotrain stall / in-memory copy: **{steady / snapshot_s:.2f}x** "
        f"(median), {max(stall) / snapshot_s:.2f}x at the worst (target 1.5x; the stall also "
        "holds DeepSpeed's assembly of its state dictionaries and a barrier, and competes for "
        "the cores with the previous checkpoint's upload). The buffers are allocated before "
        "training (a snapshot thrown away), so the first checkpoint is no slower. "
        f"One training step: {step_seconds:.2f} s (median).",
        "",
        "## The serialising thread",
        "",
        f"Serialising {full_bytes / mb:,.0f} MiB of tensors, the thread alone (its chunks "
        "taken at once, nothing hashed or sent): "
        f"{serialise_s['with']:.2f} s as torch.save writes by default (a CRC32 of every record "
        f"for the zip's directory), {serialise_s['without']:.2f} s as the checkpointer writes "
        f"(none: each chunk has its own SHA-256 and CRC32), each the best of three: "
        f"**{serialise_s['with'] / serialise_s['without']:.1f}x** faster. Here the hashing "
        "competes with it for two cores; where the uploaders have cores of their own, this "
        "thread is what a publish waits for.",
        "",
        "## Upload throughput (same endpoint, same machine)",
        "",
        "| | MiB/s |",
        "|---|---:|",
        f"| spotrain: serialise + hash + upload + verify + manifest + catalog (while "
        f"training) | {first['uploaded_bytes'] / mb / upload_s[0]:,.0f} |",
        "| spotrain's upload of one hashed file, training idle "
        f"(`checkpoint_store.PieceUploader`, as for a first checkpoint) | "
        f"{naive['bytes'] / mb / naive['idle_upload_s']:,.0f} |",
        f"| naive `upload_file` (default transfer settings) | "
        f"{naive['bytes'] / mb / naive['upload_s']:,.0f} |",
        f"| raw parallel multipart (16 MiB parts, 8 in flight), nothing else | "
        f"{naive['bytes'] / mb / raw['multipart']:,.0f} |",
        f"| raw parallel PUTs (4 MiB, 16 in flight), nothing else | "
        f"{naive['bytes'] / mb / raw['puts']:,.0f} |",
        "",
        f"spotrain / the faster raw transfer, training idle: "
        f"**{raw_s / naive['idle_upload_s']:.2f}x** "
        "(target 0.9x); while training: "
        f"{(first['uploaded_bytes'] / upload_s[0]) / raw_bandwidth:.2f}x "
        "(serialisation and upload compete with training for the same cores).",
        "",
        "Incremental: each later checkpoint sent "
        + ", ".join(
            f"{p['uploaded_bytes'] / mb:,.0f} MiB (reused {p['reused_bytes'] / mb:,.2f})"
            for p in ours["published"][1:]
        )
        + " — nothing is frozen in this run, so every chunk changes.",
        "",
        "## Fine-tuning with frozen layers",
        "",
        f"The same model in this process (one rank, ZeRO-2 fp32), the embeddings and blocks "
        f"0-{FROZEN_BLOCKS - 1} of {MODEL['layers']} frozen "
        f"({finetune['frozen_params'] / finetune['params']:.0%} of the parameters), a "
        "checkpoint every step:",
        "",
        "| checkpoint | sent | reused |",
        "|---|---:|---:|",
        *(
            f"| step {p['step']} | {p['uploaded_bytes'] / mb:,.1f} MiB | "
            f"{p['reused_bytes'] / mb:,.1f} MiB |"
            for p in finetune["published"]
        ),
        "",
        f"Bytes changed from step {finetune['published'][-2]['step']} to step "
        f"{finetune['published'][-1]['step']} (4 KiB pages that differ, every file): "
        f"{finetune['changed'] / mb:,.1f} MiB; the last checkpoint sent "
        f"{finetune['published'][-1]['uploaded_bytes'] / mb:,.1f} MiB: "
        f"**{finetune['published'][-1]['uploaded_bytes'] / finetune['changed']:.3f}x** the "
        "changed bytes (target 1.01x). The first checkpoint sends everything; the second sends "
        "the unchanged chunks once more as their second copy (bytes two checkpoints share are "
        "kept in two objects); from the third on only what changed goes up.",
        "",
        "## Spot notice to published emergency checkpoint",
        "",
        f"Interruption notice served after step {ours['noticed_after']}; the run stopped after "
        f"step {ours['stopped']['step']} with its checkpoint published "
        f"**{notice_s:.1f} s** after the watcher saw the notice (EC2 gives 120 s): "
        f"**{notice_s / (full_bytes / raw_bandwidth):.2f}x** the state's bytes over raw "
        f"bandwidth ({full_bytes / raw_bandwidth:.1f} s; target 1.3x). That includes finishing "
        "the step under way when the notice came (one step: "
        f"{step_seconds:.1f} s) and publishing the checkpoint already in flight; the emergency "
        f"checkpoint itself took {emergency_s:.1f} s from its snapshot to published, "
        f"{emergency_s / (full_bytes / raw_bandwidth):.2f}x the state's bytes over raw "
        "bandwidth.",
        "",
        "## Restore",
        "",
        "| | seconds | MiB/s |",
        "|---|---:|---:|",
        f"| `restore_policy.restore` (catalog, download, SHA-256 of every shard) | "
        f"{restore['restore_s']:.1f} | {restore['bytes'] / mb / restore['restore_s']:,.0f} |",
        f"| raw parallel download of the same objects | {restore['raw_download_s']:.1f} | "
        f"{restore['bytes'] / mb / restore['raw_download_s']:,.0f} |",
        "",
        f"Restore / raw: {restore['restore_s'] / restore['raw_download_s']:.2f}x "
        f"(step {restore['step']}, {restore['bytes'] / mb:,.0f} MiB).",
        "",
    ]
    out = ROOT / "bench" / "checkpoint.md"
    out.write_text("\n".join(lines))
    print(out.read_text())


if __name__ == "__main__":
    main()
