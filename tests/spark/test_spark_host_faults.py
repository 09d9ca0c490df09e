"""State hosts that fail: at start (the error names the cause) and after their task (the driver
notices at once and runs the epoch again; nothing is lost or counted twice)."""

from __future__ import annotations

import functools
import re
import tempfile
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from statetier.backend.spark import StatefulPipeline

from tests.spark.spark_support import (
    HostDiesInSnapshot,
    VectorWordCount,
    collecting,
    expected_counts,
    zipf_words,
)
from tests.spark.test_spark_pipeline import make


def test_a_host_that_cannot_start_names_the_cause(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: the host cannot bind it
    pipeline = make(
        pipelines,
        VectorWordCount,
        f"file://{tmp_path}/ckpt",
        2,
        **{"host.bind-address": "192.0.2.1"},
    )
    df = spark.createDataFrame([(w,) for w in zipf_words(200, 50, 1)], "word string")
    with pytest.raises(Exception) as info:
        pipeline.run(df)
    message = str(info.value)
    assert "the statetier state host did not start" in message
    assert "exited with status 1" in message
    assert "Cannot assign requested address" in message  # from the host's own log
    # where the whole log is: under the executor's local dir, which Spark removes at the end
    log = re.search(r"its log \((\S+statetier-host-\S+\.log)\)", message)
    assert log is not None and not log.group(1).startswith(tempfile.gettempdir() + "/statetier")
    assert pipeline.store.epochs() == []  # nothing committed


def test_a_host_killed_after_its_task_costs_a_rerun_not_the_epoch(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    marker = tmp_path / "killed-once"
    factory = functools.partial(HostDiesInSnapshot, str(marker))
    pipeline = make(pipelines, factory, f"file://{tmp_path}/ckpt", 2)
    _, seconds = run_with_a_host_killed(spark, pipeline, marker)
    assert seconds[1] < 30  # noticed at once (its registry connection closed), no timeout


def run_with_a_host_killed(
    spark: SparkSession, pipeline: StatefulPipeline, marker: Path
) -> tuple[list[list[str]], list[float]]:
    """Three epochs of a :class:`HostDiesInSnapshot` pipeline (its host dies in epoch 2's
    snapshot, ``marker`` says so), checked as on any session: one re-run of epoch 2 that
    restores the lost range, exact outputs. The batches and each epoch's seconds."""
    batches = [zipf_words(1000, 200, seed) for seed in range(3)]
    outputs: dict[str, int] = {}
    sink = collecting(outputs)
    seconds = []
    for epoch, words in enumerate(batches, start=1):
        started = time.monotonic()
        df = spark.createDataFrame([(w,) for w in words], "word string")
        report = pipeline.run_epoch(df, epoch, sink)
        seconds.append(time.monotonic() - started)
        assert report.epoch == epoch
    assert marker.exists()  # the host did die in epoch 2's snapshot
    assert [r.reruns for r in pipeline.reports] == [0, 1, 0]
    assert pipeline.reports[1].restored >= 1  # the re-run restored the lost range
    assert pipeline.store.epochs() == [1, 2, 3]
    assert outputs == expected_counts(batches)
    return batches, seconds
