"""The streaming example docs/spark.md opens with: sessions per user from click files, with a
watermark, event-time timers, a Parquet sink written once per epoch, both checkpoint locations,
and the function's module shipped to the executors. Checked against the sessions computed here
in plain Python."""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from statetier.backend.spark import StatefulPipeline

HERE = Path(__file__).resolve().parent


def sessionize(spark: SparkSession, work: Path) -> None:
    """Read the click files as a stream, write each epoch's ended sessions to Parquet."""
    spark.sparkContext.addPyFile(str(HERE / "sessions.py"))  # the state hosts import it
    from sessions import Sessions

    pipeline = StatefulPipeline(
        Sessions,
        key="user",
        output_schema="user string, first bigint, last bigint, clicks bigint",
        parallelism=4,
        config={"checkpoint.uri": f"file://{work}/statetier"},  # or s3://bucket/prefix
    )
    clicks = (
        spark.readStream.schema("user string, ts bigint")
        .option("maxFilesPerTrigger", 1)
        .csv(str(work / "clicks"))
        .withColumn("event_time", sf.timestamp_millis("ts"))
        .withWatermark("event_time", "10 seconds")
        .select("user", "ts")  # the key column, then the value's
    )

    def sink(sessions: DataFrame, epoch: int) -> None:
        # Idempotent per epoch: a re-run of the epoch overwrites its own folder.
        sessions.write.mode("overwrite").parquet(str(work / "sessions" / f"epoch={epoch}"))

    query = (
        pipeline.write_stream(clicks, sink)
        .option("checkpointLocation", str(work / "spark"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    # The input is over: fire the timers of the sessions still open.
    pipeline.run(spark.createDataFrame([], "user string, ts bigint"), sink, end_of_input=True)
    pipeline.stop_hosts()


def write_clicks(folder: Path, files: int = 4) -> None:
    """Click files in event-time order, one micro-batch each; pauses longer than the gap."""
    rng, events = random.Random(7), []
    for user in [f"user-{i}" for i in range(20)]:
        ts = rng.randrange(60_000)
        for _ in range(rng.randrange(3, 25)):
            ts += rng.choice([2_000, 5_000, 40_000, 90_000])
            events.append((user, ts))
    events.sort(key=lambda e: e[1])
    folder.mkdir(parents=True)
    size = -(-len(events) // files)
    for i in range(files):
        path = folder / f"clicks-{i}.csv"
        path.write_text("".join(f"{user},{ts}\n" for user, ts in events[i * size : (i + 1) * size]))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # the source reads in this order


def expected_sessions(folder: Path, gap_ms: int) -> set[tuple[str, int, int, int]]:
    """Each user's clicks split where two clicks are the gap or more apart."""
    per_user: dict[str, list[int]] = {}
    for path in folder.glob("*.csv"):
        for line in path.read_text().splitlines():
            user, clicked = line.split(",")
            per_user.setdefault(user, []).append(int(clicked))
    out = set()
    for user, times in per_user.items():
        times.sort()
        session = [times[0]]
        for ts in times[1:]:
            if ts - session[-1] >= gap_ms:
                out.add((user, session[0], session[-1], len(session)))
                session = []
            session.append(ts)
        out.add((user, session[0], session[-1], len(session)))
    return out


def main() -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix="statetier-guide-"))
    try:
        write_clicks(work / "clicks")
        sessionize(spark, work)
        rows = spark.read.parquet(str(work / "sessions")).collect()
        found = [(r.user, r.first, r.last, r.clicks) for r in rows]
        from sessions import GAP_MS

        expected = expected_sessions(work / "clicks", GAP_MS)
        assert len(found) == len(set(found)), "a session was written twice"
        assert set(found) == expected, sorted(set(found) ^ expected)[:10]
        print(f"{len(found)} sessions from {len(rows)} rows, as computed without Spark")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
