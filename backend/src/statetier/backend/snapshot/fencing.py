"""Conditional writes: what lets exactly one writer commit an epoch.

Two writers can be alive for one checkpoint location (a restarted driver while the old one is
not dead yet, a speculative job). Two mechanisms keep them from committing over each other:

- The writer lease, ``writer.json``: a writer takes it by replacing the object only if it is
  still the version it read (compare-and-swap), recording a new generation and its owner token.
  Every commit first swaps the lease again, from the version the writer last wrote to one
  naming the epoch. A writer whose lease was taken fails that swap and is fenced: it can never
  commit again.
- The manifest is created only if absent, so one epoch is committed once.

Per storage: S3 through botocore (``IfMatch`` / ``IfNoneMatch`` on PutObject; create-if-absent
through s3fs is not honored by every S3 server, conditional PutObject through botocore is by the
SeaweedFS used here); local files through ``os.link`` (fails if the name exists) and ``flock``;
``memory://`` under a process-wide lock. Versions are the S3 ETag, else a content checksum.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import uuid
import zlib
from collections.abc import Iterator
from typing import Any, Protocol

from statetier.backend.snapshot.retry import single_attempt_botocore

__all__ = ["ConditionalOps", "FencedError", "conditional_ops_for", "new_owner_token"]


class FencedError(RuntimeError):
    """Another writer holds the checkpoint location or has committed this epoch."""


def new_owner_token(generation: int) -> str:
    """A writer's token: its lease generation and a random part (never reused)."""
    return f"g{generation:06d}-{uuid.uuid4().hex[:12]}"


class ConditionalOps(Protocol):
    """Atomic single-object operations a storage must offer for fencing."""

    def get(self, path: str) -> tuple[bytes, str] | None:
        """Content and version of ``path``, or None when it does not exist."""

    def create(self, path: str, data: bytes) -> str | None:
        """Write ``path`` only if it does not exist: its new version, or None when it does."""

    def replace(self, path: str, data: bytes, version: str) -> str | None:
        """Overwrite ``path`` only if it is still at ``version``: the new version, or None."""


def _content_version(data: bytes) -> str:
    return f"{zlib.crc32(data):08x}-{len(data)}"


class LocalConditionalOps:
    """Local files: create by hard link (atomic, never overwrites), replace under flock."""

    def get(self, path: str) -> tuple[bytes, str] | None:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        return data, _content_version(data)

    def _temp(self, path: str, data: bytes) -> str:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        temp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        with open(temp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return temp

    def create(self, path: str, data: bytes) -> str | None:
        temp = self._temp(path, data)
        try:
            os.link(temp, path)
        except FileExistsError:
            return None
        finally:
            os.unlink(temp)
        return _content_version(data)

    @contextlib.contextmanager
    def _locked(self, path: str) -> Iterator[None]:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(f"{path}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def replace(self, path: str, data: bytes, version: str) -> str | None:
        with self._locked(path):
            current = self.get(path)
            if current is None or current[1] != version:
                return None
            os.replace(self._temp(path, data), path)
            return _content_version(data)


_MEMORY_LOCK = threading.Lock()


class FsConditionalOps:
    """Any fsspec filesystem whose objects live in this process (``memory://``): a lock
    around check-and-write is atomic because no other process can see the objects."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def get(self, path: str) -> tuple[bytes, str] | None:
        try:
            data: bytes = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        return data, _content_version(data)

    def create(self, path: str, data: bytes) -> str | None:
        with _MEMORY_LOCK:
            if self.fs.exists(path):
                return None
            self.fs.pipe_file(path, data)
            return _content_version(data)

    def replace(self, path: str, data: bytes, version: str) -> str | None:
        with _MEMORY_LOCK:
            current = self.get(path)
            if current is None or current[1] != version:
                return None
            self.fs.pipe_file(path, data)
            return _content_version(data)


class S3ConditionalOps:
    """S3 through botocore (which s3fs brings), with the endpoint and credentials of the s3fs
    filesystem."""

    def __init__(self, fs: Any) -> None:
        import botocore.session  # type: ignore[import-untyped]
        from botocore.config import Config  # type: ignore[import-untyped]

        client_kwargs = dict(getattr(fs, "client_kwargs", {}) or {})
        # One attempt per call, as s3fs is configured: the store's retry owns the policy.
        config = Config(
            connect_timeout=getattr(fs, "connect_timeout", 5),
            read_timeout=getattr(fs, "read_timeout", 15),
            **single_attempt_botocore(),
        )
        endpoint = getattr(fs, "endpoint_url", None) or client_kwargs.get("endpoint_url")
        self.client = botocore.session.get_session().create_client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=getattr(fs, "key", None),
            aws_secret_access_key=getattr(fs, "secret", None),
            aws_session_token=getattr(fs, "token", None),
            region_name=client_kwargs.get("region_name") or "us-east-1",
            config=config,
        )

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        bucket, _, key = path.partition("/")
        return bucket, key

    @staticmethod
    def _code(exc: Exception) -> str:
        response = getattr(exc, "response", None)
        return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""

    def get(self, path: str) -> tuple[bytes, str] | None:
        bucket, key = self._split(path)
        try:
            response = self.client.get_object(Bucket=bucket, Key=key)
        except Exception as exc:
            if self._code(exc) in ("NoSuchKey", "404"):
                return None
            raise
        return response["Body"].read(), str(response["ETag"])

    def _put(self, path: str, data: bytes, **condition: str) -> str | None:
        bucket, key = self._split(path)
        try:
            response = self.client.put_object(Bucket=bucket, Key=key, Body=data, **condition)
        except Exception as exc:
            if self._code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return None
            if self._code(exc) in ("NoSuchKey", "404") and "IfMatch" in condition:
                return None
            raise
        return str(response["ETag"])

    def create(self, path: str, data: bytes) -> str | None:
        return self._put(path, data, IfNoneMatch="*")

    def replace(self, path: str, data: bytes, version: str) -> str | None:
        return self._put(path, data, IfMatch=version)


def conditional_ops_for(fs: Any) -> ConditionalOps:
    """The conditional operations of an fsspec filesystem.

    A filesystem that wraps another (a test's fault injector, a caching layer) can provide its
    own through a ``statetier_conditional_ops()`` method.
    """
    own = getattr(fs, "statetier_conditional_ops", None)
    if own is not None:
        ops: ConditionalOps = own()
        return ops
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if "file" in protocols or "local" in protocols:
        return LocalConditionalOps()
    if "s3" in protocols or "s3a" in protocols:
        return S3ConditionalOps(fs)
    if "memory" in protocols:
        return FsConditionalOps(fs)
    raise ValueError(
        f"checkpoints cannot be fenced on {protocols[0]}:// (no conditional writes); "
        "use s3://, file:// or memory://"
    )
