"""The columnar layout of a block (data files of format version 4): a key group's keys and
values as two Arrow binary columns, a tombstone as a null value.

Why columns: merging msgpack blocks (format versions 1-3) builds a Python bytes object and a
dict entry per entry and sorts them in CPython, about 2 microseconds an entry, on the cores
Spark needs. As Arrow columns a merge is a concatenation, one stable sort and two filters in
Arrow's C++, and bytes become columns (and columns bytes) without a Python object per entry: a
whole compaction of a word count's range took 3x less CPU, and its base was 20% smaller after
zstd (docs/checkpoints.md). Decoding into Python objects, which a restore needs, costs about
what msgpack's did.

A block before its codec compresses it (integers little-endian)::

    count u32 | key-length width u8 | value-length width u8 | flags u8
    key lengths    count x width (width 1, 2 or 4 bytes)
    value lengths  count x width
    tombstones     count bytes, 1 where the value is a tombstone (only with flag 1)
    keys           the keys' bytes, end to end
    values         the values' bytes, end to end (a tombstone has none)

Each length column takes the narrowest width its longest entry fits in: a word count's keys and
values fit in one byte each, which zstd then compresses well.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import struct
from collections.abc import Sequence
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "Columns",
    "Packed",
    "decode",
    "encode",
    "encode_lists",
    "from_flat",
    "from_lists",
    "joined",
    "merge",
    "sort_by_key",
]

_HEAD = struct.Struct("<IBBB")
# Arrow's default pool (mimalloc) keeps freed memory for later allocations, which the memory
# governor reads in RSS as if it were state (the eight ranges of tests/spill/test_governor.py
# peaked 4 MiB higher with it): columns live in the allocator Python's objects use.
_POOL = pa.system_memory_pool()
# Arrays are built from buffers: ``pa.array`` and ``pa.repeat`` import pandas (23 MiB of RSS
# that a state host has no use for), as does ``to_numpy`` of a boolean array.
_TRUE = pa.BooleanArray.from_buffers(pa.bool_(), 1, [None, pa.py_buffer(b"\x01")])
_TOMBSTONES = 1  # flag: a tombstone column follows the lengths
_WIDTHS: dict[int, type[np.unsignedinteger]] = {1: np.uint8, 2: np.uint16, 4: np.uint32}


@dataclasses.dataclass(frozen=True)
class Columns:
    """A key group's entries: ``keys`` and ``values`` of the same length, a null value a
    tombstone (deltas only)."""

    keys: pa.LargeBinaryArray
    values: pa.LargeBinaryArray

    def __len__(self) -> int:
        return len(self.keys)

    def to_flat(self) -> list[bytes | None]:
        """The entries as Python objects, laid out ``[key, value, key, value, ...]``."""
        flat: list[bytes | None] = [None] * (2 * len(self.keys))
        flat[0::2] = self.keys.to_pylist()
        flat[1::2] = self.values.to_pylist()
        return flat


@dataclasses.dataclass(frozen=True)
class Packed:
    """Items already written end to end, and each one's length: a column as a block stores it,
    made without a bytes object per item (a serializer's ``pack_many``)."""

    lengths: np.ndarray
    data: bytes | memoryview

    def __len__(self) -> int:
        return len(self.lengths)

    def to_list(self) -> list[bytes]:
        """Each item's bytes (for the msgpack layout, which stores items one by one)."""
        data = bytes(self.data)
        ends = np.cumsum(self.lengths).tolist()
        return [data[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]


# A column's items: their bytes one by one (None a tombstone, in a value column), or packed
Items = Sequence[bytes] | Packed
ValueItems = Sequence[bytes | None] | Packed


def from_lists(keys: Items, values: ValueItems) -> Columns:
    """Columns of ``keys`` and their ``values`` (None a tombstone), copied once into Arrow."""
    if len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys but {len(values)} values")
    return Columns(_binary(keys, nullable=False), _binary(values))


def from_flat(flat: Sequence[bytes | None]) -> Columns:
    """Columns of entries laid out ``[key, value, key, value, ...]``."""
    return from_lists(flat[0::2], flat[1::2])  # type: ignore[arg-type]  # keys are never None


# A column as the block stores it: each item's length, the items' bytes end to end, and where
# the nulls are (None when there are none; a null has no bytes)
_Raw = tuple[np.ndarray, "bytes | memoryview", "np.ndarray | None"]


def _raw(items: ValueItems, nullable: bool = True) -> _Raw:
    """The raw column of ``items``, from one join and their lengths: a tenth of the time
    ``pa.array`` takes over a list of bytes (it inspects every object). Keys are never None,
    so their column skips the scan for nulls (``nullable`` False). Packed items are one
    already, without nulls."""
    if isinstance(items, Packed):
        return items.lengths, items.data, None
    count = len(items)
    nulls = None
    present = cast("Sequence[bytes]", items)
    if nullable and not all(map(operator.is_not, items, itertools.repeat(None))):
        nulls = np.fromiter(map(operator.is_, items, itertools.repeat(None)), np.bool_, count)
        present = [b"" if item is None else item for item in items]
    return np.fromiter(map(len, present), np.int64, count), b"".join(present), nulls


def _binary(items: ValueItems, nullable: bool = True) -> pa.LargeBinaryArray:
    lengths, data, nulls = _raw(items, nullable)
    valid = None if nulls is None else pa.py_buffer(np.packbits(~nulls, bitorder="little"))
    return _array(len(items), lengths, pa.py_buffer(data), valid)


def _array(
    count: int, lengths: np.ndarray, data: pa.Buffer, valid: pa.Buffer | None = None
) -> pa.LargeBinaryArray:
    offsets = np.zeros(count + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    array = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), count, [valid, pa.py_buffer(offsets), data]
    )
    assert isinstance(array, pa.LargeBinaryArray)
    return array


def sort_by_key(columns: Columns) -> Columns:
    """``columns`` ordered by key bytes; entries with equal keys keep their order (the sort is
    stable, which :func:`merge` relies on)."""
    order = pc.sort_indices(columns.keys, memory_pool=_POOL)
    return Columns(_take(columns.keys, order), _take(columns.values, order))


def _take(array: pa.LargeBinaryArray, indices: pa.Array) -> pa.LargeBinaryArray:
    taken: pa.LargeBinaryArray = pc.take(array, indices, memory_pool=_POOL)
    return taken


def _filter(array: pa.LargeBinaryArray, mask: pa.BooleanArray) -> pa.LargeBinaryArray:
    kept: pa.LargeBinaryArray = pc.filter(array, mask, memory_pool=_POOL)
    return kept


def merge(chain: Sequence[Columns]) -> Columns:
    """The entries left after applying ``chain`` oldest first: for each key its newest value,
    sorted by key, and no key whose newest value is a tombstone. Each part must hold a key at
    most once (a block does)."""
    if not chain:
        return from_lists([], [])
    keys = pa.concat_arrays([part.keys for part in chain], memory_pool=_POOL)
    values = pa.concat_arrays([part.values for part in chain], memory_pool=_POOL)
    if len(keys) == 0:
        return Columns(keys, values)
    ordered = sort_by_key(Columns(keys, values))  # equal keys stay oldest first
    keys, values = ordered.keys, ordered.values
    differs = pc.not_equal(keys.slice(0, len(keys) - 1), keys.slice(1), memory_pool=_POOL)
    newest = pa.concat_arrays([differs, _TRUE], memory_pool=_POOL)
    keep = pc.and_(newest, pc.is_valid(values, memory_pool=_POOL), memory_pool=_POOL)
    return Columns(_filter(keys, keep), _filter(values, keep))


def encode(columns: Columns) -> bytes:
    """The block's bytes (before compression)."""
    values = columns.values
    if values.null_count and _lengths(values)[_nulls(values)].any():
        values = _binary(values.to_pylist())  # Arrow lets a null slot keep bytes: drop them
    return _pack(len(columns), _column(columns.keys), _column(values))


def encode_lists(keys: Items, values: ValueItems) -> bytes:
    """:func:`encode` of :func:`from_lists` without the Arrow arrays in between: a delta's
    block, which is stored in the order given (a third less time than through the arrays)."""
    if len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys but {len(values)} values")
    return _pack(len(keys), _raw(keys, nullable=False), _raw(values))


def _pack(count: int, keys: _Raw, values: _Raw) -> bytes:
    key_lengths, key_data, _ = keys
    value_lengths, value_data, tombstones = values
    key_width, value_width = _width(key_lengths), _width(value_lengths)
    flags = 0 if tombstones is None else _TOMBSTONES
    parts: list[bytes | memoryview] = [
        _HEAD.pack(count, key_width, value_width, flags),
        key_lengths.astype(_WIDTHS[key_width]).tobytes(),
        value_lengths.astype(_WIDTHS[value_width]).tobytes(),
    ]
    if tombstones is not None:
        parts.append(tombstones.astype(np.uint8).tobytes())
    parts += [key_data, value_data]
    return b"".join(parts)


def _width(lengths: np.ndarray) -> int:
    """The narrowest width of the lengths column that holds ``lengths``."""
    longest = int(lengths.max(initial=0))
    width = next((w for w in (1, 2, 4) if longest < 1 << (8 * w)), None)
    if width is None:
        raise ValueError(f"an entry of {longest} bytes is longer than a block allows (4 GiB)")
    return width


def _offsets(array: pa.LargeBinaryArray) -> np.ndarray:
    """The array's offsets into its data buffer (an array sliced or taken need not start at
    its buffer's start)."""
    buffer = array.buffers()[1]
    return np.frombuffer(buffer, np.int64, len(array) + 1, array.offset * 8)


def _nulls(array: pa.LargeBinaryArray) -> np.ndarray:
    """Where the array is null, from its validity bitmap (see ``_TRUE``)."""
    start, count = array.offset, len(array)
    bits = np.frombuffer(array.buffers()[0], np.uint8)
    valid = np.unpackbits(bits, count=start + count, bitorder="little")[start:]
    nulls: np.ndarray = valid == 0
    return nulls


def _lengths(array: pa.LargeBinaryArray) -> np.ndarray:
    return np.diff(_offsets(array))


def _column(array: pa.LargeBinaryArray) -> _Raw:
    """The raw column of an array whose nulls have no bytes (a view into its data buffer)."""
    offsets = _offsets(array)
    data = memoryview(array.buffers()[2] or b"")[int(offsets[0]) : int(offsets[-1])]
    nulls = _nulls(array) if array.null_count else None
    return np.diff(offsets), data, nulls


def joined(array: pa.LargeBinaryArray) -> bytes | memoryview:
    """The items of ``array`` end to end (a view into its data buffer, nulls having no bytes):
    what a bulk decoder reads in one call, without a bytes object per item."""
    return _column(array)[1] if len(array) else b""


def decode(block: bytes | memoryview) -> Columns:
    """The columns of a block's bytes (after decompression), without copying its keys and
    values; a ValueError that says what does not add up when the bytes are not such a block."""
    size = len(block)
    if size < _HEAD.size:
        raise ValueError(f"is {size} bytes, shorter than a block's head")
    count, key_width, value_width, flags = _HEAD.unpack_from(block)
    if key_width not in _WIDTHS or value_width not in _WIDTHS or flags & ~_TOMBSTONES:
        raise ValueError(
            f"has an unknown length width or flag ({key_width}, {value_width}, {flags})"
        )
    position = _HEAD.size
    lengths_end = position + count * (key_width + value_width + (flags & _TOMBSTONES))
    if lengths_end > size:
        raise ValueError(f"is {size} bytes, too short for the lengths of {count} entries")
    key_lengths = np.frombuffer(block, _WIDTHS[key_width], count, position)
    position += count * key_width
    value_lengths = np.frombuffer(block, _WIDTHS[value_width], count, position)
    position += count * value_width
    valid = None
    if flags & _TOMBSTONES:
        tombstones = np.frombuffer(block, np.uint8, count, position)
        position += count
        if tombstones.max(initial=0) > 1 or value_lengths[tombstones == 1].any():
            raise ValueError("has a tombstone column that is not 0s and 1s of empty values")
        valid = pa.py_buffer(np.packbits(tombstones == 0, bitorder="little"))
    key_bytes = int(key_lengths.sum(dtype=np.int64))
    value_bytes = int(value_lengths.sum(dtype=np.int64))
    if position + key_bytes + value_bytes != size:
        total = position + key_bytes + value_bytes
        raise ValueError(f"has lengths that add up to {total} bytes, not its {size}")
    buffer = pa.py_buffer(block)
    keys = _array(count, key_lengths, buffer.slice(position, key_bytes))
    values = _array(count, value_lengths, buffer.slice(position + key_bytes, value_bytes), valid)
    return Columns(keys, values)
