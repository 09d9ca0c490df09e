"""State hosts that fail: at start (the error names the cause) and after their task (the driver
notices at once and runs the epoch again; nothing is lost or counted twice)."""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from statetier.backend.spark import StatefulPipeline

from tests.spark.spark_support import (
    HostDiesInSnapshot,
    VectorWordCount,
    run_with_a_host_killed,
    words_df,
    zipf_words,
)
from tests.spark.test_spark_pipeline import make


@pytest.mark.own_hosts  # its bind address is a host setting: a running host would serve it
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
    df = words_df(spark, zipf_words(200, 50, 1))
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
