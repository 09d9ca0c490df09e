"""What a state host keeps between tasks, bounded: the most recently used entries only.

A host keeps each pipeline's function (unpickled from the task's bytes), its resolved settings
and its checkpoint store, so that a task does not unpickle, resolve or connect again. A host
lives as long as its executor, and on a Spark Connect server that is the server's life: every
query with a function or settings of its own adds entries, for days. So a host keeps at most
:data:`KEPT_PER_TABLE` of each and drops the least recently used; a task that needs a dropped
one makes it again. What a hosted range holds (its instance, its store) is its own reference
and outlives the entry.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

# far above the pipelines one application runs at once: dropping one costs a remake (an unpickle,
# 0.2 ms of settings, a store object), never state
KEPT_PER_TABLE = 64


class Kept(Generic[K, V]):
    """``make``'s values by key, at most ``limit`` of them (the least recently used go first).
    Not locked: the host calls it under its lock."""

    def __init__(self, limit: int = KEPT_PER_TABLE) -> None:
        if limit < 1:
            raise ValueError(f"a kept table holds at least one entry, not {limit}")
        self.limit = limit
        self._values: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value of ``key``, made by ``make`` when it is not kept."""
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
            return value
        value = self._values[key] = make()
        if len(self._values) > self.limit:
            self._values.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: object) -> bool:
        return key in self._values
