"""The ``statetier`` and ``statetier-metadata`` Spark data sources read what a job committed.

A 6-epoch job on the local runner (parallelism 2, then 3 from epoch 4: a rescale writes new
bases) keeps Value, List, Map (TTL), Reducing and Value (TTL) state and event-time timers; an
oracle computed here from the same inputs says what the function's state holds after each
epoch. The reader's rows (at the latest and an older epoch, in another number of partitions
than the job's) and the change feed of epochs 2..5 must equal it. One real Spark session
(the Spark tests' ``spark`` fixture), the checkpoint on local disk.
"""

from __future__ import annotations

import json
import operator
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException, PySparkException
from pyspark.sql import SparkSession
from statetier.backend import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
    load_config,
)
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.keygroups import assign_to_key_group
from statetier.backend.local_runner import LocalRunner
from statetier.backend.spark import StatefulPipeline
from statetier.backend.spark.state_source import PUSHDOWN_CONF, register_data_sources
from statetier.backend.ttl import ManualClock
from statetier.tools.bench import state_read

from tests.spark.spark_support import (
    VectorWordCount,
    expected_counts,
    run_available_now,
    zipf_words,
)

TTL_MS = 2500
EPOCH_MS = 1000
MAX_PARALLELISM = 128
TIMER_BASE = 1_000_000
TTL = StateTtlConfig(TTL_MS, incremental_cleanup_size=0)
COUNT = ValueStateDescriptor[int]("count")
SEEN = ListStateDescriptor[int]("seen")
ATTRS = MapStateDescriptor("attrs", ttl=TTL)
TOTAL = ReducingStateDescriptor[int]("total", reduce_function=operator.add)
LAST = ValueStateDescriptor[int]("last", ttl=TTL)
OFFSETS = ListStateDescriptor[int]("offsets")  # operator state
CLEAR = -1  # a record that clears its key's count


class Tracker(KeyedProcessFunction[str, int, None]):
    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(COUNT)
        self.seen = context.get_state(SEEN)
        self.attrs = context.get_state(ATTRS)
        self.total = context.get_state(TOTAL)
        self.last = context.get_state(LAST)
        self.offsets = context.get_list_state(OFFSETS)
        if not context.is_restored:
            self.offsets.add(context.index)  # one element per instance of the first run

    def process(self, key: str, value: int, context: RuntimeContext) -> list[None]:
        if value == CLEAR:
            self.count.clear()
            return []
        self.count.update((self.count.value() or 0) + 1)
        self.seen.add(value)
        self.attrs.put(f"a{value % 3}", value)
        self.total.add(value)
        self.last.update(value)
        context.timer_service.register_event_time_timer(TIMER_BASE + value % 5)
        return []


def epoch_inputs() -> list[list[tuple[str, int]]]:
    """Six epochs of records; a CLEAR is the only record of its key in its epoch, and only
    for a key with a count (so every touched key's count changes)."""
    rng = random.Random(41)
    counted: set[str] = set()
    epochs = []
    for _ in range(6):
        keys = rng.sample([f"k{i}" for i in range(40)], 25)
        records = []
        for key in keys:
            if key in counted and rng.random() < 0.2:
                records.append((key, CLEAR))
                counted.discard(key)
            else:
                records += [(key, rng.randrange(1, 100)) for _ in range(rng.randrange(1, 3))]
                counted.add(key)
        epochs.append(records)
    return epochs


class Oracle:
    """The function's state after each epoch, from the inputs alone."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.seen: dict[str, list[int]] = {}
        self.attrs: dict[str, dict[str, tuple[int, int]]] = {}
        self.total: dict[str, int] = {}
        self.last: dict[str, tuple[int, int]] = {}
        self.timers: set[tuple[str, int]] = set()
        self.history: list[dict[str, Any]] = []
        self.count_changes: list[set[tuple[int, str, str, int | None]]] = []

    def epoch(self, epoch: int, records: list[tuple[str, int]]) -> None:
        now = epoch * EPOCH_MS
        for key, value in records:
            if value == CLEAR:
                self.count.pop(key, None)
                continue
            self.count[key] = self.count.get(key, 0) + 1
            self.seen.setdefault(key, []).append(value)
            self.attrs.setdefault(key, {})[f"a{value % 3}"] = (value, now)
            self.total[key] = self.total.get(key, 0) + value
            self.last[key] = (value, now)
            self.timers.add((key, TIMER_BASE + value % 5))
        touched = {key for key, _ in records}
        self.count_changes.append(
            {
                (epoch, "update", k, self.count[k])
                if k in self.count
                else (epoch, "delete", k, None)
                for k in touched
            }
        )
        self.history.append(self.rows(now))

    def rows(self, now: int) -> dict[str, Any]:
        """Per state, the rows the reader shows at ``now`` (expired ones out) and all."""

        def alive(stamp: int) -> bool:
            return stamp + TTL_MS > now

        attrs_all = {
            (k, u, v, s + TTL_MS) for k, m in self.attrs.items() for u, (v, s) in m.items()
        }
        last_all = {(k, v, s + TTL_MS) for k, (v, s) in self.last.items()}
        return {
            "count": {(k, v) for k, v in self.count.items()},
            "seen": sorted((k, v) for k, vs in self.seen.items() for v in vs),
            "total": {(k, v) for k, v in self.total.items()},
            "attrs": {r for r in attrs_all if alive(r[3] - TTL_MS)},
            "attrs_all": attrs_all,
            "last": {r for r in last_all if alive(r[2] - TTL_MS)},
            "last_all": last_all,
            "timers": set(self.timers),
        }


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Oracle]:
    """The checkpoint of the 6-epoch job, and its oracle."""
    uri = f"file://{tmp_path_factory.mktemp('state-source')}/ckpt"
    config = load_config({"checkpoint.retained": 10, "compaction.delta-trigger": 2}, env={})
    clock = ManualClock(0)
    oracle = Oracle()
    runner = LocalRunner(
        Tracker, 2, max_parallelism=MAX_PARALLELISM, checkpoint_uri=uri, clock=clock, config=config
    )
    for epoch, records in enumerate(epoch_inputs(), start=1):
        if epoch == 4:  # rescale: the ranges of epoch 4 are new bases
            runner.close()
            runner = LocalRunner(Tracker, 3, checkpoint_uri=uri, clock=clock, config=config)
        clock.set(epoch * EPOCH_MS)
        runner.run_epoch(records)
        oracle.epoch(epoch, records)
    runner.close()
    return uri, oracle


@pytest.fixture(scope="module")
def reader(spark: SparkSession) -> Iterator[SparkSession]:
    """The session with the data sources registered and Python filter pushdown on."""
    before = str(spark.conf.get(PUSHDOWN_CONF, "false"))
    spark.conf.set(PUSHDOWN_CONF, "true")
    register_data_sources(spark)
    yield spark
    spark.conf.set(PUSHDOWN_CONF, before)


def load(spark: SparkSession, uri: str, **options: Any) -> Any:
    read = spark.read.format("statetier").option("path", uri)
    for name, value in options.items():
        read = read.option(name, value)
    return read.load()


def state_rows(spark: SparkSession, uri: str, state: str, epoch: int, **options: Any) -> Any:
    now = epoch * EPOCH_MS
    rows = load(spark, uri, state=state, epoch=epoch, processing_time=now, **options).collect()
    for row in rows:
        assert row.key_group == assign_to_key_group(row.key, MAX_PARALLELISM)
    return rows


def _ms(timestamp: Any) -> int:
    ms: int = round(timestamp.timestamp() * 1000)
    return ms


@pytest.mark.parametrize("epoch", [6, 3])
def test_the_reader_shows_what_the_function_holds(
    reader: SparkSession, job: tuple[str, Oracle], epoch: int
) -> None:
    uri, oracle = job
    want = oracle.history[epoch - 1]
    rows = {s: state_rows(reader, uri, s, epoch, partitions=5) for s in ("count", "seen", "total")}
    assert {(r.key, json.loads(r.value)) for r in rows["count"]} == want["count"]
    assert {(r.key, json.loads(r.value)) for r in rows["total"]} == want["total"]
    # one row per list element
    assert sorted((r.key, json.loads(r.value)) for r in rows["seen"]) == want["seen"]
    attrs = state_rows(reader, uri, "attrs", epoch, partitions=5)
    assert {(r.key, r.user_key, json.loads(r.value), _ms(r.expires_at)) for r in attrs} == (
        want["attrs"]
    )
    last = state_rows(reader, uri, "last", epoch)
    assert {(r.key, json.loads(r.value), _ms(r.expires_at)) for r in last} == want["last"]


def test_expired_entries_are_hidden_unless_asked(
    reader: SparkSession, job: tuple[str, Oracle]
) -> None:
    uri, oracle = job
    want = oracle.history[-1]
    assert want["attrs"] < want["attrs_all"], "the job should leave expired entries"
    every = state_rows(reader, uri, "attrs", 6, include_expired=True)
    assert {(r.key, r.user_key, json.loads(r.value), _ms(r.expires_at)) for r in every} == (
        want["attrs_all"]
    )
    last = state_rows(reader, uri, "last", 6, include_expired="true")
    assert {(r.key, json.loads(r.value), _ms(r.expires_at)) for r in last} == want["last_all"]


def test_timers_are_read_per_key_and_timestamp(
    reader: SparkSession, job: tuple[str, Oracle]
) -> None:
    uri, oracle = job
    rows = load(reader, uri, readRegisteredTimers=True).collect()
    assert {(r.key, r.timestamp) for r in rows} == oracle.history[-1]["timers"]
    assert {r.domain for r in rows} == {"event-time"}


def test_operator_state_is_read_per_instance(reader: SparkSession, job: tuple[str, Oracle]) -> None:
    uri, _ = job
    rows = load(reader, uri, state="offsets", operatorState=True).collect()
    # the first run's two instances each added its index; the rescale to 3 split them
    assert sorted(json.loads(r.value) for r in rows) == [0, 1]
    assert {r.instance for r in rows} <= {0, 1, 2} and {r.mode for r in rows} == {"split"}


def test_the_change_feed_of_epochs_2_to_5(reader: SparkSession, job: tuple[str, Oracle]) -> None:
    uri, oracle = job
    rows = load(
        reader, uri, state="count", readChangeFeed=True, changeStartEpoch=2, changeEndEpoch=5
    ).collect()
    got = {
        (r.epoch, r.change_type, r.key, None if r.value is None else json.loads(r.value))
        for r in rows
    }
    assert len(got) == len(rows), "a change was reported twice"
    assert got == set().union(*oracle.count_changes[1:5])
    assert {r.change_type for r in rows} == {"update", "delete"}


def test_a_key_and_a_key_group_range_are_pushed_down(
    reader: SparkSession, job: tuple[str, Oracle]
) -> None:
    uri, oracle = job
    df = load(reader, uri, state="count")
    key, count = sorted(oracle.history[-1]["count"])[3]
    assert [(r.key, int(r.value)) for r in df.where(df.key == key).collect()] == [(key, count)]
    low = df.where((df.key_group >= 10) & (df.key_group < 40)).collect()
    assert {(r.key, int(r.value)) for r in low} == {
        (k, v)
        for k, v in oracle.history[-1]["count"]
        if 10 <= assign_to_key_group(k, MAX_PARALLELISM) < 40
    }
    ranged = load(reader, uri, state="count", key_groups="10-39").collect()
    assert sorted(ranged) == sorted(low)


def test_the_metadata_view_lists_the_states(reader: SparkSession, job: tuple[str, Oracle]) -> None:
    uri, _ = job
    rows = {
        r.state: r
        for r in reader.read.format("statetier-metadata").option("path", uri).load().collect()
    }
    user = {name for name, r in rows.items() if not r.internal}
    assert user == {"count", "seen", "attrs", "total", "last", "offsets"}
    offsets = rows["offsets"]
    assert (offsets.kind, offsets.redistribution, offsets.elements) == ("operator", "split", 2)
    assert (rows["attrs"].kind, rows["attrs"].ttl_ms, rows["attrs"].user_key_serializer) == (
        "map",
        TTL_MS,
        "msgpack",
    )
    assert rows["total"].kind == "reducing" and rows["count"].ttl_ms is None
    assert {(r.epoch, r.max_parallelism, r.parallelism) for r in rows.values()} == {
        (6, MAX_PARALLELISM, 3)
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"state": "cuont"}, "no keyed state 'cuont' in epoch 6 of file://.*did you mean 'count'"),
        ({"state": "count", "epoch": 9}, "epoch 9 is not committed under .*committed: 1..6"),
        ({"state": "count", "epoch": "x"}, "option epoch='x': give an integer >= 1"),
    ],
)
def test_bad_options_fail_with_one_line(
    reader: SparkSession, job: tuple[str, Oracle], options: dict[str, Any], message: str
) -> None:
    uri, _ = job
    with pytest.raises((AnalysisException, PySparkException)) as failure:
        _ = load(reader, uri, **options).schema
    assert failure.match(message)


def test_a_location_without_a_commit_is_named(reader: SparkSession, tmp_path: Path) -> None:
    with pytest.raises((AnalysisException, PySparkException), match="no committed epoch under"):
        _ = load(reader, f"file://{tmp_path}/empty", state="count").schema


def test_it_reads_what_a_spark_streaming_job_committed(
    reader: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    source, uri = tmp_path / "in", f"file://{tmp_path}/ckpt"
    source.mkdir()
    batches = [zipf_words(600, 80, seed) for seed in range(2)]
    for i, batch in enumerate(batches):  # a micro-batch per file, oldest first
        (source / f"part-{i}.csv").write_text("\n".join(batch) + "\n")
        os.utime(source / f"part-{i}.csv", (1_000_000 + i, 1_000_000 + i))
    pipeline = StatefulPipeline(
        VectorWordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=2,
        config={"checkpoint.uri": uri},
    )
    pipelines.append(pipeline)
    words = reader.readStream.schema("word string").option("maxFilesPerTrigger", 1).csv(str(source))

    def sink(out: Any, epoch: int) -> None:
        out.collect()  # the epoch's tasks run (and commit) when its output is consumed

    run_available_now(pipeline.write_stream(words, sink), tmp_path / "spark")
    assert [r.epoch for r in pipeline.reports] == [1, 2]
    rows = load(reader, uri, state="count", partitions=3).collect()
    assert {r.key: json.loads(r.value) for r in rows} == expected_counts(batches)
    changes = load(reader, uri, state="count", readChangeFeed=True, changeStartEpoch=2).collect()
    total = expected_counts(batches)
    assert {(r.epoch, r.key, json.loads(r.value)) for r in changes} == {
        (2, word, total[word]) for word in set(batches[1])
    }


def test_the_state_read_benchmark_reads_both_states_whole(
    reader: SparkSession, tmp_path: Path
) -> None:
    """``statetier bench state-read`` at a small size: both readers checked against the
    expected counts, timed side by side (the figures are the benchmark's own business)."""
    result = state_read.run(reader, 2000, 1, 2, False, tmp_path)
    assert result["keys"] == 2000 and result["spark_state"] == "aggregation"
    assert [len(result["seconds"][side]) for side in ("spark", "statetier")] == [1, 1]
    assert (
        result["ratio"] == result["median_seconds"]["spark"] / result["median_seconds"]["statetier"]
    )
