"""The driver's upkeep after commits: a merge that takes longer than an epoch does not hold up
the next commits (it would put compaction back on the micro-batch's path) until a chain reaches
CUT_FACTOR x the trigger (then the stream waits: backpressure), and the commits made while it
runs are taken care of by one later job, not one each."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
from statetier.backend.config import load_config
from statetier.backend.keygroups import assign_to_key_group
from statetier.backend.runtime import FunctionInstance
from statetier.backend.snapshot import SnapshotStore, commit_snapshot
from statetier.backend.snapshot.compaction import CompactionRequest, CompactionResult
from statetier.backend.snapshot.manifest import Manifest
from statetier.backend.spark.functions import KEY_GROUP_COLUMN
from statetier.backend.spark.upkeep import EpochUpkeep
from statetier.tools.bench.spark_functions import ArrowWordCount


class GatedCompactor:
    """The upkeep's own local compactor, held at a gate until the test opens it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.started = threading.Event()
        self.gate = threading.Event()
        self.calls = 0

    def compact(self, request: CompactionRequest) -> CompactionResult:
        self.calls += 1
        self.started.set()
        assert self.gate.wait(30), "the test never opened the gate"
        result: CompactionResult = self.inner.compact(request)
        return result


def commit_epoch(
    instance: FunctionInstance, store: SnapshotStore, lease: Any, epoch: int
) -> Manifest:
    words = [f"w{(epoch * 7 + i) % 50}" for i in range(100)]
    function = cast(ArrowWordCount, instance.function)
    key_groups = [assign_to_key_group(word, 128) for word in words]  # as the pipeline adds
    records = pa.table({"word": words, KEY_GROUP_COLUMN: pa.array(key_groups, pa.int32())})
    function.process_range(records, instance.context)
    instance.before_snapshot(epoch)
    prepared = instance.writer.prepare(store, epoch, lease.owner)
    for f in prepared.uploads:
        store.put(f.entry.path, f.data)
    return commit_snapshot(store, epoch, [prepared.snapshot], lease)


def test_commits_do_not_wait_for_a_running_compaction(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/ckpt"
    store = SnapshotStore(uri)
    lease = store.acquire_writer()
    settings = {"checkpoint.uri": uri, "compaction.delta-trigger": 2, "compaction.size-ratio": 100}
    config = load_config(settings, env={})
    upkeep = EpochUpkeep(store, config)
    assert upkeep.compaction is not None
    gated = GatedCompactor(upkeep.compaction.compactor)
    upkeep.compaction.compactor = gated
    instance = FunctionInstance(cast(Any, ArrowWordCount), 0, 1, 128, store=store)
    try:
        waits = []
        for epoch in range(1, 7):
            manifest = commit_epoch(instance, store, lease, epoch)
            started = time.perf_counter()
            upkeep.committed(manifest, lease.owner)
            waits.append(time.perf_counter() - started)
            if epoch == 3:  # base + 2 deltas: the merge starts and is held at the gate
                assert gated.started.wait(10)
        assert max(waits) < 1.0, waits  # epochs 4-6 committed while the merge was held
        assert gated.calls == 1
        # epoch 7's chain has 6 deltas, CUT_FACTOR x the trigger: compaction fell behind, the
        # commit waits for the running merge (backpressure)
        opener = threading.Timer(0.5, gated.gate.set)
        opener.start()
        manifest = commit_epoch(instance, store, lease, 7)
        started = time.perf_counter()
        upkeep.committed(manifest, lease.owner)
        assert time.perf_counter() - started >= 0.4
        upkeep.drain()
        # epochs 4-6 were one queued job, for epoch 6, and epoch 7 one more; their chain starts
        # with the merged files, whose update is still pending, so nothing more was merged
        assert gated.calls == 1 and upkeep.compactions == 1
        (update,) = upkeep.updates()
        assert update.base is not None
        assert [f.epoch for f in update.inputs] == [1, 2, 3]
        (chain,) = store.manifest().chains()
        assert [f.epoch for f in chain.files] == [1, 2, 3, 4, 5, 6, 7]
        assert store.missing([update.base]) == []  # the merged base is in storage
    finally:
        gated.gate.set()
        upkeep.close()
        instance.close()
