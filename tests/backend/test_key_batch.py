"""Bulk reads and writes through a KeyBatch: the same state, the same change log and the same
checks as the per-key path, on heap, TTL and spilled key groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pytest
from statetier.backend import (
    NullKeyError,
    StateTtlConfig,
    ValueState,
    ValueStateDescriptor,
)
from statetier.backend.keyed_backend import KeyedStateBackend, KeyGroupOutOfRangeError
from statetier.backend.keygroups import KeyGroupRange, assign_to_key_group
from statetier.backend.snapshot import (
    PreparedSubtask,
    SnapshotStore,
    SubtaskWriter,
    commit_snapshot,
    restore_keyed_state,
)
from statetier.backend.snapshot.format import DataFileReader
from statetier.backend.spill import SpillManager, SpillStorage
from statetier.backend.ttl import ManualClock

MAX_P = 128
HALF = KeyGroupRange(64, 127)  # a range that does not start at 0: slots are key group - 64


def _keys_in(key_range: KeyGroupRange, count: int, prefix: str = "k") -> list[str]:
    """``count`` distinct string keys whose key groups are in ``key_range``."""
    keys: list[str] = []
    n = 0
    while len(keys) < count:
        key = f"{prefix}{n}"
        if assign_to_key_group(key, MAX_P) in key_range:
            keys.append(key)
        n += 1
    return keys


def _backend(
    clock: ManualClock | None = None,
) -> tuple[KeyedStateBackend, ValueState[int]]:
    backend = KeyedStateBackend(HALF, MAX_P, clock=clock)
    return backend, backend.get_state(ValueStateDescriptor[int]("count"))


def _ordered(keys: list[Any], order: str) -> list[Any]:
    """``keys`` as hashed, or sorted by key group: a sorted batch takes the handles' path of one
    C-level call per key group (``KeyBatch.runs``), any other the per-key one."""
    if order == "as hashed":
        return keys
    return sorted(keys, key=lambda k: assign_to_key_group(k, MAX_P))


ORDERS = pytest.mark.parametrize("order", ["as hashed", "by key group"])


def _per_key(backend: KeyedStateBackend, state: ValueState[int], keys: list[Any]) -> list[Any]:
    values = []
    for key in keys:
        backend.set_current_key(key)
        values.append(state.value())
    return values


@ORDERS
def test_bulk_reads_and_writes_are_the_per_key_reads_and_writes(order: str) -> None:
    backend, count = _backend()
    keys = _ordered(_keys_in(HALF, 300), order)
    for i, key in enumerate(keys[:100]):  # some keys have values, written key by key
        backend.set_current_key(key)
        count.update(i)
    batch = backend.key_batch(keys)
    assert (batch.runs is not None) == (order == "by key group")
    assert count.values(batch) == [*range(100), *[None] * 200]
    count.update_all(batch, [i * 2 for i in range(300)])
    assert _per_key(backend, count, keys) == [i * 2 for i in range(300)]
    # None clears, as update(None) does; the other keys keep their new values
    count.update_all(batch, [None if i % 3 == 0 else i for i in range(300)])
    assert _per_key(backend, count, keys) == [None if i % 3 == 0 else i for i in range(300)]
    assert sorted(backend.keys("count")) == sorted(k for i, k in enumerate(keys) if i % 3)


def test_repeated_keys_read_per_position_and_the_last_write_wins() -> None:
    backend, count = _backend()
    key, other = _keys_in(HALF, 2)
    batch = backend.key_batch([key, other, key])
    count.update_all(batch, [1, 2, 3])
    assert count.values(batch) == [3, 2, 3]
    # sorted by key group: a repeated key within one key group's run, the last write wins too
    ranked = backend.key_batch(
        [key, key, other] if batch.slots[0] <= batch.slots[1] else [other, key, key]
    )
    assert ranked.runs is not None
    count.update_all(ranked, [4, 5, 6])
    assert count.values(backend.key_batch([key, other])) == (
        [5, 6] if batch.slots[0] <= batch.slots[1] else [6, 4]
    )


def test_the_pipelines_key_group_column_gives_the_same_slots_as_hashing() -> None:
    backend, count = _backend()
    keys = _keys_in(HALF, 200)
    groups = [assign_to_key_group(k, MAX_P) for k in keys]
    given = backend.key_batch(pa.array(keys), pa.array(groups, pa.int32()))
    assert given.slots == [g - HALF.start for g in groups]
    assert backend.key_batch(keys, np.array(groups)).slots == given.slots
    count.update_all(given, pa.array(range(200), pa.int64()))
    assert count.values(backend.key_batch(keys)) == list(range(200))


def test_a_key_group_column_out_of_step_with_the_keys_is_refused() -> None:
    backend, _ = _backend()
    keys = _keys_in(HALF, 64)
    groups = [assign_to_key_group(k, MAX_P) for k in keys]
    with pytest.raises(ValueError, match="not in step with the keys"):
        backend.key_batch(keys, groups[1:] + groups[:1])  # shifted by one
    with pytest.raises(ValueError, match="64 keys but 63 key groups"):
        backend.key_batch(keys, groups[:-1])
    with pytest.raises(KeyGroupOutOfRangeError, match="key group 3 is outside"):
        backend.key_batch(keys, [3, *groups[1:]])
    with pytest.raises(TypeError, match="must be ints"):
        backend.key_batch(keys, cast(list[int], [float(g) for g in groups]))


@pytest.mark.parametrize("order", ["as hashed", "by key group"])
@pytest.mark.parametrize("column", ["arrow", "chunked", "numpy", "list"])
def test_a_key_group_column_gives_the_slots_and_runs_hashing_gives(order: str, column: str) -> None:
    """Whatever form the column takes, the batch is the one the per-key hashing makes: the
    same slots, and the same runs (None when the keys are not sorted by key group)."""
    backend, _ = _backend()
    keys = _ordered(_keys_in(HALF, 300), order)
    groups = [assign_to_key_group(k, MAX_P) for k in keys]
    given: Any = {
        "arrow": pa.array(groups, pa.int32()),
        "chunked": pa.chunked_array([groups[:100], groups[100:]], pa.int64()),
        "numpy": np.array(groups, np.uint16),
        "list": groups,
    }[column]
    batch, hashed = backend.key_batch(keys, given), backend.key_batch(keys)
    assert batch.slots == hashed.slots == [g - HALF.start for g in groups]
    assert batch.runs == hashed.runs
    assert (batch.runs is None) == (order == "as hashed")
    assert backend.key_batch([], pa.array([], pa.int32())).runs == []


def test_a_key_group_column_of_another_type_or_with_nulls_is_refused() -> None:
    backend, _ = _backend()
    keys = _keys_in(HALF, 3)
    groups = [assign_to_key_group(k, MAX_P) for k in keys]
    with pytest.raises(TypeError, match=r"must be ints .* not double"):
        backend.key_batch(keys, pa.array(groups, pa.float64()))
    with pytest.raises(TypeError, match="not int32 with nulls"):
        backend.key_batch(keys, pa.array([groups[0], None, groups[2]], pa.int32()))
    with pytest.raises(TypeError, match="must be ints, not bool"):
        backend.key_batch(keys, np.array([True, False, True]))
    with pytest.raises(TypeError, match="must be ints"):
        backend.key_batch(keys, [groups[0], True, groups[2]])
    with pytest.raises(KeyGroupOutOfRangeError, match="outside"):
        backend.key_batch(keys, [groups[0], 2**70, groups[2]])


def test_keys_hashing_would_refuse_are_refused_though_not_hashed() -> None:
    backend, _ = _backend()
    keys: list[Any] = _keys_in(HALF, 40)
    groups = [assign_to_key_group(k, MAX_P) for k in keys]
    for bad, error in [(None, NullKeyError), (True, TypeError), (2**70, TypeError)]:
        # position 1 is not in the sample of hashed keys: only the type checks see it
        with pytest.raises(error):
            backend.key_batch([keys[0], bad, *keys[2:]], groups)
    with pytest.raises(NullKeyError):
        backend.key_batch([keys[0], None])  # hashed: refused as set_current_key refuses it


def test_a_batch_serves_only_its_own_backend() -> None:
    backend, count = _backend()
    _, other_count = _backend()
    batch = backend.key_batch(_keys_in(HALF, 3))
    with pytest.raises(ValueError, match="made by another state backend"):
        other_count.values(batch)
    with pytest.raises(ValueError, match="made by another state backend"):
        other_count.update_all(batch, [1, 2, 3])
    with pytest.raises(ValueError, match="2 values for a KeyBatch of 3 keys"):
        count.update_all(batch, [1, 2])


def test_bulk_writes_are_in_the_next_delta_and_restore_exactly(tmp_path: Path) -> None:
    store = SnapshotStore(f"file://{tmp_path}/ckpt")
    backend, count = _backend()
    rest = KeyedStateBackend(KeyGroupRange(0, HALF.start - 1), MAX_P)  # the other key groups
    writers = [SubtaskWriter(backend, None), SubtaskWriter(rest, None)]
    keys = _keys_in(HALF, 500)
    batch = backend.key_batch(keys)
    count.update_all(batch, list(range(500)))

    def checkpoint(epoch: int) -> list[PreparedSubtask]:
        prepared = [writer.prepare(store, epoch) for writer in writers]
        for file in (f for p in prepared for f in p.uploads):
            store.put(file.entry.path, file.data)
        commit_snapshot(store, epoch, [p.snapshot for p in prepared])
        return prepared

    base = checkpoint(1)[0]
    assert backend.drain_touched_keys() == {}  # the snapshot drained the log
    later = backend.key_batch(keys[:50], [assign_to_key_group(k, MAX_P) for k in keys[:50]])
    count.update_all(later, [None if i < 10 else -i for i in range(50)])
    delta = checkpoint(2)[0]
    assert [f.entry.kind for f in delta.uploads] == ["delta"]
    (delta_file,), (base_file,) = delta.uploads, base.uploads
    assert DataFileReader(delta_file.data, "delta").verify() == 50  # only the touched keys
    assert DataFileReader(base_file.data, "base").verify() == 500
    restored, restored_count = _backend()
    restore_keyed_state(store, restored, 2)
    expected = [None if i < 10 else (-i if i < 50 else i) for i in range(500)]
    assert restored_count.values(restored.key_batch(keys)) == expected


def test_ttl_state_bulk_access_renews_and_expires_as_per_key_access() -> None:
    clock = ManualClock()
    backend = KeyedStateBackend(HALF, MAX_P, clock=clock)
    ttl = StateTtlConfig(ttl_ms=100)
    seen = backend.get_state(ValueStateDescriptor[str]("seen", ttl=ttl))
    keys = _keys_in(HALF, 20)
    backend.set_current_key(keys[0])  # the current key before the bulk calls stays current
    seen.update_all(backend.key_batch(keys), [f"v{i}" for i in range(20)])
    clock.advance(60)
    seen.update_all(backend.key_batch(keys[:5]), ["renewed"] * 5)  # written at 60
    clock.advance(60)  # 120: the first write expired, the renewed ones live until 160
    assert seen.values(backend.key_batch(keys)) == ["renewed"] * 5 + [None] * 15
    assert backend.current_key == keys[0]
    assert seen.value() == "renewed"


@ORDERS
def test_bulk_access_reaches_spilled_key_groups(tmp_path: Path, order: str) -> None:
    backend, count = _backend()
    manager = SpillManager(backend, SpillStorage([str(tmp_path)], 1 << 20))
    keys = _ordered(_keys_in(HALF, 400), order)
    count.update_all(backend.key_batch(keys), list(range(400)))
    spilled_group = assign_to_key_group(keys[0], MAX_P)
    assert manager.spill_key_group(spilled_group)
    on_disk = [k for k in keys if assign_to_key_group(k, MAX_P) == spilled_group]
    batch = backend.key_batch(keys)
    assert count.values(batch) == list(range(400))
    count.update_all(batch, [i + 1 for i in range(400)])
    assert manager.is_spilled(spilled_group)
    assert _per_key(backend, count, on_disk) == [keys.index(k) + 1 for k in on_disk]


def test_a_batch_counts_one_request_per_key_and_polls_the_spill_tier_once() -> None:
    backend, _ = _backend()
    hits = [0] * (len(HALF) + 1)
    polls: list[int] = []
    backend.count_hits(hits, on_poll=lambda: polls.append(1))
    keys = _keys_in(HALF, 300)
    backend.key_batch(keys + keys[:10])
    expected = [0] * (len(HALF) + 1)
    for key in keys + keys[:10]:
        expected[assign_to_key_group(key, MAX_P) - HALF.start] += 1
    assert hits == expected
    assert polls == [1]
    # sorted by key group with the pipeline's column: counted a run at a time, the same counts
    ranked = _ordered(keys + keys[:10], "by key group")
    batch = backend.key_batch(ranked, [assign_to_key_group(k, MAX_P) for k in ranked])
    assert batch.runs is not None
    assert hits == [2 * n for n in expected]
    assert polls == [1, 1]


def test_a_key_touched_by_several_batches_and_per_key_is_drained_once() -> None:
    backend, count = _backend()
    keys = _keys_in(HALF, 30)
    groups = [assign_to_key_group(k, MAX_P) for k in keys]
    count.update_all(backend.key_batch(keys[:20], groups[:20]), [1] * 20)
    count.update_all(backend.key_batch(keys[10:], groups[10:]), [2] * 20)
    backend.set_current_key(keys[0])
    count.update(3)
    drained = backend.drain_touched_keys()
    flat = [k for group in drained.values() for k in group]
    assert sorted(flat) == sorted(keys)
    assert all(assign_to_key_group(k, MAX_P) == g for g, ks in drained.items() for k in ks)
    backend.set_current_key(keys[5])  # a later epoch: what it touches (and the current key)
    assert {k for ks in backend.drain_touched_keys().values() for k in ks} == {keys[0], keys[5]}


@pytest.mark.parametrize("order", ["by key group", "as hashed"])
def test_drained_keys_are_grouped_once_each_whatever_the_batch_order(order: str) -> None:
    """A batch sorted by key group is filed in slices, any other key by key: either way each
    touched key is drained once, under its own key group (checked against a per-key oracle)."""
    backend, count = _backend()
    single, *keys = _keys_in(HALF, 301)
    keys += keys[::7]  # repeated within the batch
    groups = [assign_to_key_group(k, MAX_P) for k in keys]
    if order == "by key group":
        ranked = sorted(range(len(keys)), key=groups.__getitem__)
        keys, groups = [keys[i] for i in ranked], [groups[i] for i in ranked]
    backend.set_current_key(single)  # touched per key
    count.update(0)
    count.update_all(backend.key_batch(keys, groups), list(range(len(keys))))
    expected: dict[int, set[Any]] = {}
    for key in [single, *keys]:
        expected.setdefault(assign_to_key_group(key, MAX_P), set()).add(key)
    drained = backend.drain_touched_keys()
    assert {g: set(ks) for g, ks in drained.items()} == expected
    assert sum(map(len, drained.values())) == len({single, *keys})


def test_tuple_keys_are_each_checked_against_their_given_key_group() -> None:
    backend, count = _backend()
    keys: list[Any] = [(k, 1) for k in _keys_in(KeyGroupRange(0, MAX_P - 1), 400)]
    keys = [k for k in keys if assign_to_key_group(k, MAX_P) in HALF][:40]
    groups = [assign_to_key_group(k, MAX_P) for k in keys]
    count.update_all(backend.key_batch(keys, groups), list(range(40)))
    assert count.values(backend.key_batch(keys)) == list(range(40))
    wrong = next(g for g in HALF if g != groups[1])  # position 1: not in a sample of 1 in 16
    with pytest.raises(ValueError, match="not in step with the keys"):
        backend.key_batch(keys, [groups[0], wrong, *groups[2:]])
