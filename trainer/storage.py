"""The one storage seam for checkpoints: `file://` paths and `s3://` buckets behind one
interface. Nothing else in the trainer talks to boto3.

Every upload is verified: the SHA-256 of the bytes sent is computed while reading them, S3
checks each part in transit (`ChecksumAlgorithm=SHA256`), and the stored object's size and
recorded digest are read back before `put_file` returns. Writes to S3 name the bucket's KMS key,
as the checkpoint buckets' policies require.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from spotrain.errors import SpotrainError

_CHUNK = 8 * 1024 * 1024
DIGEST_METADATA_KEY = "sha256"


class StorageError(SpotrainError):
    """A storage location is unusable, or an object is missing or not what was written."""


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    sha256: str


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class Storage(Protocol):
    """Keys are '/'-separated paths relative to the storage's root."""

    uri: str

    def put_file(self, path: Path, key: str) -> StoredObject: ...

    def get_file(self, key: str, path: Path) -> StoredObject: ...

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def get_bytes(self, key: str) -> bytes: ...

    def stat(self, key: str) -> StoredObject | None: ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str) -> list[str]: ...

    def delete(self, keys: list[str]) -> None: ...


class LocalStorage:
    """A folder. Writes go to a temporary file first and are renamed into place, so a reader
    never sees half an object."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = f"file://{root}"

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise StorageError(f"key {key!r} escapes the storage root {self.root}")
        return path

    def _write_atomically(self, key: str, chunks: Iterator[bytes]) -> StoredObject:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        digest, size = hashlib.sha256(), 0
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(handle, "wb") as out:
                for chunk in chunks:
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return StoredObject(key, size, digest.hexdigest())

    def put_file(self, path: Path, key: str) -> StoredObject:
        def chunks() -> Iterator[bytes]:
            with path.open("rb") as source:
                while chunk := source.read(_CHUNK):
                    yield chunk

        return self._write_atomically(key, chunks())

    def get_file(self, key: str, path: Path) -> StoredObject:
        source = self._path(key)
        if not source.is_file():
            raise StorageError(f"{self.uri}/{key} does not exist")
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, path)
        return StoredObject(key, path.stat().st_size, sha256_of(path))

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write_atomically(key, iter([data]))

    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        if not path.is_file():
            raise StorageError(f"{self.uri}/{key} does not exist")
        return path.read_bytes()

    def stat(self, key: str) -> StoredObject | None:
        path = self._path(key)
        if not path.is_file():
            return None
        return StoredObject(key, path.stat().st_size, sha256_of(path))

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.exists():
            return []
        root = self.root.resolve()
        return sorted(
            str(p.resolve().relative_to(root))
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)


class S3Storage:
    """A bucket and prefix, through the boto3 transfer manager (multipart, parallel parts)."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        *,
        kms_key_id: str | None = None,
        client: Any = None,
        max_concurrency: int = 8,
        # Measured against the local cloud (bench/checkpoint.py): uploads ran 3x faster in
        # 16 MiB parts than in 64 MiB ones, downloads 3x faster in 64 MiB ranges than in
        # 16 MiB ones. Both are in AWS's recommended range; the transfer manager grows parts
        # for files that would need more than 10,000.
        part_size: int = 16 * 1024 * 1024,
        download_part_size: int = 64 * 1024 * 1024,
    ) -> None:
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.kms_key_id = kms_key_id
        self._client = client
        self._max_concurrency, self._part_size = max_concurrency, part_size
        self._download_part_size = download_part_size

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("s3")
        return self._client

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def transfer_config(self, *, download: bool = False) -> Any:
        from boto3.s3.transfer import TransferConfig

        part = self._download_part_size if download else self._part_size
        return TransferConfig(
            multipart_threshold=part,
            multipart_chunksize=part,
            max_concurrency=self._max_concurrency,
        )

    def _encryption(self) -> dict[str, str]:
        if self.kms_key_id is None:
            return {}
        return {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": self.kms_key_id}

    def put_file(self, path: Path, key: str) -> StoredObject:
        from botocore.exceptions import ClientError

        digest, size = sha256_of(path), path.stat().st_size
        extra = {
            **self._encryption(),
            "ChecksumAlgorithm": "SHA256",
            "Metadata": {DIGEST_METADATA_KEY: digest},
        }
        try:
            self.client.upload_file(
                str(path),
                self.bucket,
                self._key(key),
                ExtraArgs=extra,
                Config=self.transfer_config(),
            )
        except (ClientError, OSError) as error:
            raise self._write_error(f"upload of {path} to {self.uri}/{key}", error) from error
        stored = self.stat(key)
        if stored is None or stored.size != size or stored.sha256 != digest:
            raise StorageError(
                f"{self.uri}/{key} does not match what was sent (size {size}, sha256 {digest}); "
                "the upload is not usable"
            )
        return stored

    def get_file(self, key: str, path: Path) -> StoredObject:
        from botocore.exceptions import ClientError

        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.client.download_file(
                self.bucket, self._key(key), str(path), Config=self.transfer_config(download=True)
            )
        except ClientError as error:
            raise StorageError(f"download of {self.uri}/{key} failed: {error}") from error
        return StoredObject(key, path.stat().st_size, sha256_of(path))

    def put_bytes(self, key: str, data: bytes) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=self._key(key),
                Body=data,
                ChecksumAlgorithm="SHA256",
                Metadata={DIGEST_METADATA_KEY: hashlib.sha256(data).hexdigest()},
                **self._encryption(),
            )
        except ClientError as error:
            raise self._write_error(f"write of {self.uri}/{key}", error) from error

    def _write_error(self, what: str, error: Exception) -> StorageError:
        """The write's failure, with the usual fix when the bucket refused it."""
        hint = ""
        status = getattr(error, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 403 and self.kms_key_id is None:
            hint = (
                "; spotrain's checkpoint buckets accept only SSE-KMS writes with their own key: "
                "pass the bucket's key (kms_key_id in the training configuration, --kms-key-id "
                "on the command line)"
            )
        return StorageError(f"{what} failed: {error}{hint}")

    def get_bytes(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            return bytes(
                self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
            )
        except ClientError as error:
            raise StorageError(f"{self.uri}/{key} could not be read: {error}") from error

    def stat(self, key: str) -> StoredObject | None:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as error:
            if error.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
                return None
            raise StorageError(f"{self.uri}/{key} could not be inspected: {error}") from error
        return StoredObject(
            key, int(head["ContentLength"]), head.get("Metadata", {}).get(DIGEST_METADATA_KEY, "")
        )

    def exists(self, key: str) -> bool:
        return self.stat(key) is not None

    def list(self, prefix: str) -> list[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        start = len(self.prefix) + 1 if self.prefix else 0
        keys = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
            keys += [item["Key"][start:] for item in page.get("Contents", [])]
        return sorted(keys)

    def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [{"Key": self._key(k)} for k in keys[start : start + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})


def open_storage(uri: str, *, kms_key_id: str | None = None, client: Any = None) -> Storage:
    """`file:///path` or a plain path, or `s3://bucket/prefix`."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return LocalStorage(Path(parsed.path if parsed.scheme else uri))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise StorageError(f"{uri!r} names no bucket: write s3://<bucket>/<prefix>")
        return S3Storage(parsed.netloc, parsed.path, kms_key_id=kms_key_id, client=client)
    raise StorageError(f"{uri!r}: checkpoints go to file:// paths or s3:// buckets")
