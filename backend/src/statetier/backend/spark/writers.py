"""Which streaming query of this application writes which checkpoint location.

The writer lease (snapshot.fencing) lets a newer writer take a location over, because the
older one may be a dead driver that can never give it back. Within one application that is the
wrong answer for a second *live* query on the same ``checkpoint.uri``: it would fence the query
that was there first, after that query's sink had written its micro-batch. Spark refuses a
second active query on one Spark checkpoint the same way, within the application; across
applications the lease still fences at commit.

A pipeline claims its location here just before it first takes the lease, under its streaming
query's id (a batch run claims nothing). A claim counts while its query is active. On Spark
Connect the ``foreachBatch`` process sees no query id: nothing is claimed, and the lease alone
fences a second writer at its commit.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pyspark.sql import SparkSession
from statetier.backend.snapshot import FencedError
from statetier.backend.spark.session_kind import is_connect

__all__ = ["CheckpointInUseError", "claim_location"]

# The local property Spark sets on a streaming query's micro-batch thread.
QUERY_ID_PROPERTY = "sql.streaming.queryId"


class CheckpointInUseError(FencedError):
    """Another active query of this application writes the checkpoint location."""


@dataclass(frozen=True)
class _Claim:
    pipeline: str
    query_id: str


_CLAIMS: dict[str, _Claim] = {}  # checkpoint location -> the query that writes it
_LOCK = threading.Lock()


def claim_location(spark: SparkSession, location: str, pipeline: str) -> None:
    """Record that ``pipeline``'s running query writes ``location``, or raise
    :class:`CheckpointInUseError` if another pipeline's query that is still active does."""
    if is_connect(spark):
        return
    query_id = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    with _LOCK:
        held = _CLAIMS.get(location)
        if held is not None and _another(held, pipeline, query_id) and _active(spark, held):
            raise CheckpointInUseError(
                f"checkpoint {location} is being written by pipeline {held.pipeline!r} "
                f"(streaming query {held.query_id}, still active): give this query its own "
                "checkpoint.uri (spark.statetier.checkpoint.uri), or stop the other query first"
            )
        if query_id:
            _CLAIMS[location] = _Claim(pipeline, query_id)


def _another(held: _Claim, pipeline: str, query_id: str | None) -> bool:
    """Whether the claim is another writer's: not this pipeline's, nor its query's (a query
    restarted from its Spark checkpoint keeps its id, and Spark runs one run of it at a time)."""
    return held.pipeline != pipeline and held.query_id != query_id


def _active(spark: SparkSession, held: _Claim) -> bool:
    """Whether the claim's query is active in any session of the application (the
    micro-batch's session is a clone whose query manager does not list it)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    uuid = jvm.java.util.UUID.fromString(held.query_id)
    return bool(spark._jsparkSession.sharedState().activeStreamingQueries().containsKey(uuid))
