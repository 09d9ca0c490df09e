"""Two streaming queries on one statetier checkpoint (issue 45): the second fails before its sink
sees a micro-batch, naming the checkpoint and the pipeline whose query writes it, and the first
goes on committing. Real Spark (local[2]), two queries of one application, each with its own
Spark checkpoint."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from statetier.backend.snapshot import SnapshotStore
from statetier.backend.spark import StatefulPipeline

from tests.spark.spark_support import VectorWordCount, zipf_words


def _start(
    spark: SparkSession,
    pipelines: list[StatefulPipeline],
    tmp_path: Path,
    name: str,
    seen: list[tuple[int, int]],
) -> StreamingQuery:
    """A query over the files of ``tmp_path/in``, one per micro-batch, whose sink records
    (epoch, rows) of every micro-batch it is handed."""
    pipeline = StatefulPipeline(
        VectorWordCount, key="word", output_schema="word string, count bigint", parallelism=2,
        config={"checkpoint.uri": f"file://{tmp_path}/ckpt"}, name=name,
    )  # fmt: skip
    pipelines.append(pipeline)

    def sink(out: DataFrame, epoch: int) -> None:
        seen.append((epoch, out.count()))

    stream = spark.readStream.schema("word string").option("maxFilesPerTrigger", 1)
    return (
        pipeline.write_stream(stream.csv(str(tmp_path / "in")), sink)
        .option("checkpointLocation", str(tmp_path / f"spark-{name}"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )


def _wait(condition: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_a_second_query_on_a_checkpoint_fails_before_its_sink_runs(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    for i in range(4):
        (source / f"part-{i}.csv").write_text("\n".join(zipf_words(300, 50, i)) + "\n")
    store = SnapshotStore(f"file://{tmp_path}/ckpt")
    first_seen: list[tuple[int, int]] = []
    second_seen: list[tuple[int, int]] = []
    first = _start(spark, pipelines, tmp_path, "first", first_seen)
    try:
        _wait(lambda: store.epochs()[-1:] == [1])  # the first query writes the checkpoint
        second = _start(spark, pipelines, tmp_path, "second", second_seen)
        try:
            _wait(lambda: not second.isActive)
        finally:
            second.stop()
        assert second_seen == []  # its sink never ran
        error = second.exception()
        assert error is not None
        (line,) = [x for x in str(error).splitlines() if "CheckpointInUseError" in x][-1:]
        message = line.split("CheckpointInUseError: ", 1)[1]
        assert message.startswith(f"checkpoint {store.uri} is being written by pipeline 'first'")
        assert str(first.id) in message and "give this query its own checkpoint.uri" in message
        _wait(lambda: store.epochs()[-1:] == [4])  # the first query was not fenced
        assert first.isActive and first.exception() is None
    finally:
        first.stop()
    assert [epoch for epoch, _ in first_seen] == [1, 2, 3, 4]
    assert sum(rows for _, rows in first_seen) > 0
