"""``statetier bench spark-wordcount --connect``: the word count on a Spark Connect session, next
to the same pipelines on a classic session, in one run.

The same Zipf words as ``spark-wordcount`` (Parquet, one file per micro-batch, ``availableNow``,
8 partitions) go through statetier's ``write_stream``, Spark's RocksDB ``groupBy().count()`` and
``foreach_batch``, a ``foreachBatch`` query of statetier's shape without state (each micro-batch
read by one task, its rows counted in Arrow, to the ``noop`` sink): what Spark's
``foreachBatch`` itself costs a query on each kind of session. They run first on a classic
``SparkSession`` of this process, then, after it stopped, on a local ``SparkConnectServer``
(statetier.tools.connect_server) running the same master and settings, whose client is this
process. On Connect statetier's coordinator (registry, commit, upkeep) runs in the server's
``foreachBatch`` process, so the counts are checked from the checkpoint.

Reported: records/s of each (median of ``--rounds`` after ``--warmups`` untimed runs, one by
default), statetier / RocksDB on Connect (target >= 1.5x), statetier on Connect / on classic
(target >= 0.9, within 10%) and, not judged, ``foreach_batch`` on Connect / on classic: the
same ratio for Spark's ``foreachBatch`` alone, against which statetier's can be read. Beside
them, where each query's wall time went (medians), from the micro-batches' times as Spark
measures them (``triggerExecution``): its start (before its first micro-batch; on Connect Spark
starts the ``foreachBatch`` process then), its first micro-batch, and the others, with the
records/s of the others alone and the same ratios of those rates (the rate of a query that runs
on, which the targets do not judge).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from statetier.backend.helptext import plain
from statetier.tools.bench import print_table
from statetier.tools.bench.spark_wordcount import (
    bench_statetier,
    checkpoint_counts,
    progress_seconds,
    run_rocksdb,
    run_streaming,
    spark_session,
    stream,
    write_input,
)
from statetier.tools.connect_server import ConnectServer
from statetier.tools.workloads import batches, zipf_words

TARGETS = {"connect_rocksdb": 1.5, "classic_statetier": 0.9}
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PHASES = ("start", "first_batch", "later_batches")


@dataclass(frozen=True)
class Timing:
    """One query's run: its wall seconds, whether its counts were exact (None: unchecked), and
    the seconds of each micro-batch as Spark measured it."""

    seconds: float
    exact: bool | None
    batch_seconds: list[float]

    def phases(self) -> dict[str, float]:
        """Where the wall time went: before the first micro-batch, the first, the others."""
        batches = self.batch_seconds
        return {
            "start": self.seconds - sum(batches),
            "first_batch": batches[0] if batches else 0.0,
            "later_batches": sum(batches[1:]),
        }


Run = Callable[[Path, Path], Timing]


def spark_batch_seconds(query: Any) -> list[float]:
    """The seconds of each micro-batch of ``query``, in batch order (see progress_seconds)."""
    return [seconds for _, seconds in sorted(progress_seconds(query).items())]


def rocksdb(spark: Any, source: Path, work: Path) -> Timing:
    """Spark's ``groupBy().count()`` on the RocksDB state store (the session's provider)."""
    elapsed, query = run_rocksdb(spark, source, work)
    return Timing(elapsed, None, spark_batch_seconds(query))


def foreach_batch(spark: Any, source: Path, work: Path) -> Timing:
    """A ``foreachBatch`` query of statetier's shape without state (foreach_batch_peer)."""
    from statetier.tools.bench.foreach_batch_peer import count_batch

    writer = stream(spark, source).writeStream.foreachBatch(count_batch)
    elapsed, query = run_streaming(writer, work / "foreach-batch-ckpt")
    return Timing(elapsed, None, spark_batch_seconds(query))


def connect_statetier(spark: Any, source: Path, work: Path, partitions: int) -> Timing:
    """statetier's ``write_stream`` on the Connect session, unchecked (see connect_runs)."""
    from statetier.backend.spark import StatefulPipeline
    from statetier.tools.bench.spark_functions import ArrowWordCount

    pipeline = StatefulPipeline(
        ArrowWordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=partitions,
        config={"checkpoint.uri": f"file://{work}/ckpt"},
    )
    elapsed, query = run_streaming(
        pipeline.write_stream(stream(spark, source)), work / "spark-ckpt"
    )
    return Timing(elapsed, None, spark_batch_seconds(query))


def connect_session(server: ConnectServer) -> Any:
    """A Connect session to ``server`` (pyspark's functions then build Connect columns)."""
    from pyspark.sql.connect.session import SparkSession

    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    return SparkSession.builder.remote(server.url).getOrCreate()


def timed(
    runs: dict[str, Run], source: Path, work: Path, rounds: int, warmups: int
) -> dict[str, Any]:
    """Each run ``warmups`` times untimed, then ``rounds`` rotated rounds; median seconds, and
    the median of each phase of the queries' wall time (Timing.phases)."""
    for w in range(warmups):
        for name, run in runs.items():
            run(source, work / f"warm{w}-{name}")
    timings: dict[str, list[Timing]] = collections.defaultdict(list)
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            timings[name].append(runs[name](source, work / f"r{r}-{name}"))
    return {name: summary(times) for name, times in timings.items()}


def summary(times: list[Timing]) -> dict[str, Any]:
    """The rounds of one pipeline: median seconds and phases, each round's seconds, and whether
    every checked round counted exactly (None: none was checked)."""
    checked = [t.exact for t in times if t.exact is not None]
    phases = [t.phases() for t in times]
    return {
        "seconds": statistics.median(t.seconds for t in times),
        "rounds_seconds": [round(t.seconds, 2) for t in times],
        "exact": all(checked) if checked else None,
        "phases_seconds": {
            phase: round(statistics.median(p[phase] for p in phases), 2) for phase in PHASES
        },
        "batches": len(times[0].batch_seconds),
    }


def later_rate(result: dict[str, Any], words: int) -> float:
    """Records/s of the micro-batches after the first (they are of equal size)."""
    batches, later = result["batches"], result["phases_seconds"]["later_batches"]
    return words * (batches - 1) / batches / later if batches > 1 and later > 0 else 0.0


def peer_ratios(results: dict[str, Any], figure: str) -> dict[str, float]:
    """statetier on Connect against its peers by ``figure``, and ``foreach_batch`` on Connect
    against classic (``foreach_batch_classic``): 0.0 where a peer has none."""
    pairs = {
        "connect_rocksdb": ("connect_statetier", "connect_rocksdb"),
        "classic_statetier": ("connect_statetier", "classic_statetier"),
        "foreach_batch_classic": ("connect_foreach_batch", "classic_foreach_batch"),
    }
    return {
        name: results[a][figure] / results[b][figure] if results[b][figure] else 0.0
        for name, (a, b) in pairs.items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="statetier bench spark-wordcount --connect", description=plain(__doc__)
    )
    parser.add_argument("--words", type=int, default=2_000_000)
    parser.add_argument("--vocabulary", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--warmups",
        type=int,
        default=1,
        help="untimed runs of each pipeline before the timed rounds (0: none, as the tests do)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmups < 0:
        parser.error(
            f"--rounds must be 1 or more and --warmups 0 or more, not {args.rounds} and "
            f"{args.warmups}"
        )

    words = zipf_words(args.words, args.vocabulary)
    expected = dict(collections.Counter(words))
    work = Path(tempfile.mkdtemp(prefix="statetier-bench-connect-"))
    source = work / "in"
    write_input(None, batches(words, args.batches), source)
    p = args.partitions
    results: dict[str, Any] = {}
    try:
        results.update(classic_runs(source, work / "classic", p, args, expected))
        results.update(connect_runs(source, work / "connect", p, args, expected))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for result in results.values():
        result["records_per_s"] = round(len(words) / result["seconds"], 1)
        result["later_batches_records_per_s"] = round(later_rate(result, len(words)), 1)
    ratios = peer_ratios(results, "records_per_s")
    later_ratios = peer_ratios(results, "later_batches_records_per_s")
    exact = all(results[n]["exact"] for n in ("classic_statetier", "connect_statetier"))
    meets = exact and all(ratios[name] >= target for name, target in TARGETS.items())
    report = {
        "benchmark": "spark-wordcount --connect",
        "words": args.words,
        "batches": args.batches,
        "partitions": p,
        "master": args.master,
        "pipelines": results,
        "ratios": {name: round(r, 3) for name, r in ratios.items()},
        "later_batches_ratios": {name: round(r, 3) for name, r in later_ratios.items()},
        "targets": TARGETS,
        "meets_target": meets,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        rows = [
            [
                name,
                f"{r['seconds']:.1f}",
                f"{r['records_per_s']:,.0f}",
                *(f"{r['phases_seconds'][phase]:.2f}" for phase in PHASES),
                f"{r['later_batches_records_per_s']:,.0f}",
                str(r["exact"]),
            ]
            for name, r in results.items()
        ]
        print_table(
            f"spark-wordcount --connect: {args.words:,} Zipf words, {args.batches} micro-batches, "
            f"{p} partitions, {args.master}",
            [
                "pipeline",
                "seconds",
                "records/s",
                "start s",
                "1st batch s",
                "later batches s",
                "later records/s",
                "counts exact",
            ],
            rows,
        )
        print(f"  connect statetier / connect rocksdb: {ratios['connect_rocksdb']:.3f}x (>= 1.5x)")
        print(f"  connect statetier / classic: {ratios['classic_statetier']:.3f} (>= 0.9)")
        print(
            "  connect foreach_batch / classic (Spark's foreachBatch alone, not judged): "
            f"{ratios['foreach_batch_classic']:.3f}"
        )
        print(
            "  after the first micro-batch (not judged): "
            f"{later_ratios['connect_rocksdb']:.3f}x connect rocksdb, "
            f"{later_ratios['classic_statetier']:.3f} of classic; "
            f"foreach_batch {later_ratios['foreach_batch_classic']:.3f} of classic"
        )
    return 0 if meets else 1


def classic_runs(
    source: Path, work: Path, partitions: int, args: Any, expected: dict[str, int]
) -> dict[str, Any]:
    spark = spark_session(partitions, args.master)
    pipelines: list[Any] = []

    def statetier(src: Path, out: Path) -> Timing:
        elapsed, info = bench_statetier(
            spark, src, out, f"file://{out}/ckpt", partitions, {}, pipelines
        )
        batches = [s or 0.0 for s in info["spark_batch_seconds"]]  # None: not in the progress
        return Timing(elapsed, info["counts"] == expected, batches)

    try:
        runs: dict[str, Run] = {
            "classic_statetier": statetier,
            "classic_rocksdb": lambda src, out: rocksdb(spark, src, out),
            "classic_foreach_batch": lambda src, out: foreach_batch(spark, src, out),
        }
        return timed(runs, source, work, args.rounds, args.warmups)
    finally:
        for pipeline in pipelines:
            pipeline.stop_hosts()
        spark.stop()


def connect_runs(
    source: Path, work: Path, partitions: int, args: Any, expected: dict[str, int]
) -> dict[str, Any]:
    from statetier.backend.snapshot import SnapshotStore

    work.mkdir(parents=True)
    conf = {
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.default.parallelism": str(partitions),
        "spark.driver.memory": "2g",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
    }
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with ConnectServer.start(work / "server.log", args.master, conf, env=env) as server:
        spark = connect_session(server)

        def statetier(src: Path, out: Path) -> Timing:
            timing = connect_statetier(spark, src, out, partitions)
            counts = checkpoint_counts(SnapshotStore(f"file://{out}/ckpt"))
            return dataclasses.replace(timing, exact=counts == expected)

        try:
            runs: dict[str, Run] = {
                "connect_statetier": statetier,
                "connect_rocksdb": lambda src, out: rocksdb(spark, src, out),
                "connect_foreach_batch": lambda src, out: foreach_batch(spark, src, out),
            }
            return timed(runs, source, work, args.rounds, args.warmups)
        finally:
            spark.stop()
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
