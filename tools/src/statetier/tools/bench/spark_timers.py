"""``statetier bench timers``: sessionization with event-time timers on Spark, statetier against
``transformWithStateInPandas``, on the same input in the same run.

Users click at random (bursts a few seconds apart, pauses longer than the 30 s gap); the clicks,
in time order, are written once as Parquet files, one per micro-batch (``maxFilesPerTrigger=1``,
``availableNow``), and both pipelines read them with ``withWatermark(event_time, "0 seconds")``
on ``local[2]``:

- ``statetier``: ``StatefulPipeline.write_stream`` of ``spark_functions.ArrowSessions``, the
  sessionization a user writes for speed (a ``KeyGroupFunction``: the range's clicks sorted by
  user and time with Arrow, then per user the session in a ValueState and an event-time timer at
  its last click plus the gap, moved once per micro-batch; ``on_timer`` emits the session).
  Timers fire at each micro-batch's watermark.
- ``statetier_per_record`` (for information): ``spark_functions.Sessions``, the same as a
  ``KeyedProcessFunction`` called per click (a state read and a timer move per click).
- ``transform_with_state_in_pandas``: ``spark_baselines.TwsSessions``, the same logic as a
  ``StatefulProcessor`` (``timeMode="EventTime"``, RocksDB state store, append mode).

Both collect their sessions in ``foreachBatch`` (``toArrow``) and each is checked against one
oracle, the sessions closed by the last click: Spark runs a no-data micro-batch when the
watermark moves after the last file, and statetier a wake-up micro-batch for the timers that
watermark made due (spark.wakeups), so both emit the same sessions. records/s = clicks / wall
time of the query; each runs once, after an untimed warm-up on a small input.

First, before Spark starts, ``local_per_record``: the per-record ``Sessions`` on the LocalRunner
(``local_timers``, parallelism 2, ``--epochs`` epochs), its CPU microseconds per click in this
process, the median of ``--local-rounds`` runs; ``--local-only`` stops there.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from statetier.tools.bench import print_table
from statetier.tools.bench.local_timers import epochs_of, median_runs
from statetier.tools.bench.spark_functions import SESSION_GAP_MS, Sessions
from statetier.tools.bench.spark_wordcount import run_query, spark_session

Click = tuple[str, int]
Session = tuple[str, int, int, int]
TARGET = 10.0  # statetier / transformWithStateInPandas, records/s
SCHEMA = "user string, start long, end long, clicks long"


def clicks(count: int, users: int, seed: int = 17) -> list[Click]:
    """``count`` clicks of ``users`` users in time order."""
    rng = random.Random(seed)
    clock = {f"user-{i:06d}": rng.randrange(60_000) for i in range(users)}
    names = list(clock)
    out = []
    for _ in range(count):
        user = rng.choice(names)
        clock[user] += rng.choice([1_000, 4_000, 9_000, 45_000, 120_000])
        out.append((user, clock[user]))
    return sorted(out, key=lambda c: c[1])


def write_input(parts: list[list[Click]], directory: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    for i, part in enumerate(parts):
        users, times = zip(*part, strict=True) if part else ((), ())
        table = pa.table({"user": pa.array(users, pa.string()), "ts": pa.array(times, pa.int64())})
        path = directory / f"part-{i:03d}.parquet"
        pq.write_table(table, path)
        # the source reads files in modification-time order: make it the batches' order
        stamp = 1_700_000_000 + i
        os.utime(path, (stamp, stamp))


def closed_sessions(parts: list[list[Click]], watermark: int) -> list[Session]:
    """Sessions closed by a later click of their user, or whose gap ends at ``watermark``."""
    by_user: dict[str, list[int]] = {}
    for part in parts:
        for user, t in part:
            by_user.setdefault(user, []).append(t)
    out = []
    for user, times in by_user.items():
        start = end = times[0]
        n = 0
        for t in times:
            if t - end >= SESSION_GAP_MS:
                out.append((user, start, end, n))
                start, n = t, 0
            end, n = t, n + 1
        if end + SESSION_GAP_MS <= watermark:
            out.append((user, start, end, n))
    return sorted(out)


def events(spark: Any, source: Path) -> Any:
    from pyspark.sql import functions as sf

    return (
        spark.readStream.schema("user string, ts long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
        .withColumn("event_time", sf.timestamp_millis("ts"))
        .withWatermark("event_time", "0 seconds")
    )


def collector(out: list[Session]) -> Any:
    def sink(df: Any, _: int) -> None:
        table = df.toArrow()  # one Arrow collect: Row objects would cost both sides alike
        columns = [table[name].to_pylist() for name in ("user", "start", "end", "clicks")]
        out.extend(zip(*columns, strict=True))

    return sink


def bench_statetier(
    spark: Any,
    source: Path,
    work: Path,
    partitions: int,
    pipelines: list[Any],
    function: Any = None,
) -> tuple[float, list[Session]]:
    from statetier.backend.spark import StatefulPipeline
    from statetier.tools.bench.spark_functions import ArrowSessions

    pipeline = StatefulPipeline(
        function or ArrowSessions,
        key="user",
        output_schema=SCHEMA,
        parallelism=partitions,
        config={"checkpoint.uri": f"file://{work}/statetier"},
    )
    pipelines.append(pipeline)
    out: list[Session] = []
    stream = events(spark, source).select("user", "ts")
    elapsed = run_query(pipeline.write_stream(stream, collector(out)), work / "spark-ckpt")
    pipeline.release()
    return elapsed, out


def bench_tws(spark: Any, source: Path, work: Path) -> tuple[float, list[Session]]:
    from statetier.tools.bench.spark_baselines import TwsSessions

    out: list[Session] = []
    sessions = (
        events(spark, source)
        .select("user", "ts", "event_time")
        .groupBy("user")
        .transformWithStateInPandas(
            statefulProcessor=TwsSessions(),
            outputStructType=SCHEMA,
            outputMode="Append",
            timeMode="EventTime",
        )
    )
    writer = sessions.writeStream.outputMode("append").foreachBatch(collector(out))
    return run_query(writer, work / "tws-ckpt"), out


def local_per_record(data: list[Click], args: argparse.Namespace) -> dict[str, Any]:
    """The per-record ``Sessions`` on the LocalRunner (local_timers), checked against the
    oracle; its sessions themselves are left out of the report."""
    parts = epochs_of(data, args.epochs)
    result = median_runs(parts, args.local_rounds)
    expected = closed_sessions(parts, data[-1][1])
    result["sessions_exact"] = sorted(result.pop("sessions")) == expected
    result["floor_exact"] = sorted(result.pop("floor_sessions")) == expected
    return result


def local_line(local: dict[str, Any]) -> str:
    return (
        f"  local_per_record (LocalRunner, parallelism {local['parallelism']}, "
        f"{local['epochs']} epochs): {local['cpu_us_per_record']:.2f} CPU us/record, "
        f"{local['records_per_s']:,.0f} records/s (median of {local['rounds']}), "
        f"exact {local['sessions_exact']}; the hand-written floor "
        f"{local['floor_cpu_us_per_record']:.2f} CPU us/record, statetier "
        f"{local['ratio_to_floor']:.2f}x it"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="statetier bench timers")
    parser.add_argument("--clicks", type=int, default=250_000)
    parser.add_argument("--users", type=int, default=25_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=50, help="epochs of local_per_record")
    parser.add_argument("--local-rounds", type=int, default=5, help="runs of local_per_record")
    parser.add_argument("--local-only", action="store_true", help="only local_per_record")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    data = clicks(args.clicks, args.users)
    local = local_per_record(data, args)
    if args.local_only:
        print(json.dumps(local, indent=2) if args.json else local_line(local))
        return 0 if local["sessions_exact"] and local["floor_exact"] else 1
    size = -(-len(data) // args.batches)
    parts = [data[i : i + size] for i in range(0, len(data), size)]
    warm = clicks(2_000, 200, seed=3)
    work = Path(tempfile.mkdtemp(prefix="statetier-bench-timers-"))
    spark = spark_session(args.partitions)
    pipelines: list[Any] = []
    try:
        write_input(parts, work / "in")
        write_input([warm[:1_000], warm[1_000:]], work / "warm")
        bench_statetier(spark, work / "warm", work / "w-st", args.partitions, pipelines)
        bench_tws(spark, work / "warm", work / "w-tws")
        st_seconds, st_out = bench_statetier(
            spark, work / "in", work / "st", args.partitions, pipelines
        )
        rec_seconds, rec_out = bench_statetier(
            spark, work / "in", work / "rec", args.partitions, pipelines, Sessions
        )
        tws_seconds, tws_out = bench_tws(spark, work / "in", work / "tws")
    finally:
        for pipeline in pipelines:
            pipeline.stop_hosts()
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    expected = closed_sessions(parts, data[-1][1])  # the final watermark: the last click
    st_exact = sorted(st_out) == expected
    rec_exact = sorted(rec_out) == expected
    tws_exact = sorted(tws_out) == expected
    results = {
        name: {
            "records": len(data),
            "seconds": round(seconds, 3),
            "records_per_s": round(len(data) / seconds, 1),
            "sessions": len(out),
            "sessions_exact": exact,
        }
        for name, seconds, out, exact in [
            ("statetier", st_seconds, st_out, st_exact),
            ("statetier_per_record", rec_seconds, rec_out, rec_exact),
            ("transform_with_state_in_pandas", tws_seconds, tws_out, tws_exact),
        ]
    }
    ratio = tws_seconds / st_seconds
    report = {
        "benchmark": "timers",
        "clicks": args.clicks,
        "users": args.users,
        "batches": len(parts),
        "partitions": args.partitions,
        "pipelines": results,
        "local_per_record": local,
        "ratio": round(ratio, 3),
        "target": TARGET,
        "meets_target": ratio >= TARGET
        and st_exact
        and rec_exact
        and tws_exact
        and local["sessions_exact"]
        and local["floor_exact"],
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(
            f"timers: sessionization, {args.clicks:,} clicks of {args.users:,} users, "
            f"{len(parts)} micro-batches, {args.partitions} partitions, local[2]",
            ["pipeline", "records", "seconds", "records/s", "sessions", "exact"],
            [
                [
                    name,
                    f"{r['records']:,}",
                    f"{r['seconds']:.1f}",
                    f"{r['records_per_s']:,.0f}",
                    f"{r['sessions']:,}",
                    str(r["sessions_exact"]),
                ]
                for name, r in results.items()
            ],
        )
        print(f"  statetier / transform_with_state_in_pandas: {ratio:.1f}x (target >= {TARGET}x)")
        per_record = tws_seconds / rec_seconds
        print(f"  statetier_per_record / transform_with_state_in_pandas: {per_record:.1f}x")
        print(local_line(local))
    return 0 if report["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
