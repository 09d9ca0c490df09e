"""A streaming word count on Spark (local[2]): a query planned once with ``write_stream``, state
warm in the executor's state host, one committed epoch per micro-batch; a restarted query
resumes from both checkpoints with exact counts."""

from __future__ import annotations

import collections
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from statetier.backend import RuntimeContext, ValueStateDescriptor
from statetier.backend.spark import KeyGroupFunction, StatefulPipeline


class WordCount(KeyGroupFunction):
    """One Arrow pass per range: a count per distinct word, one state update each."""

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


def run_query(spark: SparkSession, source: Path, work: Path, latest: dict[str, int]) -> int:
    """Process the files not yet seen; returns the epochs this run committed."""
    pipeline = StatefulPipeline(
        WordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=4,
        config={"checkpoint.uri": f"file://{work}/statetier"},
    )

    def sink(out: DataFrame, epoch: int) -> None:
        rows = out.collect()
        latest.update((r.word, r["count"]) for r in rows)
        print(f"epoch {epoch}: {len(rows)} words updated, the={latest.get('the')}")

    words = spark.readStream.schema("word string").option("maxFilesPerTrigger", 1)
    query = (
        pipeline.write_stream(words.csv(str(source)), sink)
        .option("checkpointLocation", str(work / "spark"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    pipeline.stop_hosts()
    return len(pipeline.reports)


def main() -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix="statetier-example-"))
    source = work / "in"
    source.mkdir()
    text = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "the", "end"]
    latest: dict[str, int] = {}
    try:
        for run, files in enumerate([range(3), range(3, 5)]):
            for i in files:  # one file per micro-batch
                (source / f"part-{i}.csv").write_text("\n".join(text[i:] + text) + "\n")
            epochs = run_query(spark, source, work, latest)
            print(f"query {run + 1} committed {epochs} epochs")
        expected = collections.Counter(w for i in range(5) for w in text[i:] + text)
        assert latest == dict(expected), (latest, expected)
        print(f"final counts match ({len(latest)} words) after a restart")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
