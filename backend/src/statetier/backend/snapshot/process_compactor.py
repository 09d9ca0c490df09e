"""A compactor that merges in a child process of its own.

A merge is CPU-bound Python: run on a thread of a process that has other Python work (the Spark
driver's micro-batch loop, its py4j calls and commits), it holds the GIL for most of its time
and slows that work down. In a child process it only takes a core. The child is started (with
``spawn``: the parent may have JVM and event-loop threads that ``fork`` would copy half-way) at
the first compaction and serves the following ones, ignores Ctrl-C (its parent stops it) and
exits when its parent is gone; the request and result are the same JSON
objects a compaction service takes, the filesystem travels pickled (fsspec filesystems pickle
as their constructor arguments).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import signal
import threading
import time

from statetier.backend.snapshot.compaction import (
    CompactionRequest,
    CompactionResult,
    LocalCompactor,
)

__all__ = ["ProcessCompactor"]


class ProcessCompactor:
    """Runs ``local``'s merges in one child process."""

    def __init__(self, local: LocalCompactor) -> None:
        self.local = local
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self.cpu_seconds = 0.0  # the child's CPU in merges so far (for benchmarks)

    def compact(self, request: CompactionRequest) -> CompactionResult:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    1,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_child_setup,
                    initargs=(os.getpid(),),
                )
            pool = self._pool
        try:
            result, cpu = pool.submit(_compact, self.local, request.to_json()).result()
        except concurrent.futures.process.BrokenProcessPool:
            with self._lock:  # the child died (killed, out of memory): a new one next time
                if self._pool is pool:
                    self._pool = None
            raise
        self.cpu_seconds += cpu
        return result

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _child_setup(parent: int) -> None:
    """The child leaves Ctrl-C to its parent (a terminal sends it to the whole process group;
    the parent stops the child) and ends when its parent is gone, whatever ended it: it must
    not outlive the driver, nor hold the pipes the driver's own parent reads to their end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="statetier-parent-watch", daemon=True).start()


def _compact(local: LocalCompactor, request: str) -> tuple[CompactionResult, float]:
    """The merge, in the child; its result and the child's CPU seconds for it."""
    started = time.process_time()
    result = local.compact(CompactionRequest.from_json(request))
    return result, time.process_time() - started
