"""Many keys at once: the keys of a vectorized pass, each key group resolved once.

A function that sees a whole range of records at once (Spark's ``KeyGroupFunction``) reads and
writes the state of many keys per call. Going key by key through ``set_current_key`` costs, per
key, a key-group lookup (a hash for a key not seen yet this epoch), a context switch and a
handle call for every read and write. A :class:`KeyBatch` does the key-group part once for all of
its keys, from the key-group column the pipeline already computed or by hashing, and records the
keys as touched for the next incremental snapshot; handles then read and write all of its keys in
one loop (``ValueState.values(batch)``, ``ValueState.update_all(batch, values)``). Backends make
batches (``KeyedStateBackend.key_batch``, ``RuntimeContext.key_batch``); a batch serves the
handles of the backend that made it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from statetier.backend.state.context import KeyContext

__all__ = ["KeyBatch", "as_list"]


class KeyBatch:
    """``keys`` and the slot of each key's key group in its backend's range, in the same order.

    The keys may repeat; a handle's bulk read returns one value per position and a bulk write
    applies its values in order (the last write of a repeated key wins).
    """

    __slots__ = ("context", "keys", "logged_at", "runs", "slots", "written")

    def __init__(self, keys: list[Any], slots: list[int], context: KeyContext) -> None:
        self._start(keys, slots, _slot_runs(np.asarray(slots, np.int64)), context)

    @classmethod
    def from_slot_array(cls, keys: list[Any], slots: np.ndarray, context: KeyContext) -> KeyBatch:
        """A batch whose slots come as a numpy array (from a key-group column): its runs found
        from the array itself, with no list to convert first."""
        batch = cls.__new__(cls)
        batch._start(keys, slots.tolist(), _slot_runs(slots), context)
        return batch

    def _start(
        self,
        keys: list[Any],
        slots: list[int],
        runs: list[tuple[int, int, int]] | None,
        context: KeyContext,
    ) -> None:
        self.keys = keys
        self.slots = slots
        self.context = context
        # (slot, start, stop) of each key group's keys when the batch is sorted by key group
        # (as a function sorts it to keep each key group's map in cache), else None: handles
        # and the change log then take a key group's keys in one C-level call on its map
        # instead of one Python step per key
        self.runs = runs
        self.written: list[tuple[object, list[Any]]] | None = []
        self.logged_at = context.drains  # in the change log since its last drain

    def __len__(self) -> int:
        return len(self.keys)

    def forget_written(self, maps: object) -> None:
        """A bulk write into the table of ``maps`` begins: what an earlier one recorded there
        stops being true as its first key is written (and stays untrue if it fails half-way)."""
        if self.written:
            self.written = [(m, v) for m, v in self.written if m is not maps]

    def record_written(self, maps: object, values: list[Any]) -> None:
        """A handle's bulk write left its keys with ``values`` (None where it removed one) in
        the table whose key-group maps are ``maps``: an incremental snapshot can write them
        without looking each key up again (``written_to``). ``values`` must be the handle's
        own list, one the caller cannot change."""
        if self.written is not None:
            self.forget_written(maps)
            self.written.append((maps, values))

    def written_to(self, maps: object) -> list[Any] | None:
        """The values the last bulk write with this batch left in the table of ``maps``, one
        per key; None when none was recorded or when the per-key path (``scoped``) may have
        written since. Valid only while nothing else touched the keys' key groups, which the
        backend's change log tells (``KeyedStateBackend.drain_touched``)."""
        for written_maps, values in self.written or ():
            if written_maps is maps:
                return values
        return None

    def scoped(self) -> Iterator[Any]:
        """Each key in turn as the current key (the per-key path of any handle); the key that
        was current before is current again when the iteration ends or is abandoned.

        Handles may then write any table under these keys without the change log knowing of
        each write, so the batch forgets what bulk writes recorded, for good."""
        self._log_again_if_kept()
        self.written = None
        ctx = self.context
        before = ctx.key, ctx.index
        try:
            for key, slot in zip(self.keys, self.slots, strict=True):
                ctx.index = slot
                ctx.key = key
                yield key
        finally:
            ctx.key, ctx.index = before

    def check_owner(self, context: KeyContext) -> None:
        """Refuse a batch made by another backend: its slots index that backend's range."""
        if context is not self.context:
            raise ValueError(
                "this KeyBatch was made by another state backend: make it with the context of "
                "the function whose state it reads (context.key_batch(keys))"
            )
        self._log_again_if_kept()

    def _log_again_if_kept(self) -> None:
        """A batch kept past a snapshot (the change log's drain) and used again goes into the
        log again, or the next delta would miss its keys; what its writes recorded before is
        forgotten (other writes may have followed them then)."""
        ctx = self.context
        if self.logged_at != ctx.drains:
            self.logged_at = ctx.drains
            self.written = []
            ctx.batch_log.append(self)

    def checked_values(self, context: KeyContext, values: Iterable[Any]) -> list[Any]:
        """``values`` as a list, one per key, for a bulk write by a handle of ``context``."""
        self.check_owner(context)
        new = as_list(values)
        if len(new) != len(self):
            raise ValueError(f"{len(new)} values for a KeyBatch of {len(self)} keys")
        return new

    def read_each(self, context: KeyContext, read: Callable[[], Any]) -> list[Any]:
        """``read()`` under each key in turn: the bulk read of a handle without a faster one."""
        self.check_owner(context)
        return [read() for _ in self.scoped()]

    def write_each(
        self, context: KeyContext, write: Callable[[Any], None], values: Iterable[Any]
    ) -> None:
        """``write(value)`` under each key in turn: the bulk write of a handle without a
        faster one."""
        self.map_each(context, write, values)

    def map_each(
        self, context: KeyContext, call: Callable[[Any], Any], values: Iterable[Any]
    ) -> list[Any]:
        """``call(value)`` under each key in turn, and what each call returned: the bulk
        read-modify-write of a handle without a faster one."""
        new = self.checked_values(context, values)
        return [call(value) for _, value in zip(self.scoped(), new, strict=True)]


def _slot_runs(slots: np.ndarray) -> list[tuple[int, int, int]] | None:
    """``(slot, start, stop)`` of each run of equal slots when ``slots`` never decreases; None
    otherwise."""
    if not len(slots):
        return []
    steps = np.diff(slots)
    if (steps < 0).any():
        return None
    starts = np.concatenate(([0], np.flatnonzero(steps) + 1))
    stops = np.append(starts[1:], len(slots))
    return list(zip(slots[starts].tolist(), starts.tolist(), stops.tolist(), strict=True))


def as_list(values: Any) -> list[Any]:
    """``values`` as a new Python list: an Arrow array (``to_pylist``), a numpy array (``tolist``,
    which gives Python ints), or any iterable."""
    if isinstance(values, list):
        return values.copy()  # the caller's list may change after it handed it over
    to_pylist = getattr(values, "to_pylist", None)
    if callable(to_pylist):
        return list(to_pylist())
    tolist = getattr(values, "tolist", None)
    if callable(tolist):
        return list(tolist())
    return list(values)
