"""``statetier demo``: a streaming word count on Spark (local[2]) with tiered state.

Generated Zipf words arrive as Parquet files, one micro-batch each, read by a Structured
Streaming query whose ``foreachBatch`` runs a :class:`StatefulPipeline`. The state lives in the
executor's state host (warm across micro-batches), spills key groups to local disk under a small
memory budget, and is checkpointed every batch to SeaweedFS started on 127.0.0.1 as the embedded
object store. The first run processes the first half of the files; ``--restart`` adds the second
half and resumes both the Spark query and the state from their checkpoints. Both runs check the
checkpointed counts against ``collections.Counter``.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from statetier.backend.demo import print_summary
from statetier.backend.workloads import batches, zipf_words


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="statetier demo", description=__doc__)
    parser.add_argument("--words", type=int, default=1_000_000, help="records over both runs")
    parser.add_argument("--vocabulary", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=10, help="micro-batches over both runs")
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument(
        "--budget",
        default="192m",
        help="memory.budget of the state host (RSS-based: the runtime alone is about 125 MB)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dir", default="statetier-demo", help="where everything goes")
    parser.add_argument("--restart", action="store_true", help="resume from the checkpoints")
    args = parser.parse_args(argv)
    return run(args)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from statetier.backend.bench.spark_functions import ArrowWordCount
    from statetier.backend.bench.spark_wordcount import read_counts, spark_session
    from statetier.backend.seaweed import SeaweedFS
    from statetier.backend.spark import StatefulPipeline

    directory = Path(args.dir).resolve()
    if not args.restart and directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)
    words = zipf_words(args.words, args.vocabulary, seed=args.seed)
    parts = batches(words, args.batches)
    half = args.batches // 2
    todo = range(half, args.batches) if args.restart else range(half)
    source = directory / "input"
    source.mkdir(exist_ok=True)
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i in todo:
        pq.write_table(pa.table({"word": parts[i]}), source / f"part-{i:04d}.parquet")
    done = [w for i in range(todo.stop) for w in parts[i]]

    weed = SeaweedFS.start(directory / "seaweedfs")
    spark = spark_session(args.parallelism)
    pipeline = None
    try:
        uri = weed.uri("demo-wordcount")
        pipeline = StatefulPipeline(
            ArrowWordCount,
            key="word",
            output_schema="word string, count bigint",
            parallelism=args.parallelism,
            config={
                "checkpoint.uri": uri,
                "spill.enabled": True,
                "memory.budget": args.budget,
                "spill.check-interval": "50ms",
                "spill.dirs": str(directory / "spill"),
            },
            storage_options=weed.options,
            name="demo-wordcount",
        )
        stored = pipeline_epochs(uri, weed.options)
        started = time.perf_counter()
        words = spark.readStream.schema("word string").option("maxFilesPerTrigger", 1)
        query = (
            pipeline.write_stream(words.parquet(str(source)))
            .option("checkpointLocation", str(directory / "spark-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        elapsed = time.perf_counter() - started
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        counts = read_counts(pipeline)
        exact = counts == dict(collections.Counter(done))
        summary(args, pipeline, weed, uri, stored, elapsed, counts, exact)
    finally:
        if pipeline is not None:
            pipeline.stop_hosts()
        spark.stop()
        weed.stop()
    return 0 if exact else 1


def pipeline_epochs(uri: str, options: dict[str, Any]) -> list[int]:
    from statetier.backend.snapshot import SnapshotStore

    return SnapshotStore(uri, **options).epochs()


def summary(
    args: argparse.Namespace,
    pipeline: Any,
    weed: Any,
    uri: str,
    stored: list[int],
    elapsed: float,
    counts: dict[str, int],
    exact: bool,
) -> None:
    reports = pipeline.reports
    records = sum(r.records for r in reports)
    store = pipeline.store
    manifest = store.manifest()
    latest_bytes = sum(f.size for f in manifest.files())
    all_bytes = sum(store.list_files().values())
    spilled = max((r.spilled_key_groups for r in reports), default=0)
    last_spilled = reports[-1].spilled_key_groups if reports else 0
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:5]
    rows = [
        ("run", "restart: resumed from the checkpoints" if args.restart else "first run"),
        ("resumed from epoch", str(stored[-1]) if stored else "none (fresh start)"),
        (
            "batches",
            f"{len(reports)} (epochs {reports[0].epoch}-{reports[-1].epoch})" if reports else "0",
        ),
        ("records", f"{records:,} on local[2], parallelism {args.parallelism}"),
        ("records/s", f"{records / elapsed:,.0f} (query wall time, incl. a checkpoint per batch)"),
        (
            "warm-hit rate",
            f"{pipeline.warm_hit_rate():.0%} of ranges served from the state host "
            f"({sum(r.restored for r in reports)} restored from tier 2)",
        ),
        (
            "spill ratio",
            f"{last_spilled}/{manifest.max_parallelism} key groups on disk at the "
            f"end (max {spilled}; memory.budget {args.budget})",
        ),
        ("checkpoint", f"{uri} on SeaweedFS {weed.endpoint}"),
        (
            "checkpoint sizes",
            f"latest epoch {latest_bytes / 1e6:.2f} MB, all retained files "
            f"{all_bytes / 1e6:.2f} MB, uploaded per batch "
            f"{sum(r.upload_bytes for r in reports) / max(len(reports), 1) / 1e6:.2f} MB",
        ),
        ("distinct words", f"{len(counts):,}"),
        ("counts exact", str(exact)),
        ("top words", ", ".join(f"{w}={n}" for w, n in top)),
    ]
    print_summary("statetier demo: streaming word count on Spark with tiered state", rows)
    if not exact:
        print("  ERROR: checkpointed counts differ from the input")


if __name__ == "__main__":
    sys.exit(main())
