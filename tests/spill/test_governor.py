"""One memory governor per process: it weighs the key groups of every backend it hosts.

The RSS is the test's (the OS boundary); backends, managers, storage, policy and moves are real.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import assign_to_key_group, key_group_range_for_instance
from statetier.backend.spill import SpillManager, SpillStorage
from statetier.backend.spill.governor import MemoryGovernor
from statetier.backend.spill.monitor import MemoryMonitor, MonitorSettings, Trigger

from tests.spill.test_monitor_policy import FakeRss

REPO = Path(__file__).parents[2]
MiB = 1 << 20
MAX_PARALLELISM = 64
COUNT = ValueStateDescriptor[int]("count")


def ranges(governor: MemoryGovernor, n: int) -> list[tuple[KeyedStateBackend, SpillManager]]:
    """``n`` backends of one pipeline (ranges 0..n-1), each managed under ``governor``."""
    out = []
    for index in range(n):
        kgs = key_group_range_for_instance(MAX_PARALLELISM, n, index)
        backend = KeyedStateBackend(kgs, MAX_PARALLELISM)
        out.append((backend, SpillManager(backend, governor=governor)))
    return out


def kg_of(key: str) -> int:
    return assign_to_key_group(key, MAX_PARALLELISM)


def fill(backend: KeyedStateBackend, keys: int, prefix: str) -> None:
    count = backend.get_state(COUNT)
    for n in range(keys):
        key = f"{prefix}{n}"
        if kg_of(key) in backend.key_groups:
            backend.set_current_key(key)
            count.update(n)


def governor_with(tmp_path: Path, rss: FakeRss) -> MemoryGovernor:
    monitor = MemoryMonitor(
        MonitorSettings(budget=1000 * MiB, budget_source="test", check_interval=0.0), rss=rss
    )
    return MemoryGovernor(SpillStorage([str(tmp_path)], 1 << 20), monitor)


def test_one_check_ranks_the_key_groups_of_every_range_by_coldness(tmp_path: Path) -> None:
    rss = FakeRss(100 * MiB)
    governor = governor_with(tmp_path, rss)
    hosted = ranges(governor, 8)
    for backend, _ in hosted:
        fill(backend, 4000, "w")
    # the first half of every range's key groups is read a lot: those must stay on heap
    hot: set[tuple[int, int]] = set()
    for i, (backend, _) in enumerate(hosted):
        count = backend.get_state(COUNT)
        kgs = list(backend.key_groups)[: len(backend.key_groups) // 2]
        for n in range(4000):
            key = f"w{n}"
            if kg_of(key) in kgs:
                hot.add((i, kg_of(key)))
                for _ in range(20):
                    backend.set_current_key(key)
                    count.value()
    managers = [m for _, m in hosted]
    for manager in managers:
        manager.refresh_accounting()
    heap = sum(m.accounting.total_heap() for m in managers)
    rss.value = 500 * MiB + heap // 2  # half the state over the spill threshold
    decision = managers[0].check()
    assert decision is not None and decision.trigger is Trigger.MEMORY
    spilled = {(i, kg) for i, m in enumerate(managers) for kg in m.spilled_key_groups()}
    assert {i for i, _ in spilled} == set(range(8))  # from every range, not the caller's only
    assert not spilled & hot  # the cold ones, across ranges
    freed = sum(d.heap_bytes for m in managers for d in m.decisions)
    assert heap // 2 <= freed < heap  # one check covered the whole process's excess
    for i, (backend, _) in enumerate(hosted):  # nothing lost
        count = backend.get_state(COUNT)
        for n in range(4000):
            if kg_of(f"w{n}") in backend.key_groups:
                backend.set_current_key(f"w{n}")
                assert count.value() == n, (i, n)
    for manager in managers:
        manager.close(load_back=False)
    assert governor.closed and not list(tmp_path.iterdir())  # the last one out cleaned up


def test_a_busy_range_carries_out_its_moves_on_its_own_thread(tmp_path: Path) -> None:
    rss = FakeRss(100 * MiB)
    governor = governor_with(tmp_path, rss)
    (idle, idle_manager), (busy, busy_manager) = ranges(governor, 2)
    fill(idle, 3000, "w")
    fill(busy, 3000, "w")
    holding, release = threading.Event(), threading.Event()

    def use_busy() -> None:  # a task processing the busy range
        with busy_manager.in_use:
            holding.set()
            release.wait(10)

    task = threading.Thread(target=use_busy)
    task.start()
    holding.wait(10)
    for manager in (idle_manager, busy_manager):
        manager.refresh_accounting()
    total = idle_manager.accounting.total_heap() + busy_manager.accounting.total_heap()
    rss.value = 500 * MiB + total * 9 // 10  # everything must go
    governor.check(idle_manager)
    assert idle_manager.spilled_key_groups()  # moved at once: its caller holds it
    assert not busy_manager.spilled_key_groups()  # never touched while in use ...
    assert busy_manager.pending_heap() > 0  # ... its share is posted
    release.set()
    task.join()
    with busy_manager.in_use:  # its next record check, on its own thread
        busy_manager.poll()
    assert busy_manager.spilled_key_groups()
    assert busy_manager.pending_heap() == 0
    for manager in (idle_manager, busy_manager):
        manager.close(load_back=False)


def test_settle_checks_even_when_no_check_is_due_and_waits_for_a_running_one(
    tmp_path: Path,
) -> None:
    """A Spark host settles each range after its snapshot: the whole process is checked then,
    whether a check is due or not (the checks at polls may all have come before the epoch's
    last records), and after a check another thread is running, not instead of it."""
    rss = FakeRss(100 * MiB)
    monitor = MemoryMonitor(
        MonitorSettings(budget=1000 * MiB, budget_source="test", check_interval=3600.0), rss=rss
    )
    governor = MemoryGovernor(SpillStorage([str(tmp_path)], 1 << 20), monitor)
    (first, first_manager), (second, second_manager) = ranges(governor, 2)
    fill(first, 3000, "w")
    first_manager.poll()  # the first check: the next is due in an hour
    fill(second, 3000, "w")
    for manager in (first_manager, second_manager):
        manager.refresh_accounting()
    total = first_manager.accounting.total_heap() + second_manager.accounting.total_heap()
    rss.value = 500 * MiB + total * 9 // 10
    second_manager.poll()
    assert not governor.due() and not second_manager.spilled_key_groups()
    governor._check.acquire()  # another thread's check is running
    settled = threading.Thread(target=second_manager.settle)
    settled.start()
    settled.join(0.3)
    assert settled.is_alive()  # waits for it ...
    governor._check.release()
    settled.join(10)
    assert second_manager.spilled_key_groups()  # ... then checks, though none was due
    for manager in (first_manager, second_manager):
        manager.close(load_back=False)


def test_a_range_that_leaves_frees_its_spill_space_and_its_share(tmp_path: Path) -> None:
    governor = governor_with(tmp_path, FakeRss(100 * MiB))
    (first, first_manager), (second, second_manager) = ranges(governor, 2)
    fill(first, 2000, "w")
    fill(second, 2000, "w")
    for kg in first.key_groups:
        first_manager.spill_key_group(kg)
    for kg in second.key_groups:
        second_manager.spill_key_group(kg)
    used = governor.storage.used_bytes()
    first_manager.close(load_back=False)
    assert governor.managers == [second_manager]
    assert governor.storage.used_bytes() < used * 3 // 4  # the first range's regions are free
    assert not governor.closed
    second_manager.close(load_back=False)
    assert governor.closed


def test_the_process_has_one_governor_per_spill_configuration(tmp_path: Path) -> None:
    from statetier.backend.config import load_config

    config = load_config({"spill.enabled": True, "spill.dirs": str(tmp_path)}, env={})
    a = KeyedStateBackend(key_group_range_for_instance(64, 2, 0), 64)
    b = KeyedStateBackend(key_group_range_for_instance(64, 2, 1), 64)
    first, second = SpillManager.from_config(a, config), SpillManager.from_config(b, config)
    assert first.governor is second.governor
    assert first.storage is second.storage and first.monitor is second.monitor
    first.close()
    second.close()
    third = SpillManager.from_config(a, config)
    assert third.governor is not first.governor  # the old one closed with its last member
    third.close()


def test_eight_ranges_in_one_process_spill_the_coldest_and_stay_within_budget(
    tmp_path: Path,
) -> None:
    """The acceptance case: eight ranges (LocalRunner, parallelism 8), one governor, a budget
    about half the state's size, a checkpoint per epoch; real RSS, real spill files."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.spill.eight_ranges", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["governors"] == 1
    assert r["budget"] <= 0.6 * r["state_bytes"]  # the state is about twice the budget
    assert r["spilled_ranges"] == list(range(8))  # cold key groups of every range went
    assert 0 < r["spilled_key_groups"] < r["key_groups"]  # ... and the hottest stayed
    assert statistics.median(r["spilled_hits"]) * 2 < statistics.median(r["heap_hits"])
    # within budget plus the runtime's own memory, as measured (stricter than the allowance)
    assert r["peak_rss"] <= r["runtime"] + r["budget"]
    assert r["exact"]


def test_only_the_runtime_starts_the_metrics_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator instance (or its spill manager) is made for every range a process owns and
    starts no server; the runtime that drives the process (here LocalRunner) starts it once."""
    from statetier.backend import metrics as backend_metrics
    from statetier.backend.config import load_config
    from statetier.backend.local_runner import LocalRunner
    from statetier.backend.runtime import FunctionInstance
    from statetier.tools.wordcount import WordCount

    started: list[int] = []
    monkeypatch.setattr(backend_metrics, "_served", [])  # as in a fresh process
    monkeypatch.setattr(backend_metrics, "start_http_server", started.append)
    port = 19090  # never bound: prometheus-client's server is replaced by a recorder
    config = load_config(
        {"metrics.port": port, "spill.enabled": True, "spill.dirs": str(tmp_path)}, env={}
    )
    instance = FunctionInstance(WordCount, 0, 1, 16, config=config)
    instance.close()
    assert started == []
    runner = LocalRunner(WordCount, 2, config=config)
    runner.close()
    assert started == [port]  # the real endpoint is scraped in tests/packaging
