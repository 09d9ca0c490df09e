"""The epoch pipeline of one job: background uploads, ordered commits, compaction, retention.

``submit`` takes the instances' prepared snapshots (bytes already copied out of the state, so
processing may go on at once), starts their uploads on a pool of ``upload-concurrency`` threads,
and returns a future of the epoch's manifest. A single committer thread commits epochs in order,
each once all its files are uploaded. After a commit it plans compactions (count and size-ratio
triggers) and retention, both in the background.

Failures: a persistent storage error (or a transient one past its retries) fails the epoch's
future with the file named; nothing is committed for it, the writers forget their chains so the
next epoch is written in full, and epochs already in flight behind it fail too (their deltas
build on the failed one). A fenced writer (another took the lease) fails every later epoch.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Sequence

from statetier.backend import metrics as backend_metrics
from statetier.backend.snapshot.chain_compaction import ChainCompaction, apply_update
from statetier.backend.snapshot.chain_update import ChainUpdate
from statetier.backend.snapshot.commit import commit_snapshot
from statetier.backend.snapshot.compaction import Compactor, LocalCompactor
from statetier.backend.snapshot.fencing import FencedError
from statetier.backend.snapshot.manifest import Manifest
from statetier.backend.snapshot.store import SnapshotStore, WriterLease
from statetier.backend.snapshot.upkeep import Upkeep
from statetier.backend.snapshot.writer import PreparedSubtask, SubtaskWriter, epoch_clock

__all__ = ["CheckpointError", "CheckpointSettings", "Checkpointer"]

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """An epoch could not be checkpointed; nothing of it was committed."""


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """How a checkpoint uploads, what it keeps and when it compacts (the ``checkpoint.*`` and
    ``compaction.*`` settings of StatetierConfig, for the local runner)."""

    upload_concurrency: int = 4
    retained: int = 3
    delta_trigger: int = 5
    size_ratio: float = 1.0
    compaction: bool = True


class Checkpointer:
    """Uploads, commits, compacts and cleans up the checkpoints of one writer."""

    def __init__(
        self,
        store: SnapshotStore,
        writers: Sequence[SubtaskWriter],
        settings: CheckpointSettings | None = None,
        *,
        lease: WriterLease | None = None,
        compactor: Compactor | None = None,
    ) -> None:
        self.store = store
        self.writers = list(writers)
        self.settings = settings or CheckpointSettings()
        self._lease = lease  # taken at the first checkpoint: readers never fence a writer
        self._compaction = ChainCompaction(
            store,
            compactor or LocalCompactor(filesystem=store.fs),
            delta_trigger=self.settings.delta_trigger,
            size_ratio=self.settings.size_ratio,
        )
        self._upkeep = Upkeep(
            store,
            self._compaction if self.settings.compaction else None,
            self.settings.retained,
            deliver=self._deliver,
            protect=self.protected,
            skip=lambda chain: chain.key_groups not in self._writers_by_range(),
        )
        self._uploads = concurrent.futures.ThreadPoolExecutor(
            self.settings.upload_concurrency, thread_name_prefix="statetier-upload"
        )
        self._committer = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="statetier-commit"
        )
        self._failures = 0
        self._fenced: BaseException | None = None
        self._lock = threading.Lock()

    @property
    def lease(self) -> WriterLease:
        if self._lease is None:
            self._lease = self.store.acquire_writer()
        return self._lease

    @property
    def owner(self) -> str:
        return self.lease.owner

    def begin(self, epoch: int, *, full: bool = False) -> concurrent.futures.Future[Manifest]:
        """Serialize every instance's state for ``epoch`` now (a consistent copy), then upload
        and commit it in the background; the future resolves to the committed manifest."""
        with self._lock:  # a failure resets the writers under the same lock
            failures_seen = self._failures
            prepared = [w.prepare(self.store, epoch, self.owner, full=full) for w in self.writers]
        return self._submit(epoch, prepared, failures_seen)

    def _submit(
        self, epoch: int, prepared: Sequence[PreparedSubtask], failures_seen: int
    ) -> concurrent.futures.Future[Manifest]:
        """Start uploading ``prepared`` and commit ``epoch`` once every file is up."""
        uploads = [
            self._uploads.submit(self.store.put, f.entry.path, f.data)
            for p in prepared
            for f in p.uploads
        ]
        snapshots = [p.snapshot for p in prepared]
        started = time.monotonic()
        size = sum(len(f.data) for p in prepared for f in p.uploads)

        def commit() -> Manifest:
            try:
                if self._fenced is not None:
                    raise CheckpointError(f"epoch {epoch}: this writer is fenced") from (
                        self._fenced
                    )
                if self._failures != failures_seen:
                    raise CheckpointError(
                        f"epoch {epoch}: an earlier epoch failed, and this one builds on it"
                    )
                for future in uploads:
                    future.result()
                self._check_uploaded(prepared)
                manifest = commit_snapshot(self.store, epoch, snapshots, self.lease)
            except BaseException as exc:
                for future in uploads:
                    future.cancel()
                with self._lock:
                    self._failures += 1
                    if isinstance(exc, FencedError):
                        self._fenced = exc
                    for writer in self.writers:
                        writer.reset()
                backend_metrics.checkpoint_failed()
                if isinstance(exc, CheckpointError):
                    raise
                raise CheckpointError(f"epoch {epoch} was not committed: {exc}") from exc
            backend_metrics.checkpoint_committed(time.monotonic() - started, size)
            self._after_commit(manifest, epoch_clock(snapshots))
            return manifest

        return self._committer.submit(commit)

    def _check_uploaded(self, prepared: Sequence[PreparedSubtask]) -> None:
        """Never name a file the storage does not show: re-upload what a listing misses."""
        files = {f.entry.path: f for p in prepared for f in p.uploads}
        missing = self.store.missing([f.entry for f in files.values()])
        for entry in missing:
            log.warning("uploaded file %s is not listed; uploading it again", entry.path)
            self.store.put(entry.path, files[entry.path].data)
        still = self.store.missing([files[e.path].entry for e in missing])
        if still:
            raise CheckpointError(f"uploaded files are missing from storage: {still[0].path}")

    def checkpoint(self, epoch: int, *, full: bool = False) -> Manifest:
        """Prepare, upload and commit ``epoch``, waiting for the commit."""
        return self.begin(epoch, full=full).result()

    # ------------------------------------------------------------------ background work

    @property
    def compactor(self) -> Compactor:
        return self._compaction.compactor

    @compactor.setter
    def compactor(self, compactor: Compactor) -> None:
        self._compaction.compactor = compactor

    def _after_commit(self, manifest: Manifest, now_ms: int | None) -> None:
        self._upkeep.committed(manifest, self.owner, now_ms)

    def _maintain(self, manifest: Manifest, now_ms: int | None = None) -> None:
        """The background job after ``manifest``'s commit, run now (tests of a late job)."""
        self._upkeep.committed(manifest, self.owner, now_ms)
        self._upkeep.drain()

    def _deliver(self, updates: list[ChainUpdate]) -> None:
        """Compaction results go straight to the writers of their ranges."""
        by_range = self._writers_by_range()
        for update in updates:
            apply_update(by_range[update.key_groups], update)

    def _writers_by_range(self) -> dict[str, SubtaskWriter]:
        return {str(w.keyed.key_groups): w for w in self.writers if w.keyed is not None}

    def protected(self) -> set[str]:
        """Files the writers' next manifests will name (some are not committed yet)."""
        return {f.path for w in self.writers for files in w.chains().values() for f in files}

    def drain(self) -> None:
        """Wait for background compaction and retention to finish."""
        self._upkeep.drain()

    def close(self) -> None:
        self._committer.shutdown(wait=True)
        self._uploads.shutdown(wait=True)
        self._upkeep.close()
