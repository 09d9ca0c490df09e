"""A streaming query that stopped leaves the state hosts: its ranges are released once it has
stayed stopped for ``host.stopped-query-timeout`` (classic driver).

On a classic driver the host registry is the application's, and the state hosts serve every
pipeline of the application: they outlive each query. Without this module a stopped query's
ranges (their function instances, heap state and spill files) stayed in the hosts until the
application ended, or until ``StatefulPipeline.release()``; a notebook or a long-lived
application that runs query after query held every ended query's state. Spark frees a stopped
query's state stores the same way: its state store coordinator marks them inactive, and the
maintenance task unloads them (every ``spark.sql.streaming.stateStore.maintenanceInterval``,
60 s by default). On Spark Connect each query's ``foreachBatch`` process coordinates its
pipeline with a registry of its own, which ends with the query, and the hosts drop what it
routed (spark.membership): nothing is followed there.

How: every epoch that begins on the driver (a micro-batch of any pipeline, a batch run) looks,
at most once a second, at the queries followed: a pipeline is followed under the streaming
query id Spark gives its micro-batch thread. A query no longer among the application's active
ones is stopped since that look; at a look ``host.stopped-query-timeout`` later, still stopped,
its pipeline's ranges are released (the registry orders the hosts to drop them). A query
restarted before then (Spark keeps its id across a restart from its checkpoint) finds its
ranges warm; one restarted after restores them from the checkpoint, which is what a range
whose host left does too. The looks ride on epochs because that is when it matters: while no
epoch begins on the driver, its hosts serve nothing and leave after ``host.idle-timeout``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import SparkSession
from statetier.backend.spark.session_kind import is_connect
from statetier.backend.spark.writers import QUERY_ID_PROPERTY

__all__ = ["LOOK_INTERVAL_S", "StoppedQueries", "stopped_queries"]

log = logging.getLogger("statetier.spark.stopped_queries")

LOOK_INTERVAL_S = 1.0  # between two looks at the followed queries (each a py4j call per query)


@dataclass
class _Followed:
    """The query a pipeline's epochs last ran in, and what releases the pipeline's ranges."""

    query_id: str
    release: Callable[[], object]
    timeout: float
    stopped_since: float | None = None


class StoppedQueries:
    """The streaming queries of one driver whose pipelines' ranges are released once they
    stopped (see the module). Thread-safe: the micro-batches of several queries begin on
    their own threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._followed: dict[str, _Followed] = {}  # pipeline name -> its last query
        self._next_look = 0.0

    def epoch_begins(
        self, spark: SparkSession, pipeline: str, release: Callable[[], object], timeout: float
    ) -> None:
        """An epoch of ``pipeline`` begins in ``spark`` (a micro-batch's session, or a batch
        run's): follow its query, if it runs in one (a batch run of the name ends the following
        of its last query), then look at the others.

        Under the lock throughout, so that a release and an epoch of its pipeline do not
        overlap: a query restarted at the moment its ranges are released begins its epoch after
        the hosts were told, and restores them."""
        if is_connect(spark):
            return
        query_id = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        with self._lock:
            if query_id:
                self._followed[pipeline] = _Followed(query_id, release, timeout)
            else:  # a batch run of the name: its ranges are in use again
                self._followed.pop(pipeline, None)
            now = self._clock()
            if now >= self._next_look:
                self._next_look = now + LOOK_INTERVAL_S
                self._look(spark, now, running=query_id)

    def _look(self, spark: SparkSession, now: float, running: str | None) -> None:
        """(lock held) Mark the followed queries that stopped; release those stopped long
        enough. ``running`` is the query of the epoch that looks (active: it is running)."""
        try:
            active = _active_queries(spark)
        except Exception as e:  # the driver stopping: an epoch's start is not the place to fail
            log.debug("the active streaming queries could not be listed: %r", e)
            return
        for pipeline, followed in list(self._followed.items()):
            if followed.query_id == running or followed.query_id in active:
                followed.stopped_since = None
            elif followed.stopped_since is None:
                followed.stopped_since = now
            elif now - followed.stopped_since >= followed.timeout:
                del self._followed[pipeline]
                _release(pipeline, followed)

    def followed(self) -> dict[str, str]:
        """Pipeline name -> the query id it is followed under (for tests and tools)."""
        with self._lock:
            return {name: f.query_id for name, f in self._followed.items()}


def _release(pipeline: str, followed: _Followed) -> None:
    """Release a stopped query's ranges; a failure is logged, since it happens in another
    pipeline's epoch (the ranges then stay until the hosts leave, as before)."""
    log.info(
        "streaming query %s stopped %.0f s ago or more: pipeline %s's ranges leave the state hosts",
        followed.query_id,
        followed.timeout,
        pipeline,
    )
    try:
        followed.release()
    except Exception:
        log.warning("pipeline %s's ranges could not be released", pipeline, exc_info=True)


def _active_queries(spark: SparkSession) -> set[str]:
    """The ids of the application's active streaming queries, in every session (a
    micro-batch's session is a clone whose query manager does not list its own query)."""
    shared = spark._jsparkSession.sharedState()
    return {str(query_id) for query_id in shared.activeStreamingQueries().keySet().toArray()}


_STOPPED_QUERIES = StoppedQueries()


def stopped_queries() -> StoppedQueries:
    """This driver's :class:`StoppedQueries`: one per process (the registry it releases
    through is the application's, and one driver runs one application at a time)."""
    return _STOPPED_QUERIES
