"""What the driver reads from plans to route a micro-batch (statetier.backend.spark.plans)."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from statetier.backend.spark.plans import partition_count


def test_the_partitions_of_a_micro_batch_are_those_spark_planned(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A ``foreachBatch`` micro-batch (a ``LogicalRDD``) is read without planning it again, any
    other DataFrame by planning it: both give the partitions its tasks read."""
    seen: list[tuple[int, int, str]] = []

    def look(batch: DataFrame, batch_id: int) -> None:
        plan = batch._jdf.queryExecution().logical().nodeName()
        seen.append((partition_count(batch), batch.rdd.getNumPartitions(), plan))
        derived = batch.selectExpr("value * 2 AS doubled")  # no longer a LogicalRDD
        seen.append((partition_count(derived), derived.rdd.getNumPartitions(), "derived"))

    for partitions in (1, 3):
        source = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 20)
        stream = source.option("numPartitions", partitions).load()
        query = (
            stream.writeStream.foreachBatch(look)
            .option("checkpointLocation", str(tmp_path / f"ckpt-{partitions}"))
            .trigger(once=True)
            .start()
        )
        query.awaitTermination()
        assert query.exception() is None
    assert seen == [
        (1, 1, "LogicalRDD"),
        (1, 1, "derived"),
        (3, 3, "LogicalRDD"),
        (3, 3, "derived"),
    ]
