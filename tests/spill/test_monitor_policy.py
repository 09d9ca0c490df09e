"""The memory monitor, the spill/load policy and the manager's automatic, visible decisions."""

from __future__ import annotations

import gc
import logging
import mmap
import os
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from statetier.backend.config import load_config
from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import KeyGroupRange, assign_to_key_group
from statetier.backend.process_memory import read_rss, resolve_budget
from statetier.backend.runtime import FunctionInstance
from statetier.backend.spill import MemoryMonitor, MonitorSettings, SpillManager, SpillStorage
from statetier.backend.spill.metrics import METRIC_NAMES
from statetier.backend.spill.monitor import GcPauseTracker, Move
from statetier.backend.spill.policy import Candidate, choose_load, choose_spill
from statetier.tools.wordcount import WordCount

MiB = 1 << 20


# ----------------------------------------------------------------------------- budget


def test_budget_comes_from_config_then_cgroup_v2_then_v1_then_physical(tmp_path: Path) -> None:
    assert resolve_budget(512 * MiB, str(tmp_path)) == (512 * MiB, "memory.budget")
    (tmp_path / "memory").mkdir()
    v1 = tmp_path / "memory" / "memory.limit_in_bytes"
    v1.write_text("9223372036854771712\n")  # v1 "unlimited", as on this machine
    budget, source = resolve_budget(0, str(tmp_path))
    assert source == "physical memory"
    assert budget == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    v1.write_text(str(2 << 30))
    assert resolve_budget(0, str(tmp_path)) == (2 << 30, "cgroup v1 memory.limit_in_bytes")
    (tmp_path / "memory.max").write_text("max\n")
    assert resolve_budget(0, str(tmp_path))[1] == "cgroup v1 memory.limit_in_bytes"
    (tmp_path / "memory.max").write_text(str(3 << 30))
    assert resolve_budget(0, str(tmp_path)) == (3 << 30, "cgroup v2 memory.max")


def test_rss_is_read_from_the_process() -> None:
    before = read_rss()
    # fresh private anonymous pages (not heap an earlier test freed, not shared: RssShmem)
    block = mmap.mmap(-1, 64 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for offset in range(0, len(block), 4096):
        block[offset] = 1  # touch every page
    deadline = time.monotonic() + 5
    while read_rss() < before + 48 * MiB and time.monotonic() < deadline:
        time.sleep(0.05)  # the kernel folds its per-CPU RSS counts into /proc lazily
    assert read_rss() >= before + 48 * MiB
    block.close()


# ----------------------------------------------------------------------------- monitor


class FakeRss:
    """The process's RSS as the test says (the OS boundary)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __call__(self) -> int:
        return self.value


def _monitor(rss: FakeRss, **overrides: Any) -> MemoryMonitor:
    settings = MonitorSettings(budget=1000 * MiB, budget_source="test", **overrides)
    return MemoryMonitor(settings, rss=rss)


def test_spill_above_threshold_load_below_lower_one_with_hysteresis() -> None:
    rss = FakeRss(400 * MiB)
    monitor = _monitor(rss)
    assert monitor.assess(100 * MiB, 0).action is None
    rss.value = 600 * MiB  # above 50% of the budget
    verdict = monitor.assess(300 * MiB, 0)
    assert verdict.action is Move.SPILL
    assert "memory 600.0MiB > spill threshold 500.0MiB" in verdict.reason
    assert verdict.amount >= 100 * MiB  # back under the threshold, at least spill.ratio
    # the spill freed 200 MiB of heap, but CPython keeps the memory: RSS does not move
    monitor.note_spill(200 * MiB)
    after = monitor.assess(100 * MiB, 50 * MiB)
    assert after.used == 400 * MiB and after.action is None  # no thrash, no load either
    rss.value = 250 * MiB  # the process shrank for real
    load = monitor.assess(20 * MiB, 50 * MiB)
    assert load.action is Move.LOAD
    # a load fills at most up to the middle of the two thresholds
    assert load.amount <= 400 * MiB - load.used
    monitor.close()


def test_gc_pauses_trigger_a_spill_sized_to_bring_the_pause_under_the_threshold() -> None:
    rss = FakeRss(100 * MiB)
    monitor = _monitor(rss, gc_pause_threshold=0.1, gc_window=60.0)
    assert monitor.assess(200 * MiB, 0).action is None
    # a real gen-2 collection, as the tracker sees it; then pretend it took 250 ms
    gc.collect()
    at, _ = monitor.tracker.pauses[-1]
    monitor.tracker.pauses[-1] = (at, 0.25)
    verdict = monitor.assess(200 * MiB, 0)
    assert verdict.action is Move.SPILL
    assert "average gen-2 GC pause 250ms" in verdict.reason
    # pause ~ heap: 250 ms at 200 MiB -> 50 ms needs <= 40 MiB left, so >= 160 MiB goes
    assert verdict.amount >= 160 * MiB
    monitor.after_gc_spill()
    monitor.note_spill(verdict.amount)
    # after the spill the old pauses no longer count, and the prediction is under the threshold
    assert monitor.assess(200 * MiB - verdict.amount, verdict.amount).action is None
    # the heap grows back: the calibrated prediction asks for a spill before the next pause
    # (at 70 MiB the predicted pause is 87 ms: past 80% of the threshold)
    predicted = monitor.assess(70 * MiB, verdict.amount)
    assert predicted.action is Move.SPILL and "predicted gen-2 GC pause" in predicted.reason
    monitor.close()


def test_the_gc_tracker_is_shared_and_removed_with_its_last_user() -> None:
    first = GcPauseTracker.acquire()
    second = GcPauseTracker.acquire()
    assert first is second and gc.callbacks.count(first._on_gc) == 1
    GcPauseTracker.release()
    GcPauseTracker.release()
    assert first._on_gc not in gc.callbacks


# ----------------------------------------------------------------------------- policy


def test_spill_large_cold_first_load_small_hot_first() -> None:
    candidates = [
        Candidate(0, size=100, rate=1000.0),  # large, hot
        Candidate(1, size=100, rate=1.0),  # large, cold
        Candidate(2, size=10, rate=1.0),  # small, cold
        Candidate(3, size=10, rate=1000.0),  # small, hot
        Candidate(4, size=0, rate=0.0),  # empty: spilling frees nothing
    ]
    spilled = [c.key_group for c, _ in choose_spill(candidates, 150, 0.5)]
    assert spilled[0] == 1 and 4 not in spilled
    assert spilled[:2] == [1, 0] or spilled[:2] == [1, 2]
    loaded = [c.key_group for c, _ in choose_load(candidates[:4], 115, 0.5)]
    assert loaded[0] == 3 and sum(candidates[k].size for k in loaded) <= 115
    # size weight 1: only size counts; 0: only the rate
    assert [c.key_group for c, _ in choose_spill(candidates, 1, 1.0)] == [0]
    assert [c.key_group for c, _ in choose_spill(candidates, 1, 0.0)] == [1]


# ----------------------------------------------------------------------------- manager


def _words_backend() -> KeyedStateBackend:
    backend = KeyedStateBackend(KeyGroupRange.of(32), 32)
    count = backend.get_state(ValueStateDescriptor[int]("count"))
    for n in range(3000):
        backend.set_current_key(f"w{n}")
        count.update(n)
    return backend


def test_pressure_spills_cold_key_groups_visibly_then_loads_them_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = _words_backend()
    rss = FakeRss(100 * MiB)
    monitor = MemoryMonitor(
        MonitorSettings(budget=1000 * MiB, budget_source="test", check_interval=0.01), rss=rss
    )
    manager = SpillManager(backend, SpillStorage([str(tmp_path)], 1 << 20), monitor)
    hot = assign_to_key_group("w7", 32)
    count = backend.get_state(ValueStateDescriptor[int]("count"))
    for _ in range(5000):  # w7's key group is the hot one
        backend.set_current_key("w7")
        count.value()
    spills_before = REGISTRY.get_sample_value(
        "statetier_key_group_spills_total", {"reason": "memory"}
    )
    manager.refresh_accounting()
    heap = manager.accounting.total_heap()
    rss.value = 500 * MiB + heap * 3 // 10  # 30% of the state over the spill threshold
    with caplog.at_level(logging.INFO, logger="statetier.spill"):
        decision = manager.check()
    assert decision is not None and decision.action is Move.SPILL
    assert hot not in decision.key_groups
    assert manager.spilled_key_groups() == sorted(decision.key_groups)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("spill:"))
    assert f"spill {len(decision.key_groups)} key groups heap -> disk" in line
    assert "because memory" in line and "> spill threshold 500.0MiB" in line
    assert 0.3 * heap <= decision.heap_bytes < 0.6 * heap
    assert f"disk={len(decision.key_groups)}" in line
    after = REGISTRY.get_sample_value("statetier_key_group_spills_total", {"reason": "memory"})
    assert after == (spills_before or 0) + len(decision.key_groups)
    assert (REGISTRY.get_sample_value("statetier_key_groups", {"tier": "disk"}) or 0) >= len(
        decision.key_groups
    )
    for n in range(3000):  # every value still there, read through the handles
        backend.set_current_key(f"w{n}")
        assert count.value() == n
    rss.value = 100 * MiB
    loaded = manager.check()
    assert loaded is not None and loaded.action is Move.LOAD and loaded.key_groups
    assert set(loaded.key_groups) <= set(decision.key_groups)
    manager.close()
    assert backend.set_current_key.__func__ is KeyedStateBackend.set_current_key  # type: ignore[attr-defined]


def test_operator_instance_runs_with_spilling_on(tmp_path: Path) -> None:
    config = load_config(
        {"spill.enabled": True, "spill.dirs": str(tmp_path), "memory.budget": "16g"}, env={}
    )
    instance = FunctionInstance(WordCount, 0, 1, 32, config=config)
    assert instance.spill is not None
    words = [f"w{n % 500}" for n in range(5000)]
    instance.process((w, 1) for w in words[:2500])
    for key_group in range(0, 32, 2):
        assert instance.spill.spill_key_group(key_group)
    instance.process((w, 1) for w in words[2500:])
    count = instance.keyed.get_state(ValueStateDescriptor[int]("count"))
    for n in range(500):
        instance.keyed.set_current_key(f"w{n}")
        assert count.value() == 10
    assert any(p.name.endswith(".chunk") for p in tmp_path.iterdir())
    instance.close()
    assert not any(p.name.endswith(".chunk") for p in tmp_path.iterdir())


def test_metric_names_are_exported() -> None:
    exported = {m.name for m in REGISTRY.collect()}
    for name in METRIC_NAMES:
        base = name.removesuffix("_total")
        assert base in exported, name
        assert name.startswith("statetier_")


def test_the_runtime_allowance_is_memory_the_budget_does_not_cover() -> None:
    """The budget is for state: the process may hold budget + allowance (its runtime beside the
    state, measured by the governor when it starts)."""
    rss = FakeRss(700 * MiB)
    monitor = _monitor(rss, allowance=600 * MiB)
    assert monitor.assess(100 * MiB, 0).action is None  # 100 MiB of state: under 50% of 1000
    rss.value = 1200 * MiB
    verdict = monitor.assess(600 * MiB, 0)
    assert verdict.action is Move.SPILL and verdict.used == 600 * MiB
    assert "runtime allowance 600.0MiB" in verdict.reason
