"""``statetier bench spark-wordcount``: statetier on Spark against Spark's own stateful operators.

The same Zipf words (2M from a 200k vocabulary by default) are written once as 10 Parquet files;
every pipeline reads them as a Structured Streaming source, one file per micro-batch
(``maxFilesPerTrigger=1``, ``availableNow``), on ``local[2]`` with 8 partitions, and keeps a
running count per word:

- ``statetier``: ``StatefulPipeline.write_stream`` (a query planned once, ``foreachBatch``
  committing each micro-batch) of the word count a user would write
  (``spark_functions.ArrowWordCount``: one Arrow pass per range; state warm in the executor's
  state host, one checkpoint per batch on local disk);
- ``statetier_s3`` (with ``--s3``): the same, checkpointing to SeaweedFS started on 127.0.0.1
  (the server's CPU during each run is reported: it shares the cores with everything else);
- ``spark_rocksdb_count``: ``groupBy("word").count()``, RocksDB state store, update mode;
- ``apply_in_pandas_with_state`` and ``transform_with_state_in_pandas`` (ValueState);
- ``ceiling``: a ``mapInPandas`` that only counts rows, over the same 8 partitions as every
  other pipeline (``repartition(8, "word")``: one file per micro-batch is one partition);
- ``ceiling_keyed``: the same with the key-group exchange (``repartitionById``) that any keyed
  pipeline needs, statetier's own floor;
- ``ceiling_one_partition``: the count over the source's one partition, no exchange (for
  information: it is not the same partitions).

Every pipeline writes to the ``noop`` sink; records/s = input records / wall time of the query.
``applyInPandasWithState`` and ``transformWithStateInPandas`` run at a few thousand records/s, so
by default they process only the first ``--slow-batches`` batches (their rate is per record, the
other batches would take many minutes); ``--slow-batches 10`` runs them on everything.
statetier checks its final counts against ``collections.Counter``. ``--only`` runs statetier and a
subset of the peers (while iterating; the JSON then lacks the others).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, cast

from statetier.backend.helptext import plain
from statetier.tools.bench import cpu_seconds, print_table
from statetier.tools.workloads import batches, zipf_words

PIPELINES = (
    "spark_rocksdb_count",
    "ceiling",
    "ceiling_uncapped",
    "ceiling_keyed",
    "ceiling_one_partition",
    "apply_in_pandas_with_state",
    "transform_with_state_in_pandas",
)
SLOW = {"apply_in_pandas_with_state", "transform_with_state_in_pandas"}
SLOW_WARMUP_WORDS = 20_000
Run = Callable[[Path, Path], tuple[float, dict[str, Any]]]
TARGETS = {
    "transform_with_state_in_pandas": 20.0,
    "spark_rocksdb_count": 1.5,
    "ceiling": 0.85,
}


NOTES = {
    "ceiling": {"note": "mapInPandas that only counts, over the same partitions (by word)"},
    "ceiling_uncapped": {
        "note": "the ceiling with Arrow batches capped by rows only, as statetier's own jobs "
        "run (spark.sql.execution.arrow.maxBytesPerBatch=2147483647; docs/spark.md)"
    },
    "ceiling_keyed": {
        "note": "the ceiling with the key-group exchange (repartitionById) keyed state needs"
    },
    "ceiling_one_partition": {
        "note": "the ceiling over the source's one partition per micro-batch (no exchange)"
    },
}


def spark_session(partitions: int, master: str = "local[2]", temp_dir: Path | None = None) -> Any:
    """The benchmarks' and the demo's session. ``temp_dir``: the driver JVM's temp dir (Spark's
    ``spark-*``, ``blockmgr-*`` and ``artifacts-*``, the native libraries it unpacks), for a
    caller that may have to kill the JVM, which then cannot remove them itself."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import pyspark
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if temp_dir is not None:
        builder = builder.config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={temp_dir}")
    executors = cluster_executors(master)
    if executors:
        # local-cluster starts executor JVMs from SPARK_HOME: the installed pyspark has one
        os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
        builder = builder.config("spark.executor.memory", f"{executors[1]}m")
    session = (
        builder.master(master)
        .appName("statetier-bench")
        .config("spark.ui.enabled", "false")
        # the bar redraws a stderr line that the report's lines on stdout would continue
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.default.parallelism", str(partitions))
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "2g")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    if executors:
        wait_for_executors(session, executors[0])
    return session


def cluster_executors(master: str) -> tuple[int, int] | None:
    """(executors, MiB each) of a ``local-cluster[N,cores,MiB]`` master, else None."""
    match = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*\d+\s*,\s*(\d+)\s*\]", master)
    return (int(match.group(1)), int(match.group(2))) if match else None


def wait_for_executors(spark: Any, count: int, timeout: float = 180.0) -> None:
    """Every pipeline then starts on the whole cluster (executors register one by one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() > count:  # + driver
            return
        time.sleep(0.2)
    raise RuntimeError(f"{count} executors did not register within {timeout:.0f}s")


def write_input(spark: Any, parts: Iterable[list[str]], directory: Path) -> None:
    """One Parquet file per part, named in order (``parts`` may be generated one by one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    for i, part in enumerate(parts):
        pq.write_table(pa.table({"word": part}), directory / f"part-{i:03d}.parquet")


def stream(spark: Any, source: Path, files: int | None = None) -> Any:
    reader = spark.readStream.schema("word string").option("maxFilesPerTrigger", 1)
    if files is not None:
        reader = reader.option("pathGlobFilter", "part-*.parquet")
    return reader.parquet(str(source))


def run_query(writer: Any, checkpoint: Path) -> float:
    return run_streaming(writer, checkpoint)[0]


def run_streaming(writer: Any, checkpoint: Path) -> tuple[float, Any]:
    """Run a query over everything available; its wall time, and the query (its progress)."""
    started = time.perf_counter()
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return elapsed, query


# ---------------------------------------------------------------------- the pipelines


def bench_statetier(
    spark: Any,
    source: Path,
    work: Path,
    uri: str,
    partitions: int,
    storage: dict[str, Any],
    pipelines: list[Any],
) -> tuple[float, dict[str, Any]]:
    """Runs statetier; the caller stops the state hosts of ``pipelines`` when the benchmark
    ends (they are the executor's, shared by every run, as Spark's Python workers are)."""
    from statetier.backend.spark import StatefulPipeline
    from statetier.tools.bench.spark_functions import ArrowWordCount

    pipeline = StatefulPipeline(
        ArrowWordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=partitions,
        config={"checkpoint.uri": uri},
        storage_options=storage,
    )
    pipelines.append(pipeline)
    writer = pipeline.write_stream(stream(spark, source))
    elapsed, query = run_streaming(writer, work / "spark-ckpt")
    pipeline.drain()
    counts = read_counts(pipeline)
    reports = pipeline.reports
    hosts = hosts_heard_since(pipeline, time.monotonic())
    # the merges of the run (the driver's, drain included), read before release() stops them:
    # on a 2-core machine they share the cores with everything else, as on a cluster they
    # would not (docs/spark.md)
    merges = pipeline.upkeep.compactions
    merge_cpu = pipeline.upkeep.compaction_cpu_seconds
    pipeline.release()  # the next run is another pipeline: this state is done with
    later = reports[1:]
    warm_later, restored_later = sum(r.warm for r in later), sum(r.restored for r in later)
    return elapsed, {
        "batches": len(reports),
        "warm_hit_rate": pipeline.warm_hit_rate(),
        "warm_hit_rate_after_first": (
            warm_later / (warm_later + restored_later) if warm_later + restored_later else 0.0
        ),
        "restored_bytes_per_epoch": [r.restored_bytes for r in reports],
        "routing_per_epoch": [r.routing for r in reports],  # pipeline.exchange (docs/spark.md)
        "state_keys": len(counts),
        "state_checkpoint_bytes": state_checkpoint_bytes(pipeline),
        "state_hosts": len(hosts),
        "state_hosts_rss_bytes": sum(h.rss for h in hosts),
        # the keyed state by tier, as the hosts report it: heap bytes (estimated) and bytes
        # spilled to local disk (FunctionInstance.state_bytes)
        "state_heap_bytes": sum(h.state_heap for h in hosts),
        "state_spilled_bytes": sum(h.state_spilled for h in hosts),
        "checkpoint_bytes": sum(r.upload_bytes for r in reports),
        "rows_to_hosts": sum(r.rows for r in reports),  # after the combiner
        "epoch_seconds": [round(r.seconds, 2) for r in reports],
        # the same micro-batches as Spark times them whole (see EpochReport.seconds)
        "spark_batch_seconds": batch_seconds(query, [r.epoch for r in reports]),
        "host_seconds": [round(r.host_seconds, 2) for r in reports],
        "commit_seconds": [round(r.commit_seconds, 2) for r in reports],
        "host_process_seconds": round(sum(r.process_seconds for r in reports), 2),
        "host_snapshot_seconds": round(sum(r.snapshot_seconds for r in reports), 2),
        "merges": merges,
        "merge_cpu_seconds": round(merge_cpu, 2),
        "counts": counts,
    }


def with_server_cpu(run: Run, pid: int) -> Run:
    """``run``, reporting the CPU the S3 server (process ``pid``, on the same cores) spent
    while it ran."""

    def measured(source: Path, out: Path) -> tuple[float, dict[str, Any]]:
        before = cpu_seconds(pid)
        elapsed, info = run(source, out)
        return elapsed, {**info, "s3_server_cpu_seconds": round(cpu_seconds(pid) - before, 2)}

    return measured


def batch_seconds(query: Any, epochs: list[int]) -> list[float | None]:
    """The time Spark measured for the micro-batch of each of ``epochs`` (epoch = batch id +
    1; ``durationMs.triggerExecution`` of the query's progress), None where the progress no
    longer holds it (Spark keeps the last ``numRecentProgressUpdates``): in step with
    ``epoch_seconds`` either way."""
    progress = progress_seconds(query)
    seconds = [progress.get(epoch - 1) for epoch in epochs]
    return [None if s is None else round(s, 2) for s in seconds]


def progress_seconds(query: Any) -> dict[int, float]:
    """The seconds of each micro-batch the query's progress still holds, by batch id
    (``durationMs.triggerExecution``)."""
    return {p["batchId"]: p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress}


def hosts_heard_since(pipeline: Any, since: float, timeout: float = 5.0) -> list[Any]:
    """The pipeline's state hosts once each has sent a heartbeat after ``since`` (one a second),
    so that their state figures cover the last epoch; as they are after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        hosts = pipeline.state_hosts()
        if all(h.last_seen > since for h in hosts) or time.monotonic() > deadline:
            return list(hosts)
        time.sleep(0.05)


def state_checkpoint_bytes(pipeline: Any) -> int:
    """What restoring the whole state of the last epoch downloads."""
    from statetier.backend.keygroups import KeyGroupRange
    from statetier.backend.snapshot import restored_bytes

    manifest = pipeline.store.manifest()
    return int(restored_bytes(manifest, KeyGroupRange(0, manifest.max_parallelism - 1)))


def read_counts(pipeline: Any) -> dict[str, int]:
    """The word counts of ``pipeline``'s latest checkpoint."""
    return checkpoint_counts(pipeline.store)


def checkpoint_counts(store: Any, parallelism: int | None = None) -> dict[str, int]:
    """The word counts of ``store``'s latest checkpoint, restored at ``parallelism`` (default:
    the checkpoint's own)."""
    from statetier.backend.runtime import FunctionInstance
    from statetier.tools.bench.spark_functions import ArrowWordCount

    manifest = store.manifest()
    parallelism = parallelism or manifest.parallelism
    counts: dict[str, int] = {}
    for index in range(parallelism):
        instance = FunctionInstance(
            cast(Any, ArrowWordCount),  # a KeyGroupFunction: open() is all a restore needs
            index,
            parallelism,
            manifest.max_parallelism,
            store=store,
            restore_epoch=manifest.epoch,
        )
        state = cast(ArrowWordCount, instance.function).count  # the state as it registered it
        for key in instance.keyed.keys("count"):
            instance.keyed.set_current_key(key)
            counts[key] = state.get() or 0
    return counts


def _untracked(peer: Callable[[Path, Path], float]) -> Run:
    """A peer's run in the shape of statetier's: seconds, and no details."""
    return lambda source, out: (peer(source, out), {})


def bench_rocksdb(spark: Any, source: Path, work: Path) -> float:
    return run_rocksdb(spark, source, work)[0]


def run_rocksdb(spark: Any, source: Path, work: Path) -> tuple[float, Any]:
    """Spark's ``groupBy().count()`` on the session's state store provider (RocksDB in these
    benchmarks); its wall time and the query."""
    counts = stream(spark, source).groupBy("word").count()
    writer = counts.writeStream.outputMode("update").format("noop")
    return run_streaming(writer, work / "rocksdb-ckpt")


def bench_apply_in_pandas(spark: Any, source: Path, work: Path) -> float:
    from pyspark.sql.streaming.state import GroupStateTimeout
    from statetier.tools.bench.spark_baselines import apply_count

    counts = (
        stream(spark, source)
        .groupBy("word")
        .applyInPandasWithState(
            apply_count,
            "word string, count long",
            "count long",
            "Update",
            GroupStateTimeout.NoTimeout,
        )
    )
    writer = counts.writeStream.outputMode("update").format("noop")
    return run_query(writer, work / "aipws-ckpt")


def bench_transform_with_state(spark: Any, source: Path, work: Path) -> float:
    from statetier.tools.bench.spark_baselines import TwsCount

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
    writer = counts.writeStream.outputMode("update").format("noop")
    return run_query(writer, work / "tws-ckpt")


def bench_ceiling_keyed(spark: Any, source: Path, work: Path, partitions: int) -> float:
    """The ceiling with the exchange any keyed state needs: key group, repartitionById, count."""
    from pyspark.sql import functions as sf
    from statetier.backend.keygroups import spark_key_group_expr
    from statetier.tools.bench.spark_baselines import count_rows

    kg = sf.expr(spark_key_group_expr(["word"], 128))
    owner = sf.expr(f"CAST((kg * {partitions}) div 128 AS INT)")
    ranged = stream(spark, source).withColumn("kg", kg).repartitionById(partitions, owner)
    counted = ranged.mapInPandas(count_rows, "n long")
    return run_query(counted.writeStream.format("noop"), work / "ceiling-keyed-ckpt")


def bench_ceiling_uncapped(spark: Any, source: Path, work: Path, partitions: int) -> float:
    """The ceiling with the Arrow byte cap statetier lifts for its own jobs lifted for it too:
    the fair peer for what that setting alone is worth."""
    from statetier.backend.spark.arrow_batches import MAX_BYTES_PER_BATCH, UNCAPPED

    spark.conf.set(MAX_BYTES_PER_BATCH, UNCAPPED)
    try:
        return bench_ceiling(spark, source, work, partitions)
    finally:
        spark.conf.unset(MAX_BYTES_PER_BATCH)


def bench_ceiling(spark: Any, source: Path, work: Path, partitions: int | None) -> float:
    """``mapInPandas`` that only counts, over the same partitions as the other pipelines (hashed
    by word, the cheapest exchange: a round-robin ``repartition`` sorts first), or over the
    source's own (``partitions`` None: one file, one partition per micro-batch)."""
    from statetier.tools.bench.spark_baselines import count_rows

    df = stream(spark, source)
    if partitions is not None:
        df = df.repartition(partitions, "word")
    counted = df.mapInPandas(count_rows, "n long")
    return run_query(counted.writeStream.format("noop"), work / f"ceiling-{partitions}-ckpt")


# ---------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0915 (one run, in order)
    parser = argparse.ArgumentParser(
        prog="statetier bench spark-wordcount", description=plain(__doc__)
    )
    parser.add_argument("--words", type=int, default=2_000_000)
    parser.add_argument("--vocabulary", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument(
        "--slow-batches",
        type=int,
        default=1,
        help="batches the pandas-state baselines process (they are slow)",
    )
    parser.add_argument("--s3", action="store_true", help="also checkpoint to SeaweedFS")
    parser.add_argument(
        "--master",
        default="local[2]",
        help="Spark master every pipeline runs on, e.g. 'local-cluster[2,1,3072]' (several "
        "executor JVMs; SPARK_HOME defaults to the installed pyspark)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="timed runs of each fast pipeline (median)"
    )
    parser.add_argument(
        "--warmup-words",
        type=int,
        default=None,
        help="words of the untimed warm-up run of every pipeline (default: all of them, in the "
        "timed runs' micro-batches: the executors' JIT compiles for several runs of a large "
        "input, and the first timed run would pay for it alone; fewer runs as one micro-batch; "
        f"the pandas-state ones take at most {SLOW_WARMUP_WORDS:,})",
    )
    parser.add_argument(
        "--only",
        default=",".join(PIPELINES),
        help="comma-separated pipelines to run (statetier always runs; default: all)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    only = set(args.only.split(","))
    unknown = only - set(PIPELINES) - {"statetier"}
    if unknown:
        parser.error(f"unknown pipelines: {', '.join(sorted(unknown))}")
    words = zipf_words(args.words, args.vocabulary)
    parts = batches(words, args.batches)
    warmup_words = min(args.warmup_words or len(words), len(words))
    work = Path(tempfile.mkdtemp(prefix="statetier-bench-spark-"))
    spark = spark_session(args.partitions, args.master)
    results: dict[str, dict[str, Any]] = {}
    pipelines: list[Any] = []
    weed = None
    try:
        full, slow = work / "in", work / "in-slow"
        write_input(spark, parts, full)
        slow_parts = parts[: args.slow_batches]
        write_input(spark, slow_parts, slow)
        slow_records = sum(len(p) for p in slow_parts)

        peers: dict[str, Callable[[Path, Path], float]] = {
            "spark_rocksdb_count": lambda src, out: bench_rocksdb(spark, src, out),
            "ceiling": lambda src, out: bench_ceiling(spark, src, out, args.partitions),
            "ceiling_uncapped": lambda src, out: bench_ceiling_uncapped(
                spark, src, out, args.partitions
            ),
            "ceiling_keyed": lambda src, out: bench_ceiling_keyed(spark, src, out, args.partitions),
            "ceiling_one_partition": lambda src, out: bench_ceiling(spark, src, out, None),
            "apply_in_pandas_with_state": lambda src, out: bench_apply_in_pandas(spark, src, out),
            "transform_with_state_in_pandas": lambda src, out: bench_transform_with_state(
                spark, src, out
            ),
        }
        runs: dict[str, Run] = {
            "statetier": lambda src, out: bench_statetier(
                spark, src, out, f"file://{out}/ckpt", args.partitions, {}, pipelines
            )
        }
        if args.s3:
            from statetier.tools.seaweed import SeaweedFS

            weed = SeaweedFS.start(work / "weed")
            store = weed
            runs["statetier_s3"] = with_server_cpu(
                lambda src, out: bench_statetier(
                    spark, src, out, store.uri(out.name), args.partitions, store.options, pipelines
                ),
                weed.process.pid,
            )
        for name in PIPELINES:
            if name in only:
                runs[name] = _untracked(peers[name])
        # Every pipeline first runs once, untimed, on the whole input by default: JIT, Spark's
        # Python workers, the exchange path, RocksDB's library and statetier's state host are
        # then warm for all (else whichever runs first pays for them alone: after a warm-up of
        # a micro-batch's worth, the first timed run of a 20M-word input on local-cluster ran at
        # 0.74-0.80x its median in two runs, the executors' JIT still compiling). Timed runs start
        # from fresh state and checkpoints, in rounds that rotate the order (the JVM keeps
        # warming up, which favours whoever runs last); each figure is the median of its rounds.
        # all the words: a whole untimed round over the timed runs' own micro-batches
        warm, warm_slow = full, work / "warm-slow"
        if warmup_words < len(words):
            warm = work / "warm"
            write_input(spark, [words[:warmup_words]], warm)
        write_input(spark, [words[: min(warmup_words, SLOW_WARMUP_WORDS)]], warm_slow)
        cold_host_epoch = 0.0
        for name, run in runs.items():
            _, info = run(warm_slow if name in SLOW else warm, work / f"w-{name}")
            if name == "statetier":
                cold_host_epoch = info["epoch_seconds"][0]  # the state host started in it
        seconds: dict[str, list[float]] = collections.defaultdict(list)
        infos: dict[str, dict[str, Any]] = {}
        expected = dict(collections.Counter(words))
        names = list(runs)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                if name in SLOW and r > 0:
                    continue  # minutes per run: once is enough
                elapsed, info = runs[name](slow if name in SLOW else full, work / f"r{r}-{name}")
                seconds[name].append(elapsed)
                if "counts" in info:
                    exact = info.pop("counts") == expected and infos.get(name, {}).get(
                        "counts_exact", True
                    )
                    infos[name] = {**info, "counts_exact": exact}
        for name, times in seconds.items():
            records = slow_records if name in SLOW else len(words)
            median = statistics.median(times)
            results[name] = {
                "records": records,
                "seconds": round(median, 3),
                "records_per_s": round(records / median, 1),
                "rounds_records_per_s": [round(records / t) for t in times],
                **NOTES.get(name, {}),
                **infos.get(name, {}),
            }
        results["statetier"]["checkpoint"] = "local disk"
        results["statetier"]["warmup_epoch_seconds_with_host_start"] = cold_host_epoch
        if "statetier_s3" in results:
            results["statetier_s3"]["checkpoint"] = "SeaweedFS (s3://)"
    finally:
        for pipeline in pipelines:
            pipeline.stop_hosts()
        spark.stop()
        if weed is not None:
            weed.stop()
        shutil.rmtree(work, ignore_errors=True)

    st = results["statetier"]["records_per_s"]
    exact_ratios = {
        name: st / results[name]["records_per_s"]
        for name in [*TARGETS, "ceiling_uncapped", "ceiling_keyed", "ceiling_one_partition"]
        if name in results
    }
    # judged before rounding: 1.495 is not 1.5; a peer left out by --only is not judged, and
    # the report says so
    unmeasured = sorted(name for name in TARGETS if name not in exact_ratios)
    meets = all(
        exact_ratios[name] >= target for name, target in TARGETS.items() if name in exact_ratios
    )
    ratios = {name: round(ratio, 3) for name, ratio in exact_ratios.items()}
    report = {
        "benchmark": "spark-wordcount",
        "words": args.words,
        "vocabulary": args.vocabulary,
        "batches": args.batches,
        "warmup_words": warmup_words,
        "partitions": args.partitions,
        "master": args.master,
        "pipelines": results,
        "ratios": ratios,
        "targets": TARGETS,
        "unmeasured_targets": unmeasured,
        "meets_target": meets and bool(results["statetier"]["counts_exact"]),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        rows = [
            [name, f"{r['records']:,}", f"{r['seconds']:.1f}", f"{r['records_per_s']:,.0f}"]
            for name, r in results.items()
        ]
        print_table(
            f"spark-wordcount: {args.words:,} Zipf words, {args.batches} micro-batches, "
            f"{args.partitions} partitions, {args.master}",
            ["pipeline", "records", "seconds", "records/s"],
            rows,
        )
        for name, ratio in ratios.items():
            target = f" (target >= {TARGETS[name]}x)" if name in TARGETS else ""
            print(f"  statetier / {name}: {ratio}x{target}")
        if unmeasured:
            print(f"  not measured (left out by --only): {', '.join(unmeasured)}")
        st_info = results["statetier"]
        print(
            f"  warm-hit rate: {st_info['warm_hit_rate']:.0%} "
            f"({st_info['warm_hit_rate_after_first']:.0%} after the first micro-batch), "
            f"counts exact: {st_info['counts_exact']}"
        )
        print(
            f"  state: {st_info['state_keys']:,} keys, "
            f"{st_info['state_checkpoint_bytes'] / 1e6:,.0f} MB in the checkpoint, "
            f"{st_info['state_heap_bytes'] / 1e6:,.0f} MB on heap and "
            f"{st_info['state_spilled_bytes'] / 1e6:,.0f} MB spilled (estimated), "
            f"{st_info['state_hosts_rss_bytes'] / 1e6:,.0f} MB RSS in "
            f"{st_info['state_hosts']} state hosts; restored per epoch (bytes): "
            f"{st_info['restored_bytes_per_epoch']}"
        )
    return 0 if report["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
