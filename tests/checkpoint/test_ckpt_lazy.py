"""Lazy restore: a restore downloads and checks the files but keeps key groups as blocks, and a
key group is decoded, from memory, when it is first read. These tests check that what the lazy
entries answer (lookups, registration, a write-back of a state never registered) is exactly the
checkpointed state, base + deltas with tombstones, and that only what is read gets decoded."""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest
from statetier.backend import ValueStateDescriptor
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import KeyGroupRange, assign_to_key_group
from statetier.backend.serializers import DEFAULT_SERIALIZER
from statetier.backend.snapshot import (
    SnapshotStore,
    SubtaskWriter,
    read_key_groups,
    restore_keyed_state,
)
from statetier.backend.snapshot.format import DataFileReader
from statetier.backend.snapshot.lazy import FlatPairs, LazyEntries, bulk_allocation
from statetier.backend.state.codec import StateCodec

from tests.checkpoint.ckpt_support import MAX_P, Location, dump_keyed, records

TOTAL = ValueStateDescriptor[int]("total")


def checkpointed(location: Location) -> tuple[SnapshotStore, dict[Any, Any]]:
    """Two epochs (bases, then deltas that also remove keys); the live "total" values."""
    live = location.runner(2)
    live.process(records(1, n=300, keys=80))
    live.checkpoint()
    live.process([*records(2, n=100, keys=80), ("k3", 0), ("k5", 0)])  # 0 removes the key
    manifest = live.checkpoint()
    assert any(f.kind == "delta" for f in manifest.keyed_files)
    totals = dump_keyed(live)["total"]
    live.close()
    store: SnapshotStore = location.store()
    return store, totals


def lazy_total(store: SnapshotStore) -> tuple[KeyedStateBackend, LazyEntries]:
    backend = KeyedStateBackend(KeyGroupRange.of(MAX_P), MAX_P)
    restore_keyed_state(store, backend)
    entries = backend.restored["total"].entries
    assert isinstance(entries, LazyEntries)
    return backend, entries


def lookup(entries: LazyEntries, key: str) -> Any:
    found = entries.lookup(assign_to_key_group(key, MAX_P), DEFAULT_SERIALIZER.dumps(key))
    return None if found is None else StateCodec(TOTAL).decode(found)


def test_lookups_decode_only_their_key_group(location: Location) -> None:
    store, totals = checkpointed(location)
    _, entries = lazy_total(store)
    assert entries.undecoded == len(entries) > 1  # nothing decoded by the restore itself
    assert all(kg in entries for kg in list(entries)) and MAX_P not in entries
    assert entries.undecoded == len(entries)  # asking whether a key group is there decodes none
    assert lookup(entries, "k0") == totals["k0"]
    assert entries.undecoded == len(entries) - 1
    for key in [f"k{i}" for i in range(80)]:
        assert lookup(entries, key) == totals.get(key), key
    assert "k3" not in totals and "k5" not in totals  # removed by a delta: a tombstone
    assert lookup(entries, "k3") is None and lookup(entries, "never-written") is None


def test_registration_decodes_exactly_the_checkpointed_state(location: Location) -> None:
    store, totals = checkpointed(location)
    backend, entries = lazy_total(store)
    backend.get_state(TOTAL)
    assert "total" not in backend.restored and entries.undecoded == 0
    table = backend.tables["total"]
    stored = {k: v for kg in backend.key_groups for k, v in table.map_for(kg).items()}
    assert stored == totals


def test_decode_all_matches_an_eager_read_of_every_file(location: Location) -> None:
    store, _ = checkpointed(location)
    _, entries = lazy_total(store)
    entries.decode_all()
    assert entries.undecoded == 0
    eager: dict[bytes, bytes | None] = {}
    chains = [c for c in store.manifest().chains() if c.state == "total"]
    for file in (f for chain in chains for f in chain.files):  # base first, then deltas
        reader = DataFileReader(store.read(file), file.path)
        eager.update(pair for kg in reader.index for pair in reader.read_block(kg))
    expected = {k: v for k, v in eager.items() if v is not None}
    lazy = {k: v for pairs in entries.values() for k, v in pairs}
    assert lazy == expected
    for pairs in entries.values():
        keys = [k for k, _ in pairs]
        assert keys == sorted(keys)  # merged key groups stay sorted, as blocks are


def test_a_state_never_registered_is_written_back_unchanged(location: Location) -> None:
    store, totals = checkpointed(location)
    backend, _ = lazy_total(store)
    prepared = SubtaskWriter(backend, None).prepare(store, 3, full=True)
    upload = next(f for f in prepared.uploads if f.entry.state == "total")
    reader = DataFileReader(upload.data, upload.entry.path)
    loads, decode = DEFAULT_SERIALIZER.loads, StateCodec(TOTAL).decode
    written = {loads(k): decode(v) for kg in reader.index for k, v in reader.read_block(kg) if v}
    assert written == totals


def test_flat_pairs_behave_as_a_list_of_pairs() -> None:
    pairs = [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
    flat = FlatPairs([x for pair in pairs for x in pair])
    assert len(flat) == 3 and list(flat) == pairs
    assert flat[0] == pairs[0] and flat[-1] == pairs[-1] and flat[1:] == pairs[1:]
    assert flat.keys() == [b"a", b"b", b"c"]
    with pytest.raises(IndexError):
        flat[3]


def test_bulk_allocation_restores_the_collector_across_threads() -> None:
    assert gc.isenabled()
    inside = threading.Barrier(2)
    seen: list[bool] = []

    def hold() -> None:
        with bulk_allocation():
            inside.wait()
            seen.append(gc.isenabled())

    other = threading.Thread(target=hold)
    other.start()
    with bulk_allocation():
        inside.wait()
        other.join()  # the other holder has left: still paused for this one
        seen.append(gc.isenabled())
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        with bulk_allocation():
            pass
        assert not gc.isenabled()  # paused by someone else before: left paused
    finally:
        gc.enable()


def test_states_named_to_decode_are_decoded_as_their_files_arrive(location: Location) -> None:
    """What a restore into registered states asks for: those states' bases decoded during the
    download, the same pairs a lazy read gives, the other states left as blocks."""
    store, _ = checkpointed(location)
    bases_only = store.manifest(1)
    every = KeyGroupRange.of(MAX_P)
    eager = read_key_groups(store, bases_only, every, decode={"total"})
    lazy = read_key_groups(store, bases_only, every)
    total, residues = eager["total"].entries, eager["residues"].entries
    assert isinstance(total, LazyEntries) and isinstance(residues, LazyEntries)
    assert total.undecoded == 0 and residues.undecoded == len(residues) > 0
    assert {kg: list(p) for kg, p in total.items()} == {
        kg: list(p) for kg, p in lazy["total"].entries.items()
    }
