"""The LocalRunner's routing: each record to the instance that owns its key group, a key hashed
once between checkpoints (the route memo), the memo dropped at a checkpoint and when large."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
from statetier.backend import routing
from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.keygroups import assign_str_to_key_group, assign_to_key_group
from statetier.backend.local_runner import LocalRunner


class Count(KeyedProcessFunction[Any, int, tuple[Any, int]]):
    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(ValueStateDescriptor[int]("count"))
        self.index = context.index

    def process(self, key: Any, value: int, context: RuntimeContext) -> list[Any]:
        total = (self.count.value() or 0) + value
        self.count.update(total)
        return [(self.index, key, total)]


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """How often the runner hashed each str key to its key group."""
    seen: collections.Counter[str] = collections.Counter()

    def counting(key: str, max_parallelism: int) -> int:
        seen[key] += 1
        return assign_str_to_key_group(key, max_parallelism)

    monkeypatch.setattr(routing, "assign_str_to_key_group", counting)
    return seen


def test_each_record_reaches_the_instance_of_its_key_group_in_every_call() -> None:
    runner = LocalRunner(Count, 3, max_parallelism=16)
    keys: list[Any] = [f"k{i}" for i in range(40)] + list(range(20)) + [b"raw", (1, "t")]
    for round_ in range(3):
        out = runner.process((key, 1) for key in keys)
        owner = {key: index for index, key, _ in out}
        for key in keys:
            kg = assign_to_key_group(key, 16)
            assert kg in runner.instances[owner[key]].keyed.key_groups, key
        assert sorted(total for _, _, total in out) == [round_ + 1] * len(keys)
    runner.close()


def test_a_key_is_hashed_once_between_checkpoints(
    tmp_path: Path, hashes: collections.Counter[str]
) -> None:
    runner = LocalRunner(Count, 2, checkpoint_uri=f"file://{tmp_path}")
    keys = [f"user-{i}" for i in range(100)]
    for _ in range(3):
        runner.process((key, 1) for key in keys + keys)
    assert set(hashes.values()) == {1}  # three calls, six records per key, one hash
    runner.checkpoint()  # the change logs are drained: the memo is dropped with them
    runner.process((key, 1) for key in keys)
    assert set(hashes.values()) == {2}
    runner.close()


def test_a_call_that_leaves_the_memo_above_its_limit_drops_it(
    monkeypatch: pytest.MonkeyPatch, hashes: collections.Counter[str]
) -> None:
    monkeypatch.setattr(routing, "ROUTE_MEMO_KEYS", 50)
    runner = LocalRunner(Count, 2)
    runner.process((f"few-{i}", 1) for i in range(50))
    runner.process((f"few-{i}", 1) for i in range(50))
    assert set(hashes.values()) == {1}  # at the limit: kept
    runner.process((f"many-{i}", 1) for i in range(60))  # 110 keys: dropped after the call
    runner.process((f"few-{i}", 1) for i in range(50))
    assert {hashes[f"few-{i}"] for i in range(50)} == {2}
    runner.close()


def test_an_unhashable_key_is_named_by_the_router() -> None:
    runner = LocalRunner(Count, 2)
    with pytest.raises(TypeError, match=r"\[1, 2\]"):
        runner.process([([1, 2], 1)])
    runner.close()


def test_the_output_follows_the_records_across_instances() -> None:
    runner = LocalRunner(Count, 3, max_parallelism=16)
    keys = [f"k{i}" for i in range(30)]
    runner.process((key, 1) for key in keys)  # first seen: hashed and logged on the way
    out = runner.process((key, 1) for key in reversed(keys))  # remembered: the memo's path
    assert [key for _, key, _ in out] == list(reversed(keys))
    assert len({index for index, _, _ in out}) == 3  # every instance had records
    runner.close()


class Raises(Count):
    """Count, and a TypeError of its own for the key "bad"."""

    def process(self, key: Any, value: int, context: RuntimeContext) -> list[Any]:
        if key == "bad":
            raise TypeError("the function's own error")
        return super().process(key, value, context)


def test_a_type_error_of_the_function_is_its_own() -> None:
    runner = LocalRunner(Raises, 2)
    with pytest.raises(TypeError, match=r"^the function's own error$"):
        runner.process([("a", 1), ("bad", 1)])
    assert [total for _, _, total in runner.process([("a", 1)])] == [2]  # "a" stood
    runner.close()


class AddsAHook(Count):
    """Count that adds a per-record hook at its second record (a state with TTL cleanup per
    record made in ``process`` does); the hook notes the current key when it runs."""

    def open(self, context: RuntimeContext) -> None:
        super().open(context)
        self.seen = 0
        self.hooked: list[Any] = []

    def process(self, key: Any, value: int, context: RuntimeContext) -> list[Any]:
        self.seen += 1
        if self.seen == 2:
            backend = context.keyed_state
            backend.add_record_hook(lambda: self.hooked.append(backend.current_key))
        return super().process(key, value, context)


def test_a_hook_added_in_a_call_runs_for_the_instances_following_records() -> None:
    runner = LocalRunner(AddsAHook, 2, max_parallelism=16)
    keys = [f"k{i}" for i in range(20)]
    runner.process((key, 0) for key in keys)  # each instance adds its hook at its second key
    for instance in runner.instances:
        own = [key for key in keys if runner.instance_for(key) is instance]
        function = instance.function
        assert isinstance(function, AddsAHook)
        assert function.hooked == own[2:]  # each of its later records, once, its key current
    runner.close()


def totals_after_a_restart(tmp_path: Path, keys: list[str]) -> dict[str, int]:
    """Each key's count restored from the last checkpoint at ``tmp_path`` (plus 0)."""
    runner = LocalRunner(Count, 2, checkpoint_uri=f"file://{tmp_path}")
    totals = {key: total for _, key, total in runner.process((key, 0) for key in keys)}
    runner.close()
    return totals


def test_a_change_log_drained_elsewhere_is_logged_again(tmp_path: Path) -> None:
    """A key's route is remembered only while its instance has it logged: after a drain that
    was not the runner's checkpoint, the next records log their keys again, so the next
    incremental checkpoint writes what they changed."""
    runner = LocalRunner(Count, 2, checkpoint_uri=f"file://{tmp_path}")
    keys = [f"user-{i}" for i in range(40)]
    runner.process((key, 1) for key in keys)
    runner.checkpoint()  # the base
    runner.process((key, 1) for key in keys)  # remembered and logged
    for instance in runner.instances:
        instance.keyed.drain_touched_keys()  # drained by someone else
    runner.process((key, 1) for key in keys)
    runner.checkpoint()  # incremental: the logged keys only
    runner.close()
    assert totals_after_a_restart(tmp_path, keys) == {key: 3 for key in keys}


def test_records_left_by_a_failed_call_are_logged_when_they_come_again(tmp_path: Path) -> None:
    """Spill counting takes the partitioned path, where every route is known before any record
    runs: when a function fails, the records after it never ran and their keys were never
    logged, so their routes are forgotten with it."""
    runner = LocalRunner(Raises, 2, checkpoint_uri=f"file://{tmp_path}", max_parallelism=16)
    keys = [f"user-{i}" for i in range(40)]
    runner.process((key, 1) for key in keys)
    runner.checkpoint()  # the base
    for instance in runner.instances:
        instance.keyed.count_hits([0] * 16)
    with pytest.raises(TypeError, match="own error"):  # "bad" comes first in its instance's part
        runner.process([("bad", 1)] + [(key, 1) for key in keys])
    failed = runner.instance_for("bad")  # instances run their parts in order: the ones before ran
    before = runner.instances[: runner.instances.index(failed)]
    never_ran = [key for key in keys if runner.instance_for(key) not in before]
    assert never_ran
    for instance in runner.instances:
        instance.keyed.count_hits(None)  # the one pass again
    runner.process((key, 1) for key in never_ran)
    runner.checkpoint()  # incremental: the logged keys only
    runner.close()
    assert totals_after_a_restart(tmp_path, keys) == {key: 2 for key in keys}
