"""Full and incremental checkpoints on s3:// and file://: what is written, what comes back."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from statetier.backend import (
    FunctionInitializationContext,
    ListStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from statetier.backend.config import load_config
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.local_runner import LocalRunner
from statetier.backend.snapshot import SnapshotStore
from statetier.backend.snapshot.format import (
    BASE,
    DELTA,
    DataFileReader,
    encode_data_file_columns,
)
from statetier.backend.snapshot.manifest import Manifest
from statetier.backend.snapshot.merge import merge_blocks
from statetier.backend.ttl import ManualClock

from tests.checkpoint.ckpt_support import (
    MAX_P,
    Location,
    dump_keyed,
    dump_operator,
    records,
    restored_operator,
)


def runner(location: Location, parallelism: int = 4, **config: Any) -> LocalRunner:
    cfg = load_config({"compaction.delta-trigger": 100, "compaction.size-ratio": 100.0, **config})
    return location.runner(parallelism, config=cfg)


@pytest.mark.parametrize("incremental", [True, False])
def test_every_epoch_restores_exactly(location: Location, incremental: bool) -> None:
    """After each epoch, a restore (here at 3) returns exactly the live state, both modes."""
    live = runner(location, **{"checkpoint.incremental": incremental})
    for epoch in range(1, 5):
        live.process(records(epoch))
        manifest = live.checkpoint()
        kinds = {f.kind for f in manifest.keyed_files if f.epoch == epoch}
        assert kinds == ({DELTA} if incremental and epoch > 1 else {"base"})
        restored = runner(location, 3)
        assert restored.restored_epoch == epoch
        assert dump_keyed(restored) == dump_keyed(live)
        assert dump_operator(restored) == restored_operator(dump_operator(live), 3)
    live.close()


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_incremental_cost_follows_the_change(location: Location, compression: str) -> None:
    live = runner(location, 4, **{"checkpoint.compression": compression})
    store = location.store()

    def entries(manifest: Manifest, epoch: int) -> int:
        files = [f for f in manifest.keyed_files if f.epoch == epoch]
        return sum(DataFileReader(store.read(f), f.path).verify() for f in files)

    live.process(records(1, n=4000, keys=2000))
    full = live.checkpoint()
    full_bytes = sum(f.size for f in full.keyed_files)
    live.process([(f"k{i}", 7) for i in range(0, 2000, 100)])  # 1% of the keys
    delta = live.checkpoint()
    delta_bytes = sum(f.size for f in delta.keyed_files if f.epoch == 2)
    assert 0 < entries(delta, 2) <= 0.05 * entries(full, 1)
    if compression == "none":
        # compressed, a delta this small is a larger share: each file's header, index and
        # footer stay as they are, and a few scattered entries compress less than a base
        assert 0 < delta_bytes <= 0.05 * full_bytes
    untouched = live.checkpoint()
    # nothing processed: each instance re-logs only its current key (drain_touched_keys keeps
    # it valid for the handles), so each delta holds one entry
    for f in (f for f in untouched.keyed_files if f.epoch == 3):
        assert DataFileReader(store.read(f), f.path).verify() <= 1
    assert dump_keyed(runner(location, 2)) == dump_keyed(live)
    live.close()


def test_removed_keys_are_tombstones(location: Location) -> None:
    live = runner(location)
    live.process([("a", 5), ("b", 6)])
    live.checkpoint()
    live.process([("a", 0)])  # clears every state of a
    manifest = live.checkpoint()
    store = location.store()
    deltas = [f for f in manifest.keyed_files if f.kind == DELTA and f.state == "total"]
    tombstones = [
        kv
        for f in deltas
        for kg in DataFileReader(store.read(f), f.path).index
        for kv in DataFileReader(store.read(f), f.path).read_block(kg)
        if kv[1] is None
    ]
    assert len(tombstones) == 1
    restored = runner(location, 1)
    assert "a" not in dump_keyed(restored)["total"] and dump_keyed(restored)["total"]["b"] == 6


class Stamp(KeyedProcessFunction[str, int, Any]):
    def open(self, context: RuntimeContext) -> None:
        ttl = StateTtlConfig(1000, cleanup_full_snapshot=True)
        self.v = context.get_state(ValueStateDescriptor[int]("v", ttl=ttl))

    def process(self, key: str, value: int, context: RuntimeContext) -> Any:
        self.v.update(value)
        return ()


def test_full_snapshot_drops_expired_entries(location: Location) -> None:
    clock = ManualClock(10_000)
    cfg = load_config({"checkpoint.incremental": False})
    live = LocalRunner(
        Stamp,
        2,
        max_parallelism=MAX_P,
        checkpoint_uri=location.uri,
        storage_options=location.options,
        clock=clock,
        config=cfg,
    )
    live.process([("old", 1)])
    clock.advance(900)
    live.process([("new", 2)])
    clock.advance(200)  # "old" expired, "new" not
    live.checkpoint()
    store = location.store()
    restored_keys = {
        k
        for f in store.manifest().keyed_files
        for kg in DataFileReader(store.read(f), f.path).index
        for k, _ in DataFileReader(store.read(f), f.path).read_block(kg)
    }
    assert len(restored_keys) == 1  # only "new" was written


def test_readers_do_not_take_the_lease(location: Location) -> None:
    live = runner(location)
    live.process(records(1))
    live.checkpoint()
    owner = SnapshotStore(location.uri, **location.options).current_owner()
    runner(location, 2).close()  # restores, never checkpoints
    assert SnapshotStore(location.uri, **location.options).current_owner() == owner
    live.process(records(2))
    live.checkpoint()  # still the writer
    live.close()


def test_a_delta_keeps_its_keys_in_touched_order_and_merges_sorted() -> None:
    def header(kind: str) -> dict[str, Any]:
        return {"state": "s", "key_groups": "0-0", "epoch": 1, "kind": kind, "max_parallelism": 1}

    base = encode_data_file_columns(header(BASE), [(0, [b"k2", b"k1", b"k0"], [b"a", b"b", b"c"])])
    touched = [b"k5", b"k1", b"k9", b"k0", b"k7"]
    delta = encode_data_file_columns(
        header(DELTA), [(0, touched, [b"v5", b"v1", b"v9", None, b"v7"])]
    )
    base_block = DataFileReader(base, "base").block(0)
    delta_block = DataFileReader(delta, "delta").block(0)
    assert base_block is not None and delta_block is not None
    assert base_block.flat()[0::2] == [b"k0", b"k1", b"k2"]  # a base is sorted
    assert delta_block.flat()[0::2] == touched  # a delta is as touched
    merged = merge_blocks([base_block, delta_block])
    expected = {b"k1": b"v1", b"k2": b"a", b"k5": b"v5", b"k7": b"v7", b"k9": b"v9"}
    assert merged == [x for key in sorted(expected) for x in (key, expected[key])]


class MarkedCount(KeyedProcessFunction[str, int, Any]):
    """Counts per key; a value of -1 also marks the key in an operator list state, so the
    operator state changes only in the epochs that carry a mark."""

    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(ValueStateDescriptor[int]("count"))

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        self.marks = context.operator_state_store.get_list_state(ListStateDescriptor[str]("marks"))

    def process(self, key: str, value: int, context: RuntimeContext) -> Iterable[Any]:
        self.count.update((self.count.value() or 0) + 1)
        if value == -1:
            self.marks.add(key)
        return ()


def marked_runner(location: Location) -> LocalRunner:
    """A :class:`MarkedCount` runner of one instance, keeping 2 epochs."""
    return LocalRunner(
        MarkedCount,
        1,
        max_parallelism=MAX_P,
        checkpoint_uri=location.uri,
        storage_options=location.options,
        config=load_config({"checkpoint.retained": 2}),
    )


def test_an_unchanged_operator_state_is_named_again_not_uploaded(location: Location) -> None:
    """A range per epoch uploading the same operator state (none at all, for most functions)
    was a PUT and, after retention, a DELETE per range and epoch on object storage."""
    live = marked_runner(location)
    files = []
    for epoch, batch in enumerate([[("a", -1)], [("b", 1)], [("c", 1)], [("d", -1)], [("e", 1)]]):
        live.process(batch)
        manifest = live.checkpoint()
        (entry,) = manifest.operator_files
        files.append((entry.path, entry.epoch))
        assert manifest.epoch == epoch + 1
    live.close()
    # new bytes in epochs 1 and 4 only; epoch 1's file outlived retention while named
    assert [e for _, e in files] == [1, 1, 1, 4, 4]
    assert files[0][0] == files[2][0] != files[3][0] == files[4][0]

    restored = marked_runner(location)
    (instance,) = restored.instances
    assert sorted(instance.operator_state.states["marks"].state.elements) == ["a", "d"]
    restored.process([("f", 1)])  # a restore redistributes the state: its next file is new
    (entry,) = restored.checkpoint().operator_files
    assert entry.epoch == 6
    restored.close()
