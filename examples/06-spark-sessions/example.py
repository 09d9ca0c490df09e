"""Event-time sessions on Spark (local[2]): a streaming query with ``withWatermark``, a session
emitted by its event-time timer once the query's watermark passes its last click by the gap;
the query stops and restarts at another parallelism, and a final batch run flushes the sessions
still open (``end_of_input``). Each ``availableNow`` run ends with a micro-batch without input
that fires the timers its last watermark made due, as Spark's own stateful operators do. Every
session is checked against an oracle: emitted exactly once, in the micro-batch where its gap
timed out.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from statetier.backend import KeyedProcessFunction, RuntimeContext, ValueStateDescriptor
from statetier.backend.spark import StatefulPipeline

GAP = 30_000  # a session ends after 30 s of event time without a click
FILES = 12  # one file of clicks per micro-batch
Session = tuple[str, int, int, int]  # user, first click, last click, clicks


class Sessions(KeyedProcessFunction[str, int, Session]):
    def open(self, context: RuntimeContext) -> None:
        self.session = context.get_state(ValueStateDescriptor[list[int]]("session"))

    def process(self, key: str, value: int, context: RuntimeContext) -> list[Session]:
        timers = context.timer_service
        session, out = self.session.value(), []
        if session is not None:
            timers.delete_event_time_timer(session[1] + GAP)
            if value - session[1] >= GAP:  # over, though the watermark has not reached it yet
                out.append((key, *session))
                session = None
        start, end, clicks = session or (value, value, 0)
        self.session.update([min(start, value), max(end, value), clicks + 1])
        timers.register_event_time_timer(max(end, value) + GAP)
        return out

    def on_timer(self, timestamp: int, key: str, context: RuntimeContext) -> list[Session]:
        start, end, clicks = self.session.value() or (0, 0, 0)
        self.session.clear()
        return [(key, start, end, clicks)]


def clicks(seed: int = 11) -> list[tuple[str, int]]:
    """Clicks in time order: users click every few seconds, with pauses longer than the gap."""
    rng = random.Random(seed)
    events = []
    for user in [f"user-{i}" for i in range(30)]:
        t = rng.randrange(60_000)
        for _ in range(rng.randrange(5, 40)):
            t += rng.choice([1_000, 4_000, 9_000, 45_000, 120_000])
            events.append((user, t))
    return sorted(events, key=lambda e: e[1])


def oracle(epochs: list[list[tuple[str, int]]]) -> list[tuple[int, Session]]:
    """Each session and the epoch that must emit it: the first micro-batch whose watermark
    (the latest earlier click: no delay) reaches its end plus the gap, or that has the user's
    next click; else the final batch run (epoch ``len(epochs) + 1``). An empty epoch is a
    micro-batch without input, run for the timers its watermark made due."""
    watermarks: list[int | None] = []
    latest: int | None = None
    for batch in epochs:
        watermarks.append(latest)
        latest = max([t for _, t in batch] + ([latest] if latest is not None else []), default=None)
    clicks_of: dict[str, list[tuple[int, int]]] = {}
    for epoch, batch in enumerate(epochs, 1):
        for user, t in batch:
            clicks_of.setdefault(user, []).append((epoch, t))
    out = []
    for user, times in clicks_of.items():
        sessions: list[list[int]] = []  # start, end, clicks, epoch of the next click
        for epoch, t in times:
            if sessions and t - sessions[-1][1] < GAP:
                sessions[-1][1:3] = [t, sessions[-1][2] + 1]
            else:
                if sessions:
                    sessions[-1].append(epoch)
                sessions.append([t, t, 1])
        for start, end, n, *next_click in sessions:
            due = next(
                (
                    e
                    for e, mark in enumerate(watermarks, 1)
                    if mark is not None and mark >= end + GAP
                ),
                len(epochs) + 1,
            )
            out.append((min([due, *next_click]), (user, start, end, n)))
    return sorted(out)


def pipeline_at(work: Path, parallelism: int) -> StatefulPipeline:
    return StatefulPipeline(
        Sessions,
        key="user",
        output_schema="user string, start bigint, end bigint, clicks bigint",
        parallelism=parallelism,
        config={"checkpoint.uri": f"file://{work}/statetier"},
    )


def collect(out: list[tuple[int, Session]]) -> Any:
    def sink(df: DataFrame, epoch: int) -> None:
        rows = [(epoch, (r.user, r.start, r.end, r.clicks)) for r in df.collect()]
        out.extend(rows)
        print(f"epoch {epoch}: {len(rows)} sessions ended")

    return sink


def run_query(spark: SparkSession, work: Path, parallelism: int, out: list[Any]) -> None:
    """Process the click files not yet seen; the watermark is the latest click (no delay)."""
    pipeline = pipeline_at(work, parallelism)
    events = (
        spark.readStream.schema("user string, ts bigint")
        .option("maxFilesPerTrigger", 1)
        .csv(str(work / "in"))
        .withColumn("event_time", sf.timestamp_millis("ts"))
        .withWatermark("event_time", "0 seconds")
        .select("user", "ts")
    )
    query = (
        pipeline.write_stream(events, collect(out))
        .option("checkpointLocation", str(work / "spark"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    pipeline.stop_hosts()


def write_files(work: Path, batches: list[list[tuple[str, int]]], files: range) -> None:
    for i in files:
        path = work / "in" / f"clicks-{i:03d}.csv"
        path.write_text("".join(f"{user},{t}\n" for user, t in batches[i]))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # the source reads in this order


def main() -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix="statetier-spark-sessions-"))
    (work / "in").mkdir()
    events = clicks()
    size = -(-len(events) // FILES)
    batches = [events[i : i + size] for i in range(0, len(events), size)]
    out: list[tuple[int, Session]] = []
    try:
        half = len(batches) // 2
        write_files(work, batches, range(half))
        run_query(spark, work, 2, out)
        print(f"query stopped after {half} micro-batches; restarting with 3 ranges instead of 2")
        write_files(work, batches, range(half, len(batches)))
        run_query(spark, work, 3, out)
        streamed = len(out)
        flush = pipeline_at(work, 3)  # the input is over: fire every event-time timer
        flush.run(
            spark.createDataFrame([], "user string, ts bigint"), collect(out), end_of_input=True
        )
        flush.stop_hosts()
        # each run ended with a micro-batch without input: the timers of its last watermark
        epochs = [*batches[:half], [], *batches[half:], []]
        assert sorted(out) == oracle(epochs), "sessions differ from the oracle"
        print(
            f"{len(events)} clicks -> {len(out)} sessions, each emitted once, in the micro-batch "
            f"where its gap timed out ({streamed} by the streaming runs, "
            f"{len(out) - streamed} still open at the end of the input)"
        )
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
