"""Spark's byte cap on the Arrow batches that feed a Python task, lifted for statetier's jobs.

Spark 4 cuts the rows it sends to ``mapInArrow`` into batches of at most
``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (10,000) and, unless
``spark.sql.execution.arrow.maxBytesPerBatch`` is ``2147483647``, of at most that many bytes
(64 MiB). Keeping to the bytes means sizing every row, column by column, as it is written: on
a word count over two executors that check was a quarter of the executors' CPU, and a third of
it was statetier's key-group column. A statetier job therefore runs with the byte cap lifted
(batches bounded by rows only, as in Spark before the byte cap existed), set as a job property
of the driver thread that runs the epoch's job, so that other jobs of the session keep Spark's
default.

A session that sets ``spark.sql.execution.arrow.maxBytesPerBatch`` itself keeps its value:
Spark copies the session's explicit settings over the job's properties when it runs a query.
Set it when a record can be large (a 1 MB record times 10,000 rows is a 10 GB batch), or lower
``maxRecordsPerBatch``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pyspark import SparkContext
from pyspark.sql import SparkSession
from statetier.backend.spark.session_kind import is_connect, on_connect_driver

__all__ = ["MAX_BYTES_PER_BATCH", "UNCAPPED", "batches_capped_by_rows_only", "capped_by_rows_only"]

MAX_BYTES_PER_BATCH = "spark.sql.execution.arrow.maxBytesPerBatch"
UNCAPPED = str(2**31 - 1)  # the value at which Spark skips the per-row size check


@contextlib.contextmanager
def batches_capped_by_rows_only(context: SparkContext) -> Iterator[None]:
    """Run the jobs started on this thread inside the block with Arrow batches bounded by rows
    only (unless the session sets the byte cap itself); restore the thread's property after."""
    previous = context.getLocalProperty(MAX_BYTES_PER_BATCH)
    context.setLocalProperty(MAX_BYTES_PER_BATCH, UNCAPPED)
    try:
        yield
    finally:
        context.setLocalProperty(MAX_BYTES_PER_BATCH, previous)  # type: ignore[arg-type]


@contextlib.contextmanager
def capped_by_rows_only(spark: SparkSession) -> Iterator[None]:
    """:func:`batches_capped_by_rows_only` for either kind of session. Spark Connect has no job
    properties: the cap is lifted in the session's conf for the block (unless the session set
    it), which the session's other jobs started meanwhile see too. In the process a Connect
    server runs ``foreachBatch`` in, the session is the query's own (Spark clones one per
    query, and its only jobs are statetier's and the sink's, which run in the block): the cap
    is lifted there once and stays, which saves three gRPC round trips per micro-batch."""
    if not is_connect(spark):
        with batches_capped_by_rows_only(spark.sparkContext):
            yield
        return
    if on_connect_driver():
        _lift_for_good(spark)
        yield
        return
    if MAX_BYTES_PER_BATCH in spark.conf.getAll:
        yield
        return
    spark.conf.set(MAX_BYTES_PER_BATCH, UNCAPPED)
    try:
        yield
    finally:
        spark.conf.unset(MAX_BYTES_PER_BATCH)


_LIFTED: set[str] = set()  # Connect sessions whose cap was lifted for good, or set by the user


def _lift_for_good(spark: SparkSession) -> None:
    """Lift the cap in a query's ``foreachBatch`` session once (unless it set its own)."""
    session = str(getattr(spark, "session_id", id(spark)))
    if session in _LIFTED:
        return
    if MAX_BYTES_PER_BATCH not in spark.conf.getAll:
        spark.conf.set(MAX_BYTES_PER_BATCH, UNCAPPED)
    _LIFTED.add(session)
