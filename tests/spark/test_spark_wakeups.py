"""Timers that fire without new input, on real Spark (local[2]): the wake-up micro-batches.

A ``write_stream`` query asks Spark for a micro-batch without input when its timers are due
(statetier.backend.spark.wakeups): processing-time timers by the clock, event-time timers once
after the input moved the watermark, as Spark's own stateful operators do. The sessionization of
examples/06-spark-sessions is run on a stream that stops, against the example's oracle and
against ``transformWithStateInPandas`` on the same files.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.spark import KeyGroupFunction, StatefulPipeline
from statetier.backend.spark.wakeups import emits_from_timers

from tests.spark.spark_support import run_available_now
from tests.spark.timer_support import SCHEMA, DelayedTimer, EventTimer, SilentTimer

pytestmark = pytest.mark.slow  # several timed streaming runs

EXAMPLE = Path(__file__).parents[2] / "examples" / "06-spark-sessions" / "example.py"
LATE_BOUND_S = 15.0  # a timer's micro-batch, on two cores shared with other Spark tests


def load_example() -> ModuleType:
    """examples/06-spark-sessions as a module; its function travels by value to the hosts."""
    spec = importlib.util.spec_from_file_location("spark_sessions_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[spec.name] = module
    cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    return module


def make(
    pipelines: list[StatefulPipeline], function: Any, tmp_path: Path, **kwargs: Any
) -> StatefulPipeline:
    pipeline = StatefulPipeline(
        function,
        key=kwargs.pop("key", "key"),
        output_schema=kwargs.pop("output_schema", SCHEMA),
        parallelism=kwargs.pop("parallelism", 2),
        config={"checkpoint.uri": f"file://{tmp_path}/ckpt"},
        **kwargs,
    )
    pipelines.append(pipeline)
    return pipeline


def write_file(directory: Path, i: int, lines: list[str]) -> None:
    directory.mkdir(exist_ok=True)
    path = directory / f"part-{i:03d}.csv"
    path.write_text("".join(f"{line}\n" for line in lines))
    os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # the source reads in this order


class Arrivals:
    """A sink that notes when each row arrived (wall clock) and in which epoch."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, tuple[Any, ...]]] = []
        self.lock = threading.Lock()

    def __call__(self, df: DataFrame, epoch: int) -> None:
        rows = [tuple(r) for r in df.collect()]
        now = time.time()
        with self.lock:
            self.rows.extend((now, epoch, row) for row in rows)

    def wait_for(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.rows) < count and time.monotonic() < deadline:
            time.sleep(0.1)


def test_processing_time_timers_fire_on_a_quiet_stream(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    """One file sets processing-time timers 4 s and 8 s after its micro-batch's time, then no
    input comes: each fires in a micro-batch of its own, soon after it is due, and the query
    then waits."""
    pipeline = make(pipelines, DelayedTimer, tmp_path)
    delays = {"a": 4_000, "b": 8_000, "c": 8_000}
    write_file(tmp_path / "in", 0, [f"{k},proc,{ms}" for k, ms in delays.items()])
    stream = spark.readStream.schema("key string, op string, ts bigint").csv(str(tmp_path / "in"))
    sink = Arrivals()
    query = (
        pipeline.write_stream(stream, sink)
        .option("checkpointLocation", str(tmp_path / "spark"))
        .start()
    )
    try:
        sink.wait_for(3, timeout=90)
        time.sleep(2)  # nothing is due any more: no micro-batch may follow
        epochs = [r.epoch for r in pipeline.reports]
    finally:
        query.stop()
    fired = {row[0]: (arrived, epoch, row) for arrived, epoch, row in sink.rows}
    assert sorted(fired) == ["a", "b", "c"]
    assert (
        fired["b"][2][2] - fired["a"][2][2] == 4_000 == fired["b"][2][2] - fired["c"][2][2] + 4_000
    )
    for key, (arrived, epoch, row) in fired.items():
        assert row[1] == "proc" and epoch > 1  # a micro-batch without input
        late = arrived - row[2] / 1000
        print(f"\nthe timer of {key} arrived {late:.2f} s after it was due")
        assert 0 <= late < LATE_BOUND_S, f"timer of {key} arrived {late:.1f} s after it was due"
    # the input's epoch, then one per due time (b and c share one; a first micro-batch slower
    # than 4 s, on a loaded machine, makes a due with them): no micro-batch fired nothing
    assert epochs[0] == 1 and len(epochs) in (2, 3), epochs
    assert sorted({epoch for _, epoch, _ in sink.rows}) == epochs[1:], (epochs, sink.rows)
    assert [r.records for r in pipeline.reports] == [3] + [0] * (len(epochs) - 1)


def test_an_available_now_run_fires_the_timers_due_at_its_final_watermark(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    """Event-time timers at each click + 1 s, watermark = the latest click (no delay): the
    run ends with a micro-batch without input that fires what the last file's clicks made due."""
    files = [[(f"k{j}", b * 3_000 + j * 300) for j in range(8)] for b in range(3)]
    for i, clicks in enumerate(files):
        write_file(tmp_path / "in", i, [f"{k},{ts}" for k, ts in clicks])
    pipeline = make(pipelines, EventTimer, tmp_path)
    stream = (
        spark.readStream.schema("key string, ts bigint")
        .option("maxFilesPerTrigger", 1)
        .csv(str(tmp_path / "in"))
        .withColumn("t", sf.timestamp_millis("ts"))
        .withWatermark("t", "0 seconds")
        .select("key", "ts")
    )
    sink = Arrivals()
    run_available_now(pipeline.write_stream(stream, sink), tmp_path / "spark")
    final_watermark = max(ts for _, ts in files[-1])
    timers = {(k, ts + EventTimer.GAP) for clicks in files for k, ts in clicks}
    due = {t for t in timers if t[1] <= final_watermark}
    fired = [(row[0], row[2]) for _, _, row in sink.rows]
    assert sorted(fired) == sorted(due)  # each once, the later ones wait for more event time
    before = max(ts for _, ts in files[-2])  # the last input micro-batch's watermark
    last = [(row[0], row[2]) for _, epoch, row in sink.rows if epoch == 4]
    assert last and sorted(last) == sorted(t for t in due if t[1] > before)
    assert [r.records for r in pipeline.reports] == [8, 8, 8, 0]


def test_a_wake_up_micro_batch_runs_again_exactly_after_a_failed_sink(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    """The sink of the micro-batch without input fails: the query stops uncommitted; the query
    restarted by a new driver-side pipeline runs that batch again with Spark's offsets and
    watermark, and its timers fire once in the output that is kept."""
    files = [[(f"k{j}", b * 3_000 + j * 100) for j in range(6)] for b in range(2)]
    for i, clicks in enumerate(files):
        write_file(tmp_path / "in", i, [f"{k},{ts}" for k, ts in clicks])
    kept: dict[int, list[tuple[Any, ...]]] = {}  # the last delivery of each batch id

    def sink(fail: bool) -> Any:
        def write(df: DataFrame, epoch: int) -> None:
            rows = [tuple(r) for r in df.collect()]
            if fail and epoch == 3:
                raise RuntimeError("the sink fails on the wake-up micro-batch")
            kept[epoch] = rows

        return write

    def run(fail: bool) -> StatefulPipeline:
        pipeline = make(pipelines, EventTimer, tmp_path)
        stream = (
            spark.readStream.schema("key string, ts bigint")
            .option("maxFilesPerTrigger", 1)
            .csv(str(tmp_path / "in"))
            .withColumn("t", sf.timestamp_millis("ts"))
            .withWatermark("t", "0 seconds")
            .select("key", "ts")
        )
        query = (
            pipeline.write_stream(stream, sink(fail))
            .option("checkpointLocation", str(tmp_path / "spark"))
            .trigger(availableNow=True)
            .start()
        )
        if fail:
            with pytest.raises(Exception, match="fails on the wake-up"):
                query.awaitTermination(180)
        else:
            query.awaitTermination(180)
        query.stop()
        pipeline.stop_hosts()
        return pipeline

    first = run(fail=True)
    assert [r.epoch for r in first.reports] == [1, 2]
    second = run(fail=False)
    assert [r.epoch for r in second.reports] == [3] and second.reports[0].records == 0
    final_watermark = max(ts for _, ts in files[-1])
    timers = {(k, ts + EventTimer.GAP) for clicks in files for k, ts in clicks}
    fired = [(row[0], row[2]) for rows in kept.values() for row in rows]
    assert sorted(fired) == sorted(t for t in timers if t[1] <= final_watermark)
    assert {row[4] for row in kept[3]} == {final_watermark}  # Spark's watermark, kept


def session_files(
    example: ModuleType, directory: Path, files: int | None = None
) -> list[list[tuple[str, int]]]:
    """The example's clicks in its files (or in ``files`` larger ones), one per micro-batch."""
    events = example.clicks()
    size = -(-len(events) // (files or example.FILES))
    batches: list[list[tuple[str, int]]] = [
        events[i : i + size] for i in range(0, len(events), size)
    ]
    directory.mkdir()
    example.write_files(directory.parent, batches, range(len(batches)))
    return batches


def clicks_stream(spark: SparkSession, directory: Path) -> DataFrame:
    return (
        spark.readStream.schema("user string, ts bigint")
        .option("maxFilesPerTrigger", 1)
        .csv(str(directory))
        .withColumn("event_time", sf.timestamp_millis("ts"))
        .withWatermark("event_time", "0 seconds")
    )


def test_the_last_sessions_are_emitted_soon_after_the_stream_stops(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    """examples/06-spark-sessions' function on a query that keeps running after its last file:
    the sessions the last watermark closed come within a bound, in the epoch the oracle says."""
    example = load_example()
    batches = session_files(example, tmp_path / "in")
    pipeline = make(
        pipelines,
        example.Sessions,
        tmp_path,
        key="user",
        output_schema="user string, start bigint, end bigint, clicks bigint",
    )
    sink = Arrivals()
    stream = clicks_stream(spark, tmp_path / "in").select("user", "ts")
    query = (
        pipeline.write_stream(stream, sink)
        .option("checkpointLocation", str(tmp_path / "spark"))
        .start()
    )
    epochs = [*batches, []]  # the input, then a micro-batch without it
    expected = [s for s in example.oracle(epochs) if s[0] <= len(epochs)]  # not still open
    try:
        sink.wait_for(len(expected), timeout=240)
        time.sleep(2)  # nothing else is due: no micro-batch may follow
        reports = list(pipeline.reports)
    finally:
        query.stop()
    assert sorted((epoch, row) for _, epoch, row in sink.rows) == expected
    assert [r.records for r in reports] == [len(b) for b in batches] + [0]
    last_input = reports[-2]
    assert last_input.epoch == len(batches)
    closed_by_watermark = [t for t, epoch, _ in sink.rows if epoch == len(epochs)]
    assert closed_by_watermark, "the last watermark closes some sessions"
    input_done = max(t for t, epoch, _ in sink.rows if epoch == len(batches))
    waited = max(closed_by_watermark) - input_done
    print(f"\nthe last sessions came {waited:.2f} s after the last input's")
    assert waited < LATE_BOUND_S, f"the last sessions came {waited:.1f} s after the input's"


def test_the_session_count_equals_transform_with_state_in_pandas(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    """The same click files, each an availableNow micro-batch: examples/06-spark-sessions'
    function and the same sessionization as a StatefulProcessor (event time, append) emit the
    same sessions; Spark's no-data micro-batch and statetier's wake-up close the same ones."""
    pytest.importorskip("pandas")
    from statetier.tools.bench.spark_baselines import TwsSessions

    example = load_example()
    assert example.GAP == 30_000  # TwsSessions' gap (tools' SESSION_GAP_MS)
    # 4 micro-batches, not the example's 12: transformWithStateInPandas takes about 8 s each here
    session_files(example, tmp_path / "in", files=4)
    pipeline = make(
        pipelines,
        example.Sessions,
        tmp_path,
        key="user",
        output_schema="user string, start bigint, end bigint, clicks bigint",
    )
    ours: list[tuple[Any, ...]] = []
    theirs: list[tuple[Any, ...]] = []

    def collect(out: list[tuple[Any, ...]]) -> Any:
        return lambda df, _: out.extend(tuple(r) for r in df.collect())

    stream = clicks_stream(spark, tmp_path / "in")
    run_available_now(
        pipeline.write_stream(stream.select("user", "ts"), collect(ours)), tmp_path / "spark-st"
    )
    provider = "spark.sql.streaming.stateStore.providerClass"
    spark.conf.set(
        provider, "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    )
    try:
        sessions = (
            stream.select("user", "ts", "event_time")
            .groupBy("user")
            .transformWithStateInPandas(
                statefulProcessor=TwsSessions(),
                outputStructType="user string, start long, end long, clicks long",
                outputMode="Append",
                timeMode="EventTime",
            )
        )
        writer = sessions.writeStream.outputMode("append").foreachBatch(collect(theirs))
        run_available_now(writer, tmp_path / "spark-tws")
    finally:
        spark.conf.unset(provider)
    assert len(ours) == len(theirs) and sorted(ours) == sorted(theirs)
    assert len(ours) > 250
    # the last micro-batch, without input, closed sessions in both (its watermark's timers)
    assert [r.records for r in pipeline.reports][-1] == 0


class _Factory(KeyedProcessFunction[str, Any, Any]):
    def __init__(self, delay: int) -> None:
        self.delay = delay

    def process(self, key: str, value: Any, context: RuntimeContext) -> list[Any]:
        return []


class _VectorTimers(KeyGroupFunction):
    def on_timer(self, timestamp: int, key: Any, context: RuntimeContext) -> list[Any]:
        return [(key, timestamp)]


def test_only_a_function_that_can_emit_from_its_timers_gets_the_wake_up_source(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    """The source costs a query Python processes on the driver; without ``on_timer`` nothing
    a wake-up fires could reach the sink."""
    assert emits_from_timers(EventTimer) and emits_from_timers(_VectorTimers)
    assert emits_from_timers(functools.partial(EventTimer))

    def factory() -> Any:
        return SilentTimer()

    assert emits_from_timers(factory)  # a factory that is not a class: it may
    assert not emits_from_timers(SilentTimer) and not emits_from_timers(KeyGroupFunction)
    assert not emits_from_timers(functools.partial(_Factory, 10))
    source = tmp_path / "in"
    write_file(source, 0, ["k1,1", "k2,2"])
    events = spark.readStream.schema("key string, ts bigint").csv(str(source))
    for function, sourced in ((SilentTimer, False), (EventTimer, True)):
        pipeline = make(pipelines, function, tmp_path / function.__name__)
        assert pipeline.emits_from_timers is sourced
        assert pickle.loads(pickle.dumps(pipeline)).emits_from_timers is sourced  # (Connect)
        run_available_now(pipeline.write_stream(events), tmp_path / function.__name__ / "q")
        assert (pipeline._wake_ups is not None) is sourced
        assert [r.epoch for r in pipeline.reports] == [1]  # (no watermark: no wake-up is due)


def test_the_request_folder_goes_with_close_or_with_the_driver(tmp_path: Path) -> None:
    """A pipeline whose release() is never called leaves no wake-up folder behind when its
    driver exits; close() removes it at once and may be called again."""
    script = (
        "from statetier.backend.spark.wakeups import WakeUps\n"
        "closed, kept = WakeUps(), WakeUps()\n"
        "closed.ask(5)\n"
        "kept.ask(7)\n"
        "closed.close()\n"
        "closed.close()\n"
        "print(closed.directory.exists(), kept.path.read_text(), kept.directory, sep='|')\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    exists, request, kept = done.stdout.strip().split("|")
    assert (exists, request) == ("False", '{"wake": 7}'), done.stdout
    assert Path(kept).parent == tmp_path
    assert not Path(kept).exists(), "the driver's exit left the wake-up folder"
