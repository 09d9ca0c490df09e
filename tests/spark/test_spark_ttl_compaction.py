"""TTL-aware compaction on the Spark path: the driver's compaction request carries the epoch's
clock (the micro-batch's processing time), so a state whose TTL asks for cleanup in compaction
loses its expired entries in the compacted base, and a state that does not keeps them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from pyspark.sql import SparkSession
from statetier.backend.runtime import FunctionInstance
from statetier.backend.snapshot import SnapshotStore
from statetier.backend.spark import StatefulPipeline
from statetier.backend.ttl import ManualClock

from tests.spark.spark_support import TTL_MS, ExpiringWords

T0 = 1_000_000


def stored_keys(store: SnapshotStore, state: str) -> set[str]:
    """The keys the latest checkpoint holds for ``state``, expired or not."""
    manifest = store.manifest()
    keys: set[str] = set()
    for index in range(manifest.parallelism):
        instance = FunctionInstance(
            cast(Any, ExpiringWords),
            index,
            manifest.parallelism,
            manifest.max_parallelism,
            store=store,
            restore_epoch=manifest.epoch,
            clock=ManualClock(T0),  # nothing looks expired to the reader
        )
        keys |= set(instance.keyed.keys(state))
    return keys


def test_the_driver_compacts_with_the_epochs_clock_and_drops_only_what_asks(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    clock = ManualClock(T0)
    uri = f"file://{tmp_path}/ckpt"
    pipeline = StatefulPipeline(
        ExpiringWords,
        key="word",
        output_schema="word string, count bigint",
        parallelism=2,
        config={
            "checkpoint.uri": uri,
            "compaction.delta-trigger": 2,
            "compaction.size-ratio": 1e6,
        },
        clock=clock,
    )
    pipelines.append(pipeline)

    def run(words: list[str]) -> None:
        df = spark.createDataFrame([(w,) for w in words], "word string")
        pipeline.run(df)
        pipeline.drain()

    old = [f"old{i}" for i in range(20)]
    run(old)  # epoch 1 at T0: a base per range
    clock.advance(2 * TTL_MS)  # old* expire
    run([f"new{i}" for i in range(20)])  # epoch 2: a delta
    run([f"new{i}" for i in range(20)])  # epoch 3: 2 deltas, compacted at T0 + 2 s
    run(["new0"])  # epoch 4: the hosts name the compacted bases
    store = SnapshotStore(uri)
    bases = [c.base for c in store.manifest().chains()]
    assert all("/compacted/" in b.path for b in bases), bases
    assert not set(old) & stored_keys(store, "cleaned")
    assert set(old) <= stored_keys(store, "kept")
