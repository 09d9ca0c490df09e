"""The memory governor: one per process, as FLIP-50's heap monitor, over every backend it hosts.

A state host serves many key-group ranges in one process, and memory pressure is the process's:
its RSS against its budget, its gen-2 GC pauses. So there is one governor per process (per
distinct spill configuration, in practice one): one :class:`MemoryMonitor`, one
:class:`SpillStorage` over the spill dirs, and one ranking of the key groups of *all* registered
backends by size and request rate. Each backend's :class:`SpillManager` only carries out the
moves the governor chose for its key groups, and keeps the accounting of its own key groups.

Threads. A backend is used by one thread at a time, which holds its ``in_use`` lock (the state
host holds it while a task processes or snapshots the range). A check runs on the thread of the
backend whose record made it due; it refreshes and moves that backend's key groups directly, and
those of every other backend whose lock it can take without waiting (an idle range: the cold
state spilling is for). A busy backend gets its moves posted instead; it carries them out at its
next record check, between records, on its own thread. Nothing ever touches a map in use.

Decisions carry a typed :class:`Trigger` (memory, GC, load-back), not text to parse.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from typing import ClassVar, Protocol

from statetier.backend.config import StatetierConfig
from statetier.backend.process_memory import resolve_budget
from statetier.backend.spill.accounting import KeyGroupAccounting
from statetier.backend.spill.decision import Choice, Decision, Order
from statetier.backend.spill.monitor import (
    MemoryMonitor,
    MonitorSettings,
    Move,
    Trigger,
)
from statetier.backend.spill.policy import Candidate, choose_load, choose_spill
from statetier.backend.spill.storage import SpillStorage, default_spill_dirs

__all__ = ["MemoryGovernor", "Member", "Trigger"]


class Member(Protocol):
    """What the governor asks of a member, a backend's spill manager
    (:class:`statetier.backend.spill.manager.SpillManager`, which registers itself): a protocol,
    so that the governor sits below the managers it ranks and moves."""

    in_use: threading.RLock
    accounting: KeyGroupAccounting

    def prepare_check(self) -> None: ...

    def pending_heap(self) -> int: ...

    def candidates(self, spill: bool, owner: int) -> list[Candidate]: ...

    def move(self, order: Order) -> Decision | None: ...

    def post(self, order: Order) -> None: ...


class MemoryGovernor:
    """Ranks and moves the key groups of every registered spill manager (:class:`Member`)."""

    def __init__(
        self,
        storage: SpillStorage,
        monitor: MemoryMonitor | None,
        *,
        size_weight: float = 0.5,
        key: tuple[object, ...] | None = None,
    ) -> None:
        self.storage = storage
        self.monitor = monitor
        self.size_weight = size_weight
        self.managers: list[Member] = []
        self._check = threading.Lock()
        self._members = threading.Lock()
        self._key = key
        self.closed = False

    # ------------------------------------------------------------------ one per process

    _shared: ClassVar[dict[tuple[object, ...], MemoryGovernor]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def for_config(cls, config: StatetierConfig) -> MemoryGovernor:
        """The process's governor for these spill settings (made on first use)."""
        dirs = tuple(config.spill_dirs) or tuple(default_spill_dirs())
        budget, source = resolve_budget(config.memory_budget)
        settings = MonitorSettings(
            budget=budget,
            budget_source=source,
            spill_threshold=config.spill_threshold,
            load_threshold=config.spill_load_threshold,
            spill_ratio=config.spill_ratio,
            gc_pause_threshold=config.spill_gc_pause_threshold,
            gc_window=config.spill_gc_window,
            check_interval=config.spill_check_interval,
        )
        key = (dirs, config.spill_chunk_size, settings, config.spill_size_weight)
        with cls._shared_lock:
            governor = cls._shared.get(key)
            if governor is None or governor.closed:
                settings = dataclasses.replace(
                    settings, allowance=config.memory_runtime_allowance, usage="state"
                )
                governor = cls(
                    SpillStorage(list(dirs), config.spill_chunk_size),
                    MemoryMonitor(settings),
                    size_weight=config.spill_size_weight,
                    key=key,
                )
                cls._shared[key] = governor
            return governor

    # ------------------------------------------------------------------ members

    def register(self, manager: Member) -> None:
        with self._members:
            self.managers.append(manager)

    def unregister(self, manager: Member) -> None:
        """A backend leaves (its range moved away or closed): its share of the accounting goes
        with it; the last one out closes the storage and the monitor."""
        with self._members:
            if manager in self.managers:
                self.managers.remove(manager)
            last = not self.managers
        if last:
            self.close()

    def close(self) -> None:
        with self._shared_lock:
            if self.closed:
                return
            self.closed = True
            if self._key is not None and self._shared.get(self._key) is self:
                del self._shared[self._key]
        if self.monitor is not None:
            self.monitor.close()
        self.storage.close()

    def due(self) -> bool:
        return self.monitor is not None and self.monitor.due()

    # ------------------------------------------------------------------ the check

    def check(self, caller: Member, *, wait: bool = False) -> list[Decision]:
        """One check of the whole process, from ``caller``'s thread (which holds its backend).
        Skipped when another thread's check is running, unless ``wait``: then it runs after it
        (a check that must see the caller's latest state, see SpillManager.settle)."""
        if self.monitor is None or not self._check.acquire(blocking=wait):
            return []
        try:
            with self._members:
                managers = list(self.managers)
            with self._hold(managers, caller) as held:
                return self._decide(managers, held, caller)
        finally:
            self._check.release()

    @contextlib.contextmanager
    def _hold(self, managers: list[Member], caller: Member) -> Iterator[set[int]]:
        """The managers this check may move now (by position): the caller and the idle ones."""
        taken: list[Member] = []
        held = set()
        try:
            for i, manager in enumerate(managers):
                if manager is caller:
                    held.add(i)
                elif manager.in_use.acquire(blocking=False):
                    taken.append(manager)
                    held.add(i)
            for i in held:
                managers[i].prepare_check()
            yield held
        finally:
            for manager in taken:
                manager.in_use.release()

    def _decide(self, managers: list[Member], held: set[int], caller: Member) -> list[Decision]:
        assert self.monitor is not None
        heap = sum(m.accounting.total_heap() - m.pending_heap() for m in managers)
        spilled = sum(m.accounting.total_spilled() for m in managers)
        verdict = self.monitor.assess(max(0, heap), spilled)
        if verdict.action is None:
            return []
        spill = verdict.action is Move.SPILL
        candidates = [(i, c) for i, m in enumerate(managers) for c in m.candidates(spill, owner=i)]
        plain = [c for _, c in candidates]
        chosen = (
            choose_spill(plain, verdict.amount, self.size_weight)
            if spill
            else choose_load(plain, verdict.amount, self.size_weight)
        )
        by_owner: dict[int, Choice] = {}
        for candidate, score in chosen:
            by_owner.setdefault(candidate.owner, []).append((candidate, score))
        decisions = []
        for i, choice in by_owner.items():
            order = Order(verdict.action, verdict.trigger, verdict.reason, choice)
            if i in held:
                decision = managers[i].move(order)
                if decision is not None:
                    decisions.append(decision)
            else:
                managers[i].post(order)
        if spill and verdict.trigger is Trigger.GC:
            self.monitor.after_gc_spill()
        self.storage.compact()
        # the caller's own move first: SpillManager.check returns it
        decisions.sort(key=lambda d: d.manager is not caller)
        return decisions
