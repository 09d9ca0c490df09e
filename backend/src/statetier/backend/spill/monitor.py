"""The memory monitor: is there pressure to spill, or room to load back, and why.

FLIP-50 watches the JVM heap and GC pauses; the Python equivalents are:

- **Budget**: ``memory.budget`` if set, else the container's limit (cgroup v2 ``memory.max``,
  cgroup v1 ``memory.limit_in_bytes``; "max" or the v1 "unlimited" value mean none), else the
  machine's physical memory.
- **Usage**: for a process's governor, the state's heap estimate, plus whatever the process's
  RSS passes budget + ``memory.runtime-allowance`` (the memory its runtime may take: interpreter,
  libraries, a batch's working memory). So the process stays within budget plus allowance, and
  a batch's working memory, which comes and goes, spills nothing. For a bare monitor (tests,
  tools): anonymous RSS less the allowance. Either way less a *credit* for memory freed by
  spills: CPython rarely returns freed memory to the OS (pymalloc keeps its arenas), so after a
  spill RSS stays flat although the memory is free for reuse; without the credit the monitor
  would keep spilling until nothing is left. A spill adds the heap bytes it freed to the credit,
  and the credit is used up as heap state grows back (new state reuses that memory first), by
  loads, and by any fall of RSS. File pages of the mmap'd chunks are not counted (page cache,
  not heap).
- **GC pauses**: generation-2 collections are timed through ``gc.callbacks`` (one process-wide
  tracker, whatever the number of backends). A full collection walks every tracked container,
  so its pause is about proportional to the heap state; each pause calibrates seconds per heap
  byte, which lets the monitor spill *before* the next pause would pass the threshold (once the
  predicted pause passes 80% of it), and size the spill so the predicted pause falls to 50% of
  it, instead of learning from one more long pause.

Hysteresis: spill above ``spill.threshold`` of the budget, load only below
``spill.load-threshold``, and a load brings usage at most to the middle of the two (and keeps
the predicted GC pause under the threshold), so a load never triggers the next spill.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import gc
import threading
import time
from collections.abc import Callable
from typing import Any

from statetier.backend.process_memory import read_rss
from statetier.backend.spill import metrics

__all__ = [
    "GcPauseTracker",
    "MemoryMonitor",
    "MonitorSettings",
    "Move",
    "Trigger",
    "Verdict",
]

# Spill when the predicted pause passes GC_EARLY of the threshold (the heap grows between two
# checks, so waiting for 100% lets the next pause pass it), down to GC_TARGET of it; loads stay
# under GC_TARGET too.
GC_EARLY = 0.8
GC_TARGET = 0.5


class GcPauseTracker:
    """Times generation-2 collections; one per process, shared by every monitor."""

    _instance: GcPauseTracker | None = None
    _users = 0
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.pauses: collections.deque[tuple[float, float]] = collections.deque(maxlen=100_000)
        self._started = 0.0

    @classmethod
    def acquire(cls) -> GcPauseTracker:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
                gc.callbacks.append(cls._instance._on_gc)
            cls._users += 1
            return cls._instance

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            cls._users -= 1
            if cls._users <= 0 and cls._instance is not None:
                gc.callbacks.remove(cls._instance._on_gc)
                cls._instance = None
                cls._users = 0

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Called on every collection of every generation: return at once unless it is a full one.
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            pause = time.perf_counter() - self._started
            self.pauses.append((time.monotonic(), pause))
            metrics.GC_PAUSE.observe(pause)

    def since(self, start: float) -> list[float]:
        return [pause for at, pause in self.pauses if at >= start]


@dataclasses.dataclass(frozen=True)
class MonitorSettings:
    budget: int
    budget_source: str
    spill_threshold: float = 0.5
    load_threshold: float = 0.3
    spill_ratio: float = 0.2
    gc_pause_threshold: float = 0.0
    gc_window: float = 60.0
    check_interval: float = 1.0
    # the runtime's own memory (interpreter, libraries, a batch's working memory), which the
    # budget does not cover
    allowance: int = 0
    # what counts against the budget: "rss" (the process's RSS less the allowance), or "state"
    # (the state's heap estimate, plus any RSS beyond budget + allowance: the process's bound)
    usage: str = "rss"


class Move(enum.Enum):
    """Which way key groups go."""

    SPILL = "spill"  # heap -> disk
    LOAD = "load"  # disk -> heap


class Trigger(enum.Enum):
    """Why key groups moved (a metric label and a log field; never parsed from text)."""

    MEMORY = "memory"  # usage above spill.threshold of the budget
    GC = "gc"  # gen-2 pauses (seen, or predicted) above spill.gc-pause-threshold
    LOAD_BACK = "load-back"  # usage below spill.load-threshold: hot key groups come back
    FORCED = "forced"  # a caller asked (tests, tools)
    CLOSE = "close"
    DISK_FULL = "disk-full"
    ERROR = "error"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the monitor found: ``action`` is a :class:`Move`, or None when nothing should move;
    ``amount`` is heap bytes to shed (spill) or that may come back (load); ``trigger`` is why,
    and ``reason`` the same in words for the spill log line (never parsed)."""

    action: Move | None
    reason: str
    amount: int = 0
    used: int = 0
    rss: int = 0
    trigger: Trigger = Trigger.MEMORY


def _mib(value: float) -> str:
    return f"{value / (1 << 20):.1f}MiB"


class MemoryMonitor:
    """Checks memory and GC pressure against the settings; see the module docstring."""

    def __init__(
        self,
        settings: MonitorSettings,
        *,
        rss: Callable[[], int] = read_rss,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._rss = rss
        self._clock = clock
        self.credit = 0  # heap bytes freed by spills that RSS still holds
        # what the runtime really takes: RSS less the state's heap estimate at the first check
        # that sees state (reported, to compare with the allowance)
        self.runtime = 0
        self._last_rss = rss()
        self._last_heap = 0
        self.tracker = GcPauseTracker.acquire()
        self._window_start = clock()  # pauses before this describe a heap that was spilled since
        self._next_check = 0.0
        self._seconds_per_byte = 0.0  # calibrated by each gen-2 pause
        self._heap_hint = 0  # heap state at the last check, to calibrate the pauses after it
        self._seen_pauses = len(self.tracker.pauses)
        self.closed = False
        metrics.MEMORY_BUDGET.set(settings.budget)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            GcPauseTracker.release()

    def due(self) -> bool:
        """Whether a check is due (the interval passed, or a full collection just happened)."""
        return self._clock() >= self._next_check or len(self.tracker.pauses) != self._seen_pauses

    def note_spill(self, heap_bytes: int) -> None:
        """``heap_bytes`` of heap state were spilled: free for reuse, though RSS keeps them."""
        self.credit += heap_bytes
        self._last_heap -= heap_bytes

    def note_load(self, heap_bytes: int) -> None:
        """``heap_bytes`` of state came back to heap, into memory the credit stood for."""
        self.credit = max(0, self.credit - heap_bytes)
        self._last_heap += heap_bytes

    def after_gc_spill(self) -> None:
        """Forget the pauses that led to a spill: they measured the heap before it."""
        self._window_start = self._clock()

    def assess(self, heap_state: int, spilled_state: int) -> Verdict:
        """One check: a spill, a load or nothing, given the heap and spilled state bytes."""
        s = self.settings
        now = self._clock()
        self._next_check = now + s.check_interval
        pauses = self.tracker.pauses
        if len(pauses) != self._seen_pauses:
            self._seen_pauses = len(pauses)
            if self._heap_hint > 0:
                self._seconds_per_byte = pauses[-1][1] / self._heap_hint
        self._heap_hint = heap_state
        rss = self._rss()
        metrics.PROCESS_RSS.set(rss)
        grown = max(0, heap_state - self._last_heap)
        credit = self.credit - max(0, self._last_rss - rss) - grown
        self.credit = max(0, credit)
        self._last_rss, self._last_heap = rss, heap_state
        if not self.runtime and heap_state > 0:
            self.runtime = rss - heap_state
            metrics.RUNTIME_MEMORY.set(self.runtime)
        used = rss - self.credit - s.allowance
        if s.usage == "state":
            # the state's own size, plus whatever RSS passes budget + allowance (the bound a
            # process must keep): working memory that comes and goes spills nothing
            used = heap_state + max(0, used - s.budget)
        if s.gc_pause_threshold > 0 and heap_state > 0:
            verdict = self._gc_verdict(now, heap_state, used, rss)
            if verdict is not None:
                return verdict
        spill_at = s.spill_threshold * s.budget
        if used > spill_at and heap_state > 0:
            amount = max(int(s.spill_ratio * heap_state), int(used - spill_at))
            return Verdict(
                Move.SPILL,
                f"{self._measure} {_mib(used)} > spill threshold {_mib(spill_at)} "
                f"({s.spill_threshold:.0%} of {_mib(s.budget)} budget from {s.budget_source}"
                f"{self._allowance_note()})",
                amount,
                used,
                rss,
                Trigger.MEMORY,
            )
        load_below = s.load_threshold * s.budget
        if used < load_below and spilled_state > 0:
            room = int((s.load_threshold + s.spill_threshold) / 2 * s.budget - used)
            if s.gc_pause_threshold > 0 and self._seconds_per_byte > 0:
                gc_room = GC_TARGET * s.gc_pause_threshold / self._seconds_per_byte - heap_state
                room = min(room, int(gc_room))
            if room > 0:
                return Verdict(
                    Move.LOAD,
                    f"{self._measure} {_mib(used)} < load threshold {_mib(load_below)} "
                    f"({s.load_threshold:.0%} of {_mib(s.budget)} budget)",
                    room,
                    used,
                    rss,
                    Trigger.LOAD_BACK,
                )
        return Verdict(None, "", 0, used, rss)

    @property
    def _measure(self) -> str:
        return "state" if self.settings.usage == "state" else "memory"

    def _allowance_note(self) -> str:
        allowance = self.settings.allowance
        return f"; runtime allowance {_mib(allowance)}" if allowance else ""

    def _gc_verdict(self, now: float, heap_state: int, used: int, rss: int) -> Verdict | None:
        s = self.settings
        threshold = s.gc_pause_threshold
        recent = [
            p for at, p in self.tracker.pauses if at >= max(self._window_start, now - s.gc_window)
        ]
        average = sum(recent) / len(recent) if recent else 0.0
        predicted = self._seconds_per_byte * heap_state
        if average <= threshold and predicted <= GC_EARLY * threshold:
            return None
        if self._seconds_per_byte > 0:
            target = GC_TARGET * threshold / self._seconds_per_byte
            amount = max(int(s.spill_ratio * heap_state), int(heap_state - target))
        else:
            amount = int(s.spill_ratio * heap_state)
        if average > threshold:
            why = (
                f"average gen-2 GC pause {average * 1000:.0f}ms over {len(recent)} collections"
                f" > threshold {threshold * 1000:.0f}ms"
            )
        else:  # acting before the pause happens: the trigger is a share of the threshold
            why = (
                f"predicted gen-2 GC pause {predicted * 1000:.0f}ms at {_mib(heap_state)} heap"
                f" > {GC_EARLY:.0%} of threshold {threshold * 1000:.0f}ms"
            )
        return Verdict(Move.SPILL, why, min(amount, heap_state), used, rss, Trigger.GC)
