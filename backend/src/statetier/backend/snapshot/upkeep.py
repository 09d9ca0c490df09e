"""The committing side's work after each commit, for every runtime: compaction, then retention,
in the background, one job at a time.

Neither ever fails an epoch. A compaction that fails (a gateway down, a refused request) leaves
its chain for the next commit to try again and never stops retention, which would let files
pile up without bound; a retention that fails (storage trouble) is simply run again after the
next commit. Jobs queue up when epochs are shorter than a compaction: a job whose epoch a newer
commit superseded compacts nothing (the newest job compacts what the writers carry on) but
still runs retention.

What differs between runtimes is passed in: where a compaction's
:class:`~statetier.backend.snapshot.chain_compaction.ChainUpdate` goes (``deliver``: straight to
the writers in the local runner, to the next epoch's tasks on Spark), which chains are taken
care of already (``skip``), and which files the writers will name that no manifest names yet
(``protect``: retention keeps them).
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable

from statetier.backend import metrics as backend_metrics
from statetier.backend.snapshot.chain_compaction import ChainCompaction, ChainUpdate
from statetier.backend.snapshot.gc import collect_garbage
from statetier.backend.snapshot.manifest import Chain, Manifest
from statetier.backend.snapshot.store import SnapshotStore

__all__ = ["Upkeep"]

log = logging.getLogger(__name__)


class Upkeep:
    """Compaction and retention after the commits of one writer."""

    def __init__(
        self,
        store: SnapshotStore,
        compaction: ChainCompaction | None,
        retained: int,
        *,
        deliver: Callable[[list[ChainUpdate]], None],
        protect: Callable[[], set[str]],
        skip: Callable[[Chain], bool] | None = None,
    ) -> None:
        self.store = store
        self.compaction = compaction
        self.retained = retained
        self._deliver = deliver
        self._protect = protect
        self._skip = skip
        self._latest = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="statetier-upkeep")
        self._jobs: list[concurrent.futures.Future[None]] = []

    @property
    def idle(self) -> bool:
        """Whether there is nothing to do after commits (no compaction, no retention)."""
        return self.compaction is None and self.retained <= 0

    def committed(self, manifest: Manifest, owner: str, now_ms: int | None = None) -> None:
        """``manifest`` was just committed by ``owner``: queue its compaction and retention.
        ``now_ms`` is the epoch's clock, for states whose TTL cleanup drops expired entries
        in compaction (:func:`~statetier.backend.snapshot.writer.epoch_clock`)."""
        self._latest = max(self._latest, manifest.epoch)
        if self.idle:
            return
        self._jobs = [job for job in self._jobs if not job.done()]
        self._jobs.append(self._pool.submit(self._maintain, manifest, owner, now_ms))

    def _maintain(self, manifest: Manifest, owner: str, now_ms: int | None) -> None:
        if self.compaction is not None and manifest.epoch >= self._latest:
            try:
                due = self.compaction.due(manifest, skip=self._skip)
                updates = self.compaction.run(manifest, owner, due, now_ms)
            except Exception:  # planning itself failed (reading the chains): next time
                log.exception("compaction after epoch %d failed", manifest.epoch)
                backend_metrics.compaction_done(False)
                updates = []
            if updates:
                self._deliver(updates)
        if self.retained > 0:
            self._retain(manifest.epoch)

    def _retain(self, epoch: int) -> None:
        try:
            report = collect_garbage(self.store, self.retained, protect=self._protect())
        except Exception:  # storage trouble: the next commit's retention deletes the rest
            log.exception("retention after epoch %d failed", epoch)
            backend_metrics.retention_done(False)
            return
        backend_metrics.retention_done(True)
        log.info(
            "retention after epoch %d: kept epochs %s, deleted %d files (%d bytes)",
            epoch,
            report.retained_epochs,
            len(report.deleted_manifests) + len(report.deleted_files),
            report.freed_bytes,
        )

    def drain(self) -> None:
        """Wait for every queued job (tests and tools that list the files)."""
        for job in list(self._jobs):
            job.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
