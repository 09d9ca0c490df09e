"""statetier.backend.testing: the function harness runs a function as LocalRunner does, and shows
its output, state and timers; what a test may get wrong gets a clear error."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import fsspec
import pytest
from statetier.backend import (
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    RuntimeContext,
    StateTtlConfig,
    ValueStateDescriptor,
)
from statetier.backend.testing import FunctionHarness, ManualClock


class Reminders(KeyedProcessFunction[str, int, tuple[str, str, int]]):
    """Each record sets a processing-time reminder ``value`` ms from now and keeps a log."""

    def open(self, context: RuntimeContext) -> None:
        self.log = context.get_state(ListStateDescriptor[int]("log"))
        self.total = context.get_state(
            ReducingStateDescriptor[int]("total", reduce_function=lambda a, b: a + b)
        )
        self.tags = context.get_state(MapStateDescriptor("tags"))
        self.last = context.get_state(
            ValueStateDescriptor[int]("last", ttl=StateTtlConfig(ttl_ms=1_000))
        )

    def process(self, key: str, value: int, context: RuntimeContext) -> Iterable[Any]:
        now = context.timer_service.current_processing_time()
        context.timer_service.register_processing_time_timer(now + value)
        self.log.add(value)
        self.total.add(value)
        self.tags.put(f"t{value}", now)
        self.last.update(value)
        return [(key, "set", now + value)]

    def on_timer(self, timestamp: int, key: str, context: RuntimeContext) -> Iterable[Any]:
        return [(key, "fired", timestamp)]


def test_processing_time_moves_only_with_the_clock() -> None:
    with FunctionHarness(Reminders, start_ms=1_000) as harness:
        assert harness.process("a", 500) == [("a", "set", 1_500)]
        assert harness.process_all([("b", 200), ("a", 100)]) == [
            ("b", "set", 1_200),
            ("a", "set", 1_100),
        ]
        assert harness.processing_time_timers("a") == [1_100, 1_500]
        assert harness.event_time_timers("a") == []
        assert harness.advance_processing_time(199) == [("a", "fired", 1_100)]
        assert harness.advance_processing_time(1) == [("b", "fired", 1_200)]
        assert harness.processing_time_timers("a") == [1_500]
        assert harness.clock.now_ms() == 1_200
        assert len(harness.output) == 5


def test_state_reads_every_kind_as_the_function_does() -> None:
    with FunctionHarness(Reminders) as harness:
        harness.process_all([("a", 5), ("a", 7)])
        assert harness.state("log", "a") == [5, 7]
        assert harness.state("total", "a") == 12
        assert harness.state("tags", "a") == {"t5": 0, "t7": 0}
        assert harness.state("last", "a") == 7
        assert harness.state("log", "nobody") == []
        assert harness.state("last", "nobody") is None
        harness.clock.advance(1_000)  # the TTL of "last" runs out
        assert harness.state("last", "a") is None
        assert sorted(harness.keys("log")) == ["a"]


def test_state_of_an_unknown_name_is_a_clear_error() -> None:
    with FunctionHarness(Reminders) as harness, pytest.raises(KeyError, match="'logs'"):
        harness.state("logs", "a")


def test_context_scopes_handles_to_a_key() -> None:
    with FunctionHarness(Reminders) as harness:
        harness.process("a", 1)
        log = harness.context("b").get_state(ListStateDescriptor[int]("log"))
        log.add(42)
        assert harness.state("log", "b") == [42]
        assert harness.state("log", "a") == [1]


def test_restart_resumes_from_the_last_checkpoint_at_another_parallelism() -> None:
    harness = FunctionHarness(Reminders, parallelism=2)
    harness.process_all([(f"k{i}", 10) for i in range(20)])
    assert harness.checkpoint() == 1
    harness.process("k0", 99)  # not checkpointed: lost by the restart
    restarted = harness.restart(parallelism=3)
    try:
        assert restarted.runner.parallelism == 3
        assert sorted(restarted.keys("log")) == sorted(f"k{i}" for i in range(20))
        assert restarted.state("log", "k0") == [10]
        assert restarted.processing_time_timers("k0") == [10]
        assert restarted.clock is harness.clock
        fired = restarted.advance_processing_time(10)
        assert sorted(fired) == sorted((f"k{i}", "fired", 10) for i in range(20))
    finally:
        restarted.close()


def test_a_function_object_runs_as_one_instance_and_does_not_restart() -> None:
    function = Reminders()
    with FunctionHarness(function) as harness:
        harness.process("a", 1)
        assert harness.functions == [function]
        with pytest.raises(ValueError, match="cannot restart"):
            harness.restart()
    with pytest.raises(ValueError, match="runs as one instance"):
        FunctionHarness(Reminders(), parallelism=2)


def test_harnesses_share_a_clock_and_keep_their_checkpoints_apart() -> None:
    clock = ManualClock(5)
    with FunctionHarness(Reminders, clock=clock) as one, FunctionHarness(Reminders) as two:
        one.process("a", 1)
        one.checkpoint()
        assert one.clock is clock
        assert one.checkpoint_uri != two.checkpoint_uri
        assert two.keys("log") == []


def test_close_drops_only_the_in_memory_checkpoint_the_harness_made(tmp_path: Path) -> None:
    memory = fsspec.filesystem("memory")
    harness = FunctionHarness(Reminders)
    harness.process("a", 1)
    harness.checkpoint()
    root = harness.runner.store.root if harness.runner.store else ""
    assert memory.exists(root)
    restarted = harness.restart()  # takes the checkpoint over: still there
    assert memory.exists(root)
    assert restarted.state("log", "a") == [1]
    restarted.close()
    assert not memory.exists(root)

    given = f"file://{tmp_path}/ckpt"
    with FunctionHarness(Reminders, checkpoint_uri=given) as kept:
        kept.process("a", 1)
        kept.checkpoint()
    assert any((tmp_path / "ckpt").iterdir())
