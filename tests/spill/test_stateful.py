"""Random state operations interleaved with spills, loads and snapshots, against a reference.

The reference is a second backend that never spills: the heap tier is the semantics the spill tier
must keep (tests/backend pins those down). Both get the same operations, with the same manual
clock for TTL; every read must agree, and a "snapshot" (what a full snapshot iterates:
``map_for(kg).items()`` of every key group) must show the same visible state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from statetier.backend.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import KeyGroupRange, assign_to_key_group
from statetier.backend.spill import SpillManager, SpillStorage
from statetier.backend.state.ttl_cleanup import purge_expired
from statetier.backend.ttl import ManualClock, StateTtlConfig, UpdateType

MAX_P = 8
RANGE = KeyGroupRange(2, 6)


class Mean:
    """An aggregate function whose accumulator is a list (a container, as real ones are)."""

    def create_accumulator(self) -> list[int]:
        return [0, 0]

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        return [accumulator[0] + value, accumulator[1] + 1]

    def get_result(self, accumulator: list[int]) -> float:
        return accumulator[0] / accumulator[1]

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0], a[1] + b[1]]


def descriptors() -> list[StateDescriptor]:
    ttl = StateTtlConfig(ttl_ms=100)
    ttl_read = StateTtlConfig(ttl_ms=100, update_type=UpdateType.ON_READ_AND_WRITE)
    return [
        ValueStateDescriptor("value"),
        ListStateDescriptor("list"),
        ReducingStateDescriptor("sum", reduce_function=lambda a, b: a + b),
        AggregatingStateDescriptor("mean", aggregate_function=Mean()),
        MapStateDescriptor("map"),
        ValueStateDescriptor("ttl_value", ttl=ttl_read),
        ListStateDescriptor("ttl_list", ttl=ttl),
        MapStateDescriptor("ttl_map", ttl=ttl),
        ReducingStateDescriptor("ttl_sum", reduce_function=lambda a, b: a + b, ttl=ttl),
    ]


def _key_in_range(n: int) -> Any:
    """Keys of several types: str, int and tuples (the spill tier stores str keys specially)."""
    return [f"k{n}", n, ("t", n), f"ключ{n}"][n % 4]


KEYS = [k for k in map(_key_in_range, range(60)) if assign_to_key_group(k, MAX_P) in RANGE][:24]

keys = st.sampled_from(KEYS)
values = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=30),
    st.lists(st.integers(-1000, 1000), max_size=6),
)
user_keys = st.one_of(st.integers(0, 5), st.sampled_from(["a", "b", "ключ"]))


class SpillMachine(RuleBasedStateMachine):
    directory = Path()  # set by the test to its tmp_path

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(1000)
        self.spilling = KeyedStateBackend(RANGE, MAX_P, clock=self.clock)
        self.reference = KeyedStateBackend(RANGE, MAX_P, clock=self.clock)
        self.handles: list[tuple[Any, Any]] = []
        for descriptor in descriptors():
            self.handles.append(
                (self.spilling.get_state(descriptor), self.reference.get_state(descriptor))
            )
        self.dir = self.directory / f"m{id(self)}"
        # tiny chunks: regions grow, move between chunks and files come and go
        self.storage = SpillStorage([str(self.dir / "a"), str(self.dir / "b")], 1 << 16)
        self.manager = SpillManager(self.spilling, self.storage)
        self.views: list[tuple[Any, dict[Any, Any]]] = []

    def teardown(self) -> None:
        for view, _ in self.views:
            view.close()
        self.manager.close()

    def _usable(self, key: Any) -> bool:
        try:
            self.reference.set_current_key(key)
        except KeyError:
            return False
        self.spilling.set_current_key(key)
        return True

    @rule(key=keys, state=st.integers(0, 8), value=values, user_key=user_keys, op=st.integers(0, 4))
    def operate(self, key: Any, state: int, value: Any, user_key: Any, op: int) -> None:
        if not self._usable(key):
            return
        a, b = self.handles[state]
        name = self.spilling.tables[list(self.spilling.tables)[state]].descriptor.kind.value
        results = []
        for handle in (a, b):
            results.append(_apply(handle, name, op, value, user_key))
        assert results[0] == results[1], (name, op, results)

    @rule(key_group=st.sampled_from(list(RANGE)))
    def spill(self, key_group: int) -> None:
        assert self.manager.spill_key_group(key_group)
        assert self.manager.tier(key_group) == "disk"

    @rule(key_group=st.sampled_from(list(RANGE)))
    def load(self, key_group: int) -> None:
        self.manager.load_key_group(key_group)
        assert self.manager.tier(key_group) == "heap"

    @rule(ms=st.integers(0, 80))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @precondition(lambda self: len(self.views) < 3)
    @rule(key_group=st.sampled_from(list(RANGE)), state=st.integers(0, 8))
    def take_view(self, key_group: int, state: int) -> None:
        """A frozen view of a spilled key group keeps reading the version it was taken at."""
        name = list(self.spilling.tables)[state]
        kg_map = self.spilling.tables[name].map_for(key_group)
        frozen = getattr(kg_map, "frozen", None)
        if frozen is None:
            return
        view = frozen()
        self.views.append((view, dict(kg_map.items())))

    @rule()
    def check_views(self) -> None:
        for view, expected in self.views:
            assert dict(view.items()) == expected
        for view, _ in self.views:
            view.close()
        self.views = []

    @invariant()
    def snapshots_agree(self) -> None:
        now = self.clock.now_ms()
        for name, table in self.spilling.tables.items():
            reference = self.reference.tables[name]
            ttl = table.descriptor.ttl
            for key_group in RANGE:
                got = dict(table.map_for(key_group).items())
                want = dict(reference.map_for(key_group).items())
                if ttl is not None:  # cleanup order may differ: compare what is visible
                    got = _live(table.descriptor, got, ttl, now)
                    want = _live(table.descriptor, want, ttl, now)
                assert got == want, (name, key_group)
                assert (key_group - RANGE.start in self.manager.spilled) == (
                    type(table.map_for(key_group)) is not dict
                )


def _live(
    descriptor: StateDescriptor, entries: dict[Any, Any], ttl: StateTtlConfig, now: int
) -> Any:
    live = {}
    for key, stored in entries.items():
        kept = purge_expired(descriptor.kind, stored, ttl, now)
        if kept is not None:
            live[key] = kept
    return live


def _apply(handle: Any, kind: str, op: int, value: Any, user_key: Any) -> Any:
    if kind == "value":
        if op == 0:
            return handle.value()
        if op == 1:
            handle.update(None)
        else:
            handle.update(value)
        return handle.value()
    if kind == "list":
        if op == 0:
            return handle.get()
        if op == 1:
            handle.add(value)
        elif op == 2:
            handle.add_all([value, value])
        elif op == 3:
            handle.update([value])
        else:
            handle.clear()
        return handle.get()
    if kind in ("reducing", "aggregating"):
        number = value if isinstance(value, int) else len(value)
        if op == 0:
            return handle.get()
        if op == 4:
            handle.clear()
        else:
            handle.add(number)
        return handle.get()
    # map
    if op == 0:
        return handle.get(user_key), handle.contains(user_key), sorted(map(str, handle.keys()))
    if op == 1:
        handle.put(user_key, value)
    elif op == 2:
        handle.remove(user_key)
    elif op == 3:
        handle.put_all({user_key: value, "x": 1})
    else:
        handle.clear()
    return sorted(map(str, handle.items())), handle.is_empty()


@pytest.mark.slow
def test_spill_tier_matches_the_heap_tier(tmp_path: Path) -> None:
    SpillMachine.directory = tmp_path
    run_state_machine_as_test(
        SpillMachine,
        settings=settings(
            max_examples=150,
            stateful_step_count=80,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            database=None,
        ),
    )
