"""What the driver reads from Spark's plans to route a micro-batch, without running it.

Each look costs what Spark's planner costs: about 10 ms per plan a DataFrame needs, paid on the
driver between two micro-batches while every executor waits. So each helper reads the cheapest
plan that answers its question.
"""

from __future__ import annotations

import re
from typing import Any, cast

from pyspark.sql import DataFrame
from pyspark.sql import functions as sf
from pyspark.sql.types import LongType, StructField, StructType
from statetier.backend.spark.functions import KEY_GROUP_COLUMN
from statetier.backend.spark.session_kind import is_connect, plan_text

__all__ = [
    "estimated_bytes",
    "key_grouped",
    "opaque_empty",
    "partition_count",
    "runs_no_task",
    "with_schema",
]


def partition_count(df: DataFrame) -> int:
    """The partitions ``df``'s tasks would read.

    The micro-batch a streaming ``foreachBatch`` gets is a ``LogicalRDD`` over the RDD Spark has
    already planned for it: its partitions are known, a look costs three py4j calls. Any other
    DataFrame is planned for the answer (``rdd()`` plans it whole, and once more to convert its
    rows: 25-70 ms measured on a Parquet source).
    """
    plan = df._jdf.queryExecution().logical()
    if plan.nodeName() == "LogicalRDD":
        return int(plan.rdd().getNumPartitions())
    return int(df._jdf.rdd().getNumPartitions())


def runs_no_task(out: DataFrame) -> bool:
    """Whether the optimizer dropped the exchange into ranges because it proved the input empty
    (``mapInArrow`` straight over an empty local relation: no task would run). Looks at the
    optimized plan only: nothing is executed."""
    if is_connect(out.sparkSession):
        return _connect_runs_no_task(out)
    plan = out._jdf.queryExecution().optimizedPlan()
    if plan.nodeName() != "MapInArrow" or plan.children().size() != 1:
        return False
    child = plan.children().head()
    return bool(child.nodeName() == "LocalRelation" and child.data().isEmpty())


def opaque_empty(df: DataFrame, partitions: int) -> DataFrame:
    """No rows of ``df``'s schema, in ``partitions`` partitions the optimizer cannot see into."""
    spark = df.sparkSession
    if is_connect(spark):  # no RDDs: a range that reads nothing, which Spark does not fold
        nothing = spark.range(0, partitions, 1, partitions).where(sf.col("id") < 0)
        return nothing.select(
            *(sf.lit(None).cast(f.dataType).alias(f.name) for f in df.schema.fields)
        )
    empty: Any = spark.sparkContext.parallelize([], partitions)
    return spark.createDataFrame(empty, df.schema)


def _connect_runs_no_task(out: DataFrame) -> bool:
    """:func:`runs_no_task` on Spark Connect, which shows plans as text only (one analyze call)."""
    lines = _optimized_plan(plan_text(out)).strip().splitlines()
    return (
        len(lines) == 2
        and lines[0].startswith("MapInArrow")
        and lines[1].lstrip("+- ").startswith("LocalRelation <empty>")
    )


def _optimized_plan(text: str) -> str:
    """The optimized logical plan's part of a plan's text (as ``explain`` prints it)."""
    return text.partition("== Optimized Logical Plan ==")[2].partition("== Physical Plan ==")[0]


def key_grouped(schema: StructType) -> StructType:
    """The schema of a DataFrame of ``schema`` with its key-group column added."""
    return StructType([*schema.fields, StructField(KEY_GROUP_COLUMN, LongType(), True)])


def with_schema(df: DataFrame, schema: StructType) -> DataFrame:
    """``df``, told its schema when it is a Spark Connect DataFrame: the driver knows it, and
    each question Connect asks the server about a plan (the columns ``mapInArrow`` names, a
    ``schema``) is a gRPC round trip, paid per micro-batch."""
    if is_connect(df.sparkSession):
        cast(Any, df)._cached_schema = schema
    return df


_SIZE = re.compile(r"sizeInBytes=([0-9.]+)\s*([KMGTPE]i)?B")
_UNITS = {None: 0, "Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}


def estimated_bytes(df: DataFrame) -> float | None:
    """The optimizer's estimate of a Connect DataFrame's bytes (its root's ``sizeInBytes``; one
    analyze call), None when the plan has none. A micro-batch a ``foreachBatch`` function gets
    keeps the estimate of the plan it was read by (a file source's: the files' bytes)."""
    found = _SIZE.search(_optimized_plan(plan_text(df, "cost")))
    if found is None:
        return None
    return float(found.group(1)) * 1024.0 ** _UNITS[found.group(2)]
