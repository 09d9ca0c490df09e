"""The user functions a Spark pipeline runs: per key, or per key group (vectorized).

:class:`KeyedProcessFunction` (the same class the local runner drives) sees one record at a time,
with its state handles scoped to the record's key. :class:`KeyGroupFunction` sees every record of
one key group of the epoch at once, as a ``pyarrow.Table``, and scopes its state handles itself
with ``context.set_current_key(key)``; it is the fast form (Arrow compute over the batch, one
state access per distinct key instead of one per record).

Both run inside the executor's state host, not in the Spark task: :func:`current_task` tells the
function which Spark task attempt fed the records (``attempt_number`` is Spark's
``TaskContext.attemptNumber()``).

A :class:`KeyGroupFunction` whose input per key is an aggregate (a count, a sum, a min or max)
can declare a :class:`Combiner`: the pipeline then pre-aggregates every input partition per key
before the key-group exchange and merges the partial aggregates after it (Flink SQL's local-global
aggregation; Spark's own ``groupBy().count()`` does the same partial aggregation before its
shuffle). The exchange, the transfer to the state host and the function's Arrow work then see one
row per key and input partition instead of one per record.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from statetier.backend.functions import KeyedProcessFunction, RuntimeContext

__all__ = [
    "KEY_GROUP_COLUMN",
    "Combiner",
    "KeyGroupFunction",
    "KeyedProcessFunction",
    "SparkTask",
    "current_task",
]

KEY_GROUP_COLUMN = "__statetier_kg"  # the key-group column the pipeline adds
ROWS_COLUMN = "__statetier_rows"  # a combiner's count of the input records behind a row

# How partial aggregates of each combinable Arrow aggregate merge after the exchange.
MERGE = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}


@dataclasses.dataclass(frozen=True)
class Combiner:
    """A per-key pre-aggregation of the input, declared by a :class:`KeyGroupFunction`.

    ``aggregates`` maps each output column to ``(input column, aggregate)`` with aggregate one of
    ``count`` (non-null values), ``sum``, ``min``, ``max``. The function then receives, per key
    group, a table of the key columns and these columns: one row per key, holding the aggregate
    over all of the key's records of the epoch. ``Combiner({"n": ("word", "count")})`` turns a
    word stream into ``(word, n)``. Only declare it when the function needs nothing else from
    the records: the records themselves never reach it.

    By default the aggregation is Spark SQL right after the key-group exchange (grouped by range
    and key, so it needs no second exchange): the JVM aggregates, and the Python side only sees
    the aggregated rows. ``map_side=True`` pre-aggregates in Arrow before the exchange instead
    (a map-side ``mapInArrow``; the host merges the partial rows), which moves less data through
    the shuffle when there are many input partitions but adds a Python pass over every record.
    """

    aggregates: Mapping[str, tuple[str, str]]
    map_side: bool = False

    def __post_init__(self) -> None:
        if not self.aggregates:
            raise ValueError("a Combiner needs at least one aggregate")
        for name, (column, how) in self.aggregates.items():
            if how not in MERGE:
                raise ValueError(
                    f"combiner column {name!r}: {how!r} is not combinable "
                    f"(use one of {', '.join(MERGE)})"
                )
            if not isinstance(column, str) or not column:
                raise ValueError(f"combiner column {name!r} needs an input column name")
        if len(set(self.partial())) != len(self.aggregates):
            raise ValueError("a Combiner lists the same (column, aggregate) twice")

    def partial(self) -> list[tuple[str, str]]:
        """Arrow ``group_by(...).aggregate`` arguments of the map side, in column order."""
        return [(column, how) for column, how in self.aggregates.values()]

    def final(self) -> list[tuple[str, str]]:
        """The arguments that merge the partial columns after the exchange."""
        return [(name, MERGE[how]) for name, (_, how) in self.aggregates.items()]


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


def processes_ranges(function: KeyGroupFunction) -> bool:
    """Whether ``function`` overrides :meth:`KeyGroupFunction.process_range`."""
    return type(function).process_range is not KeyGroupFunction.process_range


class KeyGroupFunction:
    """Processes all records of one key group of an epoch at once.

    Register states in :meth:`open` (``context.get_state(descriptor)``); in
    :meth:`process_key_group`, call ``context.set_current_key(key)`` before using a handle for
    ``key``. Return a ``pyarrow.Table``/``RecordBatch`` in the output schema, an
    iterable of output rows (tuples in schema order), or ``None``.

    Set ``combiner`` (a :class:`Combiner`) to receive per-key aggregates instead of records.
    """

    combiner: ClassVar[Combiner | None] = None

    def open(self, context: RuntimeContext) -> None:
        """Register states. Called once per instance, after a restore."""

    def process_range(self, records: Any, context: RuntimeContext) -> Iterable[Any] | Any | None:
        """Handle all records of the epoch's range at once (one vectorized pass).

        ``records`` is a ``pyarrow.Table`` whose ``KEY_GROUP_COLUMN`` column holds each record's
        key group. Override it to do one Arrow pass over the range instead of one per key group;
        when it is not overridden the host calls :meth:`process_key_group` per key group, in
        key-group order. Returns what :meth:`process_key_group` does.
        """
        raise NotImplementedError

    def process_key_group(
        self, key_group: int, records: Any, context: RuntimeContext
    ) -> Iterable[Any] | Any | None:
        """Handle ``records`` (a ``pyarrow.Table``) of ``key_group``; override it or
        :meth:`process_range`."""
        raise NotImplementedError(
            f"{type(self).__name__} overrides neither process_range nor process_key_group"
        )
