"""User functions: keyed processors and the runtime context they get their state from.

A :class:`KeyedProcessFunction` declares its states in ``open`` and then sees the records of one
key at a time in ``process``, with every state handle already scoped to that key. The same
function runs under the local runner (tests, the demo) and inside Spark tasks.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from statetier.backend.descriptors import ListStateDescriptor, StateDescriptor
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.operator_state import OperatorStateBackend
from statetier.backend.state import ListState, State

__all__ = ["KeyedProcessFunction", "RuntimeContext"]

K = TypeVar("K")
IN = TypeVar("IN")
OUT = TypeVar("OUT")


class RuntimeContext:
    """What a function may use: its keyed and operator state, and where it runs."""

    def __init__(
        self, keyed: KeyedStateBackend, operator: OperatorStateBackend, *, is_restored: bool = False
    ) -> None:
        self.keyed_state = keyed
        self.operator_state = operator
        self.is_restored = is_restored  # True when the state came from a checkpoint

    def get_state(self, descriptor: StateDescriptor) -> Any:
        """A keyed state handle (see ``KeyedStateBackend.get_state``)."""
        handle: State = self.keyed_state.get_state(descriptor)
        return handle

    def get_list_state(self, descriptor: ListStateDescriptor[Any]) -> ListState[Any]:
        """An even-split operator list state."""
        return self.operator_state.get_list_state(descriptor)

    def get_union_list_state(self, descriptor: ListStateDescriptor[Any]) -> ListState[Any]:
        """A union operator list state."""
        return self.operator_state.get_union_list_state(descriptor)

    @property
    def index(self) -> int:
        return self.operator_state.index

    @property
    def parallelism(self) -> int:
        return self.operator_state.parallelism

    @property
    def current_key(self) -> Any:
        return self.keyed_state.current_key


class KeyedProcessFunction(abc.ABC, Generic[K, IN, OUT]):
    """Processes records per key with keyed state.

    Subclasses register states in :meth:`open` and keep the handles on ``self``; the runtime
    sets the current key before calling :meth:`process`.
    """

    def open(self, context: RuntimeContext) -> None:
        """Register states. Called once per instance, after a restore."""

    @abc.abstractmethod
    def process(self, key: K, value: IN, context: RuntimeContext) -> Iterable[OUT]:
        """Handle one record of ``key``; return (or yield) output records."""
