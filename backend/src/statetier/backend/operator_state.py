"""Operator (non-keyed) state: lists per function instance, redistributed on rescale.

Each function instance keeps named lists of elements (offsets of a source, buffered records). On
restore at another parallelism the elements of all instances are redistributed, as in Flink:

- even-split (``get_list_state``): restored at the parallelism it was written with, every
  instance gets its own lists back (a recovery moves nothing, e.g. no source offsets). At
  another parallelism, the concatenation of all instances' lists is cut into contiguous parts
  of near-equal size, the longer parts rotated across the states (:func:`even_split_ranges`).
- union (``get_union_list_state``): every instance gets all elements.

Functions that use it implement :class:`CheckpointedFunction`: ``initialize_state`` runs on
start and on restore (``context.is_restored`` tells which), ``snapshot_state`` before each
snapshot, to move the function's working data into the lists.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from statetier.backend.descriptors import ListStateDescriptor
from statetier.backend.keyed_backend import KeyedStateBackend, StateRegistrationError
from statetier.backend.state import ListState, check_not_none

__all__ = [
    "CheckpointedFunction",
    "FunctionInitializationContext",
    "FunctionSnapshotContext",
    "OperatorStateBackend",
    "Redistribution",
    "even_split_ranges",
]


class Redistribution(enum.Enum):
    EVEN_SPLIT = "split"
    UNION = "union"


class OperatorListState(ListState[Any]):
    """A plain list owned by one function instance."""

    def __init__(self) -> None:
        self.elements: list[Any] = []

    def get(self) -> list[Any]:
        return list(self.elements)

    def add(self, value: Any) -> None:
        check_not_none(value, "a list element")
        self.elements.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        new = list(values)
        for value in new:
            check_not_none(value, "a list element")
        self.elements.extend(new)

    def update(self, values: Iterable[Any]) -> None:
        self.elements = []
        self.add_all(values)

    def clear(self) -> None:
        self.elements = []


@dataclasses.dataclass
class RegisteredListState:
    descriptor: ListStateDescriptor[Any]
    mode: Redistribution
    state: OperatorListState


def even_split_ranges(sizes: Mapping[str, int], parallelism: int) -> dict[str, list[range]]:
    """Per even-split state, the slice of its concatenated elements each instance gets.

    Flink's round-robin repartitioning (``RoundRobinOperatorStateRepartitioner``): each state is
    cut into contiguous parts of ``total // parallelism`` elements, and the ``total %
    parallelism`` parts one element longer go to the first instances of a rotation. The
    rotation of the next state starts where the longer parts ended, so over several states the
    instances' totals stay within one element. States are taken in name order (Flink: its map's
    order), so the assignment is deterministic.
    """
    assignment: dict[str, list[range]] = {}
    start_op = 0
    for name in sorted(sizes):
        base, remainder = divmod(sizes[name], parallelism)
        parts = [range(0)] * parallelism
        offset, next_start = 0, start_op
        for i in range(parallelism):
            op = (start_op + i) % parallelism
            count = base
            if remainder > 0:
                count += 1
                remainder -= 1
            elif remainder == 0:  # the longer parts are out: the next state starts here
                next_start = op
                remainder -= 1
            parts[op] = range(offset, offset + count)
            offset += count
        assignment[name] = parts
        start_op = next_start
    return assignment


class OperatorStateBackend:
    """The operator state of instance ``index`` of ``parallelism``."""

    def __init__(self, index: int = 0, parallelism: int = 1) -> None:
        if not 0 <= index < parallelism:
            raise ValueError(f"instance index must be in 0..{parallelism - 1}, got {index}")
        self.index = index
        self.parallelism = parallelism
        self.states: dict[str, RegisteredListState] = {}
        # name -> (mode, serializer id, [element bytes]), as redistributed for this instance
        self.restored: dict[str, tuple[Redistribution, str, list[bytes]]] = {}

    def get_list_state(self, descriptor: ListStateDescriptor[Any]) -> ListState[Any]:
        """A list redistributed by even split on rescale."""
        return self._register(descriptor, Redistribution.EVEN_SPLIT)

    def get_union_list_state(self, descriptor: ListStateDescriptor[Any]) -> ListState[Any]:
        """A list every instance receives whole on restore."""
        return self._register(descriptor, Redistribution.UNION)

    def _register(
        self, descriptor: ListStateDescriptor[Any], mode: Redistribution
    ) -> ListState[Any]:
        name = descriptor.name
        existing = self.states.get(name)
        if existing is not None:
            if existing.mode is not mode:
                raise StateRegistrationError(
                    f"operator state {name!r} is registered with {existing.mode.value} "
                    f"redistribution; cannot register it again with {mode.value}"
                )
            return existing.state
        state = OperatorListState()
        restored = self.restored.get(name)
        if restored is not None:
            restored_mode, serializer_id, elements = restored
            if restored_mode is not mode:
                raise StateRegistrationError(
                    f"operator state {name!r} was checkpointed with {restored_mode.value} "
                    f"redistribution but is registered with {mode.value}"
                )
            if serializer_id != descriptor.serializer.id:
                raise StateRegistrationError(
                    f"operator state {name!r} was checkpointed with serializer {serializer_id!r} "
                    f"but is registered with {descriptor.serializer.id!r}"
                )
            state.elements = [descriptor.serializer.loads(e) for e in elements]
            del self.restored[name]  # only now: a refused registration keeps the restored state
        self.states[name] = RegisteredListState(descriptor, mode, state)
        return state

    def state_names(self) -> list[str]:
        return sorted({*self.states, *self.restored})


@dataclasses.dataclass(frozen=True)
class FunctionInitializationContext:
    """What ``initialize_state`` receives."""

    is_restored: bool
    operator_state_store: OperatorStateBackend
    keyed_state_store: KeyedStateBackend | None


@dataclasses.dataclass(frozen=True)
class FunctionSnapshotContext:
    """What ``snapshot_state`` receives."""

    checkpoint_id: int


class CheckpointedFunction(Protocol):
    """A function with working data that must be moved into state before each snapshot."""

    def initialize_state(self, context: FunctionInitializationContext) -> None: ...

    def snapshot_state(self, context: FunctionSnapshotContext) -> None: ...
