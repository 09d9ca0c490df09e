"""Restored key groups kept as undecoded blocks, decoded when first read.

A restore is bound by the download; decoding every block into (key, value) pairs right away
costs more than the download itself and is wasted on states that are never registered again
(they are written back as they were). So a restore keeps, per key group, the blocks of its chain
(views into the downloaded files, already checked against the manifest's checksums) and
:class:`LazyEntries` decodes a key group the first time it is read: when its state is registered,
or when a key of it is looked up. Nothing is downloaded again; a decode only runs msgpack over
bytes in memory. :meth:`LazyEntries.decode_all` decodes everything at once (what an eager
restore would have done), with the cyclic garbage collector paused: the pairs are many small
containers that cannot form cycles, so collecting while they are built only burns time.
"""

from __future__ import annotations

import bisect
import gc
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import overload

from statetier.backend.snapshot import columns as block_columns
from statetier.backend.snapshot.columns import Columns
from statetier.backend.snapshot.format import Block
from statetier.backend.snapshot.merge import merge_blocks, merge_columns

__all__ = ["FlatPairs", "LazyEntries", "bulk_allocation"]

Pairs = Sequence[tuple[bytes, bytes]]

_gc_lock = threading.Lock()
_gc_pause = {"holders": 0, "was_enabled": 0}  # one process-wide switch, one count


@contextmanager
def bulk_allocation() -> Iterator[None]:
    """Pause the cyclic GC while many acyclic objects are built. Nestable and thread-safe: the
    first holder pauses it, the last one to leave enables it again if it was enabled before."""
    with _gc_lock:
        if _gc_pause["holders"] == 0:
            _gc_pause["was_enabled"] = gc.isenabled()
            gc.disable()
        _gc_pause["holders"] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pause["holders"] -= 1
            if _gc_pause["holders"] == 0 and _gc_pause["was_enabled"]:
                gc.enable()


class FlatPairs(Sequence[tuple[bytes, bytes]]):
    """A decoded block as msgpack gives it, [key, value, key, value, ...], seen as a sequence of
    (key, value) pairs: the pairs are made while iterating, not stored (building and tracking
    a tuple per entry costs more than the msgpack decode)."""

    __slots__ = ("_flat",)

    def __init__(self, flat: list[bytes]) -> None:
        self._flat = flat

    def __len__(self) -> int:
        return len(self._flat) // 2

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        flat = iter(self._flat)
        return zip(flat, flat, strict=True)

    @overload
    def __getitem__(self, index: int) -> tuple[bytes, bytes]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[bytes, bytes]]: ...
    def __getitem__(self, index: int | slice) -> tuple[bytes, bytes] | list[tuple[bytes, bytes]]:
        if isinstance(index, slice):
            return list(self)[index]
        at = range(len(self))[index]  # IndexError and negative indexes as a list has them
        return self._flat[2 * at], self._flat[2 * at + 1]

    def keys(self) -> list[bytes]:
        """The keys, sorted (as a block stores them)."""
        return self._flat[0::2]

    def values(self) -> list[bytes]:
        """The values, in the order of :meth:`keys`."""
        return self._flat[1::2]


class _Group:
    __slots__ = ("blocks", "pairs")

    def __init__(self, blocks: list[Block]) -> None:
        self.blocks = blocks
        self.pairs: Pairs | None = None


def _decode(blocks: list[Block]) -> Pairs:
    return FlatPairs(merge_blocks(blocks))  # sorted by key, as in a block


class LazyEntries(Mapping[int, Pairs]):
    """Key group -> its (key bytes, value bytes) pairs, decoded from its blocks on first read.

    A key group's blocks are its chain's, base first; decoding applies them in order with
    :func:`~statetier.backend.snapshot.merge.merge_blocks` (the rule compaction applies too),
    so a key group whose deltas removed every key reads as empty. Decoded pairs are kept and
    the blocks dropped.
    """

    def __init__(self, blocks: Mapping[int, list[Block]] | None = None) -> None:
        self._groups: dict[int, _Group] = {}
        for key_group, chain in (blocks or {}).items():
            self.add(key_group, chain)

    def add(self, key_group: int, blocks: list[Block]) -> None:
        """The chain of ``key_group``: its blocks, base first."""
        self._groups[key_group] = _Group(blocks)

    def take(self, other: LazyEntries) -> None:
        """Take over the key groups of ``other`` (decoded or not)."""
        self._groups.update(other._groups)

    def __getitem__(self, key_group: int) -> Pairs:
        group = self._groups[key_group]
        pairs = group.pairs
        if pairs is None:
            pairs = group.pairs = _decode(group.blocks)
            group.blocks = []
        return pairs

    def columns(self, key_group: int) -> Columns:
        """``key_group``'s entries as Arrow columns, sorted by key, without tombstones. A key
        group not decoded yet is merged in Arrow (no Python object per entry, and nothing
        kept): the bulk readers' path, which turn columns into columns."""
        group = self._groups[key_group]
        if group.pairs is None:
            return merge_columns(group.blocks)
        pairs = group.pairs
        if isinstance(pairs, FlatPairs):
            return block_columns.from_lists(pairs.keys(), pairs.values())
        return block_columns.from_lists([k for k, _ in pairs], [v for _, v in pairs])

    def __contains__(self, key_group: object) -> bool:
        return key_group in self._groups  # without decoding it

    def __iter__(self) -> Iterator[int]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)

    @property
    def undecoded(self) -> int:
        """How many key groups are still undecoded blocks."""
        return sum(1 for group in self._groups.values() if group.pairs is None)

    def decode_all(self) -> None:
        """Decode every key group now."""
        with bulk_allocation():
            for key_group in self._groups:
                self[key_group]

    def lookup(self, key_group: int, key: bytes) -> bytes | None:
        """The value bytes of ``key`` (serialized) in ``key_group``, None when absent; decodes
        only that key group. Pairs are sorted by key bytes, so this is a binary search."""
        if key_group not in self:
            return None
        pairs = self[key_group]
        keys = pairs.keys() if isinstance(pairs, FlatPairs) else [k for k, _ in pairs]
        at = bisect.bisect_left(keys, key)
        return pairs[at][1] if at < len(keys) and keys[at] == key else None
