"""A streaming word count for a cluster: the program that examples/sparkapplication-wordcount.yaml
runs (backend/Dockerfile.spark copies it to /opt/statetier/examples/wordcount.py).

Spark's rate source makes the words (no input to set up); StatefulPipeline keeps a count per word
in statetier state. Nothing about storage is in this file: the operator writes the checkpoint
URI, spill dirs and memory budget into Spark conf (spark.statetier.*), and the object store's
credentials and endpoint arrive as environment variables from a Secret (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL_S3), which s3fs and botocore read themselves.

    spark-submit wordcount.py --checkpoint-location s3a://bucket/spark/wordcount
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as sf
from statetier.backend import RuntimeContext, ValueStateDescriptor
from statetier.backend.spark import KeyGroupFunction, StatefulPipeline


class WordCount(KeyGroupFunction):
    """One Arrow pass per key-group range: a count per distinct word, one state update each."""

    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(ValueStateDescriptor[int]("count"))

    def process_range(self, records: Any, context: RuntimeContext) -> pa.Table:
        counts = records.group_by("word", use_threads=False).aggregate([("word", "count")])
        totals = []
        pairs = zip(counts["word"].to_pylist(), counts["word_count"].to_pylist(), strict=True)
        for word, n in pairs:
            context.set_current_key(word)
            total = (self.count.value() or 0) + n
            self.count.update(total)
            totals.append(total)
        return pa.table({"word": counts["word"], "count": pa.array(totals, pa.int64())})


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint-location",
        required=True,
        help="Spark's own query checkpoint (offsets, commits): a durable Hadoop path",
    )
    parser.add_argument("--rows-per-second", type=int, default=1000, help="rate of the source")
    parser.add_argument("--vocabulary", type=int, default=10_000, help="distinct words")
    parser.add_argument("--parallelism", type=int, default=8, help="key-group ranges (tasks)")
    parser.add_argument("--trigger", default="10 seconds", help="micro-batch interval")
    parser.add_argument(
        "--stop-after", type=int, default=0, help="stop after this many epochs (0: run on)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    spark = SparkSession.builder.appName("statetier-wordcount").getOrCreate()
    pipeline = StatefulPipeline(
        WordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=args.parallelism,
        name="wordcount",
    )
    words = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", args.rows_per_second)
        .load()
        .select(sf.format_string("w%d", sf.col("value") % args.vocabulary).alias("word"))
    )
    query = (
        pipeline.write_stream(words)
        .option("checkpointLocation", args.checkpoint_location)
        .trigger(processingTime=args.trigger)
        .start()
    )
    try:
        while query.isActive and (not args.stop_after or len(pipeline.reports) < args.stop_after):
            query.awaitTermination(1)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
    finally:
        query.stop()
        pipeline.stop_hosts()
    for report in pipeline.reports[-3:]:
        print(f"epoch {report.epoch}: {report.records} records, committed to {pipeline.store.uri}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
