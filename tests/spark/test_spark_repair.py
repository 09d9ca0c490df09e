"""Repair round trip (issue 41), as docs/state-as-data.md tells a user: a streaming query counts
words; it is stopped; its state is read with ``format("statetier")``, fixed with DataFrame code
(some counts halved, one key deleted) and written back with ``write_state(add_epoch=True)``;
the query restarts from its own Spark checkpoint on more input, and every count is exact
against an oracle that applied the same fix. Real Spark (the session fixture), file://.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as sf
from statetier.backend.snapshot import SnapshotStore
from statetier.backend.spark import StatefulPipeline, register_data_sources, write_state

from tests.spark.spark_support import COUNT, zipf_words
from tests.spark.test_spark_bootstrap import pipeline, stream, write_words

HALVED = [f"w{i}" for i in range(1, 6)]  # the counts a bad deploy doubled
DELETED = "w7"


def read_counts(spark: SparkSession, uri: str) -> dict[str, int]:
    """The ``count`` state of the latest epoch, through the reader."""
    df = spark.read.format("statetier").option("path", uri).option("state", "count").load()
    return {row["key"]: int(row["value"]) for row in df.select("key", "value").collect()}


def test_read_fix_write_back_and_restart_the_query_exactly(
    spark: SparkSession, tmp_path: Path, pipelines: list[StatefulPipeline]
) -> None:
    register_data_sources(spark)
    uri = f"file://{tmp_path}/ckpt"
    batches = [zipf_words(2000, 500, seed=100 + i) for i in range(3)]
    for i, words in enumerate(batches[:2]):
        write_words(tmp_path / "input", i, words)
    first = pipeline(uri, parallelism=2)
    pipelines.append(first)
    stream(spark, first, tmp_path)
    first.stop_hosts()  # the query is stopped: its application is gone
    assert SnapshotStore(uri).epochs() == [1, 2]

    # the repair, as a user writes it: read, fix with DataFrame code, write back
    state = spark.read.format("statetier").option("path", uri).option("state", "count").load()
    count = sf.col("value").cast("bigint")
    fixed = state.where(sf.col("key") != DELETED).select(
        "key",
        sf.when(sf.col("key").isin(HALVED), sf.floor(count / 2)).otherwise(count).alias("value"),
    )
    manifest = write_state(fixed, uri, COUNT, key="key", parallelism=3, add_epoch=True)
    assert manifest.epoch == 3

    oracle: dict[str, int] = {}
    for word in [w for words in batches[:2] for w in words]:
        oracle[word] = oracle.get(word, 0) + 1
    assert DELETED in oracle and all(w in oracle for w in HALVED)
    oracle = {w: n // 2 if w in HALVED else n for w, n in oracle.items() if w != DELETED}

    # the query restarts from its Spark checkpoint: micro-batch 2 goes on from the repair
    write_words(tmp_path / "input", 2, batches[2])
    again = pipeline(uri, parallelism=3)
    pipelines.append(again)
    seen = stream(spark, again, tmp_path)
    for word in batches[2]:
        oracle[word] = oracle.get(word, 0) + 1
    assert seen == {w: oracle[w] for w in batches[2]}
    assert SnapshotStore(uri).epochs()[-1] == 4  # micro-batch 2 is epoch 4, after the repair
    assert again.reports[-1].epoch == 4 and not again.reports[-1].adopted
    assert read_counts(spark, uri) == oracle
