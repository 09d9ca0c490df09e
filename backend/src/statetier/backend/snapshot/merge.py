"""The merge rule of a key group's chain: the one rule restore and compaction both apply.

A key group's state at an epoch is the blocks of its chain applied oldest first: a base holds
every entry, a delta the keys touched since the file before it. Later values win, a tombstone (a
value of None, deltas only) removes its key, and a base restarts the chain (nothing before it
counts any more). Restore (eager and lazy, see lazy) and compaction go through
:func:`merge_blocks`, and every block is decoded by :meth:`~statetier.backend.snapshot.format.
Block.flat`, so a compacted base restores exactly as the chain it replaces.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from statetier.backend.snapshot.format import BASE, Block

__all__ = ["live_chain", "merge_blocks"]


class _Kinded(Protocol):
    @property
    def kind(self) -> str: ...


K = TypeVar("K", bound=_Kinded)


def live_chain(chain: Sequence[K]) -> Sequence[K]:
    """The part of ``chain`` (files or blocks, oldest first) that counts: from its last base
    on (all of it when it has none)."""
    start = max((i for i, item in enumerate(chain) if item.kind == BASE), default=0)
    return chain[start:]


def merge_blocks(blocks: Sequence[Block]) -> list[bytes]:
    """The entries of one key group after its chain ``blocks`` (oldest first) as a block
    stores them: ``[key, value, key, value, ...]`` sorted by key bytes, without tombstones.

    A chain that is one base alone is that block as decoded (already sorted, no tombstones).
    Only a key group's chain of files can tell that a base in the middle has no block for
    it (the key group was empty then): apply :func:`live_chain` to the files first.
    """
    chain = live_chain(blocks)
    if len(chain) == 1 and chain[0].kind == BASE:
        return chain[0].flat()  # type: ignore[return-value]  # a base holds no None
    merged: dict[bytes, bytes | None] = {}
    maybe_tombstones = False
    for block in chain:
        flat = block.flat()
        pairs = iter(flat)
        merged.update(zip(pairs, pairs, strict=True))  # type: ignore[arg-type]
        # a None (tombstone) is falsy; all() is a much cheaper scan than looking for None
        maybe_tombstones = maybe_tombstones or not all(flat[1::2])
    # A tombstone left None under its key, in place: a later value replaces it there, and
    # only the keys still None at the end are removed (the last word on them was a removal).
    keys = list(merged)
    values = list(merged.values())
    if maybe_tombstones:
        live = list(map(operator.is_not, values, itertools.repeat(None)))
        keys = list(itertools.compress(keys, live))
        values = list(itertools.compress(values, live))
    ordered = sorted(keys)  # the base's keys come first, in order: timsort runs through them
    if ordered != keys:  # keys new since the base were added at the end
        keys, values = ordered, list(map(merged.__getitem__, ordered))
    out: list[Any] = [b""] * (2 * len(keys))
    out[0::2] = keys
    out[1::2] = values
    return out
