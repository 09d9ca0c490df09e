"""The change log incremental snapshots rely on: every changed key is reported once per epoch."""

from __future__ import annotations

from statetier.backend import StateTtlConfig, ValueStateDescriptor
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import KeyGroupRange, assign_to_key_group
from statetier.backend.ttl import ManualClock


def test_written_and_read_keys_are_logged_by_key_group() -> None:
    backend = KeyedStateBackend(KeyGroupRange(0, 127), 128)
    count = backend.get_state(ValueStateDescriptor[int]("count"))
    for key in ["a", "b", "a", 7, ("t", 1)]:
        backend.set_current_key(key)
        count.update((count.value() or 0) + 1)
    touched = backend.drain_touched_keys()
    flat = {k: kg for kg, keys in touched.items() for k in keys}
    assert set(flat) == {"a", "b", 7, ("t", 1)}
    assert all(flat[k] == assign_to_key_group(k, 128) for k in flat)


def test_drain_resets_the_log_but_keeps_the_current_key_usable() -> None:
    backend = KeyedStateBackend(KeyGroupRange(0, 127), 128)
    count = backend.get_state(ValueStateDescriptor[int]("count"))
    backend.set_current_key("a")
    count.update(1)
    backend.drain_touched_keys()
    count.update(2)  # no set_current_key in between: still the key "a", still logged
    assert [k for keys in backend.drain_touched_keys().values() for k in keys] == ["a"]
    backend.set_current_key("z")
    assert count.value() is None
    backend.set_current_key("a")
    assert count.value() == 2


def test_ttl_cleanup_removals_are_logged() -> None:
    clock = ManualClock()
    backend = KeyedStateBackend(KeyGroupRange(0, 127), 128, clock=clock)
    ttl = StateTtlConfig(ttl_ms=10, incremental_cleanup_size=1000)
    session = backend.get_state(ValueStateDescriptor[str]("session", ttl=ttl))
    for key in ["idle1", "idle2"]:
        backend.set_current_key(key)
        session.update("x")
    backend.drain_touched_keys()
    clock.advance(50)
    backend.set_current_key("fresh")
    session.update("y")  # this access runs cleanup over the whole (small) state
    logged = {k for keys in backend.drain_touched_keys().values() for k in keys}
    assert logged == {"fresh", "idle1", "idle2"}
    assert set(backend.keys("session")) == {"fresh"}
