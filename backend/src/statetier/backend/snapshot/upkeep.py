"""The committing side's work after each commit, for every runtime: compaction, then retention,
in the background, one job at a time.

Neither ever fails an epoch. A compaction that fails (a gateway down, a refused request) leaves
its chain for the next commit to try again and never stops retention, which would let files
pile up without bound; a retention that fails (storage trouble) is simply run again after the
next commit. When epochs are shorter than a compaction, the commits made while a job runs fold
into one queued job for the newest of them; the stream waits for the running job only once a
chain has ``CUT_FACTOR`` x the trigger deltas (backpressure).

What differs between runtimes is passed in: where a compaction's
:class:`~statetier.backend.snapshot.chain_update.ChainUpdate` goes (``deliver``: straight to
the writers in the local runner, to the next epoch's tasks on Spark), which chains are taken
care of already (``skip``), and which files the writers will name that no manifest names yet
(``protect``: retention keeps them).

Retention lists the whole location on its first run and every ``WHOLE_LISTING_EVERY`` runs;
between those it looks only at the epochs falling out of retention (see gc): on an object store
that is one short listing per commit instead of one of every retained file.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from statetier.backend import metrics as backend_metrics
from statetier.backend.snapshot.chain_compaction import CUT_FACTOR, ChainCompaction
from statetier.backend.snapshot.chain_update import ChainUpdate
from statetier.backend.snapshot.gc import collect_garbage
from statetier.backend.snapshot.manifest import Chain, Manifest
from statetier.backend.snapshot.store import SnapshotStore

__all__ = ["Upkeep"]

log = logging.getLogger(__name__)

WHOLE_LISTING_EVERY = 10  # retention runs between whole listings (what a short one misses waits)


@dataclasses.dataclass(eq=False)
class Upkeep:
    """Compaction and retention after the commits of one writer."""

    store: SnapshotStore
    compaction: ChainCompaction | None
    retained: int
    _: dataclasses.KW_ONLY
    deliver: Callable[[list[ChainUpdate]], None]
    protect: Callable[[], set[str]]
    skip: Callable[[Chain], bool] | None = None
    # what compaction cost here so far (this thread's CPU and a merge process's: the merge
    # when it runs here, the calls to the service otherwise), for benchmarks
    compaction_cpu_seconds: float = dataclasses.field(default=0.0, init=False)
    compaction_seconds: float = dataclasses.field(default=0.0, init=False)
    compactions: int = dataclasses.field(default=0, init=False)  # compacted bases made

    def __post_init__(self) -> None:
        self._latest = 0
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="statetier-upkeep")
        self._jobs: collections.deque[concurrent.futures.Future[None]] = collections.deque()
        self._next: tuple[Manifest, str, int | None] | None = None  # what the queued job takes
        self._kept_from: int | None = None  # the oldest epoch the last retention kept
        self._retentions = 0  # successful runs, for the whole listing every so often

    @property
    def idle(self) -> bool:
        """Whether there is nothing to do after commits (no compaction, no retention)."""
        return self.compaction is None and self.retained <= 0

    def committed(self, manifest: Manifest, owner: str, now_ms: int | None = None) -> None:
        """``manifest`` was just committed by ``owner``: queue its compaction and retention.
        ``now_ms`` is the epoch's clock, for states whose TTL cleanup drops expired entries
        in compaction (:func:`~statetier.backend.snapshot.writer.epoch_clock`).

        Waits for the running job only when compaction fell behind, a chain of ``CUT_FACTOR``
        x the trigger (backpressure, as a key-value store stalls writes when its compactions
        fall behind; waiting at every commit would put a merge that takes longer than an epoch
        back on the epoch's path). Otherwise the queued job takes the newest commit, and the
        commits in between only replace it."""
        self._latest = max(self._latest, manifest.epoch)
        if self.idle:
            return
        behind = self._behind(manifest)
        while self._jobs and (behind or self._jobs[0].done()):
            self._jobs.popleft().result()
        with self._lock:
            queued, self._next = self._next is not None, (manifest, owner, now_ms)
        if not queued:
            self._jobs.append(self._pool.submit(self._take_next))

    def _behind(self, manifest: Manifest) -> bool:
        if self.compaction is None:
            return False
        limit = CUT_FACTOR * self.compaction.delta_trigger
        return any(len(chain.deltas) >= limit for chain in manifest.chains())

    def _take_next(self) -> None:
        with self._lock:
            job, self._next = self._next, None
        if job is not None:
            self._maintain(*job)

    def _maintain(self, manifest: Manifest, owner: str, now_ms: int | None) -> None:
        if self.compaction is not None and manifest.epoch >= self._latest:
            started, cpu = time.perf_counter(), time.thread_time() + self._merge_process_cpu()
            try:
                due = self.compaction.due(manifest, skip=self.skip)
                updates = self.compaction.run(manifest, owner, due, now_ms)
            except Exception:  # planning itself failed (reading the chains): next time
                log.exception("compaction after epoch %d failed", manifest.epoch)
                backend_metrics.compaction_done(False)
                updates = []
            self.compaction_cpu_seconds += time.thread_time() + self._merge_process_cpu() - cpu
            self.compaction_seconds += time.perf_counter() - started
            self.compactions += sum(u.base is not None for u in updates)
            if updates:
                self.deliver(updates)
        if self.retained > 0:
            self._retain(manifest.epoch)

    def _merge_process_cpu(self) -> float:
        """CPU of merges that a compactor ran in a child process (a fallback's included)."""
        assert self.compaction is not None
        compactor = self.compaction.compactor
        local = getattr(compactor, "fallback", compactor)
        return float(getattr(local, "cpu_seconds", 0.0))

    def _retain(self, epoch: int) -> None:
        whole = self._kept_from is None or self._retentions % WHOLE_LISTING_EVERY == 0
        try:
            report = collect_garbage(
                self.store,
                self.retained,
                protect=self.protect(),
                since=None if whole else self._kept_from,
            )
        except Exception:  # storage trouble: the next commit's retention deletes the rest
            log.exception("retention after epoch %d failed", epoch)
            backend_metrics.retention_done(False)
            return
        backend_metrics.retention_done(True)
        self._retentions += 1
        if report.retained_epochs:
            self._kept_from = report.retained_epochs[0]
        log.info(
            "retention after epoch %d: kept epochs %s, deleted %d files (%d bytes)",
            epoch,
            report.retained_epochs,
            len(report.deleted_manifests) + len(report.deleted_files),
            report.freed_bytes,
        )

    def drain(self) -> None:
        """Wait for the running and queued jobs (tests and tools that list the files)."""
        while self._jobs:
            self._jobs.popleft().result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
