"""A stopped streaming query's ranges leave the state hosts after ``host.stopped-query-timeout``
(spark.stopped_queries), on the session's real local[2] Spark and its shared state hosts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from statetier.backend.spark import StatefulPipeline
from statetier.backend.spark.stopped_queries import LOOK_INTERVAL_S, stopped_queries

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
