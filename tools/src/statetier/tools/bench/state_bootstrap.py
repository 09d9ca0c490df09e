"""``statetier bench state-bootstrap``: ``write_state`` of a DataFrame of many keys, then the
word-count pipeline going on from it, checked exact.

On one Spark session (``--master``, default ``local[2]``): a DataFrame of ``--keys`` words
(``w1`` … ``wN``) with counts 1 … N is bootstrapped into a fresh file:// location as the
word count's reducing state ``count`` at ``--parallelism`` ranges (timed: wall seconds and keys
per second, with the Spark job's planning and the commit). Then :class:`ArrowWordCount`, at
another parallelism than the bootstrap's, runs one epoch of ``--more`` Zipf words over twice
the vocabulary (half of them keys it never saw); every count it emits, and every key's count
in the committed epoch (each range restored from the checkpoint, as a new state host does),
must equal the oracle's: bootstrap plus occurrences. The defaults are the acceptance run:
bootstrap 1M keys from a DataFrame, run the pipeline on more input, exact counts.

Target: at least ``TARGET_KEYS_PER_S`` keys per second bootstrapped (2 cores), exact counts.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import tempfile
import time
from collections.abc import Sequence
from operator import add
from typing import Any

from statetier.backend.descriptors import ReducingStateDescriptor
from statetier.backend.helptext import plain
from statetier.backend.runtime import FunctionInstance
from statetier.backend.snapshot import SnapshotStore
from statetier.tools.bench import print_table
from statetier.tools.bench.spark_functions import ArrowWordCount
from statetier.tools.bench.spark_wordcount import spark_session

TARGET_KEYS_PER_S = 50_000
COUNT = ReducingStateDescriptor[int]("count", reduce_function=add)


def bootstrap(spark: Any, uri: str, keys: int, parallelism: int) -> dict[str, float]:
    """``keys`` words with counts 1..keys written as ``count``: seconds and keys per second."""
    from pyspark.sql import functions as sf
    from statetier.backend.spark import write_state

    df = spark.range(1, keys + 1, numPartitions=parallelism).select(
        sf.concat(sf.lit("w"), sf.col("id").cast("string")).alias("word"),
        sf.col("id").alias("value"),
    )
    t0 = time.perf_counter()
    manifest = write_state(df, uri, COUNT, key="word", parallelism=parallelism)
    seconds = time.perf_counter() - t0
    stored = sum(f.size for f in manifest.keyed_files)
    return {"seconds": seconds, "keys_per_s": keys / seconds, "stored_mb": stored / 2**20}


def run_more(spark: Any, uri: str, words: list[str], parallelism: int) -> dict[str, int]:
    """One epoch of the word count over ``words``: the counts it emitted."""
    from statetier.backend.spark import StatefulPipeline

    pipeline = StatefulPipeline(
        ArrowWordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=parallelism,
        config={"checkpoint.uri": uri},
    )
    emitted: dict[str, int] = {}

    def sink(batch: Any, epoch: int) -> None:
        emitted.update({row["word"]: row["count"] for row in batch.collect()})

    try:
        pipeline.run(spark.createDataFrame([(w,) for w in words], "word string"), sink)
    finally:
        pipeline.stop_hosts()
    return emitted


def committed_counts(uri: str) -> dict[str, int]:
    """Every key's count in the latest epoch, each range restored as a state host does."""
    store = SnapshotStore(uri)
    manifest = store.manifest()
    counts: dict[str, int] = {}
    for index in range(manifest.parallelism):
        instance = FunctionInstance(
            ArrowWordCount,  # type: ignore[arg-type]  # a KeyGroupFunction: open() suffices
            index,
            manifest.parallelism,
            manifest.max_parallelism,
            store=store,
            restore_epoch=manifest.epoch,
        )
        state = instance.keyed.get_state(COUNT)
        for key in instance.keyed.keys("count"):
            instance.keyed.set_current_key(key)
            counts[key] = state.get() or 0
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="statetier bench state-bootstrap", description=plain(__doc__)
    )
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--more", type=int, default=200_000, help="words of the next epoch")
    parser.add_argument("--parallelism", type=int, default=2, help="of the bootstrap")
    parser.add_argument("--job-parallelism", type=int, default=3, help="of the pipeline")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    spark = spark_session(args.parallelism, args.master)
    with tempfile.TemporaryDirectory(prefix="statetier-bootstrap-") as root:
        uri = f"file://{root}/ckpt"
        written = bootstrap(spark, uri, args.keys, args.parallelism)
        rng = random.Random(41)
        vocabulary = 2 * args.keys
        weights = [1.0 / (rank + 1) for rank in range(vocabulary)]
        words = [f"w{i + 1}" for i in rng.choices(range(vocabulary), weights, k=args.more)]
        oracle = {f"w{i}": i for i in range(1, args.keys + 1)}
        for word, n in collections.Counter(words).items():
            oracle[word] = oracle.get(word, 0) + n
        t0 = time.perf_counter()
        emitted = run_more(spark, uri, words, args.job_parallelism)
        epoch_s = time.perf_counter() - t0
        emitted_exact = emitted == {w: oracle[w] for w in set(words)}
        committed_exact = committed_counts(uri) == oracle
    spark.stop()
    ok = emitted_exact and committed_exact and written["keys_per_s"] >= TARGET_KEYS_PER_S
    report = {
        "keys": args.keys,
        "bootstrap_s": round(written["seconds"], 2),
        "keys_per_s": round(written["keys_per_s"]),
        "stored_mb": round(written["stored_mb"], 1),
        "next_epoch_s": round(epoch_s, 2),
        "emitted_exact": emitted_exact,
        "committed_exact": committed_exact,
        "target_keys_per_s": TARGET_KEYS_PER_S,
        "ok": ok,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print_table(
            f"write_state of {args.keys:,} keys ({args.master}, {args.parallelism} ranges), "
            f"then {args.more:,} words at parallelism {args.job_parallelism}",
            ["measure", "value"],
            [[name, str(value)] for name, value in report.items()],
        )
    return 0 if ok else 1
