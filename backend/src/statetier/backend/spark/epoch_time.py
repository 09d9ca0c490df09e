"""An epoch's time on Spark: the watermark and processing time its timers fire at.

A micro-batch's time is the one Spark itself gives it: the ``batchWatermarkMs`` and
``batchTimestampMs`` of the batch's entry in the query's offset log. Spark writes that entry
before it runs the batch and, when a restarted query runs the batch again, reuses it; so a task
retry, a re-run of the epoch's job and a re-run after a restart all fire the same timers. The
watermark there is the query's own (``withWatermark``: the largest event time of the earlier
batches less the delay, the minimum over several watermarks unless the query says otherwise), so
statetier fires event-time timers exactly where Spark's own stateful operators would evict.

A batch run (``StatefulPipeline.run``) has no watermark unless the caller gives one; at
``end_of_input`` every event-time timer fires. Processing time is the epoch's clock: the batch
timestamp, else the pipeline's clock (``clock=`` in tests), read once when the epoch is planned.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession
from statetier.backend.spark.messages import EpochTime
from statetier.backend.spark.session_kind import is_connect, plan_text

__all__ = ["EpochTime", "has_watermark", "micro_batch_time"]

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # set by Spark on a micro-batch's jobs


def micro_batch_time(batch: DataFrame, batch_id: int) -> EpochTime:
    """The time of micro-batch ``batch_id`` (called in its ``foreachBatch`` function)."""
    execution = _query_execution(batch)
    entry = execution.offsetLog().get(batch_id)
    if entry.isEmpty():
        raise RuntimeError(f"micro-batch {batch_id} has no entry in its query's offset log")
    offsets = entry.get()
    metadata = _metadata(offsets)
    watermark = int(metadata.batchWatermarkMs())
    watermarked = _names_a_watermark(execution.logicalPlan())
    # Spark's watermark is 0 until a batch with event times ran: no event time yet
    return EpochTime(
        watermark=watermark if watermarked and watermark > 0 else None,
        processing_time=int(metadata.batchTimestampMs()),
    )


def has_watermark(df: DataFrame) -> bool:
    """Whether the streaming DataFrame ``df`` has an event-time watermark (``withWatermark``),
    even on a column it no longer selects."""
    if is_connect(df.sparkSession):  # the analyzed plan, as text (one analyze call)
        return "EventTimeWatermark" in plan_text(df)
    return _names_a_watermark(df._jdf.queryExecution().logical())


def _names_a_watermark(plan: Any) -> bool:
    return "EventTimeWatermark" in plan.toString()


def _metadata(offsets: Any) -> Any:
    """The entry's metadata (``metadataOpt`` in Spark 4.1+, ``metadata`` before)."""
    for name in ("metadataOpt", "metadata"):
        try:
            option = getattr(offsets, name)()
        except Exception:  # py4j: no such method in this Spark version
            continue
        if not option.isEmpty():
            return option.get()
    raise RuntimeError("this micro-batch's offset log entry has no metadata (watermark, time)")


def _query_execution(batch: DataFrame) -> Any:
    """The running query of ``batch`` (its stream execution in the JVM).

    ``foreachBatch`` hands a batch of a cloned session, whose query manager does not list the
    query: it is found by the query id Spark sets on the batch's jobs, in the sessions that can
    have started it.
    """
    query_id = batch.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    if query_id is None:
        raise RuntimeError("not in a micro-batch: no streaming query id on this thread")
    sessions = [SparkSession.getActiveSession(), SparkSession.builder.getOrCreate()]
    for session in sessions:
        if session is None:
            continue
        query = session.streams.get(query_id)
        if query is not None:
            return query._jsq.streamingQuery()
    raise RuntimeError(
        f"streaming query {query_id} is not among the active session's queries: start it "
        "from the session that is active on the driver"
    )
