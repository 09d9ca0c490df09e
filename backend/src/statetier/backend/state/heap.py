"""Heap handles: state values live as Python objects in one dict per key group.

These are the handles for states without TTL; they are the hot path of every pipeline, so each
method does the least it can: find the key group's dict through the shared key context and read
or write one entry. A key group's dict may be replaced by a spilled map with the same mapping
interface, which is why handles go through ``maps[index]`` on every access instead of caching it.
A write looks at the type of what it stores and checks anything not plain (state.writable), so
a value the checkpoint could not write fails at the write, naming the state and the key.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any

from statetier.backend.descriptors import AggregatingStateDescriptor, ReducingStateDescriptor
from statetier.backend.state import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
    check_not_none,
)
from statetier.backend.state.context import KeyContext
from statetier.backend.state.key_batch import KeyBatch
from statetier.backend.state.writable import PLAIN, WriteCheck, accept, check_each

KeyGroupMaps = list[MutableMapping[Any, Any]]


def checked_elements(values: Iterable[Any], check: WriteCheck = accept) -> list[Any]:
    """``values`` as a list, none of them None (a list state holds no None elements), each one
    the state can store (``check``)."""
    new = list(values)
    for value in new:
        check_not_none(value, "a list element")
        if type(value) not in PLAIN:
            check(value)
    return new


def append_elements(maps: KeyGroupMaps, ctx: KeyContext, new: list[Any]) -> None:
    """Append ``new`` to the current key's list (a new list object: a spilled map must see the
    write)."""
    if new:
        kg_map = maps[ctx.index]
        kg_map[ctx.key] = kg_map.get(ctx.key, []) + new


def store_or_drop(maps: KeyGroupMaps, ctx: KeyContext, new: list[Any] | dict[Any, Any]) -> None:
    """Make ``new`` (a list or a map) the current key's value; an empty one drops the key, as
    a list or map state holds no empty value."""
    if new:
        maps[ctx.index][ctx.key] = new
    else:
        maps[ctx.index].pop(ctx.key, None)


def check_entries(entries: dict[Any, Any], check_key: WriteCheck, check: WriteCheck) -> None:
    """Check the user keys and values a map state is given to store."""
    for user_key, value in entries.items():
        if type(user_key) not in PLAIN:
            check_key(user_key)
        if type(value) not in PLAIN:
            check(value)


class KeyGroupHandle:
    """What every handle shares: the key context and the key groups' maps, in which it reads and
    writes the current key's entry, ``clear``, which drops that entry, and the checks of what it
    writes (values, and a map's user keys), which the backend sets (``check_writes``)."""

    __slots__ = ("_check", "_check_key", "_check_record", "_ctx", "_maps")

    def __init__(self, ctx: KeyContext, maps: KeyGroupMaps) -> None:
        self._ctx = ctx
        self._maps = maps
        self._check: WriteCheck = accept
        self._check_key: WriteCheck = accept
        self._check_record: Callable[[Any], object] = accept

    def check_writes(
        self,
        values: WriteCheck,
        user_keys: WriteCheck = accept,
        records: Callable[[Any], object] | None = None,
    ) -> None:
        """Check each written value with ``values`` and each map key with ``user_keys``; a
        list or dict that ``update``, ``add`` or ``put`` writes first with ``records``
        (``writable.value_checks``), which hands what it refuses to ``values`` to be named."""
        self._check = values
        self._check_key = user_keys
        self._check_record = values if records is None else records

    def clear(self) -> None:
        ctx = self._ctx
        self._maps[ctx.index].pop(ctx.key, None)


class HeapValueState(KeyGroupHandle, ValueState[Any]):
    __slots__ = ()

    def value(self) -> Any:
        ctx = self._ctx
        return self._maps[ctx.index].get(ctx.key)

    def update(self, value: Any) -> None:
        kind = type(value)
        if kind not in PLAIN:  # None is not plain either: a plain value takes one test
            # a record, rewritten per record: looked at in C. HeapListState.add and
            # HeapMapState.put repeat these lines: a helper would add the Python call they
            # save (a map's put of a 3-field dict: 6,283 instructions, 5,588 inline)
            if kind is list or kind is dict:
                try:
                    check = self._check_record
                    check(value)
                except Exception:
                    self._check(value)  # names what it refused
            elif value is None:
                self.clear()
                return
            else:
                self._check(value)
        ctx = self._ctx
        self._maps[ctx.index][ctx.key] = value

    def values(self, batch: KeyBatch) -> list[Any]:
        batch.check_owner(self._ctx)
        maps, keys = self._maps, batch.keys
        if batch.runs is not None:  # a key group's keys in one C-level pass over its map
            out: list[Any] = []
            for slot, start, stop in batch.runs:
                out += map(maps[slot].get, keys[start:stop])
            return out
        return [maps[slot].get(key) for key, slot in zip(keys, batch.slots, strict=True)]

    def update_all(self, batch: KeyBatch, values: Iterable[Any]) -> None:
        new = batch.checked_values(self._ctx, values)
        maps, keys = self._maps, batch.keys
        check_each(self._check, new, keys)
        batch.forget_written(maps)
        # no key to clear (`is`, not `in`: a value's == may be elementwise): one update each
        if batch.runs is not None and not any(map(operator.is_, new, itertools.repeat(None))):
            for slot, start, stop in batch.runs:
                maps[slot].update(zip(keys[start:stop], new[start:stop], strict=True))
            batch.record_written(maps, new)  # a copy of the caller's values (checked_values)
            return
        for key, slot, value in zip(keys, batch.slots, new, strict=True):
            if value is None:
                maps[slot].pop(key, None)
            else:
                maps[slot][key] = value


class HeapListState(KeyGroupHandle, ListState[Any]):
    __slots__ = ()

    def get(self) -> list[Any]:
        ctx = self._ctx
        return list(self._maps[ctx.index].get(ctx.key, ()))

    def add(self, value: Any) -> None:
        check_not_none(value, "a list element")
        if type(value) not in PLAIN:
            kind = type(value)
            if kind is list or kind is dict:  # a row appended per record: in C, as update's
                try:
                    check = self._check_record
                    check(value)
                except Exception:
                    self._check(value)  # names what it refused
            else:
                self._check(value)
        ctx = self._ctx
        kg_map = self._maps[ctx.index]
        elements = kg_map.get(ctx.key)
        if elements is None:
            kg_map[ctx.key] = [value]
        else:
            elements.append(value)
            kg_map[ctx.key] = elements  # a spilled map must see the write

    def add_all(self, values: Iterable[Any]) -> None:
        append_elements(self._maps, self._ctx, checked_elements(values, self._check))

    def update(self, values: Iterable[Any]) -> None:
        store_or_drop(self._maps, self._ctx, checked_elements(values, self._check))


class HeapReducingState(KeyGroupHandle, ReducingState[Any]):
    __slots__ = ("_reduce",)

    def __init__(
        self, ctx: KeyContext, maps: KeyGroupMaps, descriptor: ReducingStateDescriptor[Any]
    ) -> None:
        super().__init__(ctx, maps)
        self._reduce = descriptor.reduce_function

    def get(self) -> Any:
        ctx = self._ctx
        return self._maps[ctx.index].get(ctx.key)

    def add(self, value: Any) -> None:
        check_not_none(value, "a reduced value")
        if type(value) not in PLAIN:
            self._check(value)
        ctx = self._ctx
        kg_map = self._maps[ctx.index]
        current = kg_map.get(ctx.key)
        kg_map[ctx.key] = value if current is None else self._reduce(current, value)

    def add_each(self, batch: KeyBatch, values: Iterable[Any]) -> list[Any]:
        # Read, reduce and write each entry in one step: the write finds the entry the read
        # just brought into cache. Over one range's 0.9M keys, a batch of 180k took 0.10-0.11 s
        # against 0.145 s for a values() pass, a reduce pass and an update_all() pass (each
        # read and each write a cache miss per key).
        new = batch.checked_values(self._ctx, values)
        if any(map(operator.is_, new, itertools.repeat(None))):
            check_not_none(None, "a reduced value")
        out: list[Any] = []
        maps, keys = self._maps, batch.keys
        check_each(self._check, new, keys)
        batch.forget_written(maps)
        if batch.runs is None:
            for key, slot, value in zip(keys, batch.slots, new, strict=True):
                _fold_into(maps[slot], [key], [value], self._reduce, out)
            return out
        for slot, start, stop in batch.runs:
            _fold_into(maps[slot], keys[start:stop], new[start:stop], self._reduce, out)
        # what the keys now hold, for the snapshot (a copy: the caller may change the list)
        batch.record_written(maps, out.copy())
        return out


def _fold_into(
    kg_map: MutableMapping[Any, Any],
    keys: list[Any],
    values: list[Any],
    reduce: Callable[[Any, Any], Any],
    out: list[Any],
) -> None:
    """Reduce each value into its key's entry of ``kg_map`` (the value itself where the key has
    none), appending each reduced value to ``out``."""
    get, append = kg_map.get, out.append
    for key, value in zip(keys, values, strict=True):
        current = get(key)
        reduced = value if current is None else reduce(current, value)
        kg_map[key] = reduced
        append(reduced)


class HeapAggregatingState(KeyGroupHandle, AggregatingState[Any, Any]):
    __slots__ = ("_fn",)

    def __init__(
        self,
        ctx: KeyContext,
        maps: KeyGroupMaps,
        descriptor: AggregatingStateDescriptor[Any, Any, Any],
    ) -> None:
        super().__init__(ctx, maps)
        self._fn = descriptor.aggregate_function

    def get(self) -> Any:
        ctx = self._ctx
        accumulator = self._maps[ctx.index].get(ctx.key)
        return None if accumulator is None else self._fn.get_result(accumulator)

    def add(self, value: Any) -> None:
        ctx = self._ctx
        kg_map = self._maps[ctx.index]
        accumulator = kg_map.get(ctx.key)
        if accumulator is None:
            accumulator = self._fn.create_accumulator()
        accumulator = self._fn.add(value, accumulator)
        if type(accumulator) not in PLAIN:
            self._check(accumulator)
        kg_map[ctx.key] = accumulator


class HeapMapState(KeyGroupHandle, MapState[Any, Any]):
    """Stores a dict per key; a key whose map becomes empty is removed."""

    __slots__ = ()

    def _entries(self) -> dict[Any, Any]:
        ctx = self._ctx
        entries: dict[Any, Any] = self._maps[ctx.index].get(ctx.key) or {}
        return entries

    def get(self, user_key: Any) -> Any:
        return self._entries().get(user_key)

    def put(self, user_key: Any, value: Any) -> None:
        if type(user_key) not in PLAIN:
            self._check_key(user_key)
        if type(value) not in PLAIN:
            kind = type(value)
            if kind is list or kind is dict:  # a row kept per user key: in C, as update's
                try:
                    check = self._check_record
                    check(value)
                except Exception:
                    self._check(value)  # names what it refused
            else:
                self._check(value)
        ctx = self._ctx
        kg_map = self._maps[ctx.index]
        entries = kg_map.get(ctx.key)
        if entries is None:
            kg_map[ctx.key] = {user_key: value}
        else:
            entries[user_key] = value
            kg_map[ctx.key] = entries  # a spilled map must see the write

    def put_all(self, entries: dict[Any, Any]) -> None:
        if not entries:
            return
        check_entries(entries, self._check_key, self._check)
        ctx = self._ctx
        kg_map = self._maps[ctx.index]
        current = kg_map.get(ctx.key) or {}
        current.update(entries)
        kg_map[ctx.key] = current

    def remove(self, user_key: Any) -> None:
        ctx = self._ctx
        entries = self._maps[ctx.index].get(ctx.key)
        if entries is None or user_key not in entries:
            return
        del entries[user_key]
        store_or_drop(self._maps, ctx, entries)

    def contains(self, user_key: Any) -> bool:
        return user_key in self._entries()

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(list(self._entries().items()))

    def is_empty(self) -> bool:
        return not self._entries()
