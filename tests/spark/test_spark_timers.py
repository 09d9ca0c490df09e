"""Timers and checkpoint listeners on real Spark (local[2]): batch runs and streaming queries."""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from statetier.backend.keygroups import assign_to_key_group, instance_for_key_group
from statetier.backend.snapshot import SnapshotStore
from statetier.backend.spark import StatefulPipeline
from statetier.backend.timers import MAX_WATERMARK
from statetier.backend.ttl import ManualClock

from tests.spark.spark_support import run_available_now
from tests.spark.timer_support import (
    SCHEMA,
    EventTimer,
    FailingEventTimer,
    KeyGroupTimerProbe,
    ListenerProbe,
    TimerProbe,
)

Fired = tuple[str, str, int, int, int]  # key, domain, ts, epoch, watermark


def make(
    pipelines: list[StatefulPipeline], function: Any, tmp_path: Path, p: int, **kwargs: Any
) -> StatefulPipeline:
    config = {"checkpoint.uri": f"file://{tmp_path}/ckpt", **kwargs.pop("config", {})}
    pipeline = StatefulPipeline(
        function, key="key", output_schema=SCHEMA, parallelism=p, config=config, **kwargs
    )
    pipelines.append(pipeline)
    return pipeline


def ops(spark: SparkSession, rows: list[tuple[str, str, int]]) -> DataFrame:
    # one input partition: a key's operations reach its range in this order
    return spark.createDataFrame(rows, "key string, op string, ts bigint").coalesce(1)


def fired_rows(out: list[Fired]) -> Any:
    def sink(df: DataFrame, epoch: int) -> None:
        out.extend(tuple(r) for r in df.collect())

    return sink


@pytest.mark.parametrize("function", [TimerProbe, KeyGroupTimerProbe])
def test_processing_and_event_time_timers_in_batch_runs(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path, function: Any
) -> None:
    clock = ManualClock(1_000)
    pipeline = make(pipelines, function, tmp_path, 2, clock=clock)
    out: list[Fired] = []
    sink = fired_rows(out)
    first = [
        ("a", "event", 100),
        ("a", "event", 100),  # the same timestamp twice: one timer
        ("a", "event", 200),
        ("a", "del-event", 200),  # deleted: never fires
        ("b", "proc", 1_500),
        ("b", "proc", 3_000),
        ("c", "event", 50),
        ("c", "del-event", 50),
        ("c", "event", 50),  # registered again after its delete: fires
        ("d", "event", 500),
    ]
    pipeline.run(ops(spark, first), sink)
    assert out == []  # no watermark yet, processing time 1000
    clock.set(2_000)
    pipeline.run(ops(spark, []), sink, watermark=150)
    # processing-time timers first, then event time in timestamp order
    assert out == [
        ("b", "proc", 1_500, 2, 150),
        ("c", "event", 50, 2, 150),
        ("a", "event", 100, 2, 150),
    ]
    out.clear()
    clock.set(2_500)
    late = [("e", "event", 120), ("b", "del-proc", 3_000)]  # e: already due when set
    pipeline.run(ops(spark, late), sink)  # no new watermark: it stays at 150
    assert out == [("e", "event", 120, 3, 150)]
    out.clear()
    clock.set(5_000)
    pipeline.run(ops(spark, []), sink, end_of_input=True)  # b's 3000 was deleted
    assert out == [("d", "event", 500, 4, MAX_WATERMARK)]
    out.clear()
    pipeline.run(ops(spark, []), sink, end_of_input=True)
    assert out == []  # each timer fired once


def test_timers_of_spilled_key_groups_fire(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    spill = {
        "spill.enabled": True,
        "memory.budget": "1m",
        "spill.check-interval": "10ms",
        "spill.dirs": str(tmp_path / "spill"),
    }
    pipeline = make(pipelines, EventTimer, tmp_path, 2, config=spill)
    keys = [f"k{i:05d}-{'x' * 40}" for i in range(20_000)]
    events = spark.createDataFrame(
        [(k, i % 1_000) for i, k in enumerate(keys)], "key string, ts bigint"
    )
    none = spark.createDataFrame([], "key string, ts bigint")
    out: list[Fired] = []
    pipeline.run(events, fired_rows(out))
    for _ in range(2):  # let the governor spill key groups between epochs
        pipeline.run(none, fired_rows(out))
    pipeline.run(none, fired_rows(out), watermark=1_500)
    assert max(r.spilled_key_groups for r in pipeline.reports) > 0
    assert sorted((k, ts) for k, _, ts, _, _ in out) == sorted(
        (k, i % 1_000 + 1_000) for i, k in enumerate(keys) if i % 1_000 <= 500
    )
    pipeline.run(none, fired_rows(out), end_of_input=True)
    assert len(out) == len({(k, ts) for k, _, ts, _, _ in out}) == len(keys)


def spark_watermarks(batches: list[list[tuple[str, int]]], delay: int) -> list[int | None]:
    """The watermark Spark gives each micro-batch: the largest earlier event time less delay."""
    marks: list[int | None] = []
    latest: int | None = None
    for batch in batches:
        marks.append(None if latest is None or latest - delay <= 0 else latest - delay)
        biggest = max((ts for _, ts in batch), default=latest)  # none: a wake-up's batch
        latest = biggest if latest is None or biggest is None else max(latest, biggest)
    return marks


def expected_fires(batches: list[list[tuple[str, int]]], delay: int) -> list[Fired]:
    """Each (key, ts + GAP) timer, in the first epoch whose watermark reaches it."""
    marks = spark_watermarks(batches, delay)
    out: dict[tuple[str, int], Fired] = {}
    for registered, batch in enumerate(batches):
        for key, ts in batch:
            timer = ts + EventTimer.GAP
            for b in range(registered, len(batches)):
                mark = marks[b]
                if mark is not None and mark >= timer:
                    out.setdefault((key, timer), (key, "event", timer, b + 1, mark))
                    break
    return sorted(out.values())


@pytest.mark.parametrize("api", ["write_stream", "foreach_batch"])
def test_event_time_follows_the_query_watermark_across_a_restart_and_a_retry(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path, api: str
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    batches = [[(f"k{j}", b * 700 + (j * 131) % 900) for j in range(24)] for b in range(6)]
    out: list[Fired] = []

    def run_query(files: range, function: Any, p: int) -> StatefulPipeline:
        for i in files:
            rows = "\n".join(f"{k},{ts}" for k, ts in batches[i])
            path = source / f"part-{i:03d}.csv"
            path.write_text(rows + "\n")
            os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # read in this order
        pipeline = make(pipelines, function, tmp_path, p)
        events = (
            spark.readStream.schema("key string, ts bigint")
            .option("maxFilesPerTrigger", 1)
            .csv(str(source))
            .withColumn("t", sf.timestamp_millis("ts"))
            .withWatermark("t", "500 milliseconds")
            .select("key", "ts")
        )
        writer = (
            pipeline.write_stream(events, fired_rows(out))
            if api == "write_stream"
            else events.writeStream.foreachBatch(pipeline.foreach_batch(fired_rows(out)))
        )
        run_available_now(writer, tmp_path / "spark-ckpt")
        return pipeline

    # write_stream's query ends each run with a micro-batch without input that fires what the
    # last watermark made due (a wake-up, see spark.wakeups); a foreach_batch query does not
    wake: list[list[tuple[str, int]]] = [[]] if api == "write_stream" else []
    epochs = [*batches[:4], *wake, *batches[4:], *wake]
    # range 1 of epoch 3 fails once after its timers fired: the retry fires them again from
    # the restored state; Spark keeps one attempt's output
    first = run_query(range(4), FailingEventTimer, 4)
    assert [r.epoch for r in first.reports] == list(range(1, 5 + len(wake)))
    assert first.reports[2].restored >= 1
    mp = first.store.manifest(3).max_parallelism
    failed_range = {
        k
        for k, _, _, epoch, _ in out
        if epoch == 3 and instance_for_key_group(mp, 4, assign_to_key_group(k, mp)) == 1
    }
    assert failed_range, "the failed range fired timers in epoch 3 before it failed"
    second = run_query(range(4, 6), EventTimer, 3)  # restarted, at another parallelism
    after = len(first.reports)
    assert [r.epoch for r in second.reports] == [after + 1 + i for i in range(2 + len(wake))]
    assert second.reports[0].restored == 3
    assert len(out) == len(set(out))  # no timer fired twice
    assert sorted(out) == expected_fires(epochs, 500)
    # with wake-ups, epochs 5 and 8 are the runs' micro-batches without input
    assert {epoch for *_, epoch, _ in out} >= ({3, 4, 5, 7, 8} if wake else {3, 4, 5, 6})


def test_listeners_hear_committed_and_aborted_epochs(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    pipeline = make(pipelines, functools.partial(ListenerProbe, str(logs)), tmp_path, 2)
    rows = ops(spark, [(f"k{i}", "event", i) for i in range(40)])
    for _ in range(3):
        pipeline.run(rows)
    # epoch 4 runs, but its driver never commits it (it died, say): the same epoch runs again
    pipeline.transform(rows, 4).write.format("noop").mode("overwrite").save()
    pipeline.run_epoch(rows, 4)
    pipeline.run(rows)
    lines = [line.split() for f in sorted(logs.iterdir()) for line in f.read_text().splitlines()]
    heard = {i: [(what, int(epoch)) for what, epoch, index in lines if index == i] for i in "01"}
    everything = [("complete", 1), ("complete", 2), ("complete", 3), ("aborted", 4)]
    everything.append(("complete", 4))
    runs = {r.epoch: r for r in pipeline.reports}  # the committed runs
    shown = [(r.epoch, r.warm, r.restored, r.fresh) for r in pipeline.reports]
    assert sorted(runs) == [1, 2, 3, 4, 5], shown
    for index, of_range in heard.items():
        rest = iter(everything)
        assert all(item in rest for item in of_range), (index, of_range, shown)  # in order, once
    # a range warm at epoch E + 1 is told that E is committed before its records; one that a
    # busy machine moved (a host that missed its heartbeats, say) is restored and told
    # nothing, as in Flink
    for epoch in (1, 2, 4):
        told = sum(("complete", epoch) in h for h in heard.values())
        assert told == runs[epoch + 1].warm, (epoch, heard, shown)
    # epoch 4's first run is not committed (no report): each range's instance that ran it is
    # told it is aborted when the run again restores the range on the same host (a range moved
    # meanwhile is restored elsewhere, and its old instance dropped untold)
    aborted = sum(("aborted", 4) in h for h in heard.values())
    stayed = all(runs[epoch].warm == 2 for epoch in (2, 3, 5))  # no range moved
    assert aborted == 2 if stayed else aborted <= 2, (heard, shown)


@pytest.mark.parametrize(
    "empty", [lambda df: df.limit(0), lambda df: df.where("false")], ids=["limit0", "where-false"]
)
def test_an_input_spark_proves_empty_still_runs_every_range(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path, empty: Any
) -> None:
    """Spark drops a plan whose input it proves empty (no task at all); every range still gets
    its epoch: timers fire and the epoch commits (it used to wait out host.result-timeout)."""
    clock = ManualClock(1_000)
    config = {"host.result-timeout": "30s"}
    pipeline = make(pipelines, TimerProbe, tmp_path, 2, clock=clock, config=config)
    out: list[Fired] = []
    sink = fired_rows(out)
    pipeline.run(ops(spark, [("a", "event", 100), ("b", "proc", 1_500)]), sink)
    clock.set(2_000)
    started = time.monotonic()
    report = pipeline.run(empty(ops(spark, [("z", "event", 1)])), sink, watermark=150)
    assert time.monotonic() - started < 25
    assert out == [("b", "proc", 1_500, 2, 150), ("a", "event", 100, 2, 150)]
    assert report.ranges == 2 and report.records == 0
    assert SnapshotStore(f"file://{tmp_path}/ckpt").epochs()[-1] == 2
