"""The driver's work after each commit: compaction and retention, in the background.

The state hosts only ever write deltas (or a first base); merging a range's chain into a new base
happens here, off the executors and off the micro-batch's path: on the compaction service when
``compaction.endpoints`` is set, else in this driver process. A compaction's result is a
:class:`~statetier.backend.snapshot.chain_compaction.ChainUpdate` that travels with the next
epochs' task spec until a committed manifest names its base: the range's host applies it to its
writer before its snapshot, a host that restores the range applies it to the restored chain.
Until then the compacted base is protected from retention (it lives in an epoch directory that
may fall out of the retained epochs before it is named).

``compaction.mode=executor`` keeps the old behaviour for comparison: no compaction here, the
hosts write a full base inside their snapshot once a chain is longer than the trigger.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from typing import Any

from statetier.backend.compaction_client import compactor_for
from statetier.backend.config import StatetierConfig
from statetier.backend.snapshot.chain_compaction import CUT_FACTOR, ChainCompaction, ChainUpdate
from statetier.backend.snapshot.gc import collect_garbage
from statetier.backend.snapshot.manifest import Chain, Manifest
from statetier.backend.snapshot.store import SnapshotStore

__all__ = ["EpochUpkeep"]

log = logging.getLogger(__name__)


class EpochUpkeep:
    """Compaction and retention after the commits of one pipeline, one job at a time."""

    def __init__(self, store: SnapshotStore, config: StatetierConfig) -> None:
        self.store = store
        self.retained = int(config.checkpoint_retained)
        self.compaction: ChainCompaction | None = None
        if config.compaction_mode == "background":
            self.compaction = ChainCompaction(
                store,
                compactor_for(config, store),
                delta_trigger=int(config.compaction_delta_trigger),
                size_ratio=float(config.compaction_size_ratio),
            )
        self._pending: list[ChainUpdate] = []
        self._lock = threading.Lock()
        self._latest = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="statetier-upkeep")
        self._jobs: collections.deque[concurrent.futures.Future[None]] = collections.deque()
        self._next: tuple[Manifest, str] | None = None  # the commit the queued job takes
        # what compaction cost here so far (this thread's CPU: the merge when local, the calls
        # to the service when remote; fsspec's I/O thread not included), for benchmarks
        self.compaction_cpu_seconds = 0.0
        self.compaction_seconds = 0.0
        self.compactions = 0  # compacted bases made

    @property
    def compactor(self) -> Any:
        return self.compaction.compactor if self.compaction is not None else None

    def updates(self) -> list[dict[str, Any]]:
        """The chain updates the next epoch's hosts apply (JSON-ready)."""
        with self._lock:
            return [u.to_dict() for u in self._pending]

    def committed(self, manifest: Manifest, owner: str) -> None:
        """``manifest`` was just committed: forget the updates it took (or that no longer
        apply), then compact and retain in the background. Waits for the running job only when
        compaction fell behind, a chain of ``CUT_FACTOR`` x the trigger (a merge may take longer
        than an epoch; waiting at every commit would put it back on the micro-batch's path);
        otherwise the next job takes the newest commit, and commits in between only shorten
        the queue. A failure of a finished job (storage trouble in retention) surfaces here, as
        it would have inline."""
        self._settle(manifest)
        self._latest = max(self._latest, manifest.epoch)
        behind = self._behind(manifest)
        while self._jobs and (behind or self._jobs[0].done()):
            self._jobs.popleft().result()
        with self._lock:
            queued, self._next = self._next is not None, (manifest, owner)
        if not queued:
            self._jobs.append(self._pool.submit(self._take_next))

    def _behind(self, manifest: Manifest) -> bool:
        """Whether a chain of ``manifest`` is so long that the stream should wait for the
        running compaction (backpressure, as a key-value store stalls writes when its
        compactions fall behind)."""
        if self.compaction is None:
            return False
        limit = CUT_FACTOR * self.compaction.delta_trigger
        return any(len(chain.deltas) >= limit for chain in manifest.chains())

    def _take_next(self) -> None:
        with self._lock:
            job, self._next = self._next, None
        if job is not None:
            self._maintain(*job)

    def _settle(self, manifest: Manifest) -> None:
        chains = {(c.state, c.key_groups): c for c in manifest.chains()}
        with self._lock:
            self._pending = [
                u
                for u in self._pending
                if not u.named_by(manifest)
                and (chain := chains.get((u.state, u.key_groups))) is not None
                and u.applies_to(chain)
            ]

    def _maintain(self, manifest: Manifest, owner: str) -> None:
        """Compaction (only for the newest commit: a queued job of an older one would compact
        chains the newer commit carries on anyway), then retention. A compaction failure never
        stops retention."""
        if self.compaction is not None and manifest.epoch >= self._latest:
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                due = self.compaction.due(manifest, skip=self._in_hand)
                updates = self.compaction.run(manifest, owner, due)
            except Exception:  # planning itself failed (reading the chains): next time
                log.exception("compaction after epoch %d failed", manifest.epoch)
                updates = []
            self.compaction_cpu_seconds += time.thread_time() - cpu
            self.compaction_seconds += time.perf_counter() - started
            self.compactions += sum(u.base is not None for u in updates)
            with self._lock:
                self._pending.extend(updates)
        if self.retained > 0:
            collect_garbage(self.store, self.retained, protect=self._protected())

    def _in_hand(self, chain: Chain) -> bool:
        """Whether an update for ``chain`` waits to be applied already."""
        with self._lock:
            return any(u.applies_to(chain) for u in self._pending)

    def _protected(self) -> set[str]:
        with self._lock:
            return {u.base.path for u in self._pending if u.base is not None}

    def drain(self) -> None:
        """Wait for the running and queued jobs (tests and tools that list the files)."""
        while self._jobs:
            self._jobs.popleft().result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
