"""``statetier bench state-read``: reading a state of many keys as a DataFrame, statetier's
``format("statetier")`` against Spark's own ``format("statestore")``, in one run.

The same keys (``--keys``, 1M by default: ``key-0000001``, ...) each get a count in state twice,
untimed:

- Spark, one micro-batch on the RocksDB state store: with ``--spark-state tws`` a
  ``transformWithStateInPandas`` query (``spark_baselines.TwsCount``) whose ValueState ``count``
  holds each key's count; by default a streaming ``groupBy(key).count()``, whose state holds
  the same counts and is read by the same ``statestore`` source from the same store, and which
  writes 1M keys in seconds where transformWithStateInPandas calls Python per key (about a
  hundred keys a second on a shared 2-core machine: hours for 1M);
- statetier: a local runner job (``ValueStateDescriptor("count")``, the same counts) committing
  one epoch to a ``file://`` checkpoint.

Then, on one ``local[2]`` session, ``--repeats`` times, which side goes first alternating, each
reader's whole DataFrame (every column) is written to Spark's ``noop`` sink:
``format("statestore")`` (``stateVarName=count`` for the transformWithState state), in
``--partitions`` tasks (one per shuffle partition of the query that wrote it), against
``format("statetier")`` with ``state=count``, in as many key-group ranges as the reader chooses
by default (``--statetier-partitions`` to force a count). Both are checked to hold every key once
with its count. Reported: the median seconds and rows/s of each, their ratio, each side's tasks
and the machine's load average (both sides share its cores). Target: statetier reads at least
as fast (ratio >= 1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from statetier.backend.helptext import plain
from statetier.tools.bench import print_table
from statetier.tools.bench.spark_wordcount import run_query, spark_session, stream

TARGET = 1.0  # statetier rows/s over Spark's statestore rows/s


def key_name(i: int) -> str:
    return f"key-{i:07d}"


def write_keys(keys: int, directory: Path) -> None:
    """The input of both jobs: key i appears ``i % 3 + 1`` times (its count)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    words = [key_name(i) for i in range(keys) for _ in range(i % 3 + 1)]
    pq.write_table(pa.table({"word": words}), directory / "part-000.parquet")


def build_spark_state(spark: Any, source: Path, checkpoint: Path, tws: bool) -> float:
    """The Spark query's state (see the module's docstring); its seconds."""
    from statetier.tools.bench.spark_baselines import TwsCount

    if not tws:
        counts = stream(spark, source).groupBy("word").count()
        return run_query(counts.writeStream.outputMode("update").format("noop"), checkpoint)
    counts = (
        stream(spark, source)
        .groupBy("word")
        .transformWithStateInPandas(
            statefulProcessor=TwsCount(),
            outputStructType="word string, count long",
            outputMode="Update",
            timeMode="None",
        )
    )
    return run_query(counts.writeStream.outputMode("update").format("noop"), checkpoint)


def build_statetier_state(keys: int, uri: str, parallelism: int) -> float:
    """The same counts in a statetier checkpoint (one epoch); its seconds."""
    from statetier.backend.local_runner import LocalRunner
    from statetier.tools.wordcount import WordCount

    started = time.perf_counter()
    runner = LocalRunner(WordCount, parallelism, checkpoint_uri=uri)
    try:
        runner.run_epoch((key_name(i), 1) for i in range(keys) for _ in range(i % 3 + 1))
    finally:
        runner.close()
    return time.perf_counter() - started


def spark_reader(spark: Any, checkpoint: Path, tws: bool) -> Any:
    reader = spark.read.format("statestore").option("path", str(checkpoint))
    return (reader.option("stateVarName", "count") if tws else reader).load()


def statetier_reader(spark: Any, uri: str, partitions: int | None = None) -> Any:
    """The statetier reader of the counts, in ``partitions`` tasks (None: its default)."""
    reader = spark.read.format("statetier").option("path", uri).option("state", "count")
    return (reader if partitions is None else reader.option("partitions", partitions)).load()


def timed_scan(df: Any) -> float:
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def check_counts(spark: Any, df: Any, key: str, value: str, keys: int) -> None:
    """Every key once, with its count (``key`` and ``value`` are SQL expressions of ``df``)."""
    from pyspark.sql import functions as sf

    checked = df.select(sf.expr(key).alias("k"), sf.expr(value).cast("long").alias("v"))
    expected = spark.range(keys).select(
        sf.format_string("key-%07d", "id").alias("k"), ((sf.col("id") % 3) + 1).alias("v")
    )
    wrong = checked.exceptAll(expected).count() + expected.exceptAll(checked).count()
    if wrong:
        raise RuntimeError(f"{wrong} rows of {key}/{value} differ from the expected counts")


def run(
    spark: Any,
    keys: int,
    repeats: int,
    partitions: int,
    tws: bool,
    work: Path,
    statetier_partitions: int | None = None,
) -> dict[str, Any]:
    """The benchmark on ``spark`` (with the statetier data sources registered)."""
    source, spark_ckpt, uri = work / "in", work / "tws-ckpt", f"file://{work}/statetier"
    write_keys(keys, source)
    build_seconds = {
        "spark": build_spark_state(spark, source, spark_ckpt, tws),
        "statetier": build_statetier_state(keys, uri, partitions),
    }
    readers = {
        "spark": spark_reader(spark, spark_ckpt, tws),
        "statetier": statetier_reader(spark, uri, statetier_partitions),
    }
    check_counts(spark, readers["spark"], "key.word", "value.count", keys)
    check_counts(spark, readers["statetier"], "key", "value", keys)
    times: dict[str, list[float]] = {"spark": [], "statetier": []}
    loads = [os.getloadavg()[0]]
    for repeat in range(repeats):
        order = ["spark", "statetier"] if repeat % 2 == 0 else ["statetier", "spark"]
        for side in order:
            times[side].append(timed_scan(readers[side]))
        loads.append(os.getloadavg()[0])
    medians = {side: statistics.median(values) for side, values in times.items()}
    ratio = medians["spark"] / medians["statetier"]
    return {
        "keys": keys,
        "partitions": partitions,
        "tasks": {side: df.rdd.getNumPartitions() for side, df in readers.items()},
        "load_average": [min(loads), max(loads)],
        "spark_state": "transformWithStateInPandas" if tws else "aggregation",
        "build_seconds": build_seconds,
        "seconds": times,
        "median_seconds": medians,
        "rows_per_s": {side: keys / seconds for side, seconds in medians.items()},
        "ratio": ratio,
        "meets_target": ratio >= TARGET,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="statetier bench state-read", description=plain(__doc__))
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--statetier-partitions",
        type=int,
        default=None,
        help="the statetier reader's tasks (default: its own choice, by the state's size)",
    )
    parser.add_argument(
        "--spark-state",
        choices=["aggregation", "tws"],
        default="aggregation",
        help="the Spark state read: a streaming aggregation's, or a transformWithState ValueState",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="statetier-bench-state-read-") as work:
        from statetier.backend.spark import register_data_sources

        spark = spark_session(args.partitions)
        register_data_sources(spark)
        tws = args.spark_state == "tws"
        try:
            result = run(
                spark,
                args.keys,
                args.repeats,
                args.partitions,
                tws,
                Path(work),
                args.statetier_partitions,
            )
        finally:
            spark.stop()
    if args.json:
        print(json.dumps(result))
    else:
        report(result)
    return 0 if result["meets_target"] else 1


def report(result: dict[str, Any]) -> None:
    rows = [
        [
            side,
            f"{result['median_seconds'][side]:.2f}",
            f"{result['rows_per_s'][side]:,.0f}",
            f"{result['build_seconds'][side]:.1f}",
            str(result["tasks"][side]),
        ]
        for side in ("statetier", "spark")
    ]
    print_table(
        f"reading the state of {result['keys']:,} keys, {result['partitions']} partitions, "
        f"Spark's from {result['spark_state']} (median)",
        ["reader", "seconds", "rows/s", "build s", "tasks"],
        rows,
    )
    verdict = "meets" if result["meets_target"] else "misses"
    low, high = result["load_average"]
    print(
        f"statetier / statestore: {result['ratio']:.2f}x ({verdict} the target: at least "
        f"{TARGET:.0f}x), load average {low:.1f}-{high:.1f}"
    )
