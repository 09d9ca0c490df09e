"""Compaction's TTL cleanup: expired entries left out of a compacted base (Flink's compaction
filter, ``cleanupInRocksdbCompactFilter``).

A state whose TTL asks for it (``cleanup_in_compaction``, recorded in the manifest's state
meta) has its expired values dropped when a chain is merged; list elements and map entries
expire one by one, as on the heap. Whether a value expired is judged at the clock of the chain's
epoch, which the compaction request carries (``now_ms``), never at the compacting machine's
wall clock: the compacted base stands for that epoch, and a job restored from it goes on from
that epoch's time (on Spark a re-run micro-batch keeps its timestamp), so an entry still alive
then must stay. Dropping entries expired at the epoch's time is what the heap's own cleanup
could have done by then, and every later time finds them expired too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from statetier.backend.descriptors import StateKind
from statetier.backend.state.codec import expired_purger
from statetier.backend.ttl import StateTtlConfig

__all__ = ["FlatFilter", "ttl_filter"]

FlatFilter = Callable[[list[Any]], list[Any]]


def ttl_filter(
    state_kind: str | None, ttl: dict[str, Any] | None, now_ms: int | None
) -> FlatFilter | None:
    """The filter a compaction applies to each key group's entries ([key, value, ...], the
    layout of a block), or None when the state's cleanup does not ask for one (no TTL, no
    ``cleanup_in_compaction``, or a request without a clock: an older client's).

    The filter returns its argument itself when nothing in it expired, so an untouched block
    whose entries are all alive can still be copied as it is.
    """
    if ttl is None or not ttl.get("cleanup_in_compaction") or now_ms is None:
        return None
    if state_kind is None:
        raise ValueError("a TTL cleanup in compaction needs the state's kind")
    purge = expired_purger(StateKind(state_kind), StateTtlConfig.from_json(ttl), now_ms)

    def live(flat: list[Any]) -> list[Any]:
        out: list[Any] = []
        changed = False
        for at in range(0, len(flat), 2):
            value = flat[at + 1]
            kept = purge(value)
            if kept is not value:
                changed = True
            if kept is not None:
                out += (flat[at], kept)
        return out if changed else flat

    return live
