"""The LocalRunner's routing: each record to the instance that owns its key group, a key hashed
once between checkpoints (the route memo), the memo dropped at a checkpoint and when large."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
from statetier.backend import local_runner
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

    monkeypatch.setattr(local_runner, "assign_str_to_key_group", counting)
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
    monkeypatch.setattr(local_runner, "ROUTE_MEMO_KEYS", 50)
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
