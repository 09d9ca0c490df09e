"""The current key, shared by a backend and all of its state handles.

The runtime sets the current key once per record; every handle then reads ``key`` and the key
group's slot ``index`` from this one small object. Keeping it separate from the backend keeps
the per-access path to two attribute reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class NoCurrentKeyError(RuntimeError):
    """Keyed state was used before a current key was set."""


class KeyContext:
    """``key`` is the current key, ``index`` its key group's slot in the backend's range."""

    __slots__ = ("batch_log", "drains", "index", "key", "per_record_work", "record_hooks")

    def __init__(self) -> None:
        self.key: Any = None
        self.index: int = -1
        # Called on every record (set_current_key): TTL per-record cleanup, access accounting.
        self.record_hooks: list[Callable[[], None]] = []
        # Whether making a key current takes more than setting key and index (per-record hooks,
        # or the spill tier counting records): the backend keeps it. A bool, for the loops that
        # make keys current themselves to test per record (a list's truth costs a C call).
        self.per_record_work = False
        # The change log's key batches since its last drain (their keys count as touched), and
        # how many drains there were: a batch kept past a drain logs itself again when used.
        self.batch_log: list[Any] = []  # KeyBatch (whose module imports this one)
        self.drains = 0

    def require_key(self) -> None:
        if self.index < 0:
            raise NoCurrentKeyError(
                "keyed state accessed without a current key: call set_current_key(key) first "
                "(the runtime does this before each record)"
            )
