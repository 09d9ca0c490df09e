"""``statetier bench state-bootstrap``: ``write_state`` of a DataFrame of many keys, then the
word-count pipeline going on from it, checked exact.

On one Spark session (``--master``, default ``local[2]``), after an untimed warm-up (a small
bootstrap: the first Spark job of a session pays for the JVM's and the Python workers' start):
a DataFrame of ``--keys`` words (``w1`` … ``wN``) with counts 1 … N is bootstrapped into a
fresh file:// location as the word count's reducing state ``count`` at ``--parallelism``
ranges (timed: wall seconds and keys per second, with the Spark job's planning and the
commit). Beside it, the baseline: Spark alone on the same rows, the same key-group column and
exchange into the same ranges, each task reading its rows into Python and writing nothing.
Then :class:`ArrowWordCount`, at
another parallelism than the bootstrap's, runs one epoch of ``--more`` Zipf words over twice
the vocabulary (half of them keys it never saw); every count it emits, and every key's count
in the committed epoch (each range restored from the checkpoint, as a new state host does),
must equal the oracle's: bootstrap plus occurrences. The defaults are the acceptance run:
bootstrap 1M keys from a DataFrame, run the pipeline on more input, exact counts.

Target: the bootstrap takes at most ``TARGET_RATIO`` times the baseline (it writes the state
and its files where the baseline only reads), and every count is exact. The keys per second
are reported, not targeted: on a 2-core machine shared with other work they follow its load.
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

TARGET_RATIO = 3.0
COUNT = ReducingStateDescriptor[int]("count", reduce_function=add)


def counts_df(spark: Any, keys: int, parallelism: int) -> Any:
    """``keys`` words ``w1`` … with counts 1 … keys."""
    from pyspark.sql import functions as sf

    return spark.range(1, keys + 1, numPartitions=parallelism).select(
        sf.concat(sf.lit("w"), sf.col("id").cast("string")).alias("word"),
        sf.col("id").alias("value"),
    )


def read_only(batches: Any) -> Any:
    """The baseline's tasks: every row's columns into Python, nothing written."""
    import pyarrow as pa

    rows = 0
    for batch in batches:
        batch.column("word").to_pylist()
        batch.column("value").to_pylist()
        rows += batch.num_rows
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


def baseline(spark: Any, keys: int, parallelism: int, max_parallelism: int) -> float:
    """Seconds of Spark alone: the key groups, the exchange into ranges, the rows read."""
    from pyspark.sql import functions as sf
    from statetier.backend.keygroups import spark_key_group_expr

    ranged = (
        counts_df(spark, keys, parallelism)
        .withColumn("kg", sf.expr(spark_key_group_expr(["word"], max_parallelism)))
        .repartitionById(
            parallelism, sf.expr(f"CAST(kg * {parallelism} div {max_parallelism} AS INT)")
        )
    )
    t0 = time.perf_counter()
    rows = sum(row["rows"] for row in ranged.mapInArrow(read_only, "rows bigint").collect())
    assert rows == keys
    return time.perf_counter() - t0


def bootstrap(spark: Any, uri: str, keys: int, parallelism: int) -> dict[str, float]:
    """``keys`` words with counts 1..keys written as ``count``: seconds and keys per second."""
    from statetier.backend.spark import write_state

    df = counts_df(spark, keys, parallelism)
    t0 = time.perf_counter()
    manifest = write_state(df, uri, COUNT, key="word", parallelism=parallelism)
    seconds = time.perf_counter() - t0
    stored = sum(f.size for f in manifest.keyed_files)
    return {
        "seconds": seconds,
        "keys_per_s": keys / seconds,
        "stored_mb": stored / 2**20,
        "max_parallelism": manifest.max_parallelism,
    }


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
        bootstrap(spark, f"file://{root}/warm-up", 20_000, args.parallelism)
        written = bootstrap(spark, uri, args.keys, args.parallelism)
        max_p = int(written["max_parallelism"])
        baseline_s = baseline(spark, args.keys, args.parallelism, max_p)
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
    ratio = written["seconds"] / baseline_s
    ok = emitted_exact and committed_exact and ratio <= TARGET_RATIO
    report = {
        "keys": args.keys,
        "bootstrap_s": round(written["seconds"], 2),
        "keys_per_s": round(written["keys_per_s"]),
        "spark_alone_s": round(baseline_s, 2),
        "ratio": round(ratio, 2),
        "stored_mb": round(written["stored_mb"], 1),
        "next_epoch_s": round(epoch_s, 2),
        "emitted_exact": emitted_exact,
        "committed_exact": committed_exact,
        "target_ratio": TARGET_RATIO,
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
