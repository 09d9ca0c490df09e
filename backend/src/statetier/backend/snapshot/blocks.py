"""Data file blocks as bytes: what compaction copies as-is and what it writes.

Compaction is mostly moving bytes: a key group that no delta of the chain touches has, in the
new base, exactly the block it has in the old base. Decoding and re-encoding it would cost CPU
for nothing, so :class:`DataFileBuilder` takes such a block as raw bytes (with the length, CRC-32
and entry count the old index gives) next to blocks built from merged pairs, and lays out the
file as :func:`statetier.backend.snapshot.format.encode_data_file` does: the same header, block,
index and footer bytes, so the output is byte for byte what the decode-merge-encode path writes
(a test checks this against ``encode_data_file``).

:func:`decode_block` reads a block without checking its CRC-32 again: compaction has checked the
whole file against the manifest's checksum before (every block lies inside those bytes). The
entry count and the no-tombstones-in-a-base rule are still checked.
"""

from __future__ import annotations

import zlib

import msgpack
from statetier.backend.snapshot.format import (
    _FOOTER,
    _HEADER_CRC,
    _PREAMBLE,
    DELTA,
    END_MAGIC,
    FORMAT_VERSION,
    MAGIC,
    CorruptFileError,
    IndexEntry,
)

__all__ = ["DataFileBuilder", "decode_block", "encode_block"]

Values = list[bytes | None]

_pack = msgpack.Packer(use_bin_type=True).pack


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


def encode_block(keys: list[bytes], values: list[bytes]) -> bytes:
    """A block of ``keys`` (sorted) and their ``values``, as ``encode_data_file`` packs it."""
    flat: list[bytes] = [b""] * (2 * len(keys))
    flat[0::2] = keys
    flat[1::2] = values
    block: bytes = _pack(flat)
    return block


class DataFileBuilder:
    """A data file put together block by block, each part handed on as soon as it is known.

    Write :attr:`head`, then what each ``add_*`` returns (in key-group order; empty key groups
    are simply not added), then :meth:`tail`.
    """

    def __init__(self, header: dict[str, object]) -> None:
        header_bytes: bytes = _pack({**header, "format_version": FORMAT_VERSION})
        self.head = b"".join(
            (
                _PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header_bytes)),
                _HEADER_CRC.pack(zlib.crc32(header_bytes)),
                header_bytes,
            )
        )
        self._offset = len(self.head)
        self._index: list[list[int]] = []
        self.entries = 0

    def add_raw(
        self, key_group: int, block: bytes | memoryview, crc32: int, entries: int
    ) -> bytes | memoryview:
        """A block as stored in another file (its CRC-32 and entry count from that index)."""
        self._index.append([key_group, self._offset, len(block), crc32, entries])
        self._offset += len(block)
        self.entries += entries
        return block

    def add_block(self, key_group: int, block: bytes, entries: int) -> bytes:
        """A freshly encoded block (see :func:`encode_block`)."""
        self.add_raw(key_group, block, zlib.crc32(block), entries)
        return block

    def tail(self) -> bytes:
        """The key-group index and the footer: the file's last bytes."""
        index_bytes: bytes = _pack(self._index)
        footer = _FOOTER.pack(self._offset, len(index_bytes), zlib.crc32(index_bytes), END_MAGIC)
        return index_bytes + footer
