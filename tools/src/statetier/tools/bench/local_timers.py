"""The per-record sessions of ``statetier bench timers`` on the LocalRunner, in CPU per record.

The Spark figures of ``bench timers`` are wall times of two engines on shared cores; this one
isolates statetier's own per-record path with timers: ``spark_functions.Sessions`` (a state read,
a timer deleted and one registered per click) on a :class:`LocalRunner` of ``parallelism``
instances in this process, the clicks in time order cut into ``epochs`` epochs, each epoch's
watermark the last click of the epoch before (as Spark's with a 0 s delay), timers due at it
fired first, then the epoch's clicks, then the timers they set at or before it. No checkpoint
is taken: what is measured is the function, the runner's routing and the timer service.

The figure is CPU time of this process (``time.process_time``) per click, which other processes
on the machine do not inflate as they do wall time; the sessions are checked against the same
oracle as the Spark pipelines'.

CPU time still moves with the load (caches and cores are shared): on one machine the same code
measured 5.5 to 10 us per click on consecutive runs. So each round also runs a peer, the *floor*
(:func:`floor_sessions`): the same sessions hand-written as a user would without a framework, a
dict of sessions and a heap of timers with nothing else, alternated with statetier's rounds. The
ratio of the two medians is what a busy machine moves least, and says what the framework costs
over Python's own work (on an idle machine, 3.16 us for the floor against 6.18 for statetier on
2026-11-30, and 2.74 against 4.19 on 2026-12-02: docs/benchmarks.md).
"""

from __future__ import annotations

import gc
import heapq
import statistics
import time
from dataclasses import dataclass
from typing import Any

from statetier.backend.local_runner import LocalRunner
from statetier.backend.timers import MIN_WATERMARK
from statetier.tools.bench.spark_functions import SESSION_GAP_MS, Sessions

Click = tuple[str, int]


@dataclass(frozen=True)
class LocalRun:
    """One run: CPU and wall seconds over ``records`` clicks, and the sessions it emitted."""

    records: int
    cpu_seconds: float
    wall_seconds: float
    sessions: list[Any]

    @property
    def cpu_us_per_record(self) -> float:
        return self.cpu_seconds * 1e6 / self.records

    @property
    def records_per_s(self) -> float:
        return self.records / self.wall_seconds


def epochs_of(data: list[Click], epochs: int) -> list[list[Click]]:
    """``data`` cut into ``epochs`` consecutive parts of (nearly) equal size."""
    size = -(-len(data) // epochs)
    return [data[i : i + size] for i in range(0, len(data), size)]


def run_sessions(parts: list[list[Click]], parallelism: int = 2) -> LocalRun:
    """Sessionize ``parts`` (one epoch each) with the per-record ``Sessions`` on a LocalRunner;
    the last watermark is the last click, as in the Spark pipelines."""
    gc.collect()  # the previous run's garbage is not this one's
    runner = LocalRunner(Sessions, parallelism)
    out: list[Any] = []
    watermark, now = MIN_WATERMARK, 0  # processing time is fixed: no processing-time timers
    wall, cpu = time.perf_counter(), time.process_time()
    for part in parts:
        out += runner.advance_time(watermark, now)
        out += runner.process(part)
        out += runner.advance_time(None, now)
        watermark = part[-1][1]
    out += runner.advance_time(watermark, now)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    runner.close()
    records = sum(len(part) for part in parts)
    return LocalRun(records, cpu, wall, out)


def floor_sessions(parts: list[list[Click]]) -> LocalRun:
    """The sessions of :func:`run_sessions` without statetier: a dict of open sessions and a
    heap of ``(timestamp, user)`` timers, where a timer is stale (and skipped when it comes up)
    unless it is its user's session end plus the gap. The same epochs, watermarks and output;
    what Python itself costs for this work."""
    gc.collect()
    sessions: dict[str, list[int]] = {}
    timers: list[tuple[int, str]] = []
    out: list[Any] = []

    def fire(watermark: int) -> None:
        while timers and timers[0][0] <= watermark:
            timestamp, user = heapq.heappop(timers)
            session = sessions.get(user)
            if session is not None and session[1] + SESSION_GAP_MS == timestamp:
                del sessions[user]
                out.append((user, *session))

    watermark = MIN_WATERMARK
    wall, cpu = time.perf_counter(), time.process_time()
    for part in parts:
        fire(watermark)
        for user, value in part:
            session = sessions.get(user)
            if session is not None and value - session[1] >= SESSION_GAP_MS:
                out.append((user, *session))
                session = None
            start, end, clicks = session or (value, value, 0)
            sessions[user] = [min(start, value), max(end, value), clicks + 1]
            heapq.heappush(timers, (max(end, value) + SESSION_GAP_MS, user))
        fire(watermark)
        watermark = part[-1][1]
    fire(watermark)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return LocalRun(sum(len(part) for part in parts), cpu, wall, out)


def median_runs(parts: list[list[Click]], rounds: int, parallelism: int = 2) -> dict[str, Any]:
    """``rounds`` runs of :func:`run_sessions`, each after a run of :func:`floor_sessions`: the
    median CPU microseconds per record of both and their ratio, statetier's records/s, each
    round's figures, and the sessions of statetier's last run and the floor's (for the
    exactness check)."""
    runs, floors = [], []
    for _ in range(rounds):
        floors.append(floor_sessions(parts))
        runs.append(run_sessions(parts, parallelism))
    cpu = [r.cpu_us_per_record for r in runs]
    floor_cpu = statistics.median(r.cpu_us_per_record for r in floors)
    rates = [r.records_per_s for r in runs]
    return {
        "records": runs[0].records,
        "epochs": len(parts),
        "parallelism": parallelism,
        "rounds": rounds,
        "cpu_us_per_record": round(statistics.median(cpu), 3),
        "records_per_s": round(statistics.median(rates), 1),
        "cpu_us_per_record_rounds": [round(c, 3) for c in cpu],
        "floor_cpu_us_per_record": round(floor_cpu, 3),
        "ratio_to_floor": round(statistics.median(cpu) / floor_cpu, 3),
        "sessions": runs[-1].sessions,
        "floor_sessions": floors[-1].sessions,
    }
