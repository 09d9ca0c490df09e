"""The on-disk layout of one spilled key group of one state: a hash index over a record log.

A spilled key group must answer point reads and writes of one key without deserializing the
whole key group (a heap handle touches one key per record), and must not keep its keys as Python
objects (that is the memory and the GC work spilling exists to shed). So it lives in two regions
of the mmap'd chunks (:mod:`.storage`):

- the **index**: an open-addressing hash table of 24-byte slots ``(hash64, location, key length,
  value length)``; location 0 is empty, all ones a tombstone, else ``log offset + 1``. Linear
  probing, at most 60% of the slots used (tombstones count). Lengths live in the slot so that a
  lookup is one ``unpack`` plus one key comparison.
- the **log**: key bytes followed by value bytes, appended; only the index says where records are.
  A str key is stored as its UTF-8 (no serializer call on the per-record path), any other key as
  0xFF (which never starts UTF-8) and the key serializer's bytes.

A read hashes the serialized key (xxh3, never the built-in ``hash``), probes, compares the key
bytes and decodes only that value. A write of a value of the same encoded length overwrites it in
place; otherwise a new record is appended and the slot repointed. When the log or the index is
full, the live records are copied into a fresh log and index sized for twice the live data:
compaction and growth in one step, with no decoding.

Versioning (copy-on-write, after Flink's CopyOnWriteSkipListStateMap and Nitro): a
:class:`FrozenView` copies the index (a memcpy) and *pins* the log. While a log is pinned nothing
in it is overwritten (writes append) and it is neither freed nor moved, so the view keeps reading
exactly the version it was taken at while writes go on. Unpinning frees a log replaced meanwhile.

A read-modify-write of one key (``value()`` then ``update()``, what every handle does) probes
once: the read leaves a one-entry memo of where the key is (or would go) and where its value
bytes are, so a write of the same encoded length is one slice assignment, without a second probe
or slot read. The memo is valid while ``_gen`` is unchanged: whatever can move a record or a slot
(a delete, a rebuild, compaction moving the regions) bumps it, an append that repoints the slot
moves the memo along, and nothing is overwritten in place while a view pins the log. The memo
holds a location, never a value: the key group stays on disk only.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping, MutableMapping
from typing import Any, NamedTuple

import xxhash
from statetier.backend.serializers import SerializationError
from statetier.backend.spill.storage import Region, SpaceUnavailableError, SpillStorage

__all__ = ["FrozenView", "MapCodec", "SpilledMap"]

_SLOT = struct.Struct("<QQII")
SLOT_SIZE = _SLOT.size
_slot_at = _SLOT.unpack_from
_pack_slot = _SLOT.pack_into
_TOMB = (1 << 64) - 1
_hash = xxhash.xxh3_64_intdigest

MIN_SLOTS = 64
MAX_LOAD = 0.6
MIN_LOG = 1024

# what _find says about a key
_EMPTY, _TOMBSTONE, _FOUND = 0, 1, 2

_Missing: Any = object()
# (key, gen, slot, status, key bytes, hash, value start in the log's mmap, value length)
_Memo = tuple[Any, int, int, int, bytes, int, int, int]
_NO_MEMO: _Memo = (_Missing, -1, 0, 0, b"", 0, 0, -1)

Encode = Callable[[Any], bytes]
Decode = Callable[[bytes], Any]


class MapCodec(NamedTuple):
    """How a spilled map turns its keys and stored values into bytes and back: the four always
    travel together (one per state table, shared by its maps and their frozen views).
    ``encode`` raises TypeError (SerializationError is one), ValueError or OverflowError for a
    value it cannot write."""

    key_dumps: Encode
    key_loads: Decode
    encode: Encode
    decode: Decode


_OTHER = b"\xff"  # never starts UTF-8: tags keys that are not str

# What an encoder raises for a value it cannot write (SerializationError is a TypeError): a
# serializer's own packer may be passed as ``encode`` as it is, without a wrapper per call.
_UNWRITABLE = (TypeError, ValueError, OverflowError)


def _unwritable(value: Any, exc: Exception) -> SerializationError:
    if isinstance(exc, SerializationError):
        return exc
    return SerializationError(f"cannot write a {type(value).__name__} value: {exc}")


def _key_bytes(key: Any, dumps: Encode) -> bytes:
    """Stored form of a key: UTF-8 for str (the common case, without a serializer call),
    else 0xFF followed by the key serializer's bytes. Private to the spill tier."""
    return key.encode() if type(key) is str else _OTHER + dumps(key)


def _key_of(kb: bytes, loads: Decode) -> Any:
    return loads(kb[1:]) if kb[:1] == _OTHER else kb.decode()


def _slots_for(count: int) -> int:
    """A power of two that holds ``count`` keys at a load of about a third."""
    slots = MIN_SLOTS
    while slots * 0.35 < count:
        slots <<= 1
    return slots


class _Items(ItemsView[Any, Any]):
    """``items()`` that reads each record once (the default view would probe per key)."""

    _mapping: SpilledMap | FrozenView

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return self._mapping.iter_items()


class SpilledMap(MutableMapping[Any, Any]):
    """Key -> stored value of one state in one key group, held in mmap'd regions.

    The same semantics as the dict it replaces; values come back as fresh objects (handles write
    back every change, so nothing is lost by that). ``codec`` turns keys and stored values into
    bytes and back (its value half a :class:`~statetier.backend.state.codec.StateCodec`'s
    methods, or a serializer's). ``fallback`` is called when the storage runs out of space
    during a write, or the value cannot be serialized: it must move the key group back to heap
    and return this state's heap mapping there, which then takes the write, so a full disk loses
    nothing and the heap's semantics hold.
    """

    def __init__(
        self,
        storage: SpillStorage,
        codec: MapCodec,
        items: Iterable[tuple[Any, Any]] = (),
        *,
        fallback: Callable[[Exception], MutableMapping[Any, Any]] | None = None,
    ) -> None:
        self._storage = storage
        self.codec = codec
        # bound once, for the per-record path (an attribute, not a tuple field, per call)
        self._kdumps, _, self._encode, self._decode = codec
        self.fallback = fallback
        self._index: Region | None = None
        self._data: Region | None = None
        self._mask = 0
        self._max_used = 0
        self._used = 0  # slots not empty (live + tombstones)
        self._live = 0
        self.live_bytes = 0  # exact serialized bytes of the live keys and values
        self._tail = 0
        self._gen = 0  # bumped whenever a memoized slot may have become stale
        self._memo: _Memo = _NO_MEMO
        self._at: tuple[mmap.mmap, int, int, mmap.mmap, int]
        records = []
        kbytes, encode = self._key_bytes, codec.encode
        for key, value in items:
            kb = kbytes(key)
            try:
                vb = encode(value)
            except _UNWRITABLE as exc:
                raise _unwritable(value, exc) from exc
            records.append((_hash(kb), kb, vb))
        self._build(records, 0)

    def _key_bytes(self, key: Any) -> bytes:
        return _key_bytes(key, self._kdumps)

    # ------------------------------------------------------------------ layout

    def _build(self, records: list[tuple[int, bytes, bytes]], extra: int) -> None:
        """Write ``records`` into a new index and log; the old ones are freed (or retired).

        Allocates before changing anything, so a SpaceUnavailableError leaves the map as it was.
        """
        slots = _slots_for(len(records) + 1)
        mask = slots - 1
        index = bytearray(slots * SLOT_SIZE)
        parts = []
        position = 0
        for h, kb, vb in records:
            i = h & mask
            while _slot_at(index, i * SLOT_SIZE)[1]:
                i = (i + 1) & mask
            _pack_slot(index, i * SLOT_SIZE, h, position + 1, len(kb), len(vb))
            parts.append(kb)
            parts.append(vb)
            position += len(kb) + len(vb)
        log = b"".join(parts)
        log_size = max(MIN_LOG, 2 * (len(log) + extra))
        storage = self._storage
        new_index = storage.allocate(len(index))
        try:
            new_data = storage.allocate(log_size)
        except BaseException:
            storage.free(new_index)
            raise
        o = new_index.offset
        new_index.mm[o : o + len(index)] = index
        o = new_data.offset
        new_data.mm[o : o + len(log)] = log
        self._release_regions()
        self._index, self._data = new_index, new_data
        new_index.moved = new_data.moved = self._locate
        self._mask = mask
        self._max_used = int(slots * MAX_LOAD)
        self._used = self._live = len(records)
        self.live_bytes = self._tail = len(log)
        self._locate()

    def _locate(self) -> None:
        """Cache where the regions are, for the per-record read (redone when they move)."""
        index, data = self._index, self._data
        assert index is not None and data is not None
        self._at = (index.mm, index.offset, self._mask, data.mm, data.offset - 1)
        self._gen += 1  # a memoized value position is in the old place

    def _live_records(self) -> list[tuple[int, bytes, bytes]]:
        """``(hash, key bytes, value bytes)`` of every live record, straight from the log."""
        index, data = self._index, self._data
        assert index is not None and data is not None
        index_bytes = index.mm[index.offset : index.offset + (self._mask + 1) * SLOT_SIZE]
        dm, base = data.mm, data.offset - 1
        records = []
        for h, loc, klen, vlen in _SLOT.iter_unpack(index_bytes):
            if loc and loc != _TOMB:
                start = base + loc
                records.append(
                    (h, dm[start : start + klen], dm[start + klen : start + klen + vlen])
                )
        return records

    def _release_regions(self) -> None:
        for region in (self._index, self._data):
            if region is not None:
                self._storage.free(region)
        self._index = self._data = None

    def release(self) -> None:
        """Give the regions back (a log still pinned by a view is freed when the view closes)."""
        self._release_regions()
        self._live = self._used = self.live_bytes = self._tail = 0
        self._memo = _NO_MEMO

    @property
    def released(self) -> bool:
        return self._index is None

    # ------------------------------------------------------------------ point access

    def _find(self, kb: bytes, h: int) -> tuple[int, int]:
        """``(slot, status)``: where ``kb`` is, or the first free slot on its probe path."""
        index, data = self._index, self._data
        assert index is not None and data is not None
        mm, base, mask = index.mm, index.offset, self._mask
        dm, dbase = data.mm, data.offset - 1
        klen = len(kb)
        i = h & mask
        tomb = -1
        while True:
            sh, loc, sk, _ = _slot_at(mm, base + i * SLOT_SIZE)
            if not loc:
                return (tomb, _TOMBSTONE) if tomb >= 0 else (i, _EMPTY)
            if loc == _TOMB:
                if tomb < 0:
                    tomb = i
            elif sh == h and sk == klen:
                start = dbase + loc
                if dm[start : start + klen] == kb:
                    return i, _FOUND
            i = (i + 1) & mask

    def get(self, key: Any, default: Any = None) -> Any:
        # The per-record read of every spilled key, so as few steps as it takes: almost always
        # the first slot probed holds the key (the index is at most 60% full, usually a third).
        kb = key.encode() if type(key) is str else _OTHER + self._kdumps(key)
        h = _hash(kb)
        mm, base, mask, dm, dbase = self._at
        i = h & mask
        sh, loc, klen, vlen = _slot_at(mm, base + i * SLOT_SIZE)
        if sh == h and klen == len(kb) and 0 < loc != _TOMB:
            start = dbase + loc
            if dm[start : start + klen] == kb:
                start += klen
                self._memo = (key, self._gen, i, _FOUND, kb, h, start, vlen)
                decode = self._decode  # an attribute, not a method: LOAD_METHOD would not cache
                return decode(dm[start : start + vlen])
        return self._get_probing(key, kb, h, default)

    def _get_probing(self, key: Any, kb: bytes, h: int, default: Any) -> Any:
        """``get`` when the first slot is not the key's: probe on, memoize where it is or goes."""
        i, status = self._find(kb, h)
        if status != _FOUND:
            self._memo = (key, self._gen, i, status, kb, h, 0, -1)
            return default
        mm, base, _, dm, dbase = self._at
        _, loc, klen, vlen = _slot_at(mm, base + i * SLOT_SIZE)
        start = dbase + loc + klen
        self._memo = (key, self._gen, i, _FOUND, kb, h, start, vlen)
        return self._decode(dm[start : start + vlen])

    def __getitem__(self, key: Any) -> Any:
        value = self.get(key, _Missing)
        if value is _Missing:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        kb = self._key_bytes(key)
        return self._find(kb, _hash(kb))[1] == _FOUND

    def __setitem__(self, key: Any, value: Any) -> None:
        try:
            vb = self._encode(value)
        except _UNWRITABLE as exc:
            self._write_on_heap(key, value, _unwritable(value, exc))
            return
        memo = self._memo
        if memo[0] is key and memo[1] == self._gen and memo[7] == len(vb):
            data = self._data
            if data is not None and not data.pins:
                # the write after a read of the same key, same length: overwrite in place
                start = memo[6]
                data.mm[start : start + memo[7]] = vb
                return
        try:
            self._put(key, vb)
        except SpaceUnavailableError as exc:
            self._write_on_heap(key, value, exc)

    def _write_on_heap(self, key: Any, value: Any, exc: Exception) -> None:
        """No space, or a value the serializer cannot write (the heap takes any object): the
        key group goes back to heap and the write happens there, as it would have."""
        if self.fallback is None:
            raise exc
        self.fallback(exc)[key] = value

    def _put(self, key: Any, vb: bytes) -> None:
        memo = self._memo
        if memo[0] is key and memo[1] == self._gen:
            _, _, i, status, kb, h, _, _ = memo
        else:
            kb = key.encode() if type(key) is str else _OTHER + self._kdumps(key)
            h = _hash(kb)
            i, status = self._find(kb, h)
        index, data = self._index, self._data
        assert index is not None and data is not None
        vlen = len(vb)
        if status == _FOUND:
            _, loc, klen, old_vlen = _slot_at(index.mm, index.offset + i * SLOT_SIZE)
            if old_vlen == vlen and not data.pins:
                start = data.offset - 1 + loc + klen
                data.mm[start : start + vlen] = vb
                return
            record_len = klen + vlen
            if self._tail + record_len > data.size:
                self._build(self._live_records(), record_len)
                i, status = self._find(kb, h)
                index, data = self._index, self._data
                assert index is not None and data is not None
            self.live_bytes += vlen - old_vlen
        else:
            record_len = len(kb) + vlen
            if self._used >= self._max_used or self._tail + record_len > data.size:
                self._build(self._live_records(), record_len)
                i, status = self._find(kb, h)
                index, data = self._index, self._data
                assert index is not None and data is not None
            if status == _EMPTY:
                self._used += 1
            self._live += 1
            self.live_bytes += record_len
            self._gen += 1
        position = self._tail
        o = data.offset + position
        data.mm[o : o + record_len] = kb + vb
        self._tail = position + record_len
        _pack_slot(index.mm, index.offset + i * SLOT_SIZE, h, position + 1, len(kb), vlen)
        # the slot moved to the new record: the next write of this key goes there
        self._memo = (key, self._gen, i, _FOUND, kb, h, o + len(kb), vlen)

    def _remove(self, key: Any) -> Any:
        """Delete ``key``; returns its value, or _Missing."""
        kb = self._key_bytes(key)
        h = _hash(kb)
        i, status = self._find(kb, h)
        if status != _FOUND:
            return _Missing
        index, data = self._index, self._data
        assert index is not None and data is not None
        pos = index.offset + i * SLOT_SIZE
        _, loc, klen, vlen = _slot_at(index.mm, pos)
        start = data.offset - 1 + loc + klen
        value = self._decode(data.mm[start : start + vlen])
        _pack_slot(index.mm, pos, h, _TOMB, 0, 0)
        self._live -= 1
        self.live_bytes -= klen + vlen
        self._gen += 1
        return value

    def pop(self, key: Any, default: Any = _Missing) -> Any:
        value = self._remove(key)
        if value is _Missing:
            if default is _Missing:
                raise KeyError(key)
            return default
        return value

    def __delitem__(self, key: Any) -> None:
        if self._remove(key) is _Missing:
            raise KeyError(key)

    def clear(self) -> None:
        self._build([], 0)

    def __len__(self) -> int:
        return self._live

    # ------------------------------------------------------------------ versions and scans

    def frozen(self) -> FrozenView:
        """A read-only view of the current version; close it (or use ``with``) when done."""
        return FrozenView(self)

    def iter_items(self) -> Iterator[tuple[Any, Any]]:
        """Entries of the version current when iteration starts; writes meanwhile are fine."""
        with self.frozen() as view:
            yield from view.iter_items()

    def items(self) -> ItemsView[Any, Any]:
        return _Items(self)

    def __iter__(self) -> Iterator[Any]:
        with self.frozen() as view:
            yield from view

    def __repr__(self) -> str:
        return f"SpilledMap({self._live} keys, {self.live_bytes} bytes)"


class FrozenView(Mapping[Any, Any]):
    """One version of a :class:`SpilledMap`: a copy of its index over its pinned log."""

    def __init__(self, source: SpilledMap) -> None:
        index, data = source._index, source._data
        if index is None or data is None:
            raise ValueError("the spilled map has been released")
        self._index = index.mm[index.offset : index.offset + (source._mask + 1) * SLOT_SIZE]
        self._mask = source._mask
        self._data = data
        data.pins += 1
        self._storage = source._storage
        self._len = source._live
        self._codec = source.codec
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._storage.unpin(self._data)

    def __enter__(self) -> FrozenView:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self.close()

    def _check(self) -> None:
        if self.closed:
            raise ValueError("the frozen view is closed")

    def __getitem__(self, key: Any) -> Any:
        self._check()
        kb = _key_bytes(key, self._codec.key_dumps)
        h = _hash(kb)
        mask, klen = self._mask, len(kb)
        dm, base = self._data.mm, self._data.offset - 1
        i = h & mask
        while True:
            sh, loc, sk, vlen = _slot_at(self._index, i * SLOT_SIZE)
            if not loc:
                raise KeyError(key)
            if loc != _TOMB and sh == h and sk == klen:
                start = base + loc
                if dm[start : start + klen] == kb:
                    start += klen
                    return self._codec.decode(dm[start : start + vlen])
            i = (i + 1) & mask

    def raw_items(self) -> Iterator[tuple[bytes, bytes]]:
        """(stored key bytes, encoded value) pairs of this version, without decoding."""
        self._check()
        dm, base = self._data.mm, self._data.offset - 1
        for _, loc, klen, vlen in _SLOT.iter_unpack(self._index):
            if loc and loc != _TOMB:
                start = base + loc
                yield dm[start : start + klen], dm[start + klen : start + klen + vlen]

    def iter_items(self) -> Iterator[tuple[Any, Any]]:
        kloads, decode = self._codec.key_loads, self._codec.decode
        for kb, vb in self.raw_items():
            yield _key_of(kb, kloads), decode(vb)

    def items(self) -> ItemsView[Any, Any]:
        return _Items(self)

    def __iter__(self) -> Iterator[Any]:
        kloads = self._codec.key_loads
        for kb, _ in self.raw_items():
            yield _key_of(kb, kloads)

    def __len__(self) -> int:
        return self._len
