"""How a task's records reach the keyed function on its state host, and its outputs come back.

The records of one key-group range arrive as Arrow batches with their key-group column. A
per-record function (a :class:`~statetier.backend.functions.KeyedProcessFunction`) gets them as
``(key, value)`` pairs; a :class:`~statetier.backend.spark.functions.KeyGroupFunction` gets Arrow
tables, the whole range or one key group each, after the partial rows of a map-side combiner are
merged. Whatever a function returns (rows, dicts, a table or a batch) comes back as batches of
the output schema.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from statetier.backend.functions import RuntimeContext
from statetier.backend.integer_columns import int64_array, int64_values
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.runtime import FunctionInstance
from statetier.backend.spark.checks import check_output_rows
from statetier.backend.spark.functions import (
    KEY_GROUP_COLUMN,
    ROWS_COLUMN,
    KeyGroupFunction,
    processes_ranges,
)

__all__ = ["as_batches", "count_records", "process"]


def process(
    instance: FunctionInstance,
    batches: list[pa.RecordBatch],
    key_columns: Sequence[str],
    index: int,
    schema: pa.Schema,
) -> list[pa.RecordBatch]:
    """The outputs of ``instance``'s function for the records of range ``index``."""
    check_key_groups(batches, instance.keyed.key_groups, index)
    function = instance.function
    if isinstance(function, KeyGroupFunction):
        return process_key_groups(function, instance.context, batches, schema)
    rows: list[Any] = []
    for batch in batches:
        rows.extend(instance.process(records(batch, key_columns)))
    return [to_batch(rows, schema)] if rows else []


def check_key_groups(batches: list[pa.RecordBatch], key_range: KeyGroupRange, index: int) -> None:
    """Refuse records of key groups outside the range: its state is not here."""
    for batch in batches:
        kg = int64_values(batch.column(KEY_GROUP_COLUMN))
        if len(kg) and (kg.min() < key_range.start or kg.max() > key_range.end):
            raise RuntimeError(
                f"records of key groups outside {key_range} reached range {index}: "
                "the partition-to-range mapping is broken (adaptive coalescing?)"
            )


def records(batch: pa.RecordBatch, key_columns: Sequence[str]) -> Iterator[tuple[Any, Any]]:
    """The ``(key, value)`` pairs of ``batch``: a key or value of several columns is a tuple; a
    record with no value column has the value None."""
    names = [n for n in batch.schema.names if n != KEY_GROUP_COLUMN]
    value_columns = [n for n in names if n not in key_columns]
    values = _values(batch, value_columns) if value_columns else [None] * batch.num_rows
    return zip(_values(batch, key_columns), values, strict=True)


def _values(batch: pa.RecordBatch, columns: Sequence[str]) -> Iterable[Any]:
    """One column's values, or tuples of several columns' values."""
    if len(columns) == 1:
        values: list[Any] = batch.column(columns[0]).to_pylist()
        return values
    return zip(*(batch.column(c).to_pylist() for c in columns), strict=True)


def process_key_groups(
    function: KeyGroupFunction,
    context: RuntimeContext,
    batches: list[pa.RecordBatch],
    schema: pa.Schema,
) -> list[pa.RecordBatch]:
    """The outputs of a function over Arrow tables: the whole range, or key group by key group."""
    batches = [b for b in batches if b.num_rows]
    if not batches:
        return []
    table = pa.Table.from_batches(batches)
    if function.combiner is not None and function.combiner.map_side:
        # partial rows of each map task; the Spark SQL combiner already merged its own
        final = [*function.combiner.final(), (ROWS_COLUMN, "sum")]
        table = merge_partials(table, final)
    if ROWS_COLUMN in table.column_names:
        table = table.drop_columns([ROWS_COLUMN])
    if processes_ranges(function):
        return as_batches(function.process_range(table, context), schema)
    kg = int64_values(table.column(KEY_GROUP_COLUMN))
    order = np.argsort(kg, kind="stable")
    sorted_kg = kg[order]
    table = table.drop_columns([KEY_GROUP_COLUMN]).take(int64_array(order))
    starts = [0, *(np.flatnonzero(np.diff(sorted_kg)) + 1).tolist()]
    ends = [*starts[1:], len(sorted_kg)]
    out: list[pa.RecordBatch] = []
    for start, end in zip(starts, ends, strict=True):
        result = function.process_key_group(
            int(sorted_kg[start]), table.slice(start, end - start), context
        )
        out.extend(as_batches(result, schema))
    return out


def count_records(batches: list[pa.RecordBatch]) -> int:
    """Input records behind ``batches``: their rows, or what a combiner says they stand for."""
    return sum(
        int(pc.sum(b.column(ROWS_COLUMN)).as_py() or 0)
        if ROWS_COLUMN in b.schema.names
        else b.num_rows
        for b in batches
    )


def merge_partials(table: pa.Table, final: list[tuple[str, str]]) -> pa.Table:
    """One row per key: the combiner's partial aggregates (one per map task) merged."""
    groups = [n for n in table.column_names if n not in {name for name, _ in final}]
    merged = table.group_by(groups, use_threads=False).aggregate(final)
    names = [*groups, *(name for name, _ in final)]
    columns = [merged[n] for n in groups] + [merged[f"{name}_{how}"] for name, how in final]
    return pa.Table.from_arrays(columns, names=names)


def as_batches(result: Any, schema: pa.Schema) -> list[pa.RecordBatch]:
    """A function's return value (table, batch, rows or None) as batches of ``schema``."""
    if result is None:
        return []
    if isinstance(result, pa.Table):
        batches: list[pa.RecordBatch] = result.select(schema.names).cast(schema).to_batches()
        return batches
    if isinstance(result, pa.RecordBatch):
        return [result.select(schema.names).cast(schema)]
    rows = list(result)
    return [to_batch(rows, schema)] if rows else []


def to_batch(rows: list[Any], schema: pa.Schema) -> pa.RecordBatch:
    """Output rows (tuples in schema order, or dicts) as one batch of ``schema``."""
    if isinstance(rows[0], dict):
        return pa.RecordBatch.from_pylist(rows, schema=schema)
    check_output_rows(rows, schema.names)  # a row of the wrong width, said in the user's terms
    columns = list(zip(*rows, strict=True))
    arrays = [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
