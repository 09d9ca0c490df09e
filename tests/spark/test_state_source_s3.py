"""The ``statetier`` data source reads state a job committed to S3 (a real SeaweedFS on
127.0.0.1), exactly as the job's oracle says.

The 6-epoch job of test_state_source (Value, List, Map with TTL, Reducing state, timers; a
rescale from 2 to 3 at epoch 4) commits to a bucket. Spark's Python workers get the object
store's endpoint and credentials from their environment, as executors get them from their pod's
(here the session's worker environment, never a Spark option or conf); the reader's rows at the
latest and an older epoch and the change feed must equal the oracle's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import SparkSession
from statetier.backend import load_config
from statetier.backend.local_runner import LocalRunner
from statetier.backend.spark.state_source import register_data_sources
from statetier.backend.ttl import ManualClock
from statetier.tools.compaction_launch import BUCKET, SeaweedFS

from tests.spark.test_state_source import EPOCH_MS, Oracle, Tracker, epoch_inputs


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    with SeaweedFS(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture(scope="module")
def job(seaweed: SeaweedFS) -> tuple[str, Oracle]:
    """The 6-epoch job's checkpoint in the bucket, and its oracle."""
    uri = f"s3://{BUCKET}/jobs/tracker"
    config = load_config({"checkpoint.retained": 10, "compaction.delta-trigger": 2}, env={})
    clock, oracle, inputs = ManualClock(0), Oracle(), epoch_inputs()
    for parallelism, epochs in ((2, range(1, 4)), (3, range(4, 7))):  # a rescale at epoch 4
        runner = LocalRunner(
            Tracker,
            parallelism,
            checkpoint_uri=uri,
            clock=clock,
            config=config,
            storage_options=seaweed.options,  # the job's own process writes the bucket
        )
        try:
            for epoch in epochs:
                clock.set(epoch * EPOCH_MS)
                runner.run_epoch(inputs[epoch - 1])
                oracle.epoch(epoch, inputs[epoch - 1])
        finally:
            runner.close()
    return uri, oracle


@pytest.fixture(scope="module")
def reader(spark: SparkSession, seaweed: SeaweedFS) -> Iterator[SparkSession]:
    """The session with the data sources registered for Python workers whose environment
    holds the object store's endpoint and credentials (restored afterwards)."""
    environment = spark.sparkContext.environment
    before = dict(environment)
    environment.update(seaweed.env)
    register_data_sources(spark)  # its workers get the environment of this moment
    yield spark
    environment.clear()
    environment.update(before)
    register_data_sources(spark)


def load(spark: SparkSession, uri: str, **options: Any) -> Any:
    read = spark.read.format("statetier").option("path", uri)
    for name, value in options.items():
        read = read.option(name, value)
    return read.load()


@pytest.mark.parametrize("epoch", [6, 3])
def test_state_committed_to_s3_reads_as_the_oracle_says(
    reader: SparkSession, job: tuple[str, Oracle], epoch: int
) -> None:
    uri, oracle = job
    want = oracle.history[epoch - 1]
    now = epoch * EPOCH_MS
    count = load(reader, uri, state="count", epoch=epoch, partitions=3).collect()
    assert {(r.key, json.loads(r.value)) for r in count} == want["count"]
    assert len(count) == len(want["count"])
    seen = load(reader, uri, state="seen", epoch=epoch).collect()
    assert sorted((r.key, json.loads(r.value)) for r in seen) == want["seen"]
    attrs = load(reader, uri, state="attrs", epoch=epoch, processing_time=now).collect()
    got = {(r.key, r.user_key, json.loads(r.value), round(r.expires_at.timestamp() * 1000))
           for r in attrs}  # fmt: skip
    assert got == want["attrs"]


def test_the_change_feed_from_s3(reader: SparkSession, job: tuple[str, Oracle]) -> None:
    uri, oracle = job
    rows = load(
        reader, uri, state="count", readChangeFeed=True, changeStartEpoch=2, changeEndEpoch=5
    ).collect()
    got = {
        (r.epoch, r.change_type, r.key, None if r.value is None else json.loads(r.value))
        for r in rows
    }
    assert len(got) == len(rows)
    assert got == set().union(*oracle.count_changes[1:5])
