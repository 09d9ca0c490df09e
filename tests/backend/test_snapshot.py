"""Snapshots: round trips at other parallelisms, operator state redistribution, corruption."""

from __future__ import annotations

import dataclasses
import json
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from statetier.backend import (
    AggregatingStateDescriptor,
    CheckpointedFunction,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    ListState,
    ListStateDescriptor,
    MapStateDescriptor,
    PickleSerializer,
    ReducingStateDescriptor,
    StateDescriptor,
    StateRegistrationError,
    StateTtlConfig,
    ValueStateDescriptor,
)
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import (
    KeyGroupRange,
    assign_to_key_group,
    instance_for_key_group,
    key_group_range_for_instance,
)
from statetier.backend.operator_state import OperatorStateBackend
from statetier.backend.snapshot import (
    CorruptFileError,
    Manifest,
    NoSnapshotError,
    SnapshotError,
    SnapshotStore,
    SubtaskSnapshot,
    commit_snapshot,
    restore_keyed_state,
    restore_operator_state,
    snapshot_subtask,
)
from statetier.backend.snapshot.format import (
    COLUMNS_FORMAT_VERSION,
    FORMAT_VERSION,
    READABLE_VERSION,
    DataFileReader,
)
from statetier.backend.ttl import ManualClock

P = 128
T0 = 50_000


class Average:
    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, accumulator: tuple[int, int]) -> tuple[int, int]:
        return (accumulator[0] + value, accumulator[1] + 1)

    def get_result(self, accumulator: tuple[int, int]) -> float:
        return accumulator[0] / accumulator[1]

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


TTL = StateTtlConfig(10_000)


def descriptors() -> dict[str, StateDescriptor]:
    """Fresh descriptors of every kind (with and without TTL), as each instance would build."""
    return {
        "count": ValueStateDescriptor[int]("count"),
        "hist": ListStateDescriptor[Any]("hist"),
        "attrs": MapStateDescriptor("attrs"),
        "sum": ReducingStateDescriptor[int]("sum", reduce_function=lambda a, b: a + b),
        "avg": AggregatingStateDescriptor("avg", aggregate_function=Average()),
        "t_value": ValueStateDescriptor[str]("t_value", ttl=TTL),
        "t_list": ListStateDescriptor[int]("t_list", ttl=TTL),
        "t_map": MapStateDescriptor("t_map", ttl=TTL),
        "t_sum": ReducingStateDescriptor[int]("t_sum", ttl=TTL, reduce_function=max),
        "t_avg": AggregatingStateDescriptor("t_avg", ttl=TTL, aggregate_function=Average()),
        "pickled": ValueStateDescriptor[Any]("pickled", serializer=PickleSerializer()),
    }


@dataclasses.dataclass(frozen=True)
class Opaque:
    """Only the pickle serializer can write this."""

    payload: str


KEYS: list[Any] = [
    *[f"word-{i}" for i in range(60)],
    *range(-20, 20, 3),
    b"\x00bin",
    b"",
    ("user", 1),
    ("user", 2, b"x"),
    (),
    (None,),  # a bare None key is refused; a None field is fine
    "",
]


def write_all(backend: KeyedStateBackend, key: Any, n: int) -> None:
    s: dict[str, Any] = {name: backend.get_state(d) for name, d in descriptors().items()}
    backend.set_current_key(key)
    s["count"].update(n)
    s["hist"].add_all([n, str(n), (n, n), {"n": n}])
    s["attrs"].put_all({"n": n, ("t", n): {n}, n: None})
    s["sum"].add(n)
    s["sum"].add(1)
    s["avg"].add(n)
    s["avg"].add(n + 2)
    s["t_value"].update(f"v{n}")
    s["t_list"].add_all([n, n + 1])
    s["t_map"].put("n", n)
    s["t_sum"].add(n)
    s["t_avg"].add(n)
    s["pickled"].update(Opaque(str(n)))


def expected_for(n: int) -> dict[str, Any]:
    return {
        "count": n,
        "hist": [n, str(n), (n, n), {"n": n}],
        "attrs": {"n": n, ("t", n): {n}, n: None},
        "sum": n + 1,
        "avg": n + 1.0,
        "t_value": f"v{n}",
        "t_list": [n, n + 1],
        "t_map": {"n": n},
        "t_sum": n,
        "t_avg": float(n),
        "pickled": Opaque(str(n)),
    }


def read_all(backend: KeyedStateBackend, key: Any) -> dict[str, Any]:
    s: dict[str, Any] = {name: backend.get_state(d) for name, d in descriptors().items()}
    backend.set_current_key(key)
    return {
        "count": s["count"].value(),
        "hist": s["hist"].get(),
        "attrs": dict(s["attrs"].items()),
        "sum": s["sum"].get(),
        "avg": s["avg"].get(),
        "t_value": s["t_value"].value(),
        "t_list": s["t_list"].get(),
        "t_map": dict(s["t_map"].items()),
        "t_sum": s["t_sum"].get(),
        "t_avg": s["t_avg"].get(),
        "pickled": s["pickled"].value(),
    }


def instances(
    parallelism: int, clock: ManualClock, max_parallelism: int = P
) -> list[KeyedStateBackend]:
    return [
        KeyedStateBackend(
            key_group_range_for_instance(max_parallelism, parallelism, i),
            max_parallelism,
            clock=clock,
        )
        for i in range(parallelism)
    ]


def owner(backends: list[KeyedStateBackend], key: Any) -> KeyedStateBackend:
    max_p = backends[0].max_parallelism
    kg = assign_to_key_group(key, max_p)
    return backends[instance_for_key_group(max_p, len(backends), kg)]


def snapshot_all(
    store: SnapshotStore,
    epoch: int,
    keyed: list[KeyedStateBackend],
    ops: list[OperatorStateBackend] | None = None,
) -> Manifest:
    subtasks = [
        snapshot_subtask(store, epoch, b, ops[i] if ops else None) for i, b in enumerate(keyed)
    ]
    return commit_snapshot(store, epoch, subtasks)


def memory_uri() -> str:
    return f"memory://statetier-test-{uuid.uuid4().hex}"


@pytest.fixture(params=["file", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> SnapshotStore:
    if request.param == "file":
        return SnapshotStore(f"file://{tmp_path}/snapshots")
    return SnapshotStore(memory_uri())


# --------------------------------------------------------------------------- keyed round trip


@pytest.mark.parametrize("target", [1, 3, 4, 8])
def test_keyed_round_trip_at_another_parallelism(store: SnapshotStore, target: int) -> None:
    clock = ManualClock(T0)
    source = instances(4, clock)
    for n, key in enumerate(KEYS):
        write_all(owner(source, key), key, n)
    manifest = snapshot_all(store, 7, source)
    assert manifest.epoch == 7 and manifest.max_parallelism == P and manifest.parallelism == 4
    assert set(manifest.states) == set(descriptors())
    assert store.epochs() == [7]

    restored = instances(target, clock)
    for backend in restored:
        assert restore_keyed_state(store, backend).epoch == 7
    for n, key in enumerate(KEYS):
        assert read_all(owner(restored, key), key) == expected_for(n), key
    # Every key is in exactly one instance, the one owning its key group.
    for name in descriptors():
        seen: list[Any] = []
        for backend in restored:
            for key in backend.keys(name):
                assert assign_to_key_group(key, P) in backend.key_groups
                seen.append(key)
        assert sorted(map(repr, seen)) == sorted(map(repr, KEYS)), name


def test_restore_registers_states_before_or_after(store: SnapshotStore) -> None:
    clock = ManualClock(T0)
    source = instances(2, clock)
    for n, key in enumerate(KEYS):
        write_all(owner(source, key), key, n)
    snapshot_all(store, 1, source)
    early = KeyedStateBackend(KeyGroupRange.of(P), P, clock=clock)
    for d in descriptors().values():
        early.get_state(d)  # registered first: filled by the restore
    late = KeyedStateBackend(KeyGroupRange.of(P), P, clock=clock)
    restore_keyed_state(store, early)
    restore_keyed_state(store, late)  # restored first: decoded on registration
    assert late.state_names() == sorted(descriptors())
    for n, key in enumerate(KEYS):
        assert read_all(early, key) == read_all(late, key) == expected_for(n)


def test_restored_but_unregistered_states_survive_more_snapshots(store: SnapshotStore) -> None:
    clock = ManualClock(T0)
    source = instances(4, clock)
    for n, key in enumerate(KEYS):
        write_all(owner(source, key), key, n)
    snapshot_all(store, 1, source)

    middle = instances(3, clock)
    for backend in middle:
        restore_keyed_state(store, backend)
        counter = backend.get_state(ValueStateDescriptor[int]("count"))  # only this one
        for key in list(backend.keys("count")):
            backend.set_current_key(key)
            counter.update(counter.value() + 1000)  # type: ignore[operator]
        assert "hist" in backend.state_names() and "hist" not in backend.tables
    manifest = snapshot_all(store, 2, middle)
    assert set(manifest.states) == set(descriptors())
    assert manifest.states["t_map"]["ttl"] == TTL.to_json()

    final = instances(8, clock)
    for backend in final:
        restore_keyed_state(store, backend)
    for n, key in enumerate(KEYS):
        expected = expected_for(n)
        expected["count"] = n + 1000
        assert read_all(owner(final, key), key) == expected
    # The older epoch is still there, untouched.
    old = KeyedStateBackend(KeyGroupRange.of(P), P, clock=clock)
    restore_keyed_state(store, old, epoch=1)
    assert read_all(old, KEYS[0])["count"] == 0


def test_refused_registration_keeps_the_restored_state(store: SnapshotStore) -> None:
    clock = ManualClock(T0)
    source = instances(1, clock)
    write_all(source[0], "k", 3)
    snapshot_all(store, 1, source)
    backend = KeyedStateBackend(KeyGroupRange.of(P), P, clock=clock)
    restore_keyed_state(store, backend)
    with pytest.raises(StateRegistrationError, match="'hist' was checkpointed as list"):
        backend.get_state(ValueStateDescriptor[int]("hist"))
    assert "hist" in backend.state_names()
    manifest = snapshot_all(store, 2, [backend])  # still written back
    assert manifest.states["hist"]["kind"] == "list"
    assert read_all(backend, "k")["hist"] == expected_for(3)["hist"]


def test_empty_and_unregistered_backends_snapshot(store: SnapshotStore) -> None:
    clock = ManualClock(T0)
    source = instances(2, clock)
    manifest = snapshot_all(store, 1, source)
    assert manifest.states == {} and manifest.keyed_files == []
    target = KeyedStateBackend(KeyGroupRange.of(P), P, clock=clock)
    restore_keyed_state(store, target)
    assert target.state_names() == []
    state = target.get_state(ValueStateDescriptor[int]("count"))
    target.set_current_key("k")
    assert state.value() is None


def test_restore_reads_the_requested_or_latest_epoch(store: SnapshotStore) -> None:
    clock = ManualClock(T0)
    backend = KeyedStateBackend(KeyGroupRange.of(P), P, clock=clock)
    v = backend.get_state(ValueStateDescriptor[int]("count"))
    backend.set_current_key("k")
    for epoch in (1, 2, 3):
        v.update(epoch * 10)
        snapshot_all(store, epoch, [backend])
    # A snapshot written but never committed is not seen.
    v.update(40)
    snapshot_subtask(store, 4, backend)
    assert store.epochs() == [1, 2, 3]
    cases: list[tuple[int | None, int]] = [(None, 30), (1, 10), (2, 20)]
    for wanted, expected in cases:
        target = KeyedStateBackend(KeyGroupRange.of(P), P, clock=clock)
        restore_keyed_state(store, target, wanted)
        target.set_current_key("k")
        assert target.get_state(ValueStateDescriptor[int]("count")).value() == expected
    with pytest.raises(NoSnapshotError, match="epoch 4"):
        restore_keyed_state(store, KeyedStateBackend(KeyGroupRange.of(P), P), epoch=4)


def test_no_snapshot(tmp_path: Path) -> None:
    for uri in (f"file://{tmp_path}/nothing", memory_uri()):
        empty = SnapshotStore(uri)
        assert empty.epochs() == []
        with pytest.raises(NoSnapshotError, match="no committed snapshot"):
            restore_keyed_state(empty, KeyedStateBackend(KeyGroupRange.of(P), P))
        with pytest.raises(NoSnapshotError):
            restore_operator_state(empty, OperatorStateBackend())


def test_data_files_are_deterministic(tmp_path: Path) -> None:
    """Retried attempts write the same bytes under the same names, whatever the key order."""
    clock = ManualClock(T0)
    stores = [SnapshotStore(f"file://{tmp_path}/{i}") for i in range(2)]
    manifests = []
    for store, keys in zip(stores, (KEYS, list(reversed(KEYS))), strict=True):
        backend = KeyedStateBackend(key_group_range_for_instance(P, 2, 0), P, clock=clock)
        v = backend.get_state(ValueStateDescriptor[int]("count"))
        for key in keys:
            if assign_to_key_group(key, P) in backend.key_groups:
                backend.set_current_key(key)
                v.update(len(repr(key)))
        manifests.append(snapshot_subtask(store, 3, backend))
    first, second = (m.keyed_files for m in manifests)
    assert first == second
    for entry in first:
        assert stores[0].read(entry) == stores[1].read(entry)
        assert entry.path == "data/epoch-0000000003/w/count/0-63.base.kgd"


# --------------------------------------------------------------------------- mismatches


def _one_state_snapshot(store: SnapshotStore, descriptor: StateDescriptor) -> None:
    backend = KeyedStateBackend(KeyGroupRange.of(P), P)
    state = backend.get_state(descriptor)
    backend.set_current_key("k")
    if isinstance(descriptor, MapStateDescriptor):
        state.put("a", 1)  # type: ignore[attr-defined]
    else:
        state.update(1)  # type: ignore[attr-defined]
    snapshot_all(store, 1, [backend])


def test_max_parallelism_mismatch(store: SnapshotStore) -> None:
    _one_state_snapshot(store, ValueStateDescriptor[int]("v"))
    for other in (64, 256):
        with pytest.raises(SnapshotError, match=f"max parallelism {P}.*{other}"):
            restore_keyed_state(store, KeyedStateBackend(KeyGroupRange.of(other), other))


def test_key_serializer_mismatch(store: SnapshotStore) -> None:
    _one_state_snapshot(store, ValueStateDescriptor[int]("v"))
    backend = KeyedStateBackend(KeyGroupRange.of(P), P, key_serializer=PickleSerializer())
    with pytest.raises(SnapshotError, match=r"'msgpack'.*'pickle'"):
        restore_keyed_state(store, backend)


MISMATCHED: list[tuple[StateDescriptor, StateDescriptor, str]] = [
    (ValueStateDescriptor[int]("s"), ListStateDescriptor[int]("s"), "value state.*list state"),
    (ValueStateDescriptor[int]("s"), MapStateDescriptor("s"), "value state.*map state"),
    (
        ValueStateDescriptor[int]("s"),
        ReducingStateDescriptor[int]("s", reduce_function=max),
        "value state.*reducing state",
    ),
    (
        MapStateDescriptor("s"),
        AggregatingStateDescriptor("s", aggregate_function=Average()),
        "map state.*aggregating state",
    ),
    (
        ValueStateDescriptor[int]("s"),
        ValueStateDescriptor[int]("s", serializer=PickleSerializer()),
        "serializers",
    ),
    (
        MapStateDescriptor("s"),
        MapStateDescriptor("s", key_serializer=PickleSerializer()),
        "serializers",
    ),
]


@pytest.mark.parametrize(("stored", "requested", "message"), MISMATCHED)
def test_kind_and_serializer_mismatch(
    store: SnapshotStore, stored: StateDescriptor, requested: StateDescriptor, message: str
) -> None:
    _one_state_snapshot(store, stored)
    after = KeyedStateBackend(KeyGroupRange.of(P), P)
    restore_keyed_state(store, after)
    with pytest.raises(StateRegistrationError, match=f"'s' was checkpointed.*{message}"):
        after.get_state(requested)
    before = KeyedStateBackend(KeyGroupRange.of(P), P)
    before.get_state(requested)
    with pytest.raises(StateRegistrationError, match=f"'s' was checkpointed.*{message}"):
        restore_keyed_state(store, before)


def test_commit_refuses_inconsistent_subtasks(tmp_path: Path) -> None:
    store = SnapshotStore(f"file://{tmp_path}")
    a = KeyedStateBackend(key_group_range_for_instance(P, 2, 0), P)
    b = KeyedStateBackend(key_group_range_for_instance(P, 2, 1), P)
    overlapping = KeyedStateBackend(KeyGroupRange(60, 70), P)
    with pytest.raises(SnapshotError, match="overlap"):
        commit_snapshot(store, 1, [snapshot_subtask(store, 1, x) for x in (a, overlapping)])
    other_max = KeyedStateBackend(KeyGroupRange(64, 255), 256)
    with pytest.raises(SnapshotError, match="max parallelism"):
        commit_snapshot(store, 1, [snapshot_subtask(store, 1, x) for x in (a, other_max)])
    a.get_state(ValueStateDescriptor[int]("s"))
    b.get_state(ValueStateDescriptor[int]("s", ttl=TTL))
    with pytest.raises(SnapshotError, match="disagree on state 's'"):
        commit_snapshot(store, 1, [snapshot_subtask(store, 1, x) for x in (a, b)])
    assert store.epochs() == []  # nothing was committed


def test_commit_refuses_snapshots_missing_key_groups(tmp_path: Path) -> None:
    store = SnapshotStore(f"file://{tmp_path}")
    parts = [KeyedStateBackend(key_group_range_for_instance(P, 3, i), P) for i in range(3)]
    for missing in range(3):
        subtasks = [snapshot_subtask(store, 1, b) for i, b in enumerate(parts) if i != missing]
        with pytest.raises(SnapshotError, match="key groups"):
            commit_snapshot(store, 1, subtasks)
    assert store.epochs() == []


# --------------------------------------------------------------------------- corruption


def _committed(tmp_path: Path) -> tuple[SnapshotStore, Manifest]:
    clock = ManualClock(T0)
    store = SnapshotStore(f"file://{tmp_path}/snap")
    source = instances(2, clock)
    ops = [OperatorStateBackend(i, 2) for i in range(2)]
    for i, op in enumerate(ops):
        op.get_list_state(ListStateDescriptor[int]("offsets")).add_all([i, i + 10])
    for n, key in enumerate(KEYS[:20]):
        write_all(owner(source, key), key, n)
    return store, snapshot_all(store, 1, source, ops)


def _restore_everything(store: SnapshotStore) -> None:
    for backend in instances(3, ManualClock(T0)):
        restore_keyed_state(store, backend)
    for i in range(3):
        restore_operator_state(store, OperatorStateBackend(i, 3))


def test_snapshot_files_restore_cleanly(tmp_path: Path) -> None:
    store, manifest = _committed(tmp_path)
    _restore_everything(store)
    for entry in manifest.keyed_files:
        reader = DataFileReader(store.read(entry), entry.path)
        # the writer's default: columnar blocks, compressed (checkpoint.compression=zstd)
        assert reader.header["format_version"] == COLUMNS_FORMAT_VERSION
        assert (reader.codec, reader.layout) == ("zstd", "columns")
        assert reader.header["state"] == entry.state
        assert reader.verify() == sum(e.entries for e in reader.index.values())


def test_flipped_byte_anywhere_in_a_data_file_is_detected(tmp_path: Path) -> None:
    store, manifest = _committed(tmp_path)
    entry = next(e for e in manifest.keyed_files if e.state == "hist")
    path = Path(store.full_path(entry.path))
    original = path.read_bytes()
    for position in range(0, len(original), 3):
        damaged = bytearray(original)
        damaged[position] ^= 0x01
        path.write_bytes(bytes(damaged))
        with pytest.raises(CorruptFileError) as err:
            _restore_everything(store)
        assert err.value.path == str(path)
        assert str(path) in str(err.value) and "checksum" in str(err.value)
    path.write_bytes(original)
    _restore_everything(store)


def _recommit_with(store: SnapshotStore, manifest: Manifest, path: str, data: bytes) -> Manifest:
    """Replace one file and make the manifest agree with it: damage the manifest cannot see."""
    Path(store.full_path(path)).write_bytes(data)

    def fix(entry: Any) -> Any:
        if entry.path != path:
            return entry
        return dataclasses.replace(entry, size=len(data), crc32=zlib.crc32(data))

    fixed = dataclasses.replace(
        manifest,
        keyed_files=[fix(e) for e in manifest.keyed_files],
        operator_files=[fix(e) for e in manifest.operator_files],
    )
    Path(store.full_path(store.manifest_name(manifest.epoch))).unlink()  # forged, not overwritten
    store.commit(fixed)
    return fixed


def test_flipped_byte_in_a_block_names_the_file_and_block(tmp_path: Path) -> None:
    store, manifest = _committed(tmp_path)
    entry = next(e for e in manifest.keyed_files if e.state == "attrs")
    original = store.read(entry)
    reader = DataFileReader(original, entry.path)
    for index_entry in list(reader.index.values())[:5]:
        for position in (index_entry.offset, index_entry.offset + index_entry.length // 2):
            damaged = bytearray(original)
            damaged[position] ^= 0x40
            _recommit_with(store, manifest, entry.path, bytes(damaged))
            with pytest.raises(CorruptFileError) as err:
                _restore_everything(store)
            message = str(err.value)
            assert err.value.path == store.full_path(entry.path)
            assert f"block of key group {index_entry.key_group} at offset" in message
    _recommit_with(store, manifest, entry.path, original)
    _restore_everything(store)


def test_damaged_index_footer_and_header(tmp_path: Path) -> None:
    store, manifest = _committed(tmp_path)
    entry = manifest.keyed_files[0]
    original = store.read(entry)
    cases: list[tuple[Callable[[bytes], bytes], str]] = [
        (lambda d: d[:-1], "footer"),  # truncated
        (lambda d: d[: len(d) - 30] + bytes([d[-30] ^ 1]) + d[len(d) - 29 :], "index"),
        (lambda d: b"NOTSTATE" + d[8:], "not a statetier data file"),
        (lambda d: d[:8] + (READABLE_VERSION + 1).to_bytes(2, "little") + d[10:], "newer"),
        (lambda d: d[:20], "too short"),
    ]
    for damage, fragment in cases:
        _recommit_with(store, manifest, entry.path, damage(original))
        with pytest.raises(CorruptFileError, match=fragment) as err:
            _restore_everything(store)
        assert err.value.path == store.full_path(entry.path)


def test_damaged_operator_file(tmp_path: Path) -> None:
    store, manifest = _committed(tmp_path)
    entry = manifest.operator_files[0]
    original = store.read(entry)
    damaged = bytearray(original)
    damaged[-2] ^= 0x01
    _recommit_with(store, manifest, entry.path, bytes(damaged))
    with pytest.raises(CorruptFileError, match="operator state block") as err:
        restore_operator_state(store, OperatorStateBackend(0, 1))
    assert err.value.path == store.full_path(entry.path)


def test_every_flipped_byte_of_a_manifest_is_detected(tmp_path: Path) -> None:
    store, manifest = _committed(tmp_path)
    path = Path(store.full_path(store.manifest_name(1)))
    original = path.read_bytes()
    assert Manifest.from_json(original, str(path)) == manifest
    for position in range(len(original)):
        for bit in (0x01, 0x20):
            damaged = bytearray(original)
            damaged[position] ^= bit
            with pytest.raises(CorruptFileError) as err:
                Manifest.from_json(bytes(damaged), str(path))
            assert err.value.path == str(path)
    # And through a store, as a restore meets it (the committing store keeps what it wrote).
    damaged = bytearray(original)
    damaged[len(original) // 2] ^= 0x01
    path.write_bytes(bytes(damaged))
    with pytest.raises(CorruptFileError) as err:
        _restore_everything(SnapshotStore(store.uri))
    assert str(path) in str(err.value)


def test_newer_manifest_format_is_refused(tmp_path: Path) -> None:
    store, manifest = _committed(tmp_path)
    store.commit(dataclasses.replace(manifest, epoch=2, format_version=FORMAT_VERSION + 1))
    with pytest.raises(CorruptFileError, match="newer"):
        SnapshotStore(store.uri).manifest(2)  # a reader that did not write it


def test_missing_files(tmp_path: Path) -> None:
    store, manifest = _committed(tmp_path)
    data = Path(store.full_path(manifest.keyed_files[3].path))
    data.unlink()
    with pytest.raises(CorruptFileError, match="missing") as err:
        _restore_everything(store)
    assert err.value.path == str(data)
    store, manifest = _committed(tmp_path / "again")
    ops = Path(store.full_path(manifest.operator_files[1].path))
    ops.unlink()
    with pytest.raises(CorruptFileError, match="missing") as err:
        restore_operator_state(store, OperatorStateBackend(0, 1))
    assert err.value.path == str(ops)
    Path(store.full_path(store.manifest_name(1))).unlink()
    with pytest.raises(NoSnapshotError):
        _restore_everything(store)


def test_files_no_manifest_names_are_ignored(tmp_path: Path) -> None:
    store, _ = _committed(tmp_path)
    root = Path(store.full_path(""))
    (root / "data" / "epoch-0000000002" / "count").mkdir(parents=True)
    (root / "data" / "epoch-0000000002" / "count" / "0-127.kgd").write_bytes(b"junk")
    (root / "manifests" / "epoch-0000000002.json.tmp").write_bytes(b"partial")
    (root / "manifests" / "notes.txt").write_text("not a manifest")
    assert store.epochs() == [1]
    _restore_everything(store)
    listed = json.loads(Path(store.full_path(store.manifest_name(1))).read_text())
    assert listed["epoch"] == 1


# --------------------------------------------------------------------------- operator state


def _operator_snapshot(store: SnapshotStore, parallelism: int = 4) -> list[list[int]]:
    parts = [[i * 10 + j for j in range(3)] for i in range(parallelism)]
    subtasks: list[SubtaskSnapshot] = []
    for i in range(parallelism):
        ops = OperatorStateBackend(i, parallelism)
        ops.get_list_state(ListStateDescriptor[int]("split")).add_all(parts[i])
        ops.get_union_list_state(ListStateDescriptor[int]("union")).add_all(parts[i])
        ops.get_list_state(ListStateDescriptor[Any]("tuples")).add((i, f"x{i}"))
        subtasks.append(snapshot_subtask(store, 1, None, ops))
    manifest = commit_snapshot(store, 1, subtasks)
    assert len(manifest.operator_files) == parallelism and manifest.keyed_files == []
    return parts


@pytest.mark.parametrize("target", [1, 3, 4, 8])
def test_operator_state_even_split_and_union(store: SnapshotStore, target: int) -> None:
    parts = _operator_snapshot(store)
    everything = [x for part in parts for x in part]
    split: list[list[int]] = []
    for i in range(target):
        ops = OperatorStateBackend(i, target)
        restore_operator_state(store, ops)
        split.append(ops.get_list_state(ListStateDescriptor[int]("split")).get())
        union = ops.get_union_list_state(ListStateDescriptor[int]("union")).get()
        assert union == everything  # every instance gets all, in instance order
        tuples = ops.get_list_state(ListStateDescriptor[Any]("tuples")).get()
        assert all(isinstance(t, tuple) for t in tuples)
    assert [x for part in split for x in part] == everything  # contiguous, in order
    sizes = [len(part) for part in split]
    assert max(sizes) - min(sizes) <= 1
    if target == 4:
        assert split == parts  # same parallelism: every instance gets its own back


def _split_snapshot(store: SnapshotStore, lists: dict[str, list[list[int]]]) -> None:
    """Commit even-split lists: state name -> the list of each instance."""
    parallelism = len(next(iter(lists.values())))
    subtasks = []
    for i in range(parallelism):
        ops = OperatorStateBackend(i, parallelism)
        for name, per_instance in lists.items():
            ops.get_list_state(ListStateDescriptor[int](name)).add_all(per_instance[i])
        subtasks.append(snapshot_subtask(store, 1, None, ops))
    commit_snapshot(store, 1, subtasks)


def _restored_split(
    store: SnapshotStore, names: list[str], parallelism: int
) -> list[list[list[int]]]:
    """Per state of ``names``, per instance: the restored list."""
    restored: dict[str, list[list[int]]] = {name: [] for name in names}
    for i in range(parallelism):
        ops = OperatorStateBackend(i, parallelism)
        restore_operator_state(store, ops)
        for name in names:
            restored[name].append(ops.get_list_state(ListStateDescriptor[int](name)).get())
    return [restored[name] for name in names]


def test_even_split_at_the_same_parallelism_gives_each_instance_its_own_lists(
    store: SnapshotStore,
) -> None:
    """Flink's RoundRobinOperatorStateRepartitioner returns the previous assignment when the
    parallelism is unchanged: a recovery moves no element (no source offset changes owner),
    even when the lists are of very different lengths."""
    offsets = [[1, 2, 3, 4, 5], [], [6]]
    _split_snapshot(store, {"offsets": offsets})
    assert _restored_split(store, ["offsets"], 3) == [offsets]


def test_even_split_rescale_gives_the_remainder_to_the_first_and_rotates_it(
    store: SnapshotStore,
) -> None:
    """Flink's repartitioning on a parallelism change: per state, contiguous parts of
    total // p elements; the total % p longer parts go to the first instances of a rotation
    that starts, for the next state (in name order), where the longer parts ended."""
    a = [[0, 1, 2, 3, 4, 5, 6]]  # 7 elements to 3 instances: 3, 2, 2 from instance 0
    b = [[10, 11, 12, 13, 14, 15, 16]]  # the next state starts at instance 1: 3, 2, 2
    c = [[20, 21, 22, 23]]  # then at instance 2: 2 (instance 2), 1, 1
    _split_snapshot(store, {"a": a, "b": b, "c": c})
    got_a, got_b, got_c = _restored_split(store, ["a", "b", "c"], 3)
    assert got_a == [[0, 1, 2], [3, 4], [5, 6]]
    assert got_b == [[15, 16], [10, 11, 12], [13, 14]]
    assert got_c == [[22], [23], [20, 21]]
    totals = [sum(len(lists[i]) for lists in (got_a, got_b, got_c)) for i in range(3)]
    assert totals == [6, 6, 6]  # the rotation keeps the instances' totals within one


def test_even_split_rescale_of_a_single_state_favours_the_first_instances(
    store: SnapshotStore,
) -> None:
    _split_snapshot(store, {"s": [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10]]})
    (got,) = _restored_split(store, ["s"], 4)
    assert got == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10]]


def test_operator_state_registration_errors(store: SnapshotStore) -> None:
    _operator_snapshot(store, parallelism=2)
    ops = OperatorStateBackend(0, 1)
    restore_operator_state(store, ops)
    with pytest.raises(StateRegistrationError, match="'split' was checkpointed with split"):
        ops.get_union_list_state(ListStateDescriptor[int]("split"))
    with pytest.raises(StateRegistrationError, match="'union' was checkpointed with union"):
        ops.get_list_state(ListStateDescriptor[int]("union"))
    with pytest.raises(StateRegistrationError, match="serializer 'msgpack'"):
        ops.get_list_state(ListStateDescriptor[int]("split", serializer=PickleSerializer()))
    # Nothing was lost by the refusals.
    assert ops.get_list_state(ListStateDescriptor[int]("split")).get() == [0, 1, 2, 10, 11, 12]
    assert len(ops.get_union_list_state(ListStateDescriptor[int]("union")).get()) == 6
    with pytest.raises(StateRegistrationError, match="registered with split"):
        ops.get_union_list_state(ListStateDescriptor[int]("split"))
    with pytest.raises(ValueError, match="instance index"):
        OperatorStateBackend(2, 2)


def test_operator_list_state_api() -> None:
    ops = OperatorStateBackend()
    lst = ops.get_list_state(ListStateDescriptor[int]("l"))
    assert ops.get_list_state(ListStateDescriptor[int]("l")) is lst
    lst.add(1)
    lst.add_all([2, 3])
    got = lst.get()
    got.append(99)
    assert lst.get() == [1, 2, 3]
    lst.update([4])
    assert lst.get() == [4]
    lst.clear()
    assert lst.get() == []
    with pytest.raises(ValueError, match="None"):
        lst.add(None)


def test_unregistered_operator_state_survives_a_second_snapshot(store: SnapshotStore) -> None:
    parts = _operator_snapshot(store, parallelism=4)
    subtasks = []
    for i in range(2):
        ops = OperatorStateBackend(i, 2)
        restore_operator_state(store, ops)
        ops.get_list_state(ListStateDescriptor[int]("split")).add(100 + i)  # only this one
        subtasks.append(snapshot_subtask(store, 2, None, ops))
    commit_snapshot(store, 2, subtasks)
    ops = OperatorStateBackend(0, 1)
    restore_operator_state(store, ops)
    everything = [x for part in parts for x in part]
    assert ops.get_union_list_state(ListStateDescriptor[int]("union")).get() == everything * 2
    split = ops.get_list_state(ListStateDescriptor[int]("split")).get()
    assert split == [*everything[:6], 100, *everything[6:], 101]
    assert len(ops.get_list_state(ListStateDescriptor[Any]("tuples")).get()) == 4


# --------------------------------------------------------------------------- CheckpointedFunction


class BufferingSink:
    """Flink's BufferingSink example: buffers records, flushes at a threshold, survives
    restarts by moving the buffer into operator list state before every snapshot."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.buffer: list[str] = []
        self.flushed: list[str] = []
        self.restored_flag: bool | None = None
        self.checkpointed: ListState[str] | None = None

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        store = context.operator_state_store
        self.checkpointed = store.get_list_state(ListStateDescriptor[str]("buffered"))
        self.restored_flag = context.is_restored
        if context.is_restored:
            self.buffer.extend(self.checkpointed.get())

    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        assert self.checkpointed is not None
        self.checkpointed.update(self.buffer)

    def invoke(self, record: str) -> None:
        self.buffer.append(record)
        if len(self.buffer) >= self.threshold:
            self.flushed.extend(self.buffer)
            self.buffer = []


def _start(
    parallelism: int, store: SnapshotStore, restore: bool
) -> list[tuple[BufferingSink, OperatorStateBackend, KeyedStateBackend]]:
    started = []
    for i in range(parallelism):
        ops = OperatorStateBackend(i, parallelism)
        keyed = KeyedStateBackend(key_group_range_for_instance(P, parallelism, i), P)
        if restore:
            restore_operator_state(store, ops)
            restore_keyed_state(store, keyed)
        sink = BufferingSink(threshold=4)
        function: CheckpointedFunction = sink
        function.initialize_state(FunctionInitializationContext(restore, ops, keyed))
        started.append((sink, ops, keyed))
    return started


def test_checkpointed_function_round_trip(store: SnapshotStore) -> None:
    first = _start(2, store, restore=False)
    assert all(sink.restored_flag is False for sink, _, _ in first)
    for n in range(11):
        first[n % 2][0].invoke(f"r{n}")
    pending = sorted(r for sink, _, _ in first for r in sink.buffer)
    assert pending  # some records are buffered, not flushed
    subtasks = []
    for sink, ops, keyed in first:
        sink.snapshot_state(FunctionSnapshotContext(checkpoint_id=5))
        subtasks.append(snapshot_subtask(store, 5, keyed, ops))
    commit_snapshot(store, 5, subtasks)

    second = _start(3, store, restore=True)
    assert all(sink.restored_flag is True for sink, _, _ in second)
    assert sorted(r for sink, _, _ in second for r in sink.buffer) == pending
    for sink, _, keyed in second:
        assert keyed.state_names() == []  # the function had no keyed state
        assert len(sink.buffer) <= 2
