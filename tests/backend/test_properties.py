"""Property-based tests: every state type against a plain-dict reference model.

A hypothesis state machine drives a set of keyed backends (one per function instance) through
random operation sequences over several keys, for each state kind without and with TTL, while
a ManualClock moves forward. Every read is compared with the reference model, which implements
the documented semantics directly (timestamps, update type, visibility). Mid-sequence the whole
state is snapshotted and restored into new backends at another parallelism, and the run goes on
against the same model.
"""

from __future__ import annotations

import uuid
from typing import Any

import fsspec
import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from statetier.backend import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateTtlConfig,
    StateVisibility,
    UpdateType,
    ValueStateDescriptor,
)
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import (
    assign_to_key_group,
    instance_for_key_group,
    key_group_range_for_instance,
)
from statetier.backend.operator_state import OperatorStateBackend
from statetier.backend.snapshot import (
    SnapshotStore,
    commit_snapshot,
    restore_keyed_state,
    restore_operator_state,
    snapshot_subtask,
)
from statetier.backend.ttl import ManualClock

MAX_PARALLELISM = 16
TTL_MS = 100
KEYS: list[Any] = ["a", 7, ("t", 1), (None, 2)]  # a bare None key is refused (Flink too)
USER_KEYS: list[Any] = ["x", 3, ("u", 1)]
KINDS = ("value", "list", "reducing", "aggregating", "map")

SETTINGS = settings(
    max_examples=120,
    database=None,  # no replays of examples saved by other runs: each run stands alone
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class MeanText:
    """AggregateFunction[int, list[int], str]: accumulator [sum, count], result "sum/count"."""

    def create_accumulator(self) -> list[int]:
        return [0, 0]

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        return [accumulator[0] + value, accumulator[1] + 1]

    def get_result(self, accumulator: list[int]) -> str:
        return f"{accumulator[0]}/{accumulator[1]}"

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0], a[1] + b[1]]


def concat(old: str, new: str) -> str:
    return old + new  # order-sensitive, so a wrong fold order shows


def make_descriptor(kind: str, name: str, ttl: StateTtlConfig | None) -> StateDescriptor:
    if kind == "value":
        return ValueStateDescriptor[Any](name, ttl=ttl)
    if kind == "list":
        return ListStateDescriptor[Any](name, ttl=ttl)
    if kind == "reducing":
        return ReducingStateDescriptor[str](name, ttl=ttl, reduce_function=concat)
    if kind == "aggregating":
        return AggregatingStateDescriptor(name, ttl=ttl, aggregate_function=MeanText())
    return MapStateDescriptor(name, ttl=ttl)


# --------------------------------------------------------------------------- reference model


class Model:
    """One state's content per key, stored as in the docs: values with their last-write time."""

    def __init__(self, kind: str, ttl: StateTtlConfig | None, clock: ManualClock) -> None:
        self.kind = kind
        self.ttl = ttl
        self.clock = clock
        self.data: dict[Any, Any] = {}  # key -> (value, ts) | [(v, ts)] | {uk: (v, ts)}

    @property
    def now(self) -> int:
        return self.clock.now_ms()

    def expired(self, ts: int) -> bool:
        return self.ttl is not None and ts + self.ttl.ttl_ms <= self.now

    @property
    def return_expired(self) -> bool:
        return (
            self.ttl is not None
            and self.ttl.visibility is StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP
        )

    @property
    def renew_on_read(self) -> bool:
        return self.ttl is not None and self.ttl.update_type is UpdateType.ON_READ_AND_WRITE

    # single-value kinds: value, reducing, aggregating (the accumulator)
    def read_single(self, key: Any) -> Any:
        stored = self.data.get(key)
        if stored is None:
            return None
        value, ts = stored
        if self.expired(ts):
            del self.data[key]
            return value if self.return_expired else None
        if self.renew_on_read:
            self.data[key] = (value, self.now)
        return value

    def foldable_single(self, key: Any) -> Any:
        """What an add folds into: Flink's getUnexpired (an expired value only when expired
        values are returned)."""
        stored = self.data.get(key)
        if stored is None or (self.expired(stored[1]) and not self.return_expired):
            return None
        return stored[0]

    def write_single(self, key: Any, value: Any) -> None:
        if value is None:
            self.data.pop(key, None)
        else:
            self.data[key] = (value, self.now)

    # list
    def read_list(self, key: Any) -> list[Any]:
        elements = self.data.get(key, [])
        visible = [v for v, ts in elements if self.return_expired or not self.expired(ts)]
        live = [
            (v, self.now if self.renew_on_read else ts)
            for v, ts in elements
            if not self.expired(ts)
        ]
        if live:
            self.data[key] = live
        else:
            self.data.pop(key, None)
        return visible

    def add_list(self, key: Any, values: list[Any]) -> None:
        if values:
            self.data[key] = self.data.get(key, []) + [(v, self.now) for v in values]

    def update_list(self, key: Any, values: list[Any]) -> None:
        if values:
            self.data[key] = [(v, self.now) for v in values]
        else:
            self.data.pop(key, None)

    # map
    def _map(self, key: Any) -> dict[Any, Any]:
        entries: dict[Any, Any] = self.data.get(key, {})
        return entries

    def _store_map(self, key: Any, entries: dict[Any, Any]) -> None:
        if entries:
            self.data[key] = entries
        else:
            self.data.pop(key, None)

    def map_get(self, key: Any, user_key: Any) -> tuple[bool, Any]:
        """(present, value) of one entry, as get/contains read it."""
        entries = dict(self._map(key))
        if user_key not in entries:
            return False, None
        value, ts = entries[user_key]
        if self.expired(ts):
            del entries[user_key]
            self._store_map(key, entries)
            return self.return_expired, value if self.return_expired else None
        if self.renew_on_read:
            entries[user_key] = (value, self.now)
            self._store_map(key, entries)
        return True, value

    def map_put(self, key: Any, entries: dict[Any, Any]) -> None:
        if entries:
            current = dict(self._map(key))
            current.update({k: (v, self.now) for k, v in entries.items()})
            self._store_map(key, current)

    def map_remove(self, key: Any, user_key: Any) -> None:
        current = dict(self._map(key))
        current.pop(user_key, None)
        self._store_map(key, current)

    def map_items(self, key: Any) -> dict[Any, Any]:
        entries = self._map(key)
        visible = {
            k: v for k, (v, ts) in entries.items() if self.return_expired or not self.expired(ts)
        }
        live = {
            k: (v, self.now if self.renew_on_read else ts)
            for k, (v, ts) in entries.items()
            if not self.expired(ts)
        }
        self._store_map(key, live)
        return visible

    def clear(self, key: Any) -> None:
        self.data.pop(key, None)


# --------------------------------------------------------------------------- the machine

ttl_configs = st.one_of(
    # NeverReturnExpired: what a read shows does not depend on when cleanup ran, so every
    # cleanup strategy may be on.
    st.builds(
        StateTtlConfig,
        ttl_ms=st.just(TTL_MS),
        update_type=st.sampled_from(UpdateType),
        visibility=st.just(StateVisibility.NEVER_RETURN_EXPIRED),
        incremental_cleanup_size=st.sampled_from([0, 1, 5]),
        cleanup_per_record=st.booleans(),
        cleanup_full_snapshot=st.booleans(),
    ),
    # ReturnExpiredIfNotCleanedUp: only cleanup on read, so the model knows what is left.
    st.builds(
        StateTtlConfig,
        ttl_ms=st.just(TTL_MS),
        update_type=st.sampled_from(UpdateType),
        visibility=st.just(StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP),
        incremental_cleanup_size=st.just(0),
    ),
)

keys = st.sampled_from(KEYS)
ways = st.integers(0, 2)  # list writes: add, add_all, update
views = st.sampled_from(["items", "keys", "values", "is_empty"])
texts = st.text(alphabet="abc", min_size=1, max_size=2)
steps = st.sampled_from([0, 0, 1, TTL_MS // 3, TTL_MS // 2, TTL_MS - 1, TTL_MS])
user_keys = st.sampled_from(USER_KEYS)
small_ints = st.integers(min_value=-5, max_value=50)
elements = st.one_of(small_ints, st.text(max_size=3), st.tuples(small_ints, st.booleans()))


def names(*kinds: str) -> st.SearchStrategy[str]:
    """The plain and the TTL state of each of ``kinds``."""
    return st.sampled_from([f"{prefix}{kind}" for kind in kinds for prefix in ("", "ttl_")])


class KeyedStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(1_000_000)
        self.uri = f"memory://statetier-props-{uuid.uuid4().hex}"
        self.store = SnapshotStore(self.uri)
        self.epoch = 0
        self.parallelism = 1
        self.descriptors: dict[str, tuple[str, StateTtlConfig | None]] = {}
        self.focus = "all"
        self.models: dict[str, Model] = {}
        self.backends: list[KeyedStateBackend] = []

    @initialize(
        parallelism=st.integers(min_value=1, max_value=5),
        ttl=ttl_configs,
        focus=st.sampled_from([*KINDS, "all"]),
    )
    def setup(self, parallelism: int, ttl: StateTtlConfig, focus: str) -> None:
        # Most runs exercise one kind only, so that its operations interleave densely with
        # time steps and rescales; "all" runs mix every kind.
        self.focus = focus
        for kind in KINDS:
            for config in (None, ttl):
                name = f"{'ttl_' if config else ''}{kind}"
                self.descriptors[name] = (kind, config)
                self.models[name] = Model(kind, config, self.clock)
        self._start(parallelism, restore=False, register_first=True)

    def _start(self, parallelism: int, restore: bool, register_first: bool) -> None:
        self.parallelism = parallelism
        self.backends = []
        for i in range(parallelism):
            kg_range = key_group_range_for_instance(MAX_PARALLELISM, parallelism, i)
            backend = KeyedStateBackend(kg_range, MAX_PARALLELISM, clock=self.clock)
            if register_first:
                self._register(backend)
            if restore:
                restore_keyed_state(self.store, backend)
            self.backends.append(backend)

    def _register(self, backend: KeyedStateBackend) -> None:
        for name, (kind, config) in self.descriptors.items():
            backend.get_state(make_descriptor(kind, name, config))

    def handle(self, name: str, key: Any, dt: int = 0) -> Any:
        """The state handle for a record of ``key``, ``dt`` ms after the previous record."""
        self.clock.advance(dt)
        kg = assign_to_key_group(key, MAX_PARALLELISM)
        backend = self.backends[instance_for_key_group(MAX_PARALLELISM, self.parallelism, kg)]
        kind, config = self.descriptors[name]
        state = backend.get_state(make_descriptor(kind, name, config))
        backend.set_current_key(key)
        return state

    def teardown(self) -> None:
        fs, root = fsspec.core.url_to_fs(self.uri)
        if fs.exists(root):
            fs.rm(root, recursive=True)

    # ------------------------------------------------------------------ time and rescale

    @rule(ms=st.sampled_from([1, TTL_MS // 3, TTL_MS // 2, TTL_MS - 1, TTL_MS, 2 * TTL_MS]))
    def advance_clock(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(key=keys)
    def record_without_state_access(self, key: Any) -> None:
        # set_current_key alone: per-record cleanup may run, nothing visible may change
        kg = assign_to_key_group(key, MAX_PARALLELISM)
        index = instance_for_key_group(MAX_PARALLELISM, self.parallelism, kg)
        self.backends[index].set_current_key(key)

    @rule(parallelism=st.integers(min_value=1, max_value=6), register_first=st.booleans())
    def snapshot_and_restore(self, parallelism: int, register_first: bool) -> None:
        self.epoch += 1
        subtasks = [snapshot_subtask(self.store, self.epoch, b) for b in self.backends]
        commit_snapshot(self.store, self.epoch, subtasks)
        self._start(parallelism, restore=True, register_first=register_first)

    # ------------------------------------------------------------------ value

    @precondition(lambda self: self.focus in ("value", "all"))
    @rule(name=names("value"), key=keys, dt=steps, value=st.one_of(st.none(), elements))
    def value_update(self, name: str, key: Any, dt: int, value: Any) -> None:
        self.handle(name, key, dt).update(value)
        self.models[name].write_single(key, value)

    @precondition(lambda self: self.focus in ("value", "all"))
    @rule(name=names("value"), key=keys, dt=steps)
    def value_read(self, name: str, key: Any, dt: int) -> None:
        assert self.handle(name, key, dt).value() == self.models[name].read_single(key)

    # ------------------------------------------------------------------ list

    @precondition(lambda self: self.focus in ("list", "all"))
    @rule(name=names("list"), key=keys, dt=steps, values=st.lists(elements, max_size=3), how=ways)
    def list_write(self, name: str, key: Any, dt: int, values: list[Any], how: int) -> None:
        state, model = self.handle(name, key, dt), self.models[name]
        if how == 0 and values:
            state.add(values[0])
            model.add_list(key, values[:1])
        elif how == 1:
            state.add_all(values)
            model.add_list(key, values)
        else:
            state.update(values)
            model.update_list(key, values)

    @precondition(lambda self: self.focus in ("list", "all"))
    @rule(name=names("list"), key=keys, dt=steps)
    def list_read(self, name: str, key: Any, dt: int) -> None:
        assert self.handle(name, key, dt).get() == self.models[name].read_list(key)

    # ------------------------------------------------------------------ reducing, aggregating

    @precondition(lambda self: self.focus in ("reducing", "all"))
    @rule(name=names("reducing"), key=keys, dt=steps, value=texts)
    def reducing_add(self, name: str, key: Any, dt: int, value: str) -> None:
        self.handle(name, key, dt).add(value)
        model = self.models[name]
        current = model.foldable_single(key)
        model.write_single(key, value if current is None else concat(current, value))

    @precondition(lambda self: self.focus in ("aggregating", "all"))
    @rule(name=names("aggregating"), key=keys, dt=steps, value=small_ints)
    def aggregating_add(self, name: str, key: Any, dt: int, value: int) -> None:
        self.handle(name, key, dt).add(value)
        model = self.models[name]
        acc = model.foldable_single(key) or MeanText().create_accumulator()
        model.write_single(key, MeanText().add(value, acc))

    @precondition(lambda self: self.focus in ("reducing", "aggregating", "all"))
    @rule(name=names("reducing", "aggregating"), key=keys, dt=steps)
    def single_get(self, name: str, key: Any, dt: int) -> None:
        kind = self.descriptors[name][0]
        got = self.handle(name, key, dt).get()
        expected = self.models[name].read_single(key)
        if kind == "aggregating" and expected is not None:
            expected = MeanText().get_result(expected)
        assert got == expected

    # ------------------------------------------------------------------ map

    @precondition(lambda self: self.focus in ("map", "all"))
    @rule(
        name=names("map"),
        key=keys,
        dt=steps,
        entries=st.dictionaries(user_keys, st.one_of(st.none(), small_ints), max_size=3),
        single=st.booleans(),
    )
    def map_put(self, name: str, key: Any, dt: int, entries: dict[Any, Any], single: bool) -> None:
        state = self.handle(name, key, dt)
        if single and entries:
            user_key, value = next(iter(entries.items()))
            state.put(user_key, value)
            entries = {user_key: value}
        else:
            state.put_all(entries)
        self.models[name].map_put(key, entries)

    @precondition(lambda self: self.focus in ("map", "all"))
    @rule(name=names("map"), key=keys, dt=steps, user_key=user_keys)
    def map_remove(self, name: str, key: Any, dt: int, user_key: Any) -> None:
        self.handle(name, key, dt).remove(user_key)
        self.models[name].map_remove(key, user_key)

    @precondition(lambda self: self.focus in ("map", "all"))
    @rule(name=names("map"), key=keys, dt=steps, user_key=user_keys, contains=st.booleans())
    def map_get(self, name: str, key: Any, dt: int, user_key: Any, contains: bool) -> None:
        state = self.handle(name, key, dt)
        present, value = self.models[name].map_get(key, user_key)
        if contains:
            assert state.contains(user_key) == present
        else:
            assert state.get(user_key) == value

    @precondition(lambda self: self.focus in ("map", "all"))
    @rule(name=names("map"), key=keys, dt=steps, view=views)
    def map_iterate(self, name: str, key: Any, dt: int, view: str) -> None:
        state = self.handle(name, key, dt)
        expected = self.models[name].map_items(key)
        if view == "items":
            assert dict(state.items()) == expected
        elif view == "keys":
            assert sorted(map(repr, state.keys())) == sorted(map(repr, expected))
        elif view == "values":
            assert sorted(map(repr, state.values())) == sorted(map(repr, expected.values()))
        else:
            assert state.is_empty() == (not expected)

    # ------------------------------------------------------------------ all kinds

    @rule()
    def read_everything(self) -> None:
        """Every state of every key, as a last-record-of-the-batch check would read it."""
        for name, (kind, _) in self.descriptors.items():
            for key in KEYS:
                state, model = self.handle(name, key), self.models[name]
                if kind == "value":
                    assert state.value() == model.read_single(key), (name, key)
                elif kind == "list":
                    assert state.get() == model.read_list(key), (name, key)
                elif kind == "map":
                    assert dict(state.items()) == model.map_items(key), (name, key)
                else:
                    expected = model.read_single(key)
                    if kind == "aggregating" and expected is not None:
                        expected = MeanText().get_result(expected)
                    assert state.get() == expected, (name, key)

    @rule(name=names(*KINDS), key=keys, dt=steps)
    def clear(self, name: str, key: Any, dt: int) -> None:
        self.handle(name, key, dt).clear()
        self.models[name].clear(key)

    @precondition(lambda self: self.backends)
    @invariant()
    def plain_states_hold_exactly_the_model_keys(self) -> None:
        # Without TTL nothing expires, so the stored keys are the model's (reading nothing).
        for name, (_, config) in self.descriptors.items():
            if config is not None:
                continue
            stored: list[Any] = []
            for backend in self.backends:
                if name in backend.tables:
                    stored.extend(backend.keys(name))
                elif name in backend.restored:
                    restored = backend.restored[name].entries
                    stored.extend(pair for pairs in restored.values() for pair in pairs)
            expected = self.models[name].data
            assert len(stored) == len(expected), name


TestKeyedStateAgainstModel = KeyedStateMachine.TestCase
TestKeyedStateAgainstModel.settings = SETTINGS


# --------------------------------------------------------------------------- operator state


def flink_round_robin(totals: dict[str, int], parallelism: int) -> dict[str, list[tuple[int, int]]]:
    """Flink's RoundRobinOperatorStateRepartitioner.repartitionSplitState, step by step: per
    state, (start, count) of each instance's part of the concatenated elements."""
    result: dict[str, list[tuple[int, int]]] = {}
    start_parallel_op = 0
    for name in sorted(totals):
        base_fraction, remainder = divmod(totals[name], parallelism)
        new_start_parallel_op = start_parallel_op
        parts = [(0, 0)] * parallelism
        taken = 0
        for i in range(parallelism):
            parallel_op_idx = (i + start_parallel_op) % parallelism
            number_to_assign = base_fraction
            if remainder > 0:
                number_to_assign += 1
                remainder -= 1
            elif remainder == 0:
                new_start_parallel_op = parallel_op_idx
                remainder -= 1
            parts[parallel_op_idx] = (taken, number_to_assign)
            taken += number_to_assign
        start_parallel_op = new_start_parallel_op
        result[name] = parts
    return result


SPLIT_NAMES = ("split", "split2")
UNION_CAP = 200  # union elements beyond which a rescale keeps one instance's (see below)


class OperatorStateMachine(RuleBasedStateMachine):
    """Operator list state: even-split and union lists across rescales, against plain lists.

    The model follows Flink: at an unchanged parallelism every instance keeps its own lists;
    otherwise even-split states are cut by Flink's round-robin repartitioning.
    """

    def __init__(self) -> None:
        super().__init__()
        self.uri = f"memory://statetier-ops-{uuid.uuid4().hex}"
        self.store = SnapshotStore(self.uri)
        self.epoch = 0
        self.instances = [OperatorStateBackend(0, 1)]
        self.split: dict[str, list[list[int]]] = {name: [[]] for name in SPLIT_NAMES}
        self.union: list[list[int]] = [[]]

    def _split(self, i: int, name: str) -> Any:
        return self.instances[i].get_list_state(ListStateDescriptor[int](name))

    def _union(self, i: int) -> Any:
        return self.instances[i].get_union_list_state(ListStateDescriptor[int]("union"))

    def teardown(self) -> None:
        fs, root = fsspec.core.url_to_fs(self.uri)
        if fs.exists(root):
            fs.rm(root, recursive=True)

    @rule(
        data=st.data(),
        values=st.lists(small_ints, max_size=4),
        into=st.sampled_from([*SPLIT_NAMES, "union"]),
    )
    def add(self, data: st.DataObject, values: list[int], into: str) -> None:
        i = data.draw(st.integers(0, len(self.instances) - 1))
        if into == "union":
            self._union(i).add_all(values)
            self.union[i].extend(values)
        else:
            self._split(i, into).add_all(values)
            self.split[into][i].extend(values)

    @rule(data=st.data(), name=st.sampled_from(SPLIT_NAMES))
    def clear(self, data: st.DataObject, name: str) -> None:
        i = data.draw(st.integers(0, len(self.instances) - 1))
        self._split(i, name).clear()
        self.split[name][i] = []

    @rule(parallelism=st.integers(min_value=1, max_value=6))
    def rescale(self, parallelism: int) -> None:
        self.epoch += 1
        if sum(map(len, self.union)) > UNION_CAP:
            self._keep_one_union()
        subtasks = [snapshot_subtask(self.store, self.epoch, None, ops) for ops in self.instances]
        commit_snapshot(self.store, self.epoch, subtasks)
        all_union = [x for part in self.union for x in part]
        if parallelism != len(self.instances):
            concatenated = {
                name: [x for p in lists for x in p] for name, lists in self.split.items()
            }
            parts = flink_round_robin({n: len(c) for n, c in concatenated.items()}, parallelism)
            self.split = {
                name: [concatenated[name][start : start + n] for start, n in parts[name]]
                for name in SPLIT_NAMES
            }
        self.instances = []
        for i in range(parallelism):
            ops = OperatorStateBackend(i, parallelism)
            restore_operator_state(self.store, ops)
            self.instances.append(ops)
        self.union = [list(all_union) for _ in range(parallelism)]

    def _keep_one_union(self) -> None:
        """Every instance but the first empties its union list, as a user of union state does
        to keep it from multiplying: each restore gives every instance all of the lists, so
        left alone it grows by the parallelism at each rescale (6**k elements after k of them,
        which once ran a worker out of memory)."""
        for i in range(1, len(self.instances)):
            self._union(i).clear()
            self.union[i] = []

    @invariant()
    def lists_match(self) -> None:
        for i in range(len(self.instances)):
            for name in SPLIT_NAMES:
                assert self._split(i, name).get() == self.split[name][i]
            assert self._union(i).get() == self.union[i]


TestOperatorStateAgainstModel = OperatorStateMachine.TestCase
TestOperatorStateAgainstModel.settings = settings(
    max_examples=30, stateful_step_count=25, deadline=None, database=None
)
