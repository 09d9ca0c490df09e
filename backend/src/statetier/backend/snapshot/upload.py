"""Writing a file whole or not at all while its bytes are still being produced.

Compaction produces its output block by block. Holding every block until the merge ends and then
uploading serializes CPU and network; on an object store the upload can instead run in a thread
of its own as a multipart upload, part by part while the merge goes on (the network I/O releases
the GIL). The object appears only when the upload completes; if the merge or the upload fails,
the multipart upload is aborted and nothing appears under the name. Local files (and
filesystems that cannot stream a write) get the bytes at the end, through a temporary name and a
rename.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import uuid
import zlib
from collections.abc import Iterable
from typing import Any

from fsspec.asyn import AsyncFileSystem

__all__ = ["PART_SIZE", "can_stream", "discard", "put_parts"]

PART_SIZE = 5 << 20  # the smallest part S3 accepts: the first upload starts early
_DONE, _ABORT = object(), object()


def put_parts(fs: Any, path: str, parts: Iterable[bytes | memoryview]) -> tuple[int, int]:
    """Write the concatenation of ``parts`` to ``path``; returns its size and CRC-32."""
    if not can_stream(fs):
        data = b"".join(parts)
        _put_whole(fs, path, data)
        return len(data), zlib.crc32(data)
    uploader = _Uploader(fs, path)
    size = crc = 0
    try:
        for part in parts:
            size += len(part)
            crc = zlib.crc32(part, crc)
            uploader.send(part)
    except BaseException:
        uploader.close(abort=True)
        raise
    uploader.close(abort=False)
    return size, crc


def discard(file: Any) -> None:
    """Abandon an upload: nothing appears, and a later close (the file's finalizer) does not
    try to finish it."""
    with contextlib.suppress(Exception):
        file.discard()
    file.closed = True


def _protocols(fs: Any) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def can_stream(fs: Any) -> bool:
    """Whether ``fs`` streams writes as an object store does (an explicit ``streams_uploads``
    attribute wins: wrappers say what the filesystem under them does)."""
    declared = getattr(fs, "streams_uploads", None)
    if declared is not None:
        return bool(declared)
    local = {"file", "local"} & set(_protocols(fs))
    return isinstance(fs, AsyncFileSystem) and not local


def _put_whole(fs: Any, path: str, data: bytes) -> None:
    if {"file", "local"} & set(_protocols(fs)):
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        temp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        fs.pipe_file(temp, data)
        fs.mv(temp, path)
    else:
        fs.pipe_file(path, data)


class _Uploader:
    """One multipart upload fed from a queue by its own thread."""

    def __init__(self, fs: Any, path: str) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=8)
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(fs, path), name="statetier-upload", daemon=True
        )
        self._thread.start()

    def send(self, part: bytes | memoryview) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(part)

    def close(self, abort: bool) -> None:
        """Complete the upload (or discard it); raises what went wrong in the upload."""
        self._queue.put(_ABORT if abort else _DONE)
        self._thread.join()
        if self._error is not None and not abort:
            raise self._error

    def _run(self, fs: Any, path: str) -> None:
        file, item = None, None
        try:
            file = fs.open(path, "wb", block_size=PART_SIZE)
            while (item := self._queue.get()) is not _DONE and item is not _ABORT:
                file.write(item)
            if item is _DONE:
                file.close()
            else:
                discard(file)
        except BaseException as exc:
            self._error = exc
            if file is not None:
                discard(file)
            while item is not _DONE and item is not _ABORT:
                item = self._queue.get()  # drain, so the producer never blocks on a full queue
