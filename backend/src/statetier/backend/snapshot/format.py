"""The data file format: one state's key groups of one range, immutable and checksummed.

Layout (integers little-endian)::

    header   MAGIC (8 bytes) | format version u16 | header length u32 | header crc32 u32 (from
             version 2 on) | header (msgpack map)
    blocks   one per non-empty key group, each key once: a base's entries sorted by key
             bytes, a delta's in the order the epoch touched their keys (the merge sorts
             them, see merge); in a delta a value of nil is a tombstone (the key was removed
             since the previous epoch). Laid out as the header's ``layout`` says: ``columns``
             (format version 4: a keys column and a values column, see columns), or, in
             files of versions 1-3, a msgpack array [key, value, key, value, ...] of bytes
    index    msgpack array of [key group, offset, length, crc32, entry count]
    footer   index offset u64 | index length u32 | index crc32 u32 | END_MAGIC (8 bytes)

The header says what the file is: ``kind`` ("base": every entry of the range at ``epoch``;
"delta": only the keys touched since the previous epoch), ``state``, ``key_groups``, ``epoch``,
and ``codec`` when each block is compressed (see codec; a block's crc32 is of its stored,
compressed bytes). Files with compressed blocks are format version 3, so that a reader from
before compression refuses them by their version instead of failing on their blocks; files
without stay version 2. Files with columnar blocks are version 4 and say ``layout: columns``;
writers write them, and compaction writes the layout of its newest input, so a deployment whose
writers are older keeps files they can read. Version 1 files (bases only, no ``kind``) are
still read.

A reader opens the footer, checks the index checksum, and then reads only the blocks of the key
groups it needs, checking each block's crc32 (the whole-file checksum of the manifest does not
cover a writer that damaged its bytes before checksumming the file). Blocks can be taken undecoded
(:class:`Block`, a view into the file) and decoded later, which is what a lazy restore does.
Every problem is reported with the file and block, so a corrupt checkpoint says where it is
corrupt.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgpack
from statetier.backend.snapshot import codec as codecs
from statetier.backend.snapshot import columns as block_columns
from statetier.backend.snapshot.columns import Columns, Items, Packed, ValueItems
from statetier.backend.snapshot.crc import Crc32
from statetier.backend.snapshot.versions import (
    BASE,
    COLUMNS_FORMAT_VERSION,
    COMPRESSED_FORMAT_VERSION,
    DELTA,
    FORMAT_VERSION,
    READABLE_VERSION,
    CorruptFileError,
)

__all__ = [
    "BASE",
    "COLUMNS",
    "COLUMNS_FORMAT_VERSION",
    "COMPRESSED_FORMAT_VERSION",
    "DELTA",
    "Block",
    "FORMAT_VERSION",
    "MSGPACK",
    "READABLE_VERSION",
    "CorruptFileError",
    "DataFileBuilder",
    "DataFileReader",
    "IndexEntry",
    "decode_operator_file",
    "encode_data_file",
    "encode_data_file_columns",
    "encode_operator_file",
]

MAGIC = b"STTRDAT\x00"
END_MAGIC = b"STTREND\x00"
COLUMNS = "columns"  # a block's layout: see columns
MSGPACK = "msgpack"  # a block's layout in format versions 1-3
LAYOUTS = (COLUMNS, MSGPACK)
_PREAMBLE = struct.Struct("<8sHI")
_HEADER_CRC = struct.Struct("<I")
_FOOTER = struct.Struct("<QII8s")


@dataclasses.dataclass(frozen=True)
class IndexEntry:
    key_group: int
    offset: int
    length: int
    crc32: int
    entries: int


def encode_data_file(
    header: dict[str, Any],
    key_groups: Iterable[tuple[int, Sequence[tuple[bytes, bytes | None]]]],
) -> bytes:
    """The bytes of a data file holding ``key_groups``: (key group, [(key, value)]) pairs.

    A value of None is a tombstone; only delta files (``header["kind"] == "delta"``) hold them.
    ``header["codec"]``, when there, compresses each block (see codec).
    """
    return encode_data_file_columns(
        header,
        ((kg, [k for k, _ in pairs], [v for _, v in pairs]) for kg, pairs in key_groups),
    )


def encode_data_file_columns(
    header: dict[str, Any],
    key_groups: Iterable[tuple[int, Items, ValueItems]],
) -> bytes:
    """:func:`encode_data_file` of (key group, keys, values) with the keys and their values in
    two lists, in any order: the form a snapshot builds, with no tuple per entry (each one an
    object the cyclic GC would traverse, several times the cost of encoding it).

    A base's entries are sorted here (a restore takes a base's block as it is, and looks keys
    up in it by binary search). A delta's are written as given: every reader merges a delta
    into the blocks before it and sorts the result, so sorting it here, a quarter of a delta's
    encoding on the state host, would be done twice."""
    builder = DataFileBuilder(header)
    parts: list[bytes | memoryview] = [builder.head]
    ordered = header.get("kind") != DELTA
    for key_group, keys, values in key_groups:
        if not keys:
            continue
        if ordered:  # Arrow's sort, whichever layout the builder writes
            columns = block_columns.sort_by_key(block_columns.from_lists(keys, values))
            block = builder.encode_columns(columns)
        else:
            block = builder.encode_lists(keys, values)
        parts.append(builder.add_block(key_group, block, len(keys)))
    parts.append(builder.tail())
    return b"".join(parts)


class DataFileBuilder:
    """A data file put together block by block, each part handed on as soon as it is known: the
    one place that lays out header, blocks, index and footer (:func:`encode_data_file` and
    compaction both write through it, so their bytes cannot drift apart).

    Write :attr:`head`, then what each ``add_*`` returns (in key-group order; empty key groups
    are simply not added), then :meth:`tail`. One builder per file and thread: it owns a msgpack
    Packer, which keeps a buffer between calls, and the header's codec's compressor.

    The header's ``layout`` (default ``columns``) says how blocks are laid out; ``msgpack``
    writes the files of format versions 2 and 3, as writers before columns did.
    """

    def __init__(self, header: dict[str, object]) -> None:
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self.codec = str(header.get("codec", codecs.NONE))
        self.layout = str(header.get("layout", COLUMNS))
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown block layout {self.layout!r} (one of {', '.join(LAYOUTS)})")
        self._compress = codecs.compressor(self.codec)
        header = {k: v for k, v in header.items() if k != "layout"}
        if self._compress is None:
            header = {k: v for k, v in header.items() if k != "codec"}  # version 2, as before
        if self.layout == COLUMNS:
            header["layout"] = COLUMNS
            version = COLUMNS_FORMAT_VERSION
        else:
            version = FORMAT_VERSION if self._compress is None else COMPRESSED_FORMAT_VERSION
        header_bytes: bytes = self._pack({**header, "format_version": version})
        self.head = b"".join(
            (
                _PREAMBLE.pack(MAGIC, version, len(header_bytes)),
                _HEADER_CRC.pack(zlib.crc32(header_bytes)),
                header_bytes,
            )
        )
        self._offset = len(self.head)
        self._index: list[list[int]] = []
        self.entries = 0
        self._crc = Crc32()
        self._crc.add(self.head)

    def encode_flat(self, flat: Sequence[bytes | None]) -> bytes:
        """A block of entries laid out [key, value, key, value, ...] in the order to store
        them, in the file's layout, compressed with the file's codec."""
        if self.layout == COLUMNS:
            return self.encode_lists(flat[0::2], flat[1::2])  # type: ignore[arg-type]
        block: bytes = self._pack(flat)
        return block if self._compress is None else self._compress(block)

    def encode_lists(self, keys: Items, values: ValueItems) -> bytes:
        """A block of ``keys`` and their ``values`` in the order given, in the file's layout,
        compressed with the file's codec."""
        if self.layout != COLUMNS:
            keys = keys.to_list() if isinstance(keys, Packed) else keys
            values = values.to_list() if isinstance(values, Packed) else values
            flat: list[bytes | None] = [None] * (2 * len(keys))
            flat[0::2], flat[1::2] = keys, values
            return self.encode_flat(flat)
        block = block_columns.encode_lists(keys, values)
        return block if self._compress is None else self._compress(block)

    def encode_columns(self, columns: Columns) -> bytes:
        """A block of ``columns`` in the order to store them, in the file's layout, compressed
        with the file's codec."""
        if self.layout != COLUMNS:
            return self.encode_flat(columns.to_flat())
        block = block_columns.encode(columns)
        return block if self._compress is None else self._compress(block)

    def add_raw(
        self, key_group: int, block: bytes | memoryview, crc32: int, entries: int
    ) -> bytes | memoryview:
        """A block as stored in another file of the same codec (its CRC-32 and entry count
        from that index)."""
        self._index.append([key_group, self._offset, len(block), crc32, entries])
        self._offset += len(block)
        self.entries += entries
        self._crc.add(block, crc32)
        return block

    def add_block(self, key_group: int, block: bytes, entries: int) -> bytes:
        """A freshly encoded block (see :meth:`encode_flat`)."""
        self.add_raw(key_group, block, zlib.crc32(block), entries)
        return block

    def tail(self) -> bytes:
        """The key-group index and the footer: the file's last bytes."""
        index_bytes: bytes = self._pack(self._index)
        footer = _FOOTER.pack(self._offset, len(index_bytes), zlib.crc32(index_bytes), END_MAGIC)
        self._crc.add(index_bytes + footer)
        return index_bytes + footer

    @property
    def crc32(self) -> int:
        """The CRC-32 of the whole file (once :meth:`tail` is written), from its parts' CRC-32s
        without a second pass over the blocks (see crc)."""
        return self._crc.value


@dataclasses.dataclass(frozen=True)
class Block:
    """One key group's block, not decoded yet: a slice of its file, and where it came from (for
    the error messages of a later decode)."""

    path: str
    key_group: int
    offset: int
    entries: int
    kind: str
    data: memoryview | bytes
    codec: str = codecs.NONE
    layout: str = MSGPACK

    def fail(self, problem: str) -> CorruptFileError:
        where = f"block of key group {self.key_group} at offset {self.offset}"
        return CorruptFileError(self.path, f"{where} {problem}")

    def pairs(self) -> list[tuple[bytes, bytes | None]]:
        """Decode the block: its (key, value) pairs, a value of None a tombstone."""
        flat: Iterator[Any] = iter(self.flat())
        return list(zip(flat, flat, strict=True))

    def flat(self) -> list[bytes | None]:
        """Decode the block as stored: [key, value, key, value, ...], a value of None a
        tombstone (the cheapest decode: no pair is built). With :meth:`columns`, the one block
        decoder: restore, compaction (see merge) and verification all read blocks through
        them."""
        if self.layout == COLUMNS:
            return self.columns().to_flat()
        stored = self.data
        try:
            if self.codec != codecs.NONE:
                stored = codecs.decompress(self.codec, stored)
            flat = msgpack.unpackb(stored)
        except (ValueError, msgpack.UnpackException) as exc:
            raise self.fail(f"is unreadable: {exc}") from None
        if not isinstance(flat, list) or len(flat) != 2 * self.entries:
            found = len(flat) // 2 if isinstance(flat, list) else "no"
            raise self.fail(f"holds {found} entries, index says {self.entries}")
        if self.kind != DELTA and not all(values := flat[1::2]) and None in values:
            # all() first: a much cheaper scan than looking for None, which compares each value
            raise self.fail("holds a tombstone, but this is not a delta file")
        return flat

    def columns(self) -> Columns:
        """Decode the block into columns: without a Python object per entry when the block
        is stored as columns (a merge's input), through :meth:`flat` when it is not."""
        if self.layout != COLUMNS:
            return block_columns.from_flat(self.flat())
        try:
            stored = self.data
            if self.codec != codecs.NONE:
                stored = codecs.decompress(self.codec, stored)
            found = block_columns.decode(stored)
        except ValueError as exc:
            raise self.fail(f"is unreadable: {exc}") from None
        if len(found) != self.entries:
            raise self.fail(f"holds {len(found)} entries, index says {self.entries}")
        if self.kind != DELTA and found.values.null_count:
            raise self.fail("holds a tombstone, but this is not a delta file")
        return found


class DataFileReader:
    """Reads a data file held in memory; ``path`` is only used in error messages.

    ``verified``: the whole file was checked against the manifest's checksum already (as
    compaction does with every input), so its blocks' own checksums are not checked again.
    """

    def __init__(self, data: bytes, path: str, *, verified: bool = False) -> None:
        self.path = path
        self._data = data
        self._view = memoryview(data)
        self._blocks_checked = verified
        self.header = self._read_header()
        self.index = self._read_index()

    def _fail(self, problem: str) -> CorruptFileError:
        return CorruptFileError(self.path, problem)

    def _read_header(self) -> dict[str, Any]:
        data = self._data
        if len(data) < _PREAMBLE.size + _FOOTER.size:
            raise self._fail(f"too short to be a data file ({len(data)} bytes)")
        magic, version, header_len = _PREAMBLE.unpack_from(data)
        if magic != MAGIC:
            raise self._fail(f"not a statetier data file (magic {magic!r})")
        if version > READABLE_VERSION:
            raise self._fail(
                f"format version {version} is newer than this reader ({READABLE_VERSION}); "
                "upgrade statetier"
            )
        if version < 1:
            raise self._fail(f"format version {version} is not a valid version")
        self.version: int = version
        start = _PREAMBLE.size
        if version >= 2:
            (header_crc,) = _HEADER_CRC.unpack_from(data, start)
            start += _HEADER_CRC.size
            if zlib.crc32(data[start : start + header_len]) != header_crc:
                raise self._fail(f"header at offset {start} fails its checksum")
        try:
            header: dict[str, Any] = msgpack.unpackb(data[start : start + header_len])
        except (ValueError, msgpack.UnpackException) as exc:
            raise self._fail(f"header is unreadable: {exc}") from None
        if not isinstance(header, dict):
            raise self._fail("header is not a map")
        self.codec: str = header.get("codec", codecs.NONE)
        if self.codec not in codecs.CODECS:
            raise self._fail(
                f"blocks are compressed with {self.codec!r}, a codec this reader does not "
                "know; upgrade statetier"
            )
        self.layout: str = header.get("layout", MSGPACK)
        if (self.layout == COLUMNS) != (version >= COLUMNS_FORMAT_VERSION):
            raise self._fail(f"format version {version} does not hold {self.layout} blocks")
        self._blocks_start = start + header_len
        return header

    def _read_index(self) -> dict[int, IndexEntry]:
        data = self._data
        index_offset, index_len, index_crc, end_magic = _FOOTER.unpack_from(
            data, len(data) - _FOOTER.size
        )
        if end_magic != END_MAGIC:
            raise self._fail("footer is missing or damaged (file truncated?)")
        if index_offset + index_len != len(data) - _FOOTER.size:
            raise self._fail(
                f"footer points to an index at {index_offset}+{index_len}, beyond the file"
            )
        raw = data[index_offset : index_offset + index_len]
        if zlib.crc32(raw) != index_crc:
            raise self._fail(f"key-group index at offset {index_offset} fails its checksum")
        entries = [IndexEntry(*row) for row in msgpack.unpackb(raw)]
        self._entries, self._index_offset = entries, index_offset
        for entry in entries:
            if entry.offset < self._blocks_start or entry.offset + entry.length > index_offset:
                raise self._fail(
                    f"index entry of key group {entry.key_group} points outside the blocks"
                )
        return {entry.key_group: entry for entry in entries}

    @property
    def kind(self) -> str:
        """ "base" or "delta" (version 1 files are bases)."""
        kind: str = self.header.get("kind", BASE)
        return kind

    def block(self, key_group: int) -> Block | None:
        """The undecoded block of ``key_group`` (a view into the file, its crc32 checked now),
        None when the file has none."""
        entry = self.index.get(key_group)
        if entry is None:
            return None
        view = self._view[entry.offset : entry.offset + entry.length]
        found = Block(
            self.path,
            key_group,
            entry.offset,
            entry.entries,
            self.kind,
            view,
            self.codec,
            self.layout,
        )
        if not self._blocks_checked and zlib.crc32(view) != entry.crc32:
            raise found.fail("fails its checksum")
        return found

    def check_every_block(self) -> None:
        """Check every block's crc32, and that the blocks fill the space between the header and
        the index end to end. With the header's and the index's own checksums and the footer's
        checks, every byte of a version 2 file is then checked once, so the whole-file crc32
        (a second pass over the same bytes) adds nothing. Blocks are not checked again."""
        expected = self._blocks_start
        for entry in sorted(self._entries, key=lambda e: e.offset):
            if entry.offset != expected:
                raise self._fail(f"bytes {expected}..{entry.offset} are in no block of the index")
            view = self._view[entry.offset : entry.offset + entry.length]
            if zlib.crc32(view) != entry.crc32:
                where = f"block of key group {entry.key_group} at offset {entry.offset}"
                raise self._fail(f"{where} fails its checksum")
            expected += entry.length
        if expected != self._index_offset:
            raise self._fail(f"bytes {expected}..{self._index_offset} are in no block of the index")
        self._blocks_checked = True

    def check_is(
        self, state: str | None, key_groups: str | None, kind: str, epoch: int = 0
    ) -> None:
        """The file must be what its manifest entry says (not another state's, range's or
        epoch's: a file that checks out part by part is still the wrong one if it is another
        epoch's). ``epoch`` 0 is an entry that records none (format version 1)."""
        expected_fields: list[tuple[str, Any]] = [("state", state), ("key_groups", key_groups)]
        if epoch and "epoch" in self.header:
            expected_fields.append(("epoch", epoch))
        for field, expected in expected_fields:
            if self.header.get(field) != expected:
                raise self._fail(
                    f"header says {field} {self.header.get(field)!r}, the manifest says "
                    f"{expected!r}"
                )
        if self.kind != kind:
            raise self._fail(f"is a {self.kind} file, the manifest says {kind}")

    def read_block(self, key_group: int) -> list[tuple[bytes, bytes | None]]:
        """The (key, value) pairs of ``key_group``; empty when the file has none.

        A value of None is a tombstone (delta files only).
        """
        found = self.block(key_group)
        return [] if found is None else found.pairs()

    def verify(self) -> int:
        """Check every block; return the number of entries."""
        return sum(len(self.read_block(kg)) for kg in self.index)


OPS_MAGIC = b"STTROPS\x00"
_OPS_PREAMBLE = struct.Struct("<8sHII")


def encode_operator_file(states: dict[str, dict[str, Any]]) -> bytes:
    """Operator state of one instance: name -> {mode, serializer, elements: [bytes]}."""
    payload: bytes = msgpack.packb(states, use_bin_type=True)
    return (
        _OPS_PREAMBLE.pack(OPS_MAGIC, FORMAT_VERSION, len(payload), zlib.crc32(payload)) + payload
    )


def decode_operator_file(data: bytes, path: str) -> dict[str, dict[str, Any]]:
    if len(data) < _OPS_PREAMBLE.size:
        raise CorruptFileError(path, f"too short to be an operator state file ({len(data)} bytes)")
    magic, version, length, crc = _OPS_PREAMBLE.unpack_from(data)
    if magic != OPS_MAGIC:
        raise CorruptFileError(path, f"not a statetier operator state file (magic {magic!r})")
    if version > FORMAT_VERSION:
        raise CorruptFileError(path, f"format version {version} is newer than this reader")
    payload = data[_OPS_PREAMBLE.size :]
    if len(payload) != length or zlib.crc32(payload) != crc:
        raise CorruptFileError(
            path, f"operator state block at offset {_OPS_PREAMBLE.size} fails its checksum"
        )
    states: dict[str, dict[str, Any]] = msgpack.unpackb(payload)
    return states


def checks_every_part(data: bytes) -> bool:
    """Whether ``data`` claims a format (version 2 on) in which each part has a checksum or a
    check of its own, so :meth:`DataFileReader.check_every_block` covers every byte. Anything
    else (version 1, damaged magic or version) is for the whole-file checksum to judge."""
    if len(data) < _PREAMBLE.size or data[:8] != MAGIC:
        return False
    version: int = _PREAMBLE.unpack_from(data)[1]
    return 2 <= version <= READABLE_VERSION


def diagnose(data: bytes, path: str) -> str | None:
    """Which part of a damaged file is damaged (header, index, footer or the block of a key
    group), found by checking each part's own checksum; None when every part checks out."""
    try:
        if data[:8] == OPS_MAGIC:
            decode_operator_file(data, path)
        else:
            DataFileReader(data, path).verify()
    except CorruptFileError as exc:
        return exc.problem
    except (ValueError, TypeError, KeyError, IndexError, struct.error) as exc:
        return f"unreadable: {exc}"
    return None
