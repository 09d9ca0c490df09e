"""Reading a data file's block for compaction.

Compaction is mostly moving bytes: a key group that no delta of the chain touches has, in the
new base, exactly the block it has in the old base, so compaction hands such a block to
:class:`~statetier.backend.snapshot.format.DataFileBuilder` as raw bytes and decodes only the
blocks it merges.

:func:`decode_block` reads a block without checking its CRC-32 again: compaction has checked the
whole file against the manifest's checksum before (every block lies inside those bytes). The
entry count and the no-tombstones-in-a-base rule are still checked.
"""

from __future__ import annotations

import msgpack
from statetier.backend.snapshot.format import DELTA, CorruptFileError, IndexEntry

__all__ = ["decode_block"]

Values = list[bytes | None]


def decode_block(
    data: bytes | memoryview, entry: IndexEntry, kind: str, path: str
) -> tuple[list[bytes], Values]:
    """The keys and values of the block ``entry`` indexes in ``data`` (a whole file whose
    checksum was verified); a value of None is a tombstone (delta files only)."""
    where = f"block of key group {entry.key_group} at offset {entry.offset}"
    try:
        flat = msgpack.unpackb(data[entry.offset : entry.offset + entry.length])
    except (ValueError, msgpack.UnpackException) as exc:
        raise CorruptFileError(path, f"{where} is unreadable: {exc}") from None
    if not isinstance(flat, list) or len(flat) != 2 * entry.entries:
        found = len(flat) // 2 if isinstance(flat, list) else "no"
        raise CorruptFileError(path, f"{where} holds {found} entries, index says {entry.entries}")
    values: Values = flat[1::2]
    if kind != DELTA and None in values:
        raise CorruptFileError(path, f"{where} holds a tombstone, but this is not a delta file")
    return flat[0::2], values
