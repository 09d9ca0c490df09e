"""One memory governor in the state host: several ranges in one host spill part of their key
groups, the coldest of all of them, at a budget below their state."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from statetier.backend.spark import StatefulPipeline
from statetier.tools.bench.spark_functions import ArrowWordCount
from statetier.tools.workloads import batches, zipf_words

from tests.spark.spark_support import expected_counts


def test_ranges_of_one_host_spill_part_of_their_key_groups(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    pipeline = StatefulPipeline(
        ArrowWordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=4,
        config={
            "checkpoint.uri": f"file://{tmp_path}/ckpt",
            "spill.enabled": True,
            "spill.dirs": str(tmp_path / "spill"),
            "memory.budget": "4m",  # the state's heap estimate grows to about 5 MB
            "spill.check-interval": "50ms",
        },
    )
    pipelines.append(pipeline)
    parts = batches(zipf_words(400_000, 100_000, seed=11), 4)
    outputs: dict[str, int] = {}
    for epoch, words in enumerate(parts, start=1):
        path = tmp_path / f"words-{epoch}.parquet"
        pq.write_table(pa.table({"word": words}), path)  # faster than rows from Python
        df = spark.read.parquet(str(path))
        report = pipeline.run_epoch(
            df, epoch, lambda out, _: outputs.update((r.word, r["count"]) for r in out.collect())
        )
    spilled = report.spilled_by_range
    assert 0 < sum(spilled) < 128  # part of the key groups, not all or nothing
    assert sum(1 for n in spilled if n) >= 3  # from the ranges of the one host, not one range
    assert outputs == expected_counts(parts)
