"""The state handles users program against, one interface per state kind.

A handle is obtained from a descriptor (``backend.get_state(ValueStateDescriptor("count"))``) and
always reads and writes the value of the *current key*, which the runtime sets before it hands a
record to user code. Implementations live beside this module: plain heap handles, and TTL
handles that wrap values with timestamps.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

from statetier.backend.descriptors import IN, OUT, V  # a handle's type parameters: its descriptor's
from statetier.backend.state.key_batch import KeyBatch

__all__ = [
    "AggregatingState",
    "KeyBatch",
    "ListState",
    "MapState",
    "ReducingState",
    "State",
    "ValueState",
    "check_not_none",
]

UK = TypeVar("UK")
UV = TypeVar("UV")


class State(abc.ABC):
    """Every state can be cleared for the current key."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Remove the current key's value."""


class ValueState(State, Generic[V]):
    """One value per key. Call ``update`` after mutating a value in place."""

    @abc.abstractmethod
    def value(self) -> V | None:
        """The current key's value, or None."""

    @abc.abstractmethod
    def update(self, value: V | None) -> None:
        """Set the current key's value; ``None`` clears it."""

    @abc.abstractmethod
    def values(self, batch: KeyBatch) -> list[V | None]:
        """Each key's value of ``batch`` (None where it has none), in the batch's order: what
        ``value()`` gives under each key in turn, read in one loop."""

    @abc.abstractmethod
    def update_all(self, batch: KeyBatch, values: Iterable[V | None]) -> None:
        """Set each key's value of ``batch`` to the value at its position in ``values`` (an
        iterable or an Arrow array as long as the batch; ``None`` clears): what ``update(value)``
        does under each key in turn, written in one loop."""


class ListState(State, Generic[V]):
    """A list per key."""

    @abc.abstractmethod
    def get(self) -> list[V]:
        """A copy of the current key's elements (empty when none)."""

    @abc.abstractmethod
    def add(self, value: V) -> None:
        """Append one element; None is refused."""

    @abc.abstractmethod
    def add_all(self, values: Iterable[V]) -> None:
        """Append elements."""

    @abc.abstractmethod
    def update(self, values: Iterable[V]) -> None:
        """Replace all elements; an empty iterable clears."""


class ReducingState(State, Generic[V]):
    """A value per key, combined with each added value by the reduce function."""

    @abc.abstractmethod
    def get(self) -> V | None:
        """The reduced value, or None."""

    @abc.abstractmethod
    def add(self, value: V) -> None:
        """Fold ``value`` into the current key's value."""

    @abc.abstractmethod
    def add_each(self, batch: KeyBatch, values: Iterable[V]) -> list[V]:
        """Fold each value of ``values`` (an iterable or an Arrow array as long as the batch)
        into the value of the key at its position in ``batch``: what ``add(value)`` does under
        each key in turn, in one loop. Returns each key's reduced value right after its add, in
        the batch's order (a repeated key's later positions see its earlier adds), which is
        what an update-mode output emits: reading them back with a second loop would visit
        every key's entry twice."""


class AggregatingState(State, Generic[IN, OUT]):
    """An accumulator per key; inputs go in, ``get_result`` comes out."""

    @abc.abstractmethod
    def get(self) -> OUT | None:
        """The aggregate of the current key, or None when nothing was added."""

    @abc.abstractmethod
    def add(self, value: IN) -> None:
        """Add one input to the current key's accumulator."""


class MapState(State, Generic[UK, UV]):
    """A map per key."""

    @abc.abstractmethod
    def get(self, user_key: UK) -> UV | None:
        """The value under ``user_key``, or None."""

    @abc.abstractmethod
    def put(self, user_key: UK, value: UV) -> None:
        """Set one entry."""

    @abc.abstractmethod
    def put_all(self, entries: dict[UK, UV]) -> None:
        """Set several entries."""

    @abc.abstractmethod
    def remove(self, user_key: UK) -> None:
        """Remove one entry (no error when absent)."""

    @abc.abstractmethod
    def contains(self, user_key: UK) -> bool:
        """Whether ``user_key`` has a (visible) value."""

    @abc.abstractmethod
    def items(self) -> Iterator[tuple[UK, UV]]:
        """Entries, iterated over a copy: the map may change meanwhile."""

    def keys(self) -> Iterator[UK]:
        """User keys."""
        return (k for k, _ in self.items())

    def values(self) -> Iterator[UV]:
        """Values."""
        return (v for _, v in self.items())

    @abc.abstractmethod
    def is_empty(self) -> bool:
        """Whether the current key has no (visible) entries."""


def check_not_none(value: Any, what: str) -> None:
    """Refuse a None list element or reduced value, as Flink does: a stored None would read back
    as "no value". Shared by every list and reducing state, heap, TTL and operator state alike."""
    if value is None:
        raise ValueError(f"{what} cannot be None")
