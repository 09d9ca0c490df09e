"""``ReducingState.add_each``: a KeyBatch's adds in one loop, the same state as ``add`` under
each key in turn, on heap, TTL and spilled key groups, with the reduced values returned."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest
from statetier.backend import ReducingStateDescriptor, StateTtlConfig
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import KeyGroupRange, assign_to_key_group
from statetier.backend.spill import SpillManager, SpillStorage
from statetier.backend.state import ReducingState
from statetier.backend.ttl import ManualClock

MAX_P = 128
HALF = KeyGroupRange(64, 127)
ORDERS = pytest.mark.parametrize("order", ["as hashed", "by key group"])


def _keys_in(count: int) -> list[str]:
    keys: list[str] = []
    n = 0
    while len(keys) < count:
        if assign_to_key_group(f"k{n}", MAX_P) in HALF:
            keys.append(f"k{n}")
        n += 1
    return keys


def _ordered(keys: list[str], order: str) -> list[str]:
    if order == "as hashed":
        return keys
    return sorted(keys, key=lambda k: assign_to_key_group(k, MAX_P))


def _concat(backend: KeyedStateBackend, ttl: StateTtlConfig | None = None) -> ReducingState[str]:
    """A reduce function that is not commutative: the order of its arguments shows."""
    return backend.get_state(
        ReducingStateDescriptor[str]("joined", reduce_function=operator.add, ttl=ttl)
    )


def _per_key_adds(keys: list[str], values: list[str], ttl: StateTtlConfig | None) -> list[Any]:
    """The same adds through ``set_current_key`` and ``add``: each key's value after its add."""
    backend = KeyedStateBackend(HALF, MAX_P, clock=ManualClock())
    state = _concat(backend, ttl)
    out = []
    for key, value in zip(keys, values, strict=True):
        backend.set_current_key(key)
        state.add(value)
        out.append(state.get())
    return out


@ORDERS
@pytest.mark.parametrize("ttl", [None, StateTtlConfig(ttl_ms=1000)], ids=["heap", "ttl"])
def test_add_each_is_add_under_each_key_in_turn(order: str, ttl: StateTtlConfig | None) -> None:
    backend = KeyedStateBackend(HALF, MAX_P, clock=ManualClock())
    joined = _concat(backend, ttl)
    keys = _ordered(_keys_in(50), order)
    first = joined.add_each(backend.key_batch(keys[:20]), [f"a{i}" for i in range(20)])
    # again over all 50 keys, each repeated: a repeat sees its own earlier add of this batch
    twice = _ordered(keys + keys, order)
    values = [f"b{i}" for i in range(100)]
    batch = backend.key_batch(twice)
    assert (batch.runs is not None) == (order == "by key group")
    second = joined.add_each(batch, pa.array(values))  # Arrow values, as a function has them

    expected = _per_key_adds(keys[:20] + twice, [f"a{i}" for i in range(20)] + values, ttl)
    assert first + second == expected
    final: dict[str, str] = dict(zip(keys[:20] + twice, expected, strict=True))
    for key in keys:
        backend.set_current_key(key)
        assert joined.get() == final[key]
    assert final[keys[0]].startswith("a0")  # the old value comes first: reduce(old, new)


def test_a_none_value_is_refused_before_any_add() -> None:
    backend = KeyedStateBackend(HALF, MAX_P)
    joined = _concat(backend)
    keys = _keys_in(3)
    with pytest.raises(ValueError, match="a reduced value cannot be None"):
        joined.add_each(backend.key_batch(keys), cast(list[str], ["x", None, "z"]))
    assert list(backend.keys("joined")) == []
    with pytest.raises(ValueError, match="2 values for a KeyBatch of 3 keys"):
        joined.add_each(backend.key_batch(keys), ["x", "y"])
    other = KeyedStateBackend(HALF, MAX_P)
    with pytest.raises(ValueError, match="made by another state backend"):
        _concat(other).add_each(backend.key_batch(keys), ["x", "y", "z"])


def test_ttl_adds_renew_and_expired_values_start_over() -> None:
    clock = ManualClock()
    backend = KeyedStateBackend(HALF, MAX_P, clock=clock)
    joined = _concat(backend, StateTtlConfig(ttl_ms=100))
    keys = _keys_in(4)
    joined.add_each(backend.key_batch(keys), ["a"] * 4)
    clock.advance(60)
    joined.add_each(backend.key_batch(keys[:2]), ["b", "b"])  # renewed at 60
    clock.advance(60)  # 120: the others expired at 100
    assert joined.add_each(backend.key_batch(keys), ["c"] * 4) == ["abc", "abc", "c", "c"]


@ORDERS
def test_add_each_reaches_spilled_key_groups_and_leaves_them_spilled(
    tmp_path: Path, order: str
) -> None:
    backend = KeyedStateBackend(HALF, MAX_P)
    manager = SpillManager(backend, SpillStorage([str(tmp_path)], 1 << 20))
    counts = backend.get_state(ReducingStateDescriptor[int]("n", reduce_function=operator.add))
    keys = _ordered(_keys_in(300), order)
    counts.add_each(backend.key_batch(keys), [1] * 300)
    spilled = assign_to_key_group(keys[0], MAX_P)
    assert manager.spill_key_group(spilled)
    assert counts.add_each(backend.key_batch(keys), range(300)) == [i + 1 for i in range(300)]
    assert manager.is_spilled(spilled)
    touched = backend.drain_touched_keys()
    assert sorted(k for group in touched.values() for k in group) == sorted(keys)
    for i, key in enumerate(keys):
        backend.set_current_key(key)
        assert counts.get() == i + 1
