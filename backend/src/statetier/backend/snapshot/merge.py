"""The merge rule of a key group's chain: the one rule restore and compaction both apply.

A key group's state at an epoch is the blocks of its chain applied oldest first: a base holds
every entry, a delta the keys touched since the file before it. Later values win, a tombstone (a
value of None, deltas only) removes its key, and a base restarts the chain (nothing before it
counts any more). Restore (eager and lazy, see lazy) and compaction go through
:func:`merge_columns` (Arrow's sort and filters, see columns), and every block is decoded by
:meth:`~statetier.backend.snapshot.format.Block.columns`, so a compacted base restores exactly
as the chain it replaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from statetier.backend.snapshot import columns as block_columns
from statetier.backend.snapshot.columns import Columns
from statetier.backend.snapshot.format import BASE, Block

__all__ = ["live_chain", "merge_blocks", "merge_columns"]


class _Kinded(Protocol):
    @property
    def kind(self) -> str: ...


K = TypeVar("K", bound=_Kinded)


def live_chain(chain: Sequence[K]) -> Sequence[K]:
    """The part of ``chain`` (files or blocks, oldest first) that counts: from its last base
    on (all of it when it has none)."""
    start = max((i for i, item in enumerate(chain) if item.kind == BASE), default=0)
    return chain[start:]


def merge_columns(blocks: Sequence[Block]) -> Columns:
    """The entries of one key group after its chain ``blocks`` (oldest first), sorted by key
    bytes, without tombstones: what compaction writes as the new base's block.

    A chain that is one base alone is that block as decoded (already sorted, no tombstones).
    Only a key group's chain of files can tell that a base in the middle has no block for
    it (the key group was empty then): apply :func:`live_chain` to the files first.
    """
    chain = live_chain(blocks)
    if len(chain) == 1 and chain[0].kind == BASE:
        return chain[0].columns()
    return block_columns.merge([block.columns() for block in chain])


def merge_blocks(blocks: Sequence[Block]) -> list[bytes]:
    """:func:`merge_columns` as a block stores its entries, ``[key, value, key, value, ...]``:
    the form a restore reads into its maps."""
    chain = live_chain(blocks)
    if len(chain) == 1 and chain[0].kind == BASE:
        return chain[0].flat()  # type: ignore[return-value]  # a base holds no None
    return merge_columns(chain).to_flat()  # type: ignore[return-value]  # nor a merge
