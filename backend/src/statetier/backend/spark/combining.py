"""A function's :class:`~statetier.backend.spark.functions.Combiner` as Spark runs it.

A combiner pre-aggregates the records of one key before they reach the state hosts, so a host
gets one row per key (and how many records it stands for) instead of every record. It runs in
one of two places:

- **map side** (``Combiner.map_side``): in Arrow, in a ``mapInArrow`` over each input partition
  before the ranges are formed (local-global aggregation), or inside the one task of a
  ``direct`` micro-batch;
- **after the exchange**: as a Spark SQL aggregation in the JVM, grouped by the range column so
  that it uses the exchange's range partitioning as it is (no second exchange).

Both make the same rows: the key columns, the key group, the combiner's columns, the row count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as sf
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    DataType,
    DoubleType,
    FloatType,
    IntegralType,
    LongType,
    StructField,
    StructType,
)
from statetier.backend.spark.functions import KEY_GROUP_COLUMN as KG_COLUMN
from statetier.backend.spark.functions import ROWS_COLUMN, Combiner
from statetier.backend.spark.task import Combining, combine_function

__all__ = ["aggregate_ranges", "combine_map_side", "combined_schema", "combining"]

RANGE_COLUMN = "__statetier_range"  # the range (partition) of a row, grouped by after the exchange


def combine_map_side(keyed: DataFrame, combiner: Combiner, key_columns: Sequence[str]) -> DataFrame:
    """The map side of the combiner: one row per key and chunk of each input partition."""
    schema = combined_schema(keyed, combiner, key_columns)
    return keyed.mapInArrow(combine_function(combining(schema, combiner)), schema)


def aggregate_ranges(
    keyed: DataFrame,
    range_of_row: Any,
    combiner: Combiner,
    key_columns: Sequence[str],
    parallelism: int,
) -> DataFrame:
    """The combiner as a Spark SQL aggregation right after the exchange into ``parallelism``
    ranges by ``range_of_row`` (a column expression), in the JVM.

    Grouping by the range column (plus the keys) lets the aggregate use the range
    partitioning as it is: no second exchange; the state hosts get one row per key.
    """
    _combined_fields(keyed, combiner)  # refuses what Arrow would not aggregate alike
    aggregates = [
        getattr(sf, how)(sf.col(f"`{column}`")).alias(name)
        for name, (column, how) in combiner.aggregates.items()
    ]
    aggregates.append(sf.count(sf.lit(1)).alias(ROWS_COLUMN))
    ranged = keyed.withColumn(RANGE_COLUMN, range_of_row).repartitionById(
        parallelism, sf.col(RANGE_COLUMN)
    )
    groups = [sf.col(f"`{c}`") for c in (RANGE_COLUMN, *key_columns, KG_COLUMN)]
    return ranged.groupBy(*groups).agg(*aggregates).drop(RANGE_COLUMN)


def combined_schema(keyed: DataFrame, combiner: Combiner, key_columns: Sequence[str]) -> StructType:
    """The rows a combiner makes: key columns, key group, its columns, the input rows."""
    fields = {f.name: f for f in keyed.schema.fields}
    out = [fields[name] for name in (*key_columns, KG_COLUMN)]
    out += _combined_fields(keyed, combiner)
    out.append(StructField(ROWS_COLUMN, LongType()))
    return StructType(out)


def combining(schema: StructType, combiner: Combiner) -> Combining:
    """The combiner as a task applies it in Arrow (map side, or in a task without the
    exchange), making rows of ``schema``: its groups are every column before the combiner's."""
    groups = schema.names[: -len(combiner.aggregates) - 1]  # the last: the input rows
    schema_bytes = to_arrow_schema(schema).serialize().to_pybytes()
    return Combining(groups, combiner.partial(), schema_bytes)


def _combined_fields(df: DataFrame, combiner: Combiner) -> list[StructField]:
    """The combiner's output columns as Spark fields; names a missing or unsummable input."""
    fields = {f.name: f for f in df.schema.fields}
    out = []
    for name, (column, how) in combiner.aggregates.items():
        if column not in fields:
            raise ValueError(f"combiner column {name!r}: no input column {column!r}")
        out.append(StructField(name, _aggregate_type(fields[column].dataType, how)))
    return out


def _aggregate_type(input_type: DataType, how: str) -> DataType:
    """The Spark type of a combiner column (what Arrow's aggregate produces, as Spark sees it)."""
    if how == "count":
        return LongType()
    if how == "sum":
        if isinstance(input_type, IntegralType):
            return LongType()
        if isinstance(input_type, (FloatType, DoubleType)):
            return DoubleType()
        raise TypeError(f"a combiner cannot sum {input_type.simpleString()} values")
    return input_type
