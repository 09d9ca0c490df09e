"""A pipeline keeps the reports of its latest epochs only, on the session's real local[2] Spark."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession
from statetier.backend.spark import StatefulPipeline

from tests.spark.spark_support import VectorWordCount, words_df, zipf_words


def test_the_latest_reports_are_kept_and_the_warm_hit_rate_counts_every_epoch(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    pipeline = StatefulPipeline(
        VectorWordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=2,
        config={"checkpoint.uri": f"file://{tmp_path}/ckpt"},
    )
    pipelines.append(pipeline)
    assert pipeline.reports_kept == 1000
    pipeline.reports_kept = 2
    for seed in range(4):
        pipeline.run(words_df(spark, zipf_words(300, 50, seed)))
    assert [r.epoch for r in pipeline.reports] == [3, 4]
    pipeline.release()  # the hosts drop both ranges: the next epoch restores them
    pipeline.run(words_df(spark, zipf_words(300, 50, 4)))
    assert [(r.epoch, r.restored) for r in pipeline.reports] == [(4, 0), (5, 2)]
    # epochs 2-4 warm (2 ranges each), epoch 5 restored both: over every epoch, not the kept
    assert pipeline.warm_hit_rate() == 6 / 8
