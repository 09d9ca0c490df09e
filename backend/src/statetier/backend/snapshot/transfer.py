"""Copying files a manifest names from one location to another under the same names.

A savepoint copies the files of one epoch out of a running checkpoint, and a pipeline that
restores from a savepoint copies them into its own new location. When both locations are on
one filesystem (two prefixes or two buckets of one object store), the copy is the store's own
(S3 CopyObject): no byte passes through this process, which is most of a savepoint's speed.
Across filesystems each file is read, checked against the manifest's size and checksum, and
written. Either way the copies are then listed, and one missing or of another size fails the
copy, naming it.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any

from fsspec.implementations.local import LocalFileSystem
from statetier.backend.snapshot.format import CorruptFileError
from statetier.backend.snapshot.manifest import FileEntry
from statetier.backend.snapshot.retry import call_with_retry
from statetier.backend.snapshot.store import SnapshotStore

__all__ = ["copy_files"]

COPY_CONCURRENCY = 16  # server-side copies in flight (each is a round trip, no local bytes)


def copy_files(
    source: SnapshotStore,
    dest: SnapshotStore,
    entries: Sequence[FileEntry],
    concurrency: int = COPY_CONCURRENCY,
) -> int:
    """Copy ``entries`` from ``source`` to the same names under ``dest``; the bytes copied.

    A file of ``entries`` that ``source`` lacks raises FileNotFoundError naming it (retention
    of a running job may delete an epoch while it is being copied)."""
    if not entries:
        return 0
    one = _server_side if source.fs is dest.fs else _through_here
    workers = max(1, min(concurrency, len(entries)))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda entry: one(source, dest, entry), entries))
    absent = dest.missing(entries)
    if absent:
        raise CorruptFileError(
            dest.full_path(absent[0].path),
            f"was copied from {source.url(absent[0].path)} but is not in storage with its size",
        )
    return sum(entry.size for entry in entries)


def _server_side(source: SnapshotStore, dest: SnapshotStore, entry: FileEntry) -> None:
    """One file copied by the storage itself."""
    src, dst = source.full_path(entry.path), dest.full_path(entry.path)
    fs: Any = source.fs

    def copy() -> None:
        if isinstance(fs, LocalFileSystem):
            fs.makedirs(fs._parent(dst), exist_ok=True)
        fs.cp_file(src, dst)

    try:
        call_with_retry(copy, f"copying {source.url(entry.path)}", source.retry)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{source.url(entry.path)} is gone (deleted while copying?)"
        ) from None


def _through_here(source: SnapshotStore, dest: SnapshotStore, entry: FileEntry) -> None:
    """One file read (and checked) from ``source`` and written to ``dest``."""
    dest.put(entry.path, source.read(entry))
