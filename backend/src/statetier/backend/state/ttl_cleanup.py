"""Removal of expired TTL entries that nobody reads: incremental, and on full snapshots.

Cleanup on read only catches keys that are read again. Incremental cleanup walks the whole state
a few entries at a time (Flink's default: 5 entries per state access), continuing where it left
off, so that idle keys are eventually dropped without a full scan on the hot path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

from statetier.backend.descriptors import StateKind
from statetier.backend.ttl import Clock, StateTtlConfig


def purge_expired(kind: StateKind, stored: Any, ttl: StateTtlConfig, now: int) -> Any:
    """``stored`` without its expired parts, or None when nothing is left."""
    expired = ttl.expired
    if kind is StateKind.LIST:
        live = [item for item in stored if not expired(item[1], now)]
        return live or None
    if kind is StateKind.MAP:
        live_map = {k: item for k, item in stored.items() if not expired(item[1], now)}
        return live_map or None
    return None if expired(stored[1], now) else stored


@dataclasses.dataclass(eq=False)
class IncrementalCleanup:
    """A cursor over all entries of one TTL state that checks ``size`` entries per step."""

    kind: StateKind
    ttl: StateTtlConfig
    clock: Clock
    maps: Sequence[MutableMapping[Any, Any]]
    key_group_count: int
    on_change: Callable[[Any, int], None] | None = None  # (key, slot): logged for snapshots
    removed: int = dataclasses.field(default=0, init=False)  # entries (keys) dropped so far

    def __post_init__(self) -> None:
        self._size = self.ttl.incremental_cleanup_size
        self._slot = 0
        self._pending: list[Any] = []

    def on_access(self) -> None:
        if self._size:
            self.run(self._size)

    def on_record(self) -> None:
        if self._size and self.ttl.cleanup_per_record:
            self.run(self._size)

    def run(self, budget: int) -> None:
        """Check up to ``budget`` keys, visiting each key group at most once per call."""
        now = self.clock.now_ms()
        visited = 0
        while budget > 0:
            if not self._pending:
                if visited >= self.key_group_count:
                    return
                self._slot = (self._slot + 1) % self.key_group_count
                self._pending = list(self.maps[self._slot].keys())
                visited += 1
                continue
            key = self._pending.pop()
            budget -= 1
            kg_map = self.maps[self._slot]
            stored = kg_map.get(key)
            if stored is None:
                continue
            live = purge_expired(self.kind, stored, self.ttl, now)
            if live is None:
                del kg_map[key]
                self.removed += 1
            elif live is not stored and len(live) != len(stored):
                kg_map[key] = live
            else:
                continue
            if self.on_change is not None:
                self.on_change(key, self._slot)
