"""Savepoints of a running streaming query, on real Spark (``local[2]``) and SeaweedFS.

A word count over six files runs one micro-batch per file; while it is in its fifth micro-batch
the ``statetier`` command (a process of its own) takes a savepoint of epoch 4 with the query's
Spark log entries, and retention then deletes epoch 4 from the query's checkpoint. A new query,
at another parallelism, with a new statetier location and a new Spark checkpoint location
restored from the savepoint, reads the same input directory and ends with the exact counts of
all six files: it resumes at the fifth. The same from the savepoint copied object by object to
another bucket; a bit flipped in a copy is found by ``verify`` and fails the restore.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs  # type: ignore[import-untyped]
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from statetier.backend.snapshot import SnapshotStore
from statetier.backend.spark import StatefulPipeline
from statetier.tools.bench.spark_functions import ArrowWordCount
from statetier.tools.bench.spark_wordcount import checkpoint_counts
from statetier.tools.compaction_launch import BUCKET, SeaweedFS

from tests.spark.spark_support import expected_counts, zipf_words

BATCHES = 6
SAVEPOINT_EPOCH = 4


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    with SeaweedFS(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


def statetier(seaweed: SeaweedFS, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``statetier`` command with the object store's credentials in its environment."""
    return subprocess.run(
        [sys.executable, "-m", "statetier.backend", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **seaweed.env},
        timeout=180,
        check=False,
    )


def write_input(directory: Path) -> list[list[str]]:
    directory.mkdir()
    batches = [zipf_words(3000, 1500, seed=i) for i in range(BATCHES)]
    for i, words in enumerate(batches):
        path = directory / f"part-{i:04d}.parquet"
        pq.write_table(pa.table({"word": words}), path)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # the file source's order
    return batches


def start_query(
    spark: SparkSession,
    pipeline: StatefulPipeline,
    tmp_path: Path,
    spark_checkpoint: Path,
    sink: Any,
) -> Any:
    words = spark.readStream.schema("word string").option("maxFilesPerTrigger", 1)
    return (
        pipeline.write_stream(words.parquet(str(tmp_path / "input")), sink)
        .option("checkpointLocation", str(spark_checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def word_count(seaweed: SeaweedFS, uri: str, parallelism: int, **config: Any) -> StatefulPipeline:
    return StatefulPipeline(
        ArrowWordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=parallelism,
        config={
            "checkpoint.uri": uri,
            "checkpoint.retained": 2,
            "compaction.delta-trigger": 100,  # chains keep their deltas: the savepoint merges
            **config,
        },
        storage_options=seaweed.options,
    )


def noop(out: DataFrame, epoch: int) -> None:
    out.write.format("noop").mode("overwrite").save()


def resume(
    spark: SparkSession,
    seaweed: SeaweedFS,
    tmp_path: Path,
    pipelines: list[StatefulPipeline],
    savepoint: str,
) -> StatefulPipeline:
    """A new query at parallelism 3 started from ``savepoint``: its Spark checkpoint restored
    by the command, its statetier location by ``checkpoint.restore-from``."""
    spark_checkpoint = tmp_path / f"spark-{uuid.uuid4().hex[:8]}"
    restored = statetier(seaweed, "checkpoint", "restore-spark", savepoint, str(spark_checkpoint))
    assert restored.returncode == 0, restored.stderr
    uri = f"s3://{BUCKET}/resumed-{uuid.uuid4().hex[:8]}"
    pipeline = word_count(seaweed, uri, 3, **{"checkpoint.restore-from": savepoint})
    pipelines.append(pipeline)
    query = start_query(spark, pipeline, tmp_path, spark_checkpoint, noop)
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    pipeline.drain()
    return pipeline


@pytest.mark.slow
def test_a_query_resumes_exactly_from_a_savepoint_taken_while_it_ran(
    spark: SparkSession, seaweed: SeaweedFS, tmp_path: Path, pipelines: list[StatefulPipeline]
) -> None:
    batches = write_input(tmp_path / "input")
    source_uri = f"s3://{BUCKET}/source-{uuid.uuid4().hex[:8]}"
    savepoint = f"s3://{BUCKET}/savepoints/sp-{uuid.uuid4().hex[:8]}"
    spark_checkpoint = tmp_path / "spark-checkpoint"
    in_epoch_5, savepoint_taken = threading.Event(), threading.Event()

    def sink(out: DataFrame, epoch: int) -> None:  # the fifth micro-batch waits for the savepoint
        noop(out, epoch)
        if epoch == SAVEPOINT_EPOCH + 1:
            in_epoch_5.set()
            assert savepoint_taken.wait(120)

    pipeline = word_count(seaweed, source_uri, 2)
    pipelines.append(pipeline)
    query = start_query(spark, pipeline, tmp_path, spark_checkpoint, sink)
    try:
        assert in_epoch_5.wait(180), query.exception()
        taken = statetier(
            seaweed,
            *("checkpoint", "savepoint", source_uri, savepoint),
            *("--epoch", str(SAVEPOINT_EPOCH), "--spark-checkpoint", str(spark_checkpoint)),
            "--json",
        )
    finally:
        savepoint_taken.set()
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    pipeline.drain()
    assert taken.returncode == 0, taken.stderr
    report = json.loads(taken.stdout)
    assert report["epoch"] == SAVEPOINT_EPOCH and report["spark_batch"] == SAVEPOINT_EPOCH - 1
    assert report["uri"] == savepoint and report["source"] == source_uri and report["bytes"] > 0
    source = SnapshotStore(source_uri, **seaweed.options)
    assert source.epochs() == [BATCHES - 1, BATCHES]  # retention deleted epoch 4
    store = SnapshotStore(savepoint, **seaweed.options)
    files = store.list_files()
    assert all(not chain.deltas for chain in store.manifest().chains())
    assert checkpoint_counts(store, 2) == expected_counts(batches[:SAVEPOINT_EPOCH])

    resumed = resume(spark, seaweed, tmp_path, pipelines, savepoint)
    assert [r.epoch for r in resumed.reports] == [SAVEPOINT_EPOCH + 1, BATCHES]
    assert checkpoint_counts(resumed.store, 3) == expected_counts(batches)
    assert store.list_files() == files  # the savepoint was only read

    copy = copy_to_another_bucket(seaweed, savepoint)
    resumed = resume(spark, seaweed, tmp_path, pipelines, copy)
    assert checkpoint_counts(resumed.store, 3) == expected_counts(batches)

    damaged = flip_a_bit_in_the_largest_file(seaweed, copy)
    verify = statetier(seaweed, "checkpoint", "verify", copy)
    assert verify.returncode == 1 and damaged in verify.stdout
    with pytest.raises((StreamingQueryException, AssertionError), match=damaged):
        resume(spark, seaweed, tmp_path, pipelines, copy)


def copy_to_another_bucket(seaweed: SeaweedFS, savepoint: str) -> str:
    """Every object of the savepoint, copied as it is under another bucket."""
    fs = s3fs.S3FileSystem(**seaweed.options, skip_instance_cache=True)
    bucket = f"elsewhere-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    root = savepoint.removeprefix("s3://")
    for path in fs.find(root):
        fs.copy(path, f"{bucket}/copied{path[len(root) :]}")
    return f"s3://{bucket}/copied"


def flip_a_bit_in_the_largest_file(seaweed: SeaweedFS, savepoint: str) -> str:
    store = SnapshotStore(savepoint, **seaweed.options)
    entry = max(store.manifest().keyed_files, key=lambda f: f.size)
    path = store.full_path(entry.path)
    data = bytearray(store.fs.cat_file(path))
    data[len(data) // 2] ^= 0x01
    store.fs.pipe_file(path, bytes(data))
    return entry.path
