"""A stopped streaming query's ranges leave the state hosts after ``host.stopped-query-timeout``
(spark.stopped_queries), on the session's real local[2] Spark and its shared state hosts."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from statetier.backend.spark import StatefulPipeline
from statetier.backend.spark.stopped_queries import (
    LOOK_INTERVAL_S,
    StoppedQueries,
    stopped_queries,
)
from statetier.backend.spark.writers import QUERY_ID_PROPERTY

from tests.spark.spark_support import (
    VectorWordCount,
    committed_counts,
    expected_counts,
    hosted_ranges,
    run_available_now,
    words_df,
    zipf_words,
)

SCHEMA = "word string, count bigint"


def make(
    pipelines: list[StatefulPipeline], name: str, tmp_path: Path, **config: Any
) -> StatefulPipeline:
    pipeline = StatefulPipeline(
        VectorWordCount,
        key="word",
        output_schema=SCHEMA,
        parallelism=3,
        name=name,
        config={"checkpoint.uri": f"file://{tmp_path}/{name}", **config},
    )
    pipelines.append(pipeline)
    return pipeline


def held(spark: SparkSession, pipeline: StatefulPipeline) -> dict[str, int]:
    """Pipeline name -> its ranges in the application's live state hosts."""
    return hosted_ranges(pipeline.registry(spark).secret, pipeline.state_hosts())


def stream_once(
    spark: SparkSession, pipeline: StatefulPipeline, root: Path, words: list[str]
) -> None:
    """One availableNow query of ``pipeline`` over a file of ``words`` added to its source
    (its Spark checkpoint under ``root`` too: a second call restarts the same query)."""
    source = root / "in"
    source.mkdir(parents=True, exist_ok=True)
    (source / f"part-{len(list(source.iterdir())):03d}.csv").write_text("\n".join(words) + "\n")
    stream = spark.readStream.schema("word string").csv(str(source))
    run_available_now(pipeline.write_stream(stream), root / "spark-ckpt")


def test_a_stopped_query_leaves_the_hosts_after_its_timeout_and_a_quick_restart_is_warm(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    """Two queries stop; a third pipeline's epochs go on in the application. The query whose
    timeout (1 s) has passed loses its ranges in the hosts; the one with the default (60 s)
    keeps them, and its restart finds all three warm."""
    words = [zipf_words(600, 100, seed) for seed in range(3)]
    quick = make(pipelines, "stops-quick", tmp_path, **{"host.stopped-query-timeout": "1s"})
    kept = make(pipelines, "stops-kept", tmp_path)
    other = make(pipelines, "goes-on", tmp_path)
    stream_once(spark, kept, tmp_path / "kept", words[0])
    stream_once(spark, quick, tmp_path / "quick", words[0])  # its epoch marks kept's stopped
    followed = stopped_queries().followed()
    assert {"stops-quick", "stops-kept"} <= followed.keys(), followed
    hosted = held(spark, quick)
    assert hosted.get("stops-quick") == hosted.get("stops-kept") == 3, hosted

    # the other pipeline's epochs look at the stopped queries: the first marks them stopped,
    # one at least 1 s later releases the quick one's ranges
    deadline = time.monotonic() + 60
    while "stops-quick" in stopped_queries().followed():
        assert time.monotonic() < deadline, stopped_queries().followed()
        other.run(words_df(spark, words[1]))
        time.sleep(LOOK_INTERVAL_S)
    while held(spark, quick).get("stops-quick"):  # the hosts take the order
        assert time.monotonic() < deadline, held(spark, quick)
        time.sleep(0.05)
    hosted = held(spark, quick)
    assert hosted.get("stops-kept") == 3 and hosted.get("goes-on") == 3, hosted
    assert "stops-kept" in stopped_queries().followed()

    # a restart within the timeout is served warm; one after it restores, and is exact
    before = len(kept.reports)
    stream_once(spark, kept, tmp_path / "kept", words[2])
    assert [(r.warm, r.restored) for r in kept.reports[before:]] == [(3, 0)]
    before = len(quick.reports)
    stream_once(spark, quick, tmp_path / "quick", words[2])
    assert [(r.warm, r.restored) for r in quick.reports[before:]] == [(0, 3)]
    for pipeline in (quick, kept):
        epoch = pipeline.store.epochs()[-1]
        assert committed_counts(pipeline.store, epoch) == expected_counts([words[0], words[2]])


class Clock:
    """The time :class:`StoppedQueries` reads, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def epoch_of(
    spark: SparkSession,
    queries: StoppedQueries,
    query_id: str | None,
    release: Callable[[], object],
    pipeline: str = "other",
    timeout: float = 60.0,
) -> None:
    """An epoch of ``pipeline`` begins on this thread, inside streaming query ``query_id``
    (Spark's local property, as on a micro-batch's thread) or in none (a batch run)."""
    context = spark.sparkContext
    context.setLocalProperty(QUERY_ID_PROPERTY, query_id)  # type: ignore[arg-type]
    try:
        queries.epoch_begins(spark, pipeline, release, timeout)
    finally:
        context.setLocalProperty(QUERY_ID_PROPERTY, None)  # type: ignore[arg-type]


def test_a_query_is_released_at_the_first_look_a_timeout_after_it_was_seen_stopped(
    spark: SparkSession,
) -> None:
    """With the real application's (empty) list of active queries and a clock the test moves:
    seen stopped at the first look, released at the first look ``timeout`` later, once; the
    looks are at most a second apart; a batch run of the name ends its following."""
    clock, released = Clock(), []
    queries = StoppedQueries(clock)
    gone = str(uuid.uuid4())  # a query no longer active (never was, in this application)
    epoch_of(spark, queries, gone, pipeline="p", release=lambda: released.append("p"), timeout=5)
    epoch_of(spark, queries, None, release=lambda: released.append("other"))
    assert queries.followed() == {"p": gone}  # the look of p's epoch: p was running
    for moved, expected in [(1.0, []), (4.9, []), (0.5, []), (0.5, ["p"]), (10.0, ["p"])]:
        clock.now += moved
        epoch_of(spark, queries, None, release=lambda: released.append("other"))
        assert released == expected, (moved, clock.now)
    assert queries.followed() == {}
    # a batch run of a followed name: its ranges are in use, nothing is released later
    epoch_of(spark, queries, gone, pipeline="q", release=lambda: released.append("q"), timeout=0)
    epoch_of(spark, queries, None, pipeline="q", release=lambda: released.append("q"))
    clock.now += 100
    epoch_of(spark, queries, None, release=lambda: released.append("other"))
    assert released == ["p"] and queries.followed() == {}


def test_a_release_that_fails_is_logged_and_the_epoch_goes_on(
    spark: SparkSession, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    queries = StoppedQueries(clock)

    def fails() -> None:
        raise OSError("the registry is gone")

    # heard on the module's logger itself: another test may have configured its parents
    logger = logging.getLogger("statetier.spark.stopped_queries")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger=logger.name):
            epoch_of(spark, queries, str(uuid.uuid4()), pipeline="p", release=fails, timeout=0)
            for _ in range(2):  # seen stopped, then released
                clock.now += 1
                epoch_of(spark, queries, None, release=lambda: None)
    finally:
        logger.removeHandler(caplog.handler)
    assert "pipeline p's ranges could not be released" in caplog.text
    assert "the registry is gone" in caplog.text
    assert queries.followed() == {}
