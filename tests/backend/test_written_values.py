"""A delta takes the values a key batch's bulk write recorded instead of looking each key up,
only where nothing else can have written those keys since: every case that could make the
record stale must fall back to the lookups, and the delta's bytes are always the lookups'."""

from __future__ import annotations

import operator
from collections.abc import Callable

import pytest
from statetier.backend import ReducingStateDescriptor, ValueStateDescriptor
from statetier.backend.keyed_backend import KeyedStateBackend, TouchedKeys
from statetier.backend.keygroups import KeyGroupRange, assign_to_key_group
from statetier.backend.snapshot import serialize
from statetier.backend.state import ReducingState, ValueState
from statetier.backend.state.key_batch import KeyBatch

MAX_P = 16
KEYS = sorted((f"w{i}" for i in range(200)), key=lambda k: assign_to_key_group(k, MAX_P))


class _Run:
    """A backend with a reducing sum and a value state, and a key batch of ``KEYS`` built as
    the Spark pipeline builds it (from a key-group column, sorted by key group)."""

    def __init__(self, keys: list[str] = KEYS) -> None:
        self.backend = KeyedStateBackend(KeyGroupRange.of(MAX_P), MAX_P)
        self.sums: ReducingState[int] = self.backend.get_state(
            ReducingStateDescriptor[int]("sum", reduce_function=operator.add)
        )
        self.last: ValueState[int] = self.backend.get_state(ValueStateDescriptor[int]("last"))
        self.backend.drain_touched()
        self.keys = keys

    def batch(self) -> KeyBatch:
        groups = [assign_to_key_group(k, MAX_P) for k in self.keys]
        return self.backend.key_batch(self.keys, groups)

    def delta(self, touched: TouchedKeys, state: str) -> bytes:
        table = self.backend.tables[state]
        return serialize.encode_table(self.backend, table, 2, touched, "none")

    def check(self, touched: TouchedKeys) -> None:
        """Each table's delta is byte for byte what looking every touched key up writes."""
        looked_up = TouchedKeys(touched.by_group)
        for state in ("sum", "last"):
            assert self.delta(touched, state) == self.delta(looked_up, state), state


def _recorded(run: _Run, touched: TouchedKeys, state: str) -> set[int]:
    maps = run.backend.tables[state].maps
    return {kg for kg in touched.by_group if touched.written(maps, kg) is not None}


def test_a_bulk_write_alone_is_written_from_its_record() -> None:
    run = _Run()
    batch = run.batch()
    run.sums.add_each(batch, [1] * len(KEYS))
    run.sums.add_each(batch, range(len(KEYS)))  # the second write's record replaces the first
    run.last.update_all(batch, range(100, 100 + len(KEYS)))
    touched = run.backend.drain_touched()
    assert _recorded(run, touched, "sum") == _recorded(run, touched, "last") == set(range(MAX_P))
    run.check(touched)


def test_the_callers_list_is_not_the_record() -> None:
    run = _Run()
    totals = run.sums.add_each(run.batch(), [1] * len(KEYS))
    totals[:] = [-1] * len(totals)
    touched = run.backend.drain_touched()
    assert _recorded(run, touched, "sum") == set(range(MAX_P))
    run.check(touched)


def _per_key_write_to_first_key(run: _Run, batch: KeyBatch) -> None:
    run.backend.set_current_key(KEYS[0])
    run.sums.add(1000)


def _scoped_writes(run: _Run, batch: KeyBatch) -> None:
    # the per-key path of a handle without a bulk write: no key is logged on its own
    batch.write_each(run.backend.context, run.sums.add, [5] * len(KEYS))


def _second_batch(run: _Run, batch: KeyBatch) -> None:
    run.sums.add_each(run.batch(), [7] * len(KEYS))


def _failed_bulk_write(run: _Run, batch: KeyBatch) -> None:
    values: list[object] = [3] * len(KEYS)
    values[150] = "not an int"  # the sum fails there, after 150 keys were written
    with pytest.raises(TypeError):
        run.sums.add_each(batch, values)  # type: ignore[arg-type]  # the wrong type on purpose


def _clearing_update(run: _Run, batch: KeyBatch) -> None:
    values: list[int | None] = [9] * len(KEYS)
    values[0] = None  # clears the first key: the slow path of update_all
    run.last.update_all(batch, values)


ALL = set(range(MAX_P))
FIRST = assign_to_key_group(KEYS[0], MAX_P)
# what runs after both bulk writes, and the key groups each state must then look up
AFTERWARDS: dict[str, tuple[Callable[[_Run, KeyBatch], None], dict[str, set[int]]]] = {
    "nothing": (lambda run, batch: None, {"sum": set(), "last": set()}),
    "a per-key write": (_per_key_write_to_first_key, {"sum": {FIRST}, "last": {FIRST}}),
    "the per-key path over the batch": (_scoped_writes, {"sum": ALL, "last": ALL}),
    "another batch": (_second_batch, {"sum": ALL, "last": ALL}),
    "a bulk write that failed half-way": (_failed_bulk_write, {"sum": ALL, "last": set()}),
    "an update that clears a key": (_clearing_update, {"sum": set(), "last": ALL}),
}


@pytest.mark.parametrize("then", list(AFTERWARDS))
def test_any_later_write_the_record_does_not_know_falls_back_to_lookups(then: str) -> None:
    run = _Run()
    batch = run.batch()
    run.sums.add_each(batch, range(len(KEYS)))
    run.last.update_all(batch, range(len(KEYS)))
    write, looked_up = AFTERWARDS[then]
    write(run, batch)
    touched = run.backend.drain_touched()
    for state, expected in looked_up.items():
        assert _recorded(run, touched, state) == ALL - expected, state
    run.check(touched)


def test_a_batch_that_repeats_a_key_is_looked_up_where_it_does() -> None:
    run = _Run([*KEYS[:50], KEYS[49], *KEYS[50:]])  # the repeat in KEYS[49]'s key group
    run.sums.add_each(run.batch(), [1] * (len(KEYS) + 1))
    touched = run.backend.drain_touched()
    repeated = assign_to_key_group(KEYS[49], MAX_P)
    assert _recorded(run, touched, "sum") == set(range(MAX_P)) - {repeated}
    run.check(touched)


def test_a_batch_not_sorted_by_key_group_is_looked_up() -> None:
    run = _Run(list(reversed(KEYS)))
    run.sums.add_each(run.batch(), [1] * len(KEYS))
    touched = run.backend.drain_touched()
    assert touched.runs == {}
    run.check(touched)


def _touched_keys(touched: TouchedKeys) -> set[str]:
    return {key for keys in touched.by_group.values() for key in keys}


KEPT_USES: dict[str, Callable[[_Run, KeyBatch], object]] = {
    "a bulk write": lambda run, batch: run.sums.add_each(batch, [2] * len(KEYS)),
    "a bulk read": lambda run, batch: run.last.values(batch),
    "the per-key path": lambda run, batch: [run.sums.add(2) for _ in batch.scoped()],
}


@pytest.mark.parametrize("hashed", [False, True], ids=["key-group column", "hashed"])
@pytest.mark.parametrize("use", list(KEPT_USES))
def test_a_batch_kept_past_a_snapshot_logs_its_keys_again_and_forgets_its_record(
    use: str, hashed: bool
) -> None:
    """A function may keep a batch across epochs: its keys must be in the next delta too, and
    what its bulk write recorded in the earlier epoch (before a per-key write changed a key)
    must not be written as this epoch's values."""
    run = _Run()
    batch = run.backend.key_batch(KEYS) if hashed else run.batch()
    run.sums.add_each(batch, [1] * len(KEYS))
    _per_key_write_to_first_key(run, batch)  # after the record: the record is stale there
    run.backend.set_current_key(KEYS[-1])  # (the current key stays logged: another key group)
    assert _touched_keys(run.backend.drain_touched()) == set(KEYS)
    KEPT_USES[use](run, batch)
    touched = run.backend.drain_touched()
    assert _touched_keys(touched) == set(KEYS)
    run.check(touched)
    KEPT_USES[use](run, batch)  # logged once per epoch, however often it is used
    KEPT_USES[use](run, batch)
    assert len(run.backend.context.batch_log) == 1
    run.check(run.backend.drain_touched())
