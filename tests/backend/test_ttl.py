"""State TTL with Flink's semantics, driven by a ManualClock (no sleeping)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from statetier.backend import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateTtlConfig,
    StateVisibility,
    TtlMismatchError,
    UpdateType,
    ValueStateDescriptor,
)
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import KeyGroupRange, assign_to_key_group
from statetier.backend.serializers import DEFAULT_SERIALIZER
from statetier.backend.snapshot import (
    SnapshotStore,
    commit_snapshot,
    restore_keyed_state,
    snapshot_subtask,
)
from statetier.backend.snapshot.format import DataFileReader
from statetier.backend.ttl import ManualClock

TTL = 1000
T0 = 10_000
P = 128

NEVER = StateVisibility.NEVER_RETURN_EXPIRED
RETURN = StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP
ON_WRITE = UpdateType.ON_CREATE_AND_WRITE
ON_READ = UpdateType.ON_READ_AND_WRITE


class Sum:
    """AggregateFunction[int, list[int], int]: the accumulator is a one-element list."""

    def create_accumulator(self) -> list[int]:
        return [0]

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        return [accumulator[0] + value]

    def get_result(self, accumulator: list[int]) -> int:
        return accumulator[0]

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0]]


def _replace_accumulator(state: Any, value: int) -> None:
    state.clear()
    state.add(value)


@dataclasses.dataclass
class Kind:
    """Uniform write/read over one state kind, so the TTL tables run for every kind."""

    name: str
    descriptor: Callable[[StateTtlConfig], StateDescriptor]
    write: Callable[[Any, int], None]
    read: Callable[[Any], Any]  # the visible value, None when nothing is visible


KINDS = [
    Kind(
        "value",
        lambda ttl: ValueStateDescriptor[int]("s", ttl=ttl),
        lambda s, x: s.update(x),
        lambda s: s.value(),
    ),
    Kind(
        "list",
        lambda ttl: ListStateDescriptor[int]("s", ttl=ttl),
        lambda s, x: s.update([x]),
        lambda s: (s.get() or [None])[0],
    ),
    Kind(
        "map",
        lambda ttl: MapStateDescriptor("s", ttl=ttl),
        lambda s, x: s.put("uk", x),
        lambda s: s.get("uk"),
    ),
    Kind(
        "reducing",
        lambda ttl: ReducingStateDescriptor[int]("s", ttl=ttl, reduce_function=lambda a, b: b),
        lambda s, x: s.add(x),
        lambda s: s.get(),
    ),
    Kind(
        "aggregating",
        lambda ttl: AggregatingStateDescriptor("s", ttl=ttl, aggregate_function=Sum()),
        _replace_accumulator,
        lambda s: s.get(),
    ),
]
KIND_IDS = [k.name for k in KINDS]


def make(
    descriptor: StateDescriptor, clock: ManualClock, max_parallelism: int = P
) -> tuple[KeyedStateBackend, Any]:
    backend = KeyedStateBackend(KeyGroupRange.of(max_parallelism), max_parallelism, clock=clock)
    return backend, backend.get_state(descriptor)


def stored_count(backend: KeyedStateBackend, name: str = "s") -> int:
    return backend.tables[name].entry_count()


# --------------------------------------------------------------------------- config, clock


def test_ttl_config_defaults_and_validation() -> None:
    ttl = StateTtlConfig(TTL)
    assert ttl.update_type is ON_WRITE and ttl.visibility is NEVER
    assert ttl.incremental_cleanup_size == 5 and not ttl.cleanup_per_record
    assert not ttl.cleanup_full_snapshot
    assert StateTtlConfig.of_seconds(1.5).ttl_ms == 1500
    for bad in (0, -1):
        with pytest.raises(ValueError, match="ttl_ms"):
            StateTtlConfig(bad)
    with pytest.raises(ValueError, match="incremental_cleanup_size"):
        StateTtlConfig(TTL, incremental_cleanup_size=-1)
    # Expired once ttl has fully elapsed (Flink: expiration timestamp <= now).
    assert not ttl.expired(T0, T0 + TTL - 1)
    assert ttl.expired(T0, T0 + TTL)


def test_manual_clock() -> None:
    clock = ManualClock(5)
    clock.advance(10)
    assert clock.now_ms() == 15
    clock.set(100)
    assert clock.now_ms() == 100
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)


def test_enable_time_to_live_flink_style() -> None:
    descriptor = ValueStateDescriptor[int]("s")
    descriptor.enable_time_to_live(StateTtlConfig(TTL))
    clock = ManualClock(T0)
    backend, state = make(descriptor, clock)
    backend.set_current_key("k")
    state.update(1)
    clock.advance(TTL)
    assert state.value() is None


# --------------------------------------------------------------------------- update type


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_on_create_and_write_reads_do_not_renew(kind: Kind) -> None:
    clock = ManualClock(T0)
    backend, state = make(kind.descriptor(StateTtlConfig(TTL, update_type=ON_WRITE)), clock)
    backend.set_current_key("k")
    kind.write(state, 1)
    clock.advance(TTL - 100)
    assert kind.read(state) == 1
    clock.advance(99)  # TTL - 1 after the write
    assert kind.read(state) == 1
    clock.advance(1)  # exactly TTL after the write: expired although read just before
    assert kind.read(state) is None


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_on_read_and_write_reads_renew(kind: Kind) -> None:
    clock = ManualClock(T0)
    backend, state = make(kind.descriptor(StateTtlConfig(TTL, update_type=ON_READ)), clock)
    backend.set_current_key("k")
    kind.write(state, 1)
    for _ in range(5):  # kept alive by reads alone, far beyond the TTL
        clock.advance(TTL - 1)
        assert kind.read(state) == 1
    clock.advance(TTL)
    assert kind.read(state) is None


@pytest.mark.parametrize("update_type", [ON_WRITE, ON_READ])
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_writes_renew_under_both_update_types(kind: Kind, update_type: UpdateType) -> None:
    clock = ManualClock(T0)
    backend, state = make(kind.descriptor(StateTtlConfig(TTL, update_type=update_type)), clock)
    backend.set_current_key("k")
    kind.write(state, 1)
    clock.advance(TTL - 1)
    kind.write(state, 2)
    clock.advance(TTL - 1)
    assert kind.read(state) == 2


# --------------------------------------------------------------------------- visibility table


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_never_return_expired(kind: Kind) -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, visibility=NEVER, incremental_cleanup_size=0)
    backend, state = make(kind.descriptor(ttl), clock)
    backend.set_current_key("k")
    kind.write(state, 7)
    assert stored_count(backend) == 1
    clock.advance(TTL)
    assert stored_count(backend) == 1  # still stored: nothing has cleaned it up yet
    assert kind.read(state) is None  # but never visible
    assert stored_count(backend) == 0  # and the read removed it (cleanup on read)
    assert kind.read(state) is None


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_return_expired_if_not_cleaned_up(kind: Kind) -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, visibility=RETURN, incremental_cleanup_size=0)
    backend, state = make(kind.descriptor(ttl), clock)
    backend.set_current_key("k")
    kind.write(state, 7)
    clock.advance(TTL + 5000)
    assert kind.read(state) == 7  # expired but not cleaned up: returned...
    assert stored_count(backend) == 0  # ...and cleaned up by that very read
    assert kind.read(state) is None  # so only once


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_return_expired_after_incremental_cleanup_returns_nothing(kind: Kind) -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, visibility=RETURN, incremental_cleanup_size=5)
    backend, state = make(kind.descriptor(ttl), clock)
    backend.set_current_key("k")
    kind.write(state, 7)
    clock.advance(TTL)
    backend.set_current_key("other")
    assert kind.read(state) is None  # this access runs incremental cleanup over "k" too
    backend.set_current_key("k")
    assert kind.read(state) is None  # already cleaned up: not returned


@pytest.mark.parametrize("visibility", [NEVER, RETURN])
def test_map_contains_and_is_empty_follow_visibility(visibility: StateVisibility) -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, visibility=visibility, incremental_cleanup_size=0)
    backend, m = make(MapStateDescriptor("s", ttl=ttl), clock)
    backend.set_current_key("k")
    m.put("a", 1)
    clock.advance(TTL)
    assert m.contains("a") is (visibility is RETURN)
    assert not m.contains("a")
    assert m.is_empty()
    m.put("b", 2)
    clock.advance(TTL)
    assert m.is_empty() is (visibility is NEVER)
    assert m.is_empty()


# --------------------------------------------------------------------------- per element


@pytest.mark.parametrize("visibility", [NEVER, RETURN])
def test_list_elements_expire_one_by_one(visibility: StateVisibility) -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, visibility=visibility, incremental_cleanup_size=0)
    backend, lst = make(ListStateDescriptor[str]("s", ttl=ttl), clock)
    backend.set_current_key("k")
    lst.add("a")
    clock.advance(400)
    lst.add_all(["b", "c"])  # stamped now; "a" keeps its own stamp
    clock.advance(400)
    lst.add("d")
    clock.advance(200)  # "a" expires now
    if visibility is RETURN:
        assert lst.get() == ["a", "b", "c", "d"]
    assert lst.get() == ["b", "c", "d"]
    clock.advance(400)  # "b", "c" expire
    if visibility is RETURN:
        assert lst.get() == ["b", "c", "d"]
    assert lst.get() == ["d"]
    clock.advance(400)
    if visibility is RETURN:
        assert lst.get() == ["d"]
    assert lst.get() == []
    assert stored_count(backend) == 0


def test_list_update_restamps_all_and_read_renews_with_on_read() -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, update_type=ON_READ, incremental_cleanup_size=0)
    backend, lst = make(ListStateDescriptor[str]("s", ttl=ttl), clock)
    backend.set_current_key("k")
    lst.add("a")
    clock.advance(600)
    lst.add("b")
    clock.advance(300)
    assert lst.get() == ["a", "b"]  # renews both at T0+900
    clock.advance(TTL - 1)
    assert lst.get() == ["a", "b"]
    lst.update(["x", "y"])
    clock.advance(TTL)
    assert lst.get() == []


@pytest.mark.parametrize("visibility", [NEVER, RETURN])
def test_map_entries_expire_one_by_one(visibility: StateVisibility) -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, visibility=visibility, incremental_cleanup_size=0)
    backend, m = make(MapStateDescriptor("s", ttl=ttl), clock)
    backend.set_current_key("k")
    m.put("a", 1)
    clock.advance(500)
    m.put_all({"b": 2, "c": 3})
    clock.advance(500)  # "a" expired, "b" and "c" live
    if visibility is RETURN:
        assert dict(m.items()) == {"a": 1, "b": 2, "c": 3}
    assert dict(m.items()) == {"b": 2, "c": 3}
    assert m.get("a") is None and not m.contains("a")
    assert sorted(m.keys()) == ["b", "c"] and sorted(m.values()) == [2, 3]
    m.put("c", 30)  # a write restamps that entry only
    clock.advance(500)  # "b" expires
    if visibility is RETURN:
        assert m.get("b") == 2
    assert m.get("b") is None
    assert dict(m.items()) == {"c": 30}
    clock.advance(500)
    assert m.is_empty() is (visibility is NEVER)
    assert m.is_empty() and stored_count(backend) == 0


def test_map_on_read_renews_only_what_is_read() -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, update_type=ON_READ, incremental_cleanup_size=0)
    backend, m = make(MapStateDescriptor("s", ttl=ttl), clock)
    backend.set_current_key("k")
    m.put_all({"a": 1, "b": 2})
    clock.advance(900)
    assert m.get("a") == 1  # renews "a" only
    clock.advance(100)
    assert m.get("b") is None
    assert m.get("a") == 1
    clock.advance(999)
    assert dict(m.items()) == {"a": 1}  # items renews what it returns
    clock.advance(999)
    assert dict(m.items()) == {"a": 1}


def test_map_remove_and_clear_with_ttl() -> None:
    clock = ManualClock(T0)
    backend, m = make(MapStateDescriptor("s", ttl=StateTtlConfig(TTL)), clock)
    backend.set_current_key("k")
    m.put_all({"a": 1, "b": 2})
    m.remove("a")
    m.remove("zzz")
    assert dict(m.items()) == {"b": 2}
    m.clear()
    assert m.is_empty() and stored_count(backend) == 0


# --------------------------------------------------------------------------- reduce/aggregate


# Flink's TtlReduceFunction and TtlAggregateFunction take the stored accumulator through
# getUnexpired(), which hides an expired one under NeverReturnExpired and hands it back under
# ReturnExpiredIfNotCleanedUp: add() folds into exactly what get() would return.
FOLDED = [pytest.param(NEVER, 3, id="never-return-expired"), pytest.param(RETURN, 14, id="return")]


@pytest.mark.parametrize(("visibility", "after_expiry"), FOLDED)
def test_reducing_add_and_an_expired_accumulator(
    visibility: StateVisibility, after_expiry: int
) -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, visibility=visibility, incremental_cleanup_size=0)
    descriptor = ReducingStateDescriptor[int]("s", ttl=ttl, reduce_function=lambda a, b: a + b)
    backend, r = make(descriptor, clock)
    backend.set_current_key("k")
    r.add(5)
    r.add(6)
    assert r.get() == 11
    clock.advance(TTL)
    r.add(3)  # NeverReturnExpired: the expired 11 is not folded in; Return...: 11 + 3
    assert r.get() == after_expiry
    clock.advance(TTL - 1)  # the add stamped the result now
    r.add(4)
    assert r.get() == after_expiry + 4


@pytest.mark.parametrize(("visibility", "after_expiry"), FOLDED)
def test_aggregating_add_and_an_expired_accumulator(
    visibility: StateVisibility, after_expiry: int
) -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, visibility=visibility, incremental_cleanup_size=0)
    backend, agg = make(AggregatingStateDescriptor("s", ttl=ttl, aggregate_function=Sum()), clock)
    backend.set_current_key("k")
    agg.add(5)
    agg.add(6)
    assert agg.get() == 11
    clock.advance(TTL)
    agg.add(3)
    assert agg.get() == after_expiry
    stamped = backend.tables["s"].map_for(assign_to_key_group("k", P))["k"]
    assert stamped == ([after_expiry], T0 + TTL)  # the accumulator, with its new timestamp


def test_return_expired_add_after_cleanup_starts_over() -> None:
    """ "If not cleaned up": once cleanup removed the expired value, add() starts afresh."""
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, visibility=RETURN, incremental_cleanup_size=0)
    descriptor = ReducingStateDescriptor[int]("s", ttl=ttl, reduce_function=lambda a, b: a + b)
    backend, r = make(descriptor, clock)
    backend.set_current_key("k")
    r.add(11)
    clock.advance(TTL)
    assert r.get() == 11  # returned once, and removed by this read (cleanup on read)
    r.add(3)
    assert r.get() == 3


# --------------------------------------------------------------------------- incremental


def _fill_idle_keys(backend: KeyedStateBackend, state: Any, count: int) -> list[str]:
    keys = [f"idle-{i}" for i in range(count)]
    for key in keys:
        backend.set_current_key(key)
        state.update(1)
    return keys


@pytest.mark.parametrize("size", [1, 3, 5])
def test_incremental_cleanup_checks_n_entries_per_access(size: int) -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, incremental_cleanup_size=size)
    backend, v = make(ValueStateDescriptor[int]("s", ttl=ttl), clock, max_parallelism=8)
    _fill_idle_keys(backend, v, 40)
    assert stored_count(backend) == 40  # unexpired: the accesses so far removed nothing
    clock.advance(TTL)
    backend.set_current_key("reader")  # has no value; never reads the idle keys
    remaining = 40
    while remaining:
        assert v.value() is None
        remaining = max(0, remaining - size)
        assert stored_count(backend) == remaining  # exactly `size` idle keys per access
    # The write to "reader" also ran a cleanup step, over an already empty state.
    v.update(2)
    assert stored_count(backend) == 1


def test_incremental_cleanup_spares_live_entries_and_purges_parts() -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, incremental_cleanup_size=5)
    backend = KeyedStateBackend(KeyGroupRange.of(8), 8, clock=clock)
    lst = backend.get_state(ListStateDescriptor[str]("l", ttl=ttl))
    m = backend.get_state(MapStateDescriptor("m", ttl=ttl))
    keys = [f"k{i}" for i in range(20)]
    for key in keys:
        backend.set_current_key(key)
        lst.add("old")
        m.put("old", 1)
    clock.advance(TTL // 2)
    for key in keys[:10]:
        backend.set_current_key(key)
        lst.add("new")
        m.put("new", 2)
    clock.advance(TTL // 2)  # "old" parts expired, "new" parts live
    backend.set_current_key("reader")
    for _ in range(10):
        lst.get()
        m.is_empty()
    assert sorted(backend.keys("l")) == sorted(keys[:10])
    assert sorted(backend.keys("m")) == sorted(keys[:10])
    for key in keys[:10]:
        kg = assign_to_key_group(key, 8)
        assert [v for v, _ in backend.tables["l"].map_for(kg)[key]] == ["new"]
        assert list(backend.tables["m"].map_for(kg)[key]) == ["new"]


def test_incremental_cleanup_is_per_state() -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, incremental_cleanup_size=5)
    backend = KeyedStateBackend(KeyGroupRange.of(8), 8, clock=clock)
    a = backend.get_state(ValueStateDescriptor[int]("a", ttl=ttl))
    b = backend.get_state(ValueStateDescriptor[int]("b", ttl=ttl))
    for i in range(10):
        backend.set_current_key(f"k{i}")
        a.update(1)
        b.update(1)
    clock.advance(TTL)
    backend.set_current_key("reader")
    for _ in range(10):
        a.value()
    assert stored_count(backend, "a") == 0
    assert stored_count(backend, "b") == 10


def test_incremental_cleanup_disabled_with_size_zero() -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, incremental_cleanup_size=0, cleanup_per_record=True)
    backend, v = make(ValueStateDescriptor[int]("s", ttl=ttl), clock, max_parallelism=8)
    _fill_idle_keys(backend, v, 20)
    clock.advance(TTL)
    backend.set_current_key("reader")
    for _ in range(50):
        v.value()
        backend.set_current_key("reader")
    assert stored_count(backend) == 20


@pytest.mark.parametrize("per_record", [True, False])
def test_incremental_cleanup_per_record(per_record: bool) -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, incremental_cleanup_size=2, cleanup_per_record=per_record)
    backend, v = make(ValueStateDescriptor[int]("s", ttl=ttl), clock, max_parallelism=8)
    _fill_idle_keys(backend, v, 20)
    clock.advance(TTL)
    for i in range(5):  # records that never touch the state
        backend.set_current_key(f"record-{i}")
    if per_record:
        assert stored_count(backend) == 20 - 5 * 2
    else:
        assert stored_count(backend) == 20
    for i in range(20):
        backend.set_current_key(f"record-{i}")
    assert stored_count(backend) == (0 if per_record else 20)


def test_per_record_cleanup_does_not_touch_live_entries() -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, incremental_cleanup_size=5, cleanup_per_record=True)
    backend, v = make(ValueStateDescriptor[int]("s", ttl=ttl), clock, max_parallelism=8)
    _fill_idle_keys(backend, v, 20)
    clock.advance(TTL - 1)
    for i in range(100):
        backend.set_current_key(f"record-{i}")
    assert stored_count(backend) == 20


# --------------------------------------------------------------------------- full snapshot


def _snapshot_and_restore(
    backend: KeyedStateBackend,
    descriptors: list[StateDescriptor],
    clock: ManualClock,
    tmp_uri: str,
) -> tuple[KeyedStateBackend, SnapshotStore]:
    store = SnapshotStore(tmp_uri)
    commit_snapshot(store, 1, [snapshot_subtask(store, 1, backend)])
    restored = KeyedStateBackend(backend.key_groups, backend.max_parallelism, clock=clock)
    restore_keyed_state(store, restored)
    for descriptor in descriptors:
        restored.get_state(descriptor)
    return restored, store


def _file_entries(store: SnapshotStore, state: str) -> dict[Any, bytes]:
    """key -> encoded stored value, as held by one state's data files in the latest snapshot."""
    out: dict[Any, bytes] = {}
    for entry in store.manifest().keyed_files:
        if entry.state == state:
            reader = DataFileReader(store.read(entry), entry.path)
            for kg in reader.index:
                for key_bytes, value_bytes in reader.read_block(kg):
                    assert value_bytes is not None  # full snapshots hold no tombstones
                    out[DEFAULT_SERIALIZER.loads(key_bytes)] = value_bytes
    return out


@pytest.mark.parametrize("cleanup", [True, False])
def test_cleanup_on_full_snapshot(cleanup: bool, tmp_path: Any) -> None:
    clock = ManualClock(T0)
    ttl = StateTtlConfig(
        TTL, visibility=RETURN, incremental_cleanup_size=0, cleanup_full_snapshot=cleanup
    )
    v_desc = ValueStateDescriptor[str]("v", ttl=ttl)
    l_desc = ListStateDescriptor[str]("l", ttl=ttl)
    m_desc = MapStateDescriptor("m", ttl=ttl)
    backend = KeyedStateBackend(KeyGroupRange.of(P), P, clock=clock)
    v, lst, m = backend.get_state(v_desc), backend.get_state(l_desc), backend.get_state(m_desc)
    for i in range(10):
        backend.set_current_key(f"old{i}")
        v.update("old")
        lst.add("old")
        m.put("old", 1)
    clock.advance(TTL // 2)
    for i in range(5):
        backend.set_current_key(f"new{i}")
        v.update("new")
        lst.add("new")
        m.put("new", 2)
    backend.set_current_key("old0")
    lst.add("new")  # a list with one expired and one live element
    m.put("new", 2)
    clock.advance(TTL // 2)  # the "old" values and parts are expired now

    restored, store = _snapshot_and_restore(
        backend, [v_desc, l_desc, m_desc], clock, f"file://{tmp_path}"
    )

    # What the files hold.
    files = {name: _file_entries(store, name) for name in ("v", "l", "m")}
    new_keys = {f"new{i}" for i in range(5)}
    if cleanup:
        assert set(files["v"]) == new_keys
        assert set(files["l"]) == new_keys | {"old0"}
        assert set(files["m"]) == new_keys | {"old0"}
        l_codec = restored.tables["l"].codec
        assert [x for x, _ in l_codec.decode(files["l"]["old0"])] == ["new"]
        m_codec = restored.tables["m"].codec
        assert list(m_codec.decode(files["m"]["old0"])) == ["new"]
    else:
        old_keys = {f"old{i}" for i in range(10)}
        assert set(files["v"]) == new_keys | old_keys
        assert set(files["l"]) == new_keys | old_keys

    # What a restore shows (ReturnExpiredIfNotCleanedUp: an expired value still in the
    # snapshot is returned once, one dropped by the snapshot cleanup is gone).
    rv = restored.get_state(v_desc)
    rl = restored.get_state(l_desc)
    rm = restored.get_state(m_desc)
    restored.set_current_key("old3")
    assert rv.value() == (None if cleanup else "old")
    assert rl.get() == ([] if cleanup else ["old"])
    restored.set_current_key("old0")
    assert rl.get() == (["new"] if cleanup else ["old", "new"])
    assert dict(rm.items()) == ({"new": 2} if cleanup else {"old": 1, "new": 2})
    restored.set_current_key("new1")
    assert rv.value() == "new" and rl.get() == ["new"] and rm.get("new") == 2

    # The snapshot cleanup does not clean the running backend's heap (as in Flink).
    backend.set_current_key("old3")
    assert v.value() == "old"


def test_timestamps_survive_restore(tmp_path: Any) -> None:
    clock = ManualClock(T0)
    desc = ValueStateDescriptor[int]("v", ttl=StateTtlConfig(TTL, incremental_cleanup_size=0))
    backend, v = make(desc, clock)
    backend.set_current_key("k")
    v.update(1)
    clock.advance(600)
    restored, _ = _snapshot_and_restore(backend, [desc], clock, f"file://{tmp_path}")
    rv = restored.get_state(desc)
    restored.set_current_key("k")
    clock.advance(TTL - 600 - 1)
    assert rv.value() == 1  # not restamped by the restore
    clock.advance(1)
    assert rv.value() is None


def test_cleanup_options_may_change_on_restore(tmp_path: Any) -> None:
    clock = ManualClock(T0)
    before = ValueStateDescriptor[int]("v", ttl=StateTtlConfig(TTL))
    after = ValueStateDescriptor[int](
        "v",
        ttl=StateTtlConfig(
            TTL, incremental_cleanup_size=0, cleanup_per_record=True, cleanup_full_snapshot=True
        ),
    )
    backend, v = make(before, clock)
    backend.set_current_key("k")
    v.update(1)
    restored, _ = _snapshot_and_restore(backend, [after], clock, f"file://{tmp_path}")
    restored.set_current_key("k")
    assert restored.get_state(after).value() == 1


# --------------------------------------------------------------------------- TTL mismatch

# Flink, "Working with State": "Trying to restore state, which was previously configured without
# TTL, using TTL enabled descriptor or vice versa will lead to compatibility failure" -- and "The
# TTL configuration is not part of check- or savepoints but rather a way of how Flink treats it
# in the currently running job". So only switching TTL on or off is refused.
MISMATCHES = [
    pytest.param(StateTtlConfig(TTL), None, id="enabled-to-disabled"),
    pytest.param(None, StateTtlConfig(TTL), id="disabled-to-enabled"),
]


def _checkpoint_with(ttl: StateTtlConfig | None, uri: str, clock: ManualClock) -> SnapshotStore:
    backend = KeyedStateBackend(KeyGroupRange.of(P), P, clock=clock)
    backend.get_state(ListStateDescriptor[int]("events", ttl=ttl))
    backend.set_current_key("k")
    backend.get_state(ListStateDescriptor[int]("events", ttl=ttl)).add(1)
    store = SnapshotStore(uri)
    commit_snapshot(store, 1, [snapshot_subtask(store, 1, backend)])
    return store


@pytest.mark.parametrize(("stored", "requested"), MISMATCHES)
def test_ttl_mismatch_on_restore_registering_after(
    stored: StateTtlConfig | None, requested: StateTtlConfig | None, tmp_path: Any
) -> None:
    clock = ManualClock(T0)
    store = _checkpoint_with(stored, f"file://{tmp_path}", clock)
    backend = KeyedStateBackend(KeyGroupRange.of(P), P, clock=clock)
    restore_keyed_state(store, backend)
    with pytest.raises(TtlMismatchError) as err:
        backend.get_state(ListStateDescriptor[int]("events", ttl=requested))
    message = str(err.value)
    assert "'events'" in message and "TTL" in message
    if stored is None or requested is None:
        assert "disabled" in message
    assert isinstance(err.value, ValueError)
    # The refused registration lost nothing: the right descriptor still gets the data.
    state = backend.get_state(ListStateDescriptor[int]("events", ttl=stored))
    backend.set_current_key("k")
    assert state.get() == [1]


@pytest.mark.parametrize(("stored", "requested"), MISMATCHES)
def test_ttl_mismatch_on_restore_registered_before(
    stored: StateTtlConfig | None, requested: StateTtlConfig | None, tmp_path: Any
) -> None:
    clock = ManualClock(T0)
    store = _checkpoint_with(stored, f"file://{tmp_path}", clock)
    backend = KeyedStateBackend(KeyGroupRange.of(P), P, clock=clock)
    backend.get_state(ListStateDescriptor[int]("events", ttl=requested))
    with pytest.raises(TtlMismatchError, match="'events'"):
        restore_keyed_state(store, backend)


def test_map_contains_is_a_read_that_renews_with_on_read() -> None:
    # Flink's TtlMapState.contains is get(key) != null, so OnReadAndWrite renews the entry.
    clock = ManualClock(T0)
    ttl = StateTtlConfig(TTL, update_type=ON_READ, incremental_cleanup_size=0)
    backend, m = make(MapStateDescriptor("s", ttl=ttl), clock)
    backend.set_current_key("k")
    m.put_all({"a": 1, "b": 2})
    clock.advance(TTL - 1)
    assert m.contains("a")
    clock.advance(TTL - 1)
    assert m.contains("a") and not m.contains("b")


# --------------------------------------------------------------------------- TTL changes on restore


def _restore_events(store: SnapshotStore, ttl: StateTtlConfig, clock: ManualClock) -> Any:
    backend = KeyedStateBackend(KeyGroupRange.of(P), P, clock=clock)
    restore_keyed_state(store, backend)
    state = backend.get_state(ListStateDescriptor[int]("events", ttl=ttl))
    backend.set_current_key("k")
    return state


def test_a_longer_ttl_on_restore_keeps_values_the_old_one_would_have_expired(
    tmp_path: Any,
) -> None:
    """The TTL "is not part of check- or savepoints" (Flink): a restore may lengthen it, and
    the restored timestamps are judged by the new duration."""
    clock = ManualClock(T0)
    store = _checkpoint_with(StateTtlConfig(TTL), f"file://{tmp_path}", clock)
    clock.advance(TTL + 500)  # expired under the old TTL, alive under the new one
    longer = _restore_events(store, StateTtlConfig(3 * TTL), clock)
    assert longer.get() == [1]
    clock.advance(2 * TTL - 500)  # now 3 x TTL after the write
    assert longer.get() == []


def test_a_shorter_ttl_on_restore_expires_values_sooner(tmp_path: Any) -> None:
    clock = ManualClock(T0)
    store = _checkpoint_with(StateTtlConfig(3 * TTL), f"file://{tmp_path}", clock)
    clock.advance(TTL)
    assert _restore_events(store, StateTtlConfig(TTL), clock).get() == []


def test_update_type_and_visibility_may_change_on_restore(tmp_path: Any) -> None:
    clock = ManualClock(T0)
    store = _checkpoint_with(StateTtlConfig(TTL), f"file://{tmp_path}", clock)
    clock.advance(TTL)
    # NeverReturnExpired when written; ReturnExpiredIfNotCleanedUp after the restore: the
    # expired element is returned once (the new visibility applies to restored values).
    returning = _restore_events(
        store, StateTtlConfig(TTL, visibility=RETURN, incremental_cleanup_size=0), clock
    )
    assert returning.get() == [1]
    assert returning.get() == []
    clock.set(T0 + TTL - 100)
    on_read = _restore_events(store, StateTtlConfig(TTL, update_type=ON_READ), clock)
    assert on_read.get() == [1]  # renews: read at T0 + TTL - 100
    clock.advance(TTL - 1)
    assert on_read.get() == [1]  # alive because the read renewed it under OnReadAndWrite
