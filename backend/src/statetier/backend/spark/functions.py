"""The user functions a Spark pipeline runs: per key, or per key group (vectorized).

:class:`KeyedProcessFunction` (the same class the local runner drives) sees one record at a time,
with its state handles scoped to the record's key. :class:`KeyGroupFunction` sees every record of
one key group of the epoch at once, as a ``pyarrow.Table``, and scopes its state handles itself
with ``context.set_current_key(key)``; it is the fast form (Arrow compute over the batch, one
state access per distinct key instead of one per record).

Both run inside the executor's state host, not in the Spark task: :func:`current_task` tells the
function which Spark task attempt fed the records (``attempt_number`` is Spark's
``TaskContext.attemptNumber()``).
"""

from __future__ import annotations

import abc
import dataclasses
import threading
from collections.abc import Iterable
from typing import Any

from statetier.backend.functions import KeyedProcessFunction, RuntimeContext

__all__ = ["KeyGroupFunction", "KeyedProcessFunction", "SparkTask", "current_task"]


@dataclasses.dataclass(frozen=True)
class SparkTask:
    """The Spark task attempt whose records the function is processing."""

    epoch: int
    partition_id: int
    attempt_number: int
    task_attempt_id: int


_task = threading.local()


def current_task() -> SparkTask:
    """The task being served on this thread of the state host."""
    task: SparkTask | None = getattr(_task, "value", None)
    if task is None:
        raise RuntimeError("current_task() is only available while a state host serves a task")
    return task


def set_current_task(task: SparkTask | None) -> None:
    _task.value = task


class KeyGroupFunction(abc.ABC):
    """Processes all records of one key group of an epoch at once.

    Register states in :meth:`open` (``context.get_state(descriptor)``); in
    :meth:`process_key_group`, call ``context.keyed_state.set_current_key(key)`` before using a
    handle for ``key``. Return a ``pyarrow.Table``/``RecordBatch`` in the output schema, an
    iterable of output rows (tuples in schema order), or ``None``.
    """

    def open(self, context: RuntimeContext) -> None:  # noqa: B027 (optional hook)
        """Register states. Called once per instance, after a restore."""

    @abc.abstractmethod
    def process_key_group(
        self, key_group: int, records: Any, context: RuntimeContext
    ) -> Iterable[Any] | Any | None:
        """Handle ``records`` (a ``pyarrow.Table``) of ``key_group``."""
