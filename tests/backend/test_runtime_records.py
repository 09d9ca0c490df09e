"""FunctionInstance.process: the per-record loop makes each record's key current, as
``set_current_key`` would, on its plain path (keys already in the change log switched without a
call) and on the general one (spill counting, per-record hooks), including a hook a function
adds while the loop runs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.keyed_backend import KeyGroupOutOfRangeError
from statetier.backend.keygroups import assign_to_key_group, key_group_range_for_instance
from statetier.backend.runtime import FunctionInstance

MAX_P = 16


class Count(KeyedProcessFunction[Any, int, tuple[Any, int]]):
    """Counts per key and emits the key and its count after each record."""

    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(ValueStateDescriptor[int]("count"))

    def process(self, key: Any, value: int, context: RuntimeContext) -> Iterable[tuple[Any, int]]:
        assert context.current_key == key  # the record's key is the current one
        total = (self.count.value() or 0) + value
        self.count.update(total)
        return [(key, total)]


def keys_of(instance: FunctionInstance) -> set[Any]:
    """The keys the change log holds (drained)."""
    return {key for keys in instance.keyed.drain_touched_keys().values() for key in keys}


@pytest.mark.parametrize("counting", [False, True])  # the plain loop; the spill tier's counting
def test_each_record_counts_under_its_own_key_across_calls_and_drains(counting: bool) -> None:
    instance = FunctionInstance(Count, 0, 1, MAX_P)
    hits = [0] * MAX_P
    if counting:
        instance.keyed.count_hits(hits)
    records = [("a", 1), ("b", 2), ("a", 3), (7, 1), ("b", 1), ((1, "x"), 5), ("a", 1)]
    later = [("b", 10), ("c", 1), ("b", 1)]
    assert instance.process(records) == [
        ("a", 1),
        ("b", 2),
        ("a", 4),
        (7, 1),
        ("b", 3),
        ((1, "x"), 5),
        ("a", 5),
    ]
    assert keys_of(instance) == {"a", "b", 7, (1, "x")}
    # after the drain, keys are hashed again and logged again, and their state is kept
    assert instance.process(later) == [("b", 13), ("c", 1), ("b", 14)]
    assert keys_of(instance) == {"a", "b", "c"}  # "a" was current at the drain: kept logged
    assert keys_of(instance) == {"b"}
    if counting:
        expected = [0] * MAX_P  # each record counted once, in its key group's slot
        for key, _ in records + later:
            expected[assign_to_key_group(key, MAX_P)] += 1
        assert hits == expected


def test_an_unhashable_key_in_the_records_is_named_and_the_earlier_records_stand() -> None:
    instance = FunctionInstance(Count, 0, 1, MAX_P)
    instance.process([("a", 1)])  # "a" is in the change log: the next call's plain path
    with pytest.raises(TypeError, match=r"^a record's key is a list \(\[1, 2\]\)"):
        instance.process([("a", 1), ([1, 2], 1), ("a", 1)])
    assert instance.keyed.current_key == "a"  # the refused key left the last one current
    assert instance.process([("a", 0)]) == [("a", 2)]


def test_a_key_outside_the_instances_range_is_refused_each_time() -> None:
    key_groups = key_group_range_for_instance(MAX_P, 2, 0)
    instance = FunctionInstance(Count, 0, 2, MAX_P)
    inside = next(f"k{i}" for i in range(100) if assign_to_key_group(f"k{i}", MAX_P) in key_groups)
    outside = next(
        f"k{i}" for i in range(100) if assign_to_key_group(f"k{i}", MAX_P) not in key_groups
    )
    instance.process([(inside, 1)])
    for _ in range(2):  # a refused key is not remembered
        with pytest.raises(KeyGroupOutOfRangeError, match=repr(outside)):
            instance.process([(inside, 1), (outside, 1)])
    assert instance.keyed.current_key == inside
    assert instance.process([(inside, 0)]) == [(inside, 3)]


class AddsAHook(KeyedProcessFunction[str, int, str]):
    """Adds a per-record hook at its second record (as a state with TTL cleanup per record,
    made in ``process``, does); the hook notes the current key when it runs."""

    def open(self, context: RuntimeContext) -> None:
        self.seen = 0
        self.hooked: list[Any] = []

    def process(self, key: str, value: int, context: RuntimeContext) -> Iterable[str]:
        self.seen += 1
        if self.seen == 2:
            backend = context.keyed_state
            backend.add_record_hook(lambda: self.hooked.append(backend.current_key))
        return [key]


def test_a_hook_added_by_the_function_runs_for_the_following_records_of_the_same_call() -> None:
    instance = FunctionInstance(AddsAHook, 0, 1, MAX_P)
    instance.process([("a", 0)])  # "a" in the change log: the call below starts on the plain path
    records = [("a", 0), ("b", 0), ("a", 0), ("c", 0)]
    assert instance.process(records) == ["a", "b", "a", "c"]
    function = instance.function
    assert isinstance(function, AddsAHook)
    assert function.hooked == ["b", "a", "c"]  # after each later record's key became current


class RaisesOnB(Count):
    """Count, with a TypeError of its own for the key "b"."""

    def process(self, key: Any, value: int, context: RuntimeContext) -> Iterable[tuple[Any, int]]:
        if key == "b":
            raise TypeError("the function's own error")
        return super().process(key, value, context)


def test_a_type_error_of_the_function_is_not_taken_for_an_unhashable_key() -> None:
    instance = FunctionInstance(RaisesOnB, 0, 1, MAX_P)
    instance.process([("a", 1)])  # "a" logged: the next call's plain path
    with pytest.raises(TypeError, match=r"^the function's own error$"):
        instance.process([("a", 1), ("b", 1)])
    assert instance.process([("a", 0)]) == [("a", 2)]
