"""Block compression of data files: the codecs a block may be stored with.

Each block of a data file is compressed on its own (a reader still decodes only the key groups
it needs, and compaction still copies an untouched block as it is); the file's header names the
codec (``codec``), and a file without one holds plain msgpack blocks. Compression is for the
object store's sake: a checkpoint is uploaded once per epoch, read again by every merge and
every restore, and on a store that is not free per byte (a request's CPU on the server, egress,
storage) zstd's level 1 cuts the word-count state to a third at a few milliseconds per megabyte
(docs/checkpoints.md), as Flink offers Snappy for its snapshots.

``zstd`` writes a frame that records its content size, so a reader needs nothing beside the
block to decompress it, and never decompresses more than that size.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import zstandard

__all__ = ["CODECS", "NONE", "ZSTD", "UnknownCodecError", "compressor", "decompress"]

NONE = "none"
ZSTD = "zstd"
CODECS = (ZSTD, NONE)
_ZSTD_LEVEL = 1  # level 3 compresses this state less well and is slower (docs/checkpoints.md)


class UnknownCodecError(ValueError):
    """A file names a codec this reader does not have."""


def compressor(codec: str) -> Callable[[bytes], bytes] | None:
    """A compress function for ``codec`` (None for ``none``), for one writer: each has its own
    compressor object, which is not safe to share between threads."""
    if codec == NONE:
        return None
    if codec == ZSTD:
        return zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_content_size=True).compress
    raise _unknown(codec)


def _unknown(codec: str) -> UnknownCodecError:
    return UnknownCodecError(f"unknown block codec {codec!r} (one of {', '.join(CODECS)})")


_local = threading.local()


def decompress(codec: str, data: bytes | memoryview) -> bytes:
    """The stored bytes of a block compressed with ``codec`` (one decompressor per thread); a
    ValueError when they do not decompress."""
    if codec != ZSTD:
        raise _unknown(codec)
    decompressor = getattr(_local, "zstd", None)
    if decompressor is None:
        decompressor = _local.zstd = zstandard.ZstdDecompressor()
    try:
        result: bytes = decompressor.decompress(data)
    except zstandard.ZstdError as exc:  # not a ValueError: readers report ValueErrors
        raise ValueError(f"zstd: {exc}") from None
    return result
