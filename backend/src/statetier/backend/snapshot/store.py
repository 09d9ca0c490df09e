"""Where snapshots live: the file I/O and the commit, through fsspec.

The names of the objects under a checkpoint URI are :mod:`statetier.backend.snapshot.layout`'s.
Any fsspec URL works: ``file://`` (the embedded default), ``memory://``, ``s3://``, but not a
chain of them (``file:///a::s3://b``), which would put the data under the first part only. Every
call is retried on transient errors (see retry).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import errno
import json
import logging
import os
import time
import uuid
import zlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem
from statetier.backend.config import CHAIN_URL_PROBLEM, ConfigError
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.snapshot import layout
from statetier.backend.snapshot.fencing import (
    ConditionalOps,
    FencedError,
    conditional_ops_for,
    new_owner_token,
)
from statetier.backend.snapshot.format import CorruptFileError, diagnose
from statetier.backend.snapshot.manifest import FileEntry, Manifest
from statetier.backend.snapshot.retry import (
    RetryPolicy,
    call_with_retry,
    single_attempt,
    storage_options_for,
)

__all__ = [
    "NoSnapshotError",
    "SnapshotStore",
    "WriterLease",
    "put_whole",
    "read_whole",
]

NAMED_FILE_RETRY_DELAYS = (0.1, 0.3, 0.6, 1.2)
# Above this size a read lets the filesystem fetch parts concurrently (s3fs's own threshold is
# its block size, 50 MiB by default), which needs the size, so a HEAD, first.
CONCURRENT_READ_BYTES = 50 * 2**20
MANIFESTS_REMEMBERED = 16  # the retained epochs' and a few more (checkpoint.retained: 3)
log = logging.getLogger(__name__)
T = TypeVar("T")


def _data(_: FileEntry, data: bytes) -> bytes:
    return data


class NoSnapshotError(FileNotFoundError):
    """No committed snapshot exists at the location (or not the requested epoch)."""


@dataclasses.dataclass
class WriterLease:
    """A writer's hold on a checkpoint location: its token and the lease version it wrote."""

    owner: str
    generation: int
    version: str


def put_whole(fs: Any, path: str, data: bytes) -> None:
    """Write ``data`` at ``path`` whole or not at all: one PUT on object storage (an object is
    whole or absent); a local file through a temporary name and a rename, so that a killed
    process never leaves a partial file under the final name."""
    if not isinstance(fs, LocalFileSystem):
        fs.pipe_file(path, data)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    with open(temp, "wb") as f:
        f.write(data)
    os.replace(temp, path)


def read_whole(fs: Any, path: str, size: int | None = None) -> bytes:
    """The bytes of the file at ``path`` (``size`` when the caller knows it), in one request.

    s3fs asks an object's size (a HEAD) before every plain ``cat_file``, to decide whether to
    download it in concurrent parts; on object storage that doubles the requests of every
    small read (an epoch's manifests, results and deltas). A read from offset 0 is one GET.
    """
    try:
        data: bytes = fs.cat_file(path, **_whole_range(size))
    except OSError as error:
        if isinstance(error, FileNotFoundError) or error.errno != errno.EINVAL:
            raise
        data = fs.cat_file(path)  # an empty object: a range of it is not satisfiable (416)
    return data


def _whole_range(size: int | None) -> dict[str, int]:
    """``cat_file``'s arguments that read a whole file of ``size`` bytes without asking its size
    first: from offset 0, unless it is empty (no range of it exists) or large enough that the
    filesystem should fetch its parts concurrently, which needs the size."""
    if size is not None and (size == 0 or size > CONCURRENT_READ_BYTES):
        return {}
    return {"start": 0}


class SnapshotStore:
    """Reads and writes snapshot files under one URI."""

    def __init__(
        self, uri: str, *, retry: RetryPolicy | None = None, **storage_options: Any
    ) -> None:
        if "::" in uri:
            raise ConfigError(f"checkpoint URI {uri!r}: {CHAIN_URL_PROBLEM}")
        self.uri = uri.rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(uri, **storage_options_for(uri, storage_options))
        single_attempt(self.fs)
        self.root = root.rstrip("/")
        self.retry = retry or RetryPolicy()
        self._conditional: ConditionalOps | None = None
        # manifests read or committed here, by epoch: an epoch is committed once, by one
        # writer, and its manifest never changes (see commit), so each is read at most once
        # (retention reads every retained manifest after every commit)
        self._manifests: collections.OrderedDict[int, Manifest] = collections.OrderedDict()

    @property
    def conditional(self) -> ConditionalOps:
        if self._conditional is None:
            self._conditional = conditional_ops_for(self.fs)
        return self._conditional

    # ------------------------------------------------------------------ names

    @staticmethod
    def keyed_file_name(
        epoch: int, state: str, key_groups: KeyGroupRange | str, kind: str, owner: str = "w"
    ) -> str:
        return layout.keyed_file_name(epoch, state, key_groups, kind, owner)

    @staticmethod
    def operator_file_name(epoch: int, index: int, parallelism: int, owner: str = "w") -> str:
        return layout.operator_file_name(epoch, index, parallelism, owner)

    @staticmethod
    def manifest_name(epoch: int) -> str:
        return layout.manifest_name(epoch)

    def full_path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def url(self, name: str) -> str:
        """The URL of ``name`` (what a remote compactor is handed)."""
        return f"{self.uri}/{name}"

    # ------------------------------------------------------------------ data files

    def write(self, name: str, data: bytes) -> FileEntry:
        """Write one immutable file and return its manifest entry."""
        self.put(name, data)
        return FileEntry(path=name, size=len(data), crc32=zlib.crc32(data))

    def put(self, name: str, data: bytes) -> None:
        """Write one immutable file whose entry the caller has (no second checksum pass)."""
        path = self.full_path(name)
        call_with_retry(lambda: self._put(path, data), f"writing {self.url(name)}", self.retry)

    def _put(self, path: str, data: bytes) -> None:
        put_whole(self.fs, path, data)

    def read(self, entry: FileEntry, *, checksum: bool = True) -> bytes:
        """Read a file a manifest names, checking its size and (unless the caller checks every
        part of it on its own) its checksum."""
        path = self.full_path(entry.path)

        def get() -> bytes:
            try:
                return read_whole(self.fs, path, entry.size)
            except FileNotFoundError:
                return self._read_named_again(path, entry.size)

        data = call_with_retry(get, f"reading {self.url(entry.path)}", self.retry)
        return self.check(entry, data, checksum=checksum)

    def check(self, entry: FileEntry, data: bytes, *, checksum: bool = True) -> bytes:
        """``data`` as read for ``entry``: it must have the size, and with ``checksum`` the
        crc32, the manifest records (a damaged file is diagnosed down to its damaged part)."""
        path = self.full_path(entry.path)
        if len(data) != entry.size:
            raise CorruptFileError(path, f"has {len(data)} bytes, the manifest says {entry.size}")
        if checksum and zlib.crc32(data) != entry.crc32:
            where = diagnose(data, path) or "a byte outside every checksummed part"
            raise CorruptFileError(
                path, f"fails the checksum the manifest records for it; damaged: {where}"
            )
        return data

    def _read_named_again(self, path: str, size: int) -> bytes:
        """A file a manifest names must exist, so a 404 is first taken as the storage lagging
        (SeaweedFS answers 404 for a moment for objects on a volume it has just grown): read
        again with backoff before calling the file missing."""
        for delay in NAMED_FILE_RETRY_DELAYS:
            time.sleep(delay)
            try:
                data = read_whole(self.fs, path, size)
            except FileNotFoundError:
                continue
            log.warning("%s: found after a 404 (storage lagged)", path)
            return data
        raise CorruptFileError(path, "named by the manifest but missing")

    def read_many(self, entries: Sequence[FileEntry], concurrency: int = 8) -> list[bytes]:
        """Read several files concurrently (restore is bound by round trips, not bytes)."""
        return self.read_each(entries, _data, concurrency)

    def read_each(
        self,
        entries: Sequence[FileEntry],
        then: Callable[[FileEntry, bytes], T],
        concurrency: int = 8,
        *,
        checksum: bool = True,
    ) -> list[T]:
        """Read several files concurrently and apply ``then`` to each one as soon as it is read
        and checked, while the others are still coming (``then`` may run on several threads).
        Without ``checksum`` only sizes are checked: ``then`` checks the rest."""
        if len(entries) <= 1 or concurrency <= 1:
            return [then(e, self.read(e, checksum=checksum)) for e in entries]
        if getattr(self.fs, "async_impl", False):
            return self._read_each_async(entries, then, concurrency, checksum)
        with concurrent.futures.ThreadPoolExecutor(min(concurrency, len(entries))) as pool:
            return list(pool.map(lambda e: then(e, self.read(e, checksum=checksum)), entries))

    def _read_each_async(
        self,
        entries: Sequence[FileEntry],
        then: Callable[[FileEntry, bytes], T],
        concurrency: int,
        checksum: bool,
    ) -> list[T]:
        """The downloads run on the filesystem's event loop (s3fs), as a raw bulk get does, with
        no thread per file, and this thread checks each file as it arrives. A file that fails
        there is read again on its own, with retries."""
        gate = asyncio.Semaphore(concurrency)

        async def get(entry: FileEntry) -> bytes:
            async with gate:
                data: bytes = await self.fs._cat_file(
                    self.full_path(entry.path), **_whole_range(entry.size)
                )
                return data

        pending = {
            asyncio.run_coroutine_threadsafe(get(e), self.fs.loop): i for i, e in enumerate(entries)
        }
        results: dict[int, T] = {}
        try:
            for future in concurrent.futures.as_completed(pending):
                entry = entries[pending[future]]
                if future.exception() is None:
                    data = self.check(entry, future.result(), checksum=checksum)
                else:
                    data = self.read(entry, checksum=checksum)
                results[pending[future]] = then(entry, data)
        finally:
            for future in pending:
                future.cancel()
        return [results[i] for i in range(len(entries))]

    def missing(self, entries: Sequence[FileEntry]) -> list[FileEntry]:
        """Those of ``entries`` not present with their size: one listing per directory, the
        check a commit makes before naming freshly uploaded files."""
        dirs: dict[str, dict[str, int]] = {}
        absent = []
        for entry in entries:
            directory = entry.path.rsplit("/", 1)[0]
            if directory not in dirs:
                full = self.full_path(directory)
                self.fs.invalidate_cache(full)

                def ls(full: str = full) -> list[dict[str, Any]]:
                    try:
                        found: list[dict[str, Any]] = self.fs.ls(full, detail=True)
                    except FileNotFoundError:
                        return []
                    return found

                listing = call_with_retry(ls, f"listing {self.url(directory)}", self.retry)
                dirs[directory] = {
                    str(info["name"]).rsplit("/", 1)[-1]: int(info.get("size") or 0)
                    for info in listing
                }
            if dirs[directory].get(entry.path.rsplit("/", 1)[-1]) != entry.size:
                absent.append(entry)
        return absent

    def list_files(self, epoch: int | None = None) -> dict[str, int]:
        """Every file under the location, or in the data directory of ``epoch``: name
        relative to the root -> size."""
        found: dict[str, int] = {}
        tops = layout.TOP_DIRS if epoch is None else (layout.data_dir(epoch),)
        for top in tops:
            self.fs.invalidate_cache(self.full_path(top))  # s3fs caches listings
            try:
                listing = self.fs.find(self.full_path(top), detail=True)
            except FileNotFoundError:
                continue
            for path, info in listing.items():
                name = str(path)[len(self.root) + 1 :] if str(path).startswith(self.root) else path
                found[str(name).lstrip("/")] = int(info.get("size") or 0)
        return found

    def delete(self, names: Sequence[str]) -> None:
        """Delete ``names`` (absent ones are not an error). An object store's filesystem
        (async: s3fs, gcsfs, adlfs) deletes a list in batched requests (S3's DeleteObjects
        takes 1,000 keys), where a file at a time is a request each."""
        for name in names:
            self._forget_manifest(name)
        if len(names) > 1 and getattr(self.fs, "async_impl", False):
            paths = [self.full_path(name) for name in names]
            try:
                call_with_retry(
                    lambda: self.fs.rm(paths), f"deleting {len(paths)} files", self.retry
                )
                return
            except FileNotFoundError:
                pass  # a filesystem that wants every file present: one at a time
        for name in names:
            path = self.full_path(name)

            def remove(path: str = path) -> None:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(path)

            call_with_retry(remove, f"deleting {self.url(name)}", self.retry)

    # ------------------------------------------------------------------ writer lease and commit

    def acquire_writer(self) -> WriterLease:
        """Take the writer lease: from now on every other writer of this location is fenced."""
        path = self.full_path(layout.LEASE)
        cond = self.conditional
        for _ in range(20):
            current = call_with_retry(lambda: cond.get(path), f"reading {path}", self.retry)
            generation = 1 if current is None else int(json.loads(current[0])["generation"]) + 1
            owner = new_owner_token(generation)
            body = json.dumps({"owner": owner, "generation": generation, "epoch": None}).encode()
            old = None if current is None else current[1]

            def swap(body: bytes = body, old: str | None = old) -> str | None:
                return cond.create(path, body) if old is None else cond.replace(path, body, old)

            version = call_with_retry(swap, f"taking the lease {path}", self.retry)
            if version is not None:
                return WriterLease(owner, generation, version)
        raise FencedError(f"could not take the writer lease of {self.uri}: too much contention")

    def current_owner(self) -> str | None:
        current = self.conditional.get(self.full_path(layout.LEASE))
        return None if current is None else str(json.loads(current[0])["owner"])

    def commit(self, manifest: Manifest, lease: WriterLease | None = None) -> None:
        """Write the manifest: from here on the epoch is committed.

        With a lease, the lease is first swapped from the version this writer last wrote; if
        another writer took it since, that fails and this writer is fenced. The manifest itself
        is created only if absent, so an epoch is committed once, by one writer.
        """
        cond = self.conditional
        if lease is not None:
            self._renew(lease, manifest.epoch)
        path = self.full_path(self.manifest_name(manifest.epoch))
        data = manifest.to_json()
        created = call_with_retry(
            lambda: cond.create(path, data),
            f"committing {self.url(self.manifest_name(manifest.epoch))}",
            self.retry,
        )
        if created is None:
            existing = cond.get(path)
            if existing is None or existing[0] != data:
                raise FencedError(
                    f"epoch {manifest.epoch} is already committed at {self.uri} by another writer"
                )
            # else our own earlier attempt went through, its answer was lost
        self._remember(manifest)

    def _renew(self, lease: WriterLease, epoch: int) -> None:
        path = self.full_path(layout.LEASE)
        cond = self.conditional
        body = json.dumps(
            {"owner": lease.owner, "generation": lease.generation, "epoch": epoch}
        ).encode()
        version = call_with_retry(
            lambda: cond.replace(path, body, lease.version), f"renewing {path}", self.retry
        )
        if version is None:
            current = cond.get(path)
            if current is not None and current[0] == body:
                version = current[1]  # an earlier attempt of ours went through
            else:
                holder = json.loads(current[0])["owner"] if current else "nobody"
                raise FencedError(
                    f"writer {lease.owner} lost the lease of {self.uri} to {holder}; it cannot "
                    f"commit epoch {epoch}"
                )
        lease.version = version

    # ------------------------------------------------------------------ committed epochs

    def epochs(self) -> list[int]:
        """Committed epochs, oldest first."""
        manifests = self.full_path(layout.MANIFESTS)
        self.fs.invalidate_cache(manifests)  # another writer may have committed
        try:
            names = call_with_retry(
                lambda: self.fs.ls(manifests, detail=False), f"listing {manifests}", self.retry
            )
        except FileNotFoundError:
            return []
        found = (layout.manifest_epoch(str(name)) for name in names)
        return sorted(epoch for epoch in found if epoch is not None)

    def manifest(self, epoch: int | None = None) -> Manifest:
        """The manifest of ``epoch``, or of the latest committed epoch."""
        if epoch is None:
            epochs = self.epochs()
            if not epochs:
                raise NoSnapshotError(f"no committed snapshot under {self.uri}")
            epoch = epochs[-1]
        if epoch in self._manifests:
            return self._manifests[epoch]
        path = self.full_path(self.manifest_name(epoch))

        def get() -> bytes:
            try:
                return read_whole(self.fs, path)
            except FileNotFoundError:
                raise NoSnapshotError(f"epoch {epoch} is not committed under {self.uri}") from None

        data = call_with_retry(get, f"reading {self.url(self.manifest_name(epoch))}", self.retry)
        return self._remember(Manifest.from_json(data, path))

    def _forget_manifest(self, name: str) -> None:
        epoch = layout.manifest_epoch(name)
        if epoch is not None:
            self._manifests.pop(epoch, None)

    def _remember(self, manifest: Manifest) -> Manifest:
        self._manifests[manifest.epoch] = manifest
        self._manifests.move_to_end(manifest.epoch)
        while len(self._manifests) > MANIFESTS_REMEMBERED:
            self._manifests.popitem(last=False)
        return manifest
