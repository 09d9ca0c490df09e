"""Bootstrap from PySpark (issue 41): ``write_state`` writes a DataFrame's rows as a committed
epoch by key-group range on the executors, and a pipeline at another parallelism goes on from
it with exact counts; list and map state from their columns; ``initial_state=`` seeds a
streaming query's first epoch and is not applied again on restart; bad input is one line
naming the column or the location. Real Spark (the session fixture), file:// locations.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as sf
from statetier.backend import (
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.snapshot import SnapshotStore
from statetier.backend.snapshot.bootstrap import BootstrapError
from statetier.backend.spark import StatefulPipeline, write_state

from tests.spark.spark_support import COUNT, VectorWordCount, latest, zipf_words

KEYS = 5_000


def pipeline(uri: str, parallelism: int, **kwargs: Any) -> StatefulPipeline:
    return StatefulPipeline(
        VectorWordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=parallelism,
        config={"checkpoint.uri": uri},
        **kwargs,
    )


def seeded(spark: SparkSession, keys: int) -> Any:
    """``keys`` words with counts 1..keys, in 4 partitions."""
    return spark.range(1, keys + 1, numPartitions=4).select(
        sf.concat(sf.lit("w"), sf.col("id").cast("string")).alias("word"),
        sf.col("id").alias("value"),
    )


def collect_counts(pipe: StatefulPipeline, df: Any) -> dict[str, int]:
    out: dict[str, int] = {}

    def sink(batch: Any, epoch: int) -> None:
        out.update({row["word"]: row["count"] for row in batch.collect()})

    pipe.run(df, sink)
    return out


def test_bootstrapped_counts_go_on_in_a_pipeline_of_another_parallelism_exactly(
    spark: SparkSession, tmp_path: Path, pipelines: list[StatefulPipeline]
) -> None:
    uri = f"file://{tmp_path}/ckpt"
    manifest = write_state(
        seeded(spark, KEYS), uri, COUNT, key="word", parallelism=3, max_parallelism=64
    )
    assert (manifest.epoch, manifest.parallelism, manifest.max_parallelism) == (1, 3, 64)
    words = zipf_words(10_000, KEYS * 2, seed=41)  # half of them not bootstrapped
    oracle = {f"w{i}": i for i in range(1, KEYS + 1)}
    for word in words:
        oracle[word] = oracle.get(word, 0) + 1
    pipe = pipeline(uri, parallelism=2)
    pipelines.append(pipe)
    more = spark.createDataFrame([(w,) for w in words], "word string")
    seen = collect_counts(pipe, more)
    assert seen == {w: oracle[w] for w in set(words)}
    assert pipe.reports[-1].restored == 2  # restored from the bootstrap, not fresh
    every = spark.createDataFrame([(w,) for w in oracle], "word string")
    assert collect_counts(pipe, every) == {w: n + 1 for w, n in oracle.items()}
    assert SnapshotStore(uri).epochs() == [1, 2, 3]


class ShowLists(KeyedProcessFunction[str, None, Any]):
    def open(self, context: RuntimeContext) -> None:
        self.items = context.get_state(ListStateDescriptor[int]("items"))
        self.tags = context.get_state(MapStateDescriptor("tags"))
        self.seen = context.get_state(
            ValueStateDescriptor[str]("seen", ttl=StateTtlConfig(3_600_000))
        )

    def process(self, key: str, value: None, context: RuntimeContext) -> Any:
        return [(key, self.items.get(), dict(self.tags.items()), self.seen.value())]


def test_list_map_and_ttl_state_from_their_columns(spark: SparkSession, tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/ckpt"
    rnd = random.Random(7)
    arrays = [(f"k{i}", [rnd.randrange(100) for _ in range(i % 4 + 1)]) for i in range(200)]
    write_state(
        spark.createDataFrame(arrays, "key string, element array<bigint>"),
        uri,
        ListStateDescriptor[int]("items"),
        key="key",
        parallelism=2,
        max_parallelism=32,
    )
    tags = [(f"k{i}", f"t{j}", i * j) for i in range(0, 200, 3) for j in range(3)]
    tags_df = spark.createDataFrame(tags, "key string, tag string, n bigint")
    write_state(
        tags_df, uri, MapStateDescriptor("tags"), key="key", user_key="tag", value="n",
        parallelism=3, add_epoch=True,
    )  # fmt: skip
    seen = spark.createDataFrame(
        [(f"k{i}", f"s{i}") for i in range(0, 200, 2)], "key string, value string"
    )
    ttl = StateTtlConfig(3_600_000)
    write_state(seen, uri, ValueStateDescriptor[str]("seen", ttl=ttl), key="key", add_epoch=True)
    runner = LocalRunner(ShowLists, 2, checkpoint_uri=uri)
    got = {k: rest for k, *rest in runner.process([(f"k{i}", None) for i in range(200)])}
    runner.close()
    for i, (key, elements) in enumerate(arrays):
        want_tags = {f"t{j}": i * j for j in range(3)} if i % 3 == 0 else {}
        assert got[key] == [elements, want_tags, f"s{i}" if i % 2 == 0 else None]


def test_bad_input_is_one_line_naming_the_column_or_location(
    spark: SparkSession, tmp_path: Path
) -> None:
    uri = f"file://{tmp_path}/ckpt"
    df = seeded(spark, 100)
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: write_state(df, uri, COUNT, key="name"), "key column 'name' is not in the input"),
        (
            lambda: write_state(df.select("word"), uri, COUNT, key="word"),
            "needs a column 'value', which the DataFrame lacks",
        ),
        (
            lambda: write_state(df.withColumn("n", sf.lit(1)), uri, COUNT, key="n"),
            "key column 'n' is int: cast it to BIGINT",
        ),
        (
            lambda: write_state(df.union(df), uri, COUNT, key="word", parallelism=2),
            "key 'w\\d+' is given twice",
        ),
    ]
    for call, message in cases:
        with pytest.raises(BootstrapError, match=message) as raised:
            call()
        assert "\n" not in str(raised.value)
    with pytest.raises(BootstrapError, match=r"initial_state: .* needs a column 'value'"):
        pipeline(uri, parallelism=2, initial_state={COUNT: df.select("word")})
    assert SnapshotStore(uri).epochs() == []  # nothing was committed by a refused write
    write_state(df, uri, COUNT, key="word", parallelism=2)
    with pytest.raises(BootstrapError, match=f"{uri} holds committed epochs \\(latest 1\\)"):
        write_state(df, uri, COUNT, key="word")


def write_words(directory: Path, index: int, words: list[str]) -> None:
    directory.mkdir(exist_ok=True)
    path = directory / f"part-{index:04d}.parquet"
    pq.write_table(pa.table({"word": words}), path)
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))  # the file source's order


def stream(spark: SparkSession, pipe: StatefulPipeline, tmp_path: Path) -> dict[str, int]:
    """Run the query over the input there is now (a micro-batch a file); the latest counts."""
    out: dict[str, int] = {}

    def sink(batch: Any, epoch: int) -> None:
        latest(out, ((row["word"], row["count"]) for row in batch.collect()))

    words = spark.readStream.schema("word string").option("maxFilesPerTrigger", 1)
    query = (
        pipe.write_stream(words.parquet(str(tmp_path / "input")), sink)
        .option("checkpointLocation", str(tmp_path / "spark"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    return out


def test_initial_state_seeds_a_streaming_querys_first_epoch_and_not_its_restart(
    spark: SparkSession,
    tmp_path: Path,
    pipelines: list[StatefulPipeline],
    caplog: pytest.LogCaptureFixture,
) -> None:
    uri = f"file://{tmp_path}/ckpt"
    batches = [zipf_words(2000, 1000, seed=i) for i in range(3)]
    for i, words in enumerate(batches[:2]):
        write_words(tmp_path / "input", i, words)
    initial = seeded(spark, 500)  # w1..w500 start at 1..500
    first = pipeline(uri, parallelism=2, initial_state={COUNT: initial})
    pipelines.append(first)
    oracle = {f"w{i}": i for i in range(1, 501)}
    for word in [w for words in batches[:2] for w in words]:
        oracle[word] = oracle.get(word, 0) + 1
    seen = stream(spark, first, tmp_path)
    assert seen == {w: oracle[w] for words in batches[:2] for w in words}
    assert SnapshotStore(uri).epochs() == [1, 2, 3]  # the initial state, micro-batches 0 and 1
    first.stop_hosts()
    # a restart of the query (its Spark checkpoint): the location has epochs, so another
    # initial state is ignored, said in the log, and micro-batch 2 is epoch 4
    write_words(tmp_path / "input", 2, batches[2])
    again = pipeline(uri, parallelism=3, initial_state={COUNT: seeded(spark, 1000)})
    pipelines.append(again)
    with caplog.at_level(logging.INFO, logger="statetier"):
        seen = stream(spark, again, tmp_path)
    for word in batches[2]:
        oracle[word] = oracle.get(word, 0) + 1
    assert seen == {w: oracle[w] for w in batches[2]}
    assert SnapshotStore(uri).epochs()[-1] == 4
    assert any("initial_state is ignored" in r.getMessage() for r in caplog.records)
