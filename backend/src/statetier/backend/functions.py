"""User functions: keyed processors and the runtime context they get their state from.

A :class:`KeyedProcessFunction` declares its states in ``open`` and then sees the records of one
key at a time in ``process``, with every state handle already scoped to that key. It may set
timers (``context.timer_service``) and gets ``on_timer`` calls for them, with the timer's key
current; and it may hear when an epoch is committed or aborted (:class:`CheckpointListener`,
Flink's interface of that name), e.g. to commit a two-phase-commit sink. The same function runs
under the local runner (tests, the demo) and inside Spark tasks.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from statetier.backend.descriptors import ListStateDescriptor, StateDescriptor
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.operator_state import OperatorStateBackend
from statetier.backend.state import KeyBatch, ListState, State
from statetier.backend.timers import TimeDomain, TimerService

__all__ = ["CheckpointListener", "KeyedProcessFunction", "RuntimeContext", "TimeDomain"]

K = TypeVar("K")
IN = TypeVar("IN")
OUT = TypeVar("OUT")


class RuntimeContext:
    """What a function may use: its keyed and operator state, and where it runs."""

    def __init__(
        self,
        keyed: KeyedStateBackend,
        operator_state: OperatorStateBackend,
        *,
        is_restored: bool = False,
        timer_service: TimerService | None = None,
    ) -> None:
        self.keyed_state = keyed
        self.operator_state = operator_state
        self.is_restored = is_restored  # True when the state came from a checkpoint
        self.timer_service = timer_service or TimerService(keyed, keyed.clock.now_ms())
        # While on_timer runs: the domain of the firing timer (Flink's OnTimerContext); else None.
        self.time_domain: TimeDomain | None = None

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
        """This instance's index among the function's parallel instances, from 0."""
        return self.operator_state.index

    @property
    def parallelism(self) -> int:
        """How many parallel instances the function runs as."""
        return self.operator_state.parallelism

    @property
    def current_key(self) -> Any:
        """The key the state handles are scoped to (see :meth:`set_current_key`)."""
        return self.keyed_state.current_key

    def set_current_key(self, key: Any) -> None:
        """Scope every state handle (and timer registration) to ``key``.

        The runtime does this before each ``process`` and ``on_timer`` call of a
        :class:`KeyedProcessFunction`; a function that sees many keys at once (Spark's
        ``KeyGroupFunction``) calls it before it touches ``key``'s state.
        """
        self.keyed_state.set_current_key(key)

    def key_batch(self, keys: Iterable[Any], key_groups: Iterable[int] | None = None) -> KeyBatch:
        """Many keys at once, for the handles' bulk reads and writes (``ValueState.values``,
        ``ValueState.update_all``): what a function that sees a whole range of records uses
        instead of ``set_current_key`` per key. ``key_groups`` (optional) is each key's key
        group, e.g. the pipeline's key-group column carried through an Arrow ``group_by``
        (see ``KeyedStateBackend.key_batch``)."""
        return self.keyed_state.key_batch(keys, key_groups)


@runtime_checkable
class CheckpointListener(Protocol):
    """Told when an epoch's checkpoint is committed or given up (Flink's ``CheckpointListener``).

    ``notify_checkpoint_complete(epoch)`` runs after the epoch's manifest is committed: the
    epoch's state and output are durable, so side effects prepared for it may be made visible
    (commit a two-phase-commit transaction). ``notify_checkpoint_aborted(epoch)`` runs when the
    epoch will never commit. Both run on the thread that processes records, between records.
    As in Flink a notification may be missed (a crash right after the commit), so a sink must
    also commit what a restored checkpoint says was pending.
    """

    def notify_checkpoint_complete(self, epoch: int) -> None: ...

    def notify_checkpoint_aborted(self, epoch: int) -> None: ...


class KeyedProcessFunction(abc.ABC, Generic[K, IN, OUT]):
    """Processes records per key with keyed state.

    Subclasses register states in :meth:`open` and keep the handles on ``self``; the runtime
    sets the current key before calling :meth:`process` and :meth:`on_timer`.
    """

    def open(self, context: RuntimeContext) -> None:
        """Register states. Called once per instance, after a restore."""

    @abc.abstractmethod
    def process(self, key: K, value: IN, context: RuntimeContext) -> Iterable[OUT]:
        """Handle one record of ``key``; return (or yield) output records."""

    def on_timer(self, timestamp: int, key: K, context: RuntimeContext) -> Iterable[OUT] | None:
        """A timer of ``key`` at ``timestamp`` fired (``context.time_domain`` says which kind).

        The key's state is in scope; return (or yield) output records, register new timers as
        you like. The default does nothing, as Flink's.
        """
        return None

    def notify_checkpoint_complete(self, epoch: int) -> None:
        """Epoch ``epoch`` is committed (see :class:`CheckpointListener`)."""

    def notify_checkpoint_aborted(self, epoch: int) -> None:
        """Epoch ``epoch`` will never be committed (see :class:`CheckpointListener`)."""
