"""The one storage seam for checkpoints: `file://` paths and `s3://` buckets behind one
interface. Nothing else in the trainer talks to boto3 for S3.

Objects are written once and never overwritten: S3 writes are conditional (`If-None-Match: *`),
folder writes are exclusive creates (a hard link of a finished temporary file), and a write to
a key that exists fails with `AlreadyExists`. Every upload is verified without reading it back:
the file's CRC32, computed while it was hashed for its content address, goes with the upload as
a full-object checksum that S3 checks against the bytes it stored, and the CRC32 S3 then
reports for the object must be the same. Writes to S3 name the bucket's KMS key, as the
checkpoint buckets' policies require.

Errors say whether they prove anything about the data: `ObjectMissing` (the object is not
there) does; any other `StorageError` (an unreachable store, a refused request) does not, and
callers must not treat it as damage. Transient S3 errors (5xx, throttling, broken connections)
are retried by botocore's standard retry mode before they surface.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from spotrain.core import aws_clients
from spotrain.core.errors import SpotrainError, no_region_fix, outage_fix
from spotrain.core.manifest import crc32_text

_CHUNK = 8 * 1024 * 1024
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class StorageError(SpotrainError):
    """A storage location is unusable, or a request to it failed. Proves nothing about the data
    stored there."""


class ObjectMissing(StorageError):
    """The object does not exist: proof that whatever needs it cannot be restored from it."""


class AlreadyExists(StorageError):
    """A write was refused because the key already holds an object (nothing is overwritten)."""


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    crc32: str | None = None
    """Full-object CRC32 the store computed over the bytes it holds (None: it has none)."""
    sha256: str = ""
    """SHA-256 of the bytes as fetched (set by `get_file`)."""


@dataclass(frozen=True)
class FileDigests:
    sha256: str
    crc32: str
    size: int


def digests_of(path: Path) -> FileDigests:
    """SHA-256 (the content address) and CRC32 (the transfer checksum) in one read."""
    sha, crc, size = hashlib.sha256(), 0, 0
    with path.open("rb") as source:
        while chunk := source.read(_CHUNK):
            sha.update(chunk)
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return FileDigests(sha.hexdigest(), crc32_text(crc), size)


def sha256_of(path: Path) -> str:
    return digests_of(path).sha256


class Storage(Protocol):
    """Keys are '/'-separated paths relative to the storage's root."""

    uri: str

    def put_file(self, path: Path, key: str, *, crc32: str | None = None) -> StoredObject: ...

    def get_file(self, key: str, path: Path) -> StoredObject: ...

    def put_bytes(self, key: str, data: bytes, *, crc32: str | None = None) -> None: ...

    def get_bytes(self, key: str) -> bytes: ...

    def stat(self, key: str) -> StoredObject | None: ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str) -> list[str]: ...

    def delete(self, keys: list[str]) -> None: ...


class LocalStorage:
    """A folder. Each object is written to a temporary file, synced, then linked into place,
    which fails if the name exists: a reader never sees half an object, and nothing is
    overwritten."""

    def __init__(self, root: Path) -> None:
        self.root = root.absolute()
        self.uri = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise StorageError(f"key {key!r} escapes the storage root {self.root}")
        return path

    def _write_once(
        self, key: str, chunks: Iterator[bytes], *, expect_crc32: str | None = None,
        source: Path | None = None,
    ) -> int:  # fmt: skip
        target = self._path(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        except OSError as error:
            raise StorageError(f"cannot write {self.uri}/{key}: {error}") from error
        try:
            crc, size = 0, 0
            with os.fdopen(handle, "wb") as out:
                for chunk in chunks:
                    crc = zlib.crc32(chunk, crc)
                    size += len(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if expect_crc32 is not None and crc32_text(crc) != expect_crc32:
                raise StorageError(
                    f"{source} changed while it was being stored as {key}: nothing was written"
                )
            os.link(temporary, target)
        except FileExistsError:
            raise AlreadyExists(f"{self.uri}/{key} exists; objects are never overwritten") from None
        except OSError as error:
            raise StorageError(f"cannot write {self.uri}/{key}: {error}") from error
        finally:
            Path(temporary).unlink(missing_ok=True)
        return size

    def put_file(self, path: Path, key: str, *, crc32: str | None = None) -> StoredObject:
        def chunks() -> Iterator[bytes]:
            with path.open("rb") as source:
                while chunk := source.read(_CHUNK):
                    yield chunk

        size = self._write_once(key, chunks(), expect_crc32=crc32, source=path)
        return StoredObject(key, size, crc32)

    def get_file(self, key: str, path: Path) -> StoredObject:
        source = self._path(key)
        sha, size = hashlib.sha256(), 0
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with source.open("rb") as reader, path.open("wb") as writer:
                while chunk := reader.read(_CHUNK):
                    sha.update(chunk)
                    size += len(chunk)
                    writer.write(chunk)
        except FileNotFoundError:
            raise ObjectMissing(f"{self.uri}/{key} does not exist") from None
        except OSError as error:
            raise StorageError(f"{self.uri}/{key} could not be read: {error}") from error
        return StoredObject(key, size, sha256=sha.hexdigest())

    def put_bytes(self, key: str, data: bytes, *, crc32: str | None = None) -> None:
        self._write_once(key, iter([data]), expect_crc32=crc32, source=Path(f"<{key}>"))

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise ObjectMissing(f"{self.uri}/{key} does not exist") from None
        except OSError as error:
            raise StorageError(f"{self.uri}/{key} could not be read: {error}") from error

    def stat(self, key: str) -> StoredObject | None:
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            crc = 0
            with path.open("rb") as source:
                while chunk := source.read(_CHUNK):
                    crc = zlib.crc32(chunk, crc)
            return StoredObject(key, path.stat().st_size, crc32_text(crc))
        except OSError as error:
            raise StorageError(f"{self.uri}/{key} could not be read: {error}") from error

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        root = self.root.resolve()
        base = self._path(prefix) if prefix else root
        if not prefix or prefix.endswith("/"):
            found = base.rglob("*") if base.is_dir() else iter(())
        elif base.parent.is_dir():  # a prefix may end inside a name: shards/<sha256> and copies
            found = (
                p for match in base.parent.glob(f"{base.name}*")
                for p in (match.rglob("*") if match.is_dir() else [match])
            )  # fmt: skip
        else:
            found = iter(())
        return sorted(
            str(p.resolve().relative_to(root))
            for p in found
            if p.is_file() and not p.name.startswith(".")
        )

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            try:
                self._path(key).unlink(missing_ok=True)
            except OSError as error:
                raise StorageError(f"could not delete {self.uri}/{key}: {error}") from error


S3_CONNECTIONS = 32
"""The store's client's connection pool: a checkpoint's 16 piece uploaders at once, with room
for a transfer's parts beside them. With botocore's default pool of 10, the six requests beyond
it each open a connection (a TLS handshake) and throw it away after (urllib3's "pool is full").
On the local cloud's loopback an idle upload ran at the same rate with either pool; a handshake
to a real region costs round trips."""


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
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._max_concurrency, self._part_size = max_concurrency, part_size
        self._download_part_size = download_part_size
        self._writing_once: set[str] = set()
        self._default_key_looked_up = kms_key_id is not None
        if client is not None:
            self._adopt(client)

    @property
    def client(self) -> Any:
        with self._client_lock:
            if self._client is None:
                self._adopt(aws_clients.client("s3", connections=S3_CONNECTIONS))
        return self._client

    def _adopt(self, client: Any) -> None:
        # The transfer manager takes no If-None-Match: add it to the requests that create our
        # objects (a single PUT, or the completion of a multipart upload).
        for operation in ("PutObject", "CompleteMultipartUpload"):
            client.meta.events.register(
                f"before-parameter-build.s3.{operation}",
                self._only_if_absent,
                unique_id=f"spotrain-write-once-{id(self)}-{operation}",
            )
        self._client = client

    def _only_if_absent(self, params: dict[str, Any], **_: Any) -> None:
        if params.get("Bucket") == self.bucket and params.get("Key") in self._writing_once:
            params["IfNoneMatch"] = "*"

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
            self.kms_key_id = self._default_kms_key()
        if self.kms_key_id is None:
            return {}
        return {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": self.kms_key_id}

    def _default_kms_key(self) -> str | None:
        """The bucket's default SSE-KMS key, for writers not told which key to name (operators'
        commands): spotrain's buckets refuse writes that do not name it. None if the bucket
        has none, or these credentials may not read its encryption settings."""
        from botocore.exceptions import BotoCoreError, ClientError

        if self._default_key_looked_up:
            return None
        self._default_key_looked_up = True
        try:
            rules = self.client.get_bucket_encryption(Bucket=self.bucket)[
                "ServerSideEncryptionConfiguration"
            ]["Rules"]
        except (ClientError, BotoCoreError, KeyError):
            return None
        for rule in rules:
            default = rule.get("ApplyServerSideEncryptionByDefault", {})
            if default.get("SSEAlgorithm") == "aws:kms" and default.get("KMSMasterKeyID"):
                return str(default["KMSMasterKeyID"])
        return None

    def _error(self, what: str, key: str, error: Exception, *, writing: bool) -> StorageError:
        """The failure as one message that says what to check; ObjectMissing or AlreadyExists
        where S3's answer proves it."""
        from botocore.exceptions import ClientError, NoCredentialsError, NoRegionError

        where = f"{self.uri}/{key}"
        outage = outage_fix(error, aws_clients.region_of(self._client))  # None: it answered
        if isinstance(error, NoCredentialsError):
            return StorageError(
                f"{what} {where} failed: no AWS credentials; configure them (an instance role "
                "on the fleet, AWS_PROFILE or the AWS_* variables)"
            )
        if isinstance(error, NoRegionError):
            return StorageError(
                f"{what} {where} failed: no AWS region; {no_region_fix()} (the bucket's region)"
            )
        if not isinstance(error, ClientError):  # no answer: the network, or the region
            fix = outage or "check the network path to S3"
            return StorageError(f"{what} {where} failed: {error}; {fix}")
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":
            return StorageError(
                f"{what} {where} failed: bucket {self.bucket!r} does not exist: check the store "
                "URI (the storage stack's output names the bucket) and AWS_DEFAULT_REGION"
            )
        if code in ("404", "NoSuchKey", "NotFound"):
            return ObjectMissing(f"{where} does not exist")
        if code == "PreconditionFailed" or status == 412:
            return AlreadyExists(f"{where} exists; objects are never overwritten")
        hint = "check your credentials' permissions on the bucket and its KMS key"
        if writing and status == 403 and self.kms_key_id is None:
            # Named the key neither here nor in the bucket's default encryption.
            hint = (
                "spotrain's checkpoint buckets accept only SSE-KMS writes with their own key: "
                "pass the bucket's key (kms_key_id in the training configuration, --kms-key-id "
                "on the command line)"
            )
        elif code == "SlowDown":  # S3's throttling, a 503 too: the region answers
            hint = "S3 asked to slow down, and kept asking after retries: try again later"
        elif isinstance(status, int) and status >= 500:
            hint = f"S3 kept failing after retries: {outage}; else try again later"
        return StorageError(f"{what} {where} failed: {error}; {hint}")

    def _call(self, what: str, key: str, operation: str, *, writing: bool = False,
              **kwargs: Any) -> Any:  # fmt: skip
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, operation)(Bucket=self.bucket, **kwargs)
        except (ClientError, BotoCoreError) as error:
            raise self._error(what, key, error, writing=writing) from error

    def put_file(self, path: Path, key: str, *, crc32: str | None = None) -> StoredObject:
        from botocore.exceptions import BotoCoreError, ClientError

        if crc32 is None:
            crc32 = digests_of(path).crc32
        size = path.stat().st_size
        extra = {**self._encryption(), "ChecksumCRC32": crc32}
        full_key = self._key(key)
        self._writing_once.add(full_key)
        try:
            self.client.upload_file(
                str(path), self.bucket, full_key, ExtraArgs=extra, Config=self.transfer_config()
            )
        except (ClientError, BotoCoreError) as error:
            raise self._error(f"upload of {path} to", key, error, writing=True) from error
        except OSError as error:
            raise StorageError(f"upload of {path} to {self.uri}/{key} failed: {error}") from error
        finally:
            self._writing_once.discard(full_key)
        stored = self.stat(key)
        if stored is None or stored.size != size or stored.crc32 != crc32:
            raise StorageError(
                f"{self.uri}/{key} does not hold what was sent (size {size}, CRC32 {crc32}; "
                f"stored: {stored}); it must not be used"
            )
        return stored

    def get_file(self, key: str, path: Path) -> StoredObject:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.client.download_file(
                self.bucket, self._key(key), str(path), Config=self.transfer_config(download=True)
            )
        except (ClientError, BotoCoreError) as error:
            raise self._error("download of", key, error, writing=False) from error
        except OSError as error:
            raise StorageError(f"download of {self.uri}/{key} to {path} failed: {error}") from error
        digests = digests_of(path)
        return StoredObject(key, digests.size, digests.crc32, digests.sha256)

    def put_bytes(self, key: str, data: bytes, *, crc32: str | None = None) -> None:
        """One conditional PUT. `crc32`: the bytes' CRC32 taken when they were hashed; S3
        refuses the write if what it received does not match it (BadDigest), and answers with
        the checksum it stored, which must be the same."""
        crc32 = crc32 or crc32_text(zlib.crc32(data))
        answer = self._call(
            "write of", key, "put_object", writing=True, Key=self._key(key), Body=data,
            IfNoneMatch="*", ChecksumCRC32=crc32, **self._encryption(),
        )  # fmt: skip
        if answer.get("ChecksumCRC32", crc32) != crc32:
            raise StorageError(
                f"{self.uri}/{key} does not hold what was sent (CRC32 {crc32}, stored "
                f"{answer.get('ChecksumCRC32')}); it must not be used"
            )

    def get_bytes(self, key: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        answer = self._call("read of", key, "get_object", Key=self._key(key))
        try:
            return bytes(answer["Body"].read())
        except (ClientError, BotoCoreError, OSError) as error:
            raise StorageError(f"read of {self.uri}/{key} broke off: {error}") from error

    def stat(self, key: str) -> StoredObject | None:
        try:
            head = self._call(
                "inspection of", key, "head_object", Key=self._key(key), ChecksumMode="ENABLED"
            )
        except ObjectMissing:
            return None
        return StoredObject(key, int(head["ContentLength"]), head.get("ChecksumCRC32"))

    def exists(self, key: str) -> bool:
        return self.stat(key) is not None

    def list(self, prefix: str) -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        start = len(self.prefix) + 1 if self.prefix else 0
        keys = []
        try:
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
                keys += [item["Key"][start:] for item in page.get("Contents", [])]
        except (ClientError, BotoCoreError) as error:
            raise self._error("listing of", prefix, error, writing=False) from error
        return sorted(keys)

    def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [{"Key": self._key(k)} for k in keys[start : start + 1000]]
            answer = self._call(
                "deletion in", "", "delete_objects", Delete={"Objects": batch, "Quiet": True}
            )
            failed = answer.get("Errors", [])
            if failed:
                first = failed[0]
                raise StorageError(
                    f"{len(failed)} object(s) of {self.uri} could not be deleted, e.g. "
                    f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}; deleting "
                    "checkpoints is an operator action: use credentials that may delete"
                )


def open_storage(uri: str, *, kms_key_id: str | None = None, client: Any = None) -> Storage:
    """`file:///path`, a plain path (relative to the current folder), or `s3://bucket/prefix`."""
    if not isinstance(uri, str) or not uri.strip():
        raise StorageError("the store is empty: give s3://BUCKET[/PREFIX] or file:///PATH")
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise StorageError(
                f"{uri!r} names the host {parsed.netloc!r}, not a folder: write "
                f"file:///absolute/path (three slashes), or a plain relative path such as "
                f"{parsed.netloc}{parsed.path}"
            )
        path = Path(parsed.path if parsed.scheme else uri).expanduser()
        if path.exists() and not path.is_dir():
            raise StorageError(f"store {uri!r} is a file, not a folder: name a folder")
        return LocalStorage(path)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise StorageError(f"{uri!r} names no bucket: write s3://<bucket>/<prefix>")
        if not _BUCKET_NAME.match(parsed.netloc):
            raise StorageError(
                f"{parsed.netloc!r} is not an S3 bucket name (3-63 lowercase letters, digits, "
                "'.' or '-'): check the store URI"
            )
        return S3Storage(parsed.netloc, parsed.path, kms_key_id=kms_key_id, client=client)
    raise StorageError(
        f"{uri!r}: checkpoints go to file:// paths or s3:// buckets, not {parsed.scheme}://"
    )
