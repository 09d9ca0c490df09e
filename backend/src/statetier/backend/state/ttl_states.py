"""TTL handles: every value, list element and map entry is stored as ``(value, timestamp)``.

They follow Flink's TTL decorators: an expired value found by a read is removed (cleanup on read)
and returned once only with ``RETURN_EXPIRED_IF_NOT_CLEANED_UP``; ``ON_READ_AND_WRITE`` renews the
timestamp of what a read returns; adding to a reducing or aggregating state ignores an expired
accumulator unless the visibility returns expired values (then it folds into what ``get`` would
return, as Flink does). Every access also runs the state's incremental cleanup, which checks a few
more entries of the whole state for expiry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from statetier.backend import state as handles  # the interfaces these handles implement
from statetier.backend.descriptors import (
    AggregatingStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
)
from statetier.backend.state.context import KeyContext
from statetier.backend.state.heap import (
    KeyGroupHandle,
    KeyGroupMaps,
    append_elements,
    check_entries,
    checked_elements,
    store_or_drop,
)
from statetier.backend.state.key_batch import KeyBatch
from statetier.backend.state.ttl_cleanup import IncrementalCleanup
from statetier.backend.state.writable import PLAIN
from statetier.backend.ttl import Clock, StateTtlConfig, StateVisibility, UpdateType

Stamped = tuple[Any, int]


class _TtlHandle(KeyGroupHandle):
    """What all TTL handles share: the clock, the config and the cleanup run on each access."""

    __slots__ = ("_cleanup", "_clock", "_return_expired", "_ttl", "_update_on_read")

    def __init__(
        self,
        ctx: KeyContext,
        maps: KeyGroupMaps,
        ttl: StateTtlConfig,
        clock: Clock,
        cleanup: IncrementalCleanup,
    ) -> None:
        super().__init__(ctx, maps)
        self._ttl = ttl
        self._clock = clock
        self._cleanup = cleanup
        self._return_expired = ttl.visibility is StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP
        self._update_on_read = ttl.update_type is UpdateType.ON_READ_AND_WRITE

    def _access(self) -> int:
        """Run incremental cleanup and return the current time."""
        self._cleanup.on_access()
        return self._clock.now_ms()

    def _read_stamped(self, now: int) -> Any:
        """The current key's unexpired value (renewed on read if asked), or an expired one once."""
        ctx = self._ctx
        kg_map = self._maps[ctx.index]
        stamped: Stamped | None = kg_map.get(ctx.key)
        if stamped is None:
            return None
        value, stamp = stamped
        if self._ttl.expired(stamp, now):
            del kg_map[ctx.key]
            return value if self._return_expired else None
        if self._update_on_read:
            kg_map[ctx.key] = (value, now)
        return value

    def _visible(self, now: int) -> Any:
        """The value an ``add`` folds into: the unexpired one, or with
        ``RETURN_EXPIRED_IF_NOT_CLEANED_UP`` also an expired one still stored (what ``get``
        would return), as Flink's TTL reduce and aggregate functions do (``getUnexpired``)."""
        ctx = self._ctx
        stamped: Stamped | None = self._maps[ctx.index].get(ctx.key)
        if stamped is None or (self._ttl.expired(stamped[1], now) and not self._return_expired):
            return None
        return stamped[0]

    def _write(self, value: Any, now: int) -> None:
        if type(value) not in PLAIN:
            self._check(value)
        ctx = self._ctx
        self._maps[ctx.index][ctx.key] = (value, now)

    def clear(self) -> None:
        self._cleanup.on_access()
        super().clear()


class TtlValueState(_TtlHandle, handles.ValueState[Any]):
    __slots__ = ()

    def value(self) -> Any:
        return self._read_stamped(self._access())

    def update(self, value: Any) -> None:
        now = self._access()
        if value is None:
            ctx = self._ctx
            self._maps[ctx.index].pop(ctx.key, None)
        else:
            self._write(value, now)

    def values(self, batch: KeyBatch) -> list[Any]:
        return batch.read_each(self._ctx, self.value)

    def update_all(self, batch: KeyBatch, values: Iterable[Any]) -> None:
        batch.write_each(self._ctx, self.update, values)


class TtlReducingState(_TtlHandle, handles.ReducingState[Any]):
    __slots__ = ("_reduce",)

    def __init__(self, *args: Any, descriptor: ReducingStateDescriptor[Any]) -> None:
        super().__init__(*args)
        self._reduce: Callable[[Any, Any], Any] = descriptor.reduce_function

    def get(self) -> Any:
        return self._read_stamped(self._access())

    def add(self, value: Any) -> None:
        self._fold(value)

    def add_each(self, batch: KeyBatch, values: Iterable[Any]) -> list[Any]:
        return batch.map_each(self._ctx, self._fold, values)

    def _fold(self, value: Any) -> Any:
        """``add(value)``; the reduced value it stored."""
        handles.check_not_none(value, "a reduced value")
        now = self._access()
        current = self._visible(now)
        reduced = value if current is None else self._reduce(current, value)
        self._write(reduced, now)
        return reduced


class TtlAggregatingState(_TtlHandle, handles.AggregatingState[Any, Any]):
    __slots__ = ("_fn",)

    def __init__(self, *args: Any, descriptor: AggregatingStateDescriptor[Any, Any, Any]) -> None:
        super().__init__(*args)
        self._fn = descriptor.aggregate_function

    def get(self) -> Any:
        accumulator = self._read_stamped(self._access())
        return None if accumulator is None else self._fn.get_result(accumulator)

    def add(self, value: Any) -> None:
        now = self._access()
        accumulator = self._visible(now)
        if accumulator is None:
            accumulator = self._fn.create_accumulator()
        self._write(self._fn.add(value, accumulator), now)


class TtlListState(_TtlHandle, handles.ListState[Any]):
    """Each element carries its own timestamp and expires on its own."""

    __slots__ = ()

    def get(self) -> list[Any]:
        now = self._access()
        ctx = self._ctx
        kg_map = self._maps[ctx.index]
        stamped: list[Stamped] | None = kg_map.get(ctx.key)
        if not stamped:
            return []
        expired = self._ttl.expired
        visible = [v for v, ts in stamped if self._return_expired or not expired(ts, now)]
        live = [
            (v, now if self._update_on_read else ts) for v, ts in stamped if not expired(ts, now)
        ]
        if len(live) != len(stamped) or self._update_on_read:
            if live:
                kg_map[ctx.key] = live
            else:
                del kg_map[ctx.key]
        return visible

    def add(self, value: Any) -> None:
        self.add_all((value,))

    def add_all(self, values: Iterable[Any]) -> None:
        now = self._access()
        new = checked_elements(values, self._check)
        append_elements(self._maps, self._ctx, [(v, now) for v in new])

    def update(self, values: Iterable[Any]) -> None:
        now = self._access()
        new = checked_elements(values, self._check)
        store_or_drop(self._maps, self._ctx, [(v, now) for v in new])


class TtlMapState(_TtlHandle, handles.MapState[Any, Any]):
    """Each entry carries its own timestamp and expires on its own."""

    __slots__ = ()

    def _entries(self) -> dict[Any, Stamped] | None:
        ctx = self._ctx
        entries: dict[Any, Stamped] | None = self._maps[ctx.index].get(ctx.key)
        return entries

    def _store(self, entries: dict[Any, Stamped]) -> None:
        store_or_drop(self._maps, self._ctx, entries)

    def _read(self, user_key: Any) -> tuple[bool, Any]:
        """Whether ``user_key`` has a visible entry, and its value: an expired entry is removed
        and seen once only with ``RETURN_EXPIRED_IF_NOT_CLEANED_UP``; a live one is renewed
        on read if asked. ``get`` and ``contains`` are the same read, as in Flink (``contains``
        is ``get != null``)."""
        now = self._access()
        entries = self._entries()
        if not entries or user_key not in entries:
            return False, None
        value, stamp = entries[user_key]
        if self._ttl.expired(stamp, now):
            del entries[user_key]
            self._store(entries)
            return self._return_expired, value
        if self._update_on_read:
            entries[user_key] = (value, now)
            self._store(entries)
        return True, value

    def get(self, user_key: Any) -> Any:
        visible, value = self._read(user_key)
        return value if visible else None

    def put(self, user_key: Any, value: Any) -> None:
        self.put_all({user_key: value})

    def put_all(self, entries: dict[Any, Any]) -> None:
        now = self._access()
        if not entries:
            return
        check_entries(entries, self._check_key, self._check)
        current = self._entries() or {}
        for user_key, value in entries.items():
            current[user_key] = (value, now)
        self._store(current)

    def remove(self, user_key: Any) -> None:
        self._access()
        entries = self._entries()
        if entries and user_key in entries:
            del entries[user_key]
            self._store(entries)

    def contains(self, user_key: Any) -> bool:
        return self._read(user_key)[0]

    def items(self) -> Iterator[tuple[Any, Any]]:
        now = self._access()
        entries = self._entries()
        if not entries:
            return iter(())
        expired = self._ttl.expired
        visible = [
            (k, v) for k, (v, ts) in entries.items() if self._return_expired or not expired(ts, now)
        ]
        live = {
            k: (v, now if self._update_on_read else ts)
            for k, (v, ts) in entries.items()
            if not expired(ts, now)
        }
        if len(live) != len(entries) or self._update_on_read:
            self._store(live)
        return iter(visible)

    def is_empty(self) -> bool:
        return next(self.items(), None) is None


def make_ttl_state(
    descriptor: StateDescriptor,
    ctx: KeyContext,
    maps: KeyGroupMaps,
    clock: Clock,
    cleanup: IncrementalCleanup,
) -> _TtlHandle:
    """The TTL handle for ``descriptor`` (which must have ``ttl`` set)."""
    from statetier.backend.descriptors import StateKind

    assert descriptor.ttl is not None
    args = (ctx, maps, descriptor.ttl, clock, cleanup)
    if descriptor.kind is StateKind.VALUE:
        return TtlValueState(*args)
    if descriptor.kind is StateKind.LIST:
        return TtlListState(*args)
    if descriptor.kind is StateKind.MAP:
        return TtlMapState(*args)
    if isinstance(descriptor, ReducingStateDescriptor):
        return TtlReducingState(*args, descriptor=descriptor)
    if isinstance(descriptor, AggregatingStateDescriptor):
        return TtlAggregatingState(*args, descriptor=descriptor)
    raise TypeError(f"no TTL state for descriptor {type(descriptor).__name__}")
