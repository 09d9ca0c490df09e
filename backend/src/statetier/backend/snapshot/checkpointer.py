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
from statetier.backend.snapshot.commit import commit_snapshot
from statetier.backend.snapshot.compaction import (
    Compactor,
    LocalCompactor,
    make_request,
    needs_compaction,
)
from statetier.backend.snapshot.fencing import FencedError
from statetier.backend.snapshot.gc import collect_garbage
from statetier.backend.snapshot.manifest import FileEntry, Manifest
from statetier.backend.snapshot.store import SnapshotStore, WriterLease, state_dir
from statetier.backend.snapshot.writer import PreparedSubtask, SubtaskWriter, epoch_clock

__all__ = ["CheckpointError", "CheckpointSettings", "Checkpointer"]

log = logging.getLogger(__name__)
CUT_FACTOR = 3  # a chain that failed compaction is cut at this many times the delta trigger


class CheckpointError(RuntimeError):
    """An epoch could not be checkpointed; nothing of it was committed."""


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
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
        self.compactor: Compactor = compactor or LocalCompactor(filesystem=store.fs)
        self._uploads = concurrent.futures.ThreadPoolExecutor(
            self.settings.upload_concurrency, thread_name_prefix="statetier-upload"
        )
        self._committer = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="statetier-commit"
        )
        self._background = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="statetier-compact"
        )
        self._failures = 0
        self._fenced: BaseException | None = None
        self._lock = threading.Lock()
        self._background_jobs: list[concurrent.futures.Future[None]] = []
        self._last_committed = 0  # set on the committer thread, read by maintenance

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
            self._last_committed = manifest.epoch
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

    def _after_commit(self, manifest: Manifest, now_ms: int | None) -> None:
        if not self.settings.compaction and self.settings.retained <= 0:
            return
        self._background_jobs = [f for f in self._background_jobs if not f.done()]
        self._background_jobs.append(self._background.submit(self._maintain, manifest, now_ms))

    def _maintain(self, manifest: Manifest, now_ms: int | None = None) -> None:
        """Compaction, then retention, each on its own: a failed compaction (a gateway down, a
        refused request) leaves its chain as it is for the next commit to try again, and never
        stops retention, which would let files pile up without bound. Neither fails an epoch.
        Jobs queue up when epochs are shorter than a compaction: a job whose epoch a newer
        commit superseded compacts nothing (retention, run by the jobs before it for newer
        epochs, may have deleted its files; the newest epoch's job compacts what the writers
        carry on)."""
        if self.settings.compaction and manifest.epoch >= self._last_committed:
            try:
                self.compact(manifest, now_ms)
            except Exception:  # planning itself failed (reading the chains): retried next time
                log.exception("compaction after epoch %d failed", manifest.epoch)
                backend_metrics.compaction_done(False)
        if self.settings.retained > 0:
            self._retain(manifest.epoch)

    def _retain(self, epoch: int) -> None:
        try:
            report = collect_garbage(self.store, self.settings.retained, protect=self.protected())
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

    def protected(self) -> set[str]:
        """Files the writers' next manifests will name (some are not committed yet)."""
        return {f.path for w in self.writers for files in w.chains().values() for f in files}

    def compact(self, manifest: Manifest, now_ms: int | None = None) -> int:
        """Compact the chains of ``manifest`` that hit a trigger; return how many. ``now_ms``
        is the epoch's clock (:func:`~statetier.backend.snapshot.writer.epoch_clock`), for
        states whose TTL cleanup drops expired entries in compaction."""
        done = 0
        by_range = {str(w.keyed.key_groups): w for w in self.writers if w.keyed is not None}
        for chain in manifest.chains():
            writer = by_range.get(chain.key_groups)
            if writer is None:
                continue
            if not needs_compaction(chain, self.settings.delta_trigger, self.settings.size_ratio):
                continue
            output_dir = (
                f"data/epoch-{manifest.epoch:010d}/{self.owner}/compacted/{state_dir(chain.state)}"
            )
            request = make_request(
                self.store.url,
                chain.state,
                chain.files,
                output_dir,
                manifest.max_parallelism,
                meta=manifest.states.get(chain.state),
                now_ms=now_ms,
            )
            try:
                result = self.compactor.compact(request)
            except Exception as exc:  # this chain stays as it is; the others go on
                log.warning(
                    "compaction of %s %s after epoch %d failed (the chain is kept and retried "
                    "at the next commit): %s",
                    chain.state,
                    chain.key_groups,
                    manifest.epoch,
                    exc,
                )
                backend_metrics.compaction_done(False)
                self._cut_if_too_long(writer, chain.state, len(chain.deltas))
                continue
            backend_metrics.compaction_done(True)
            output = result.outputs[0]
            name = output.url[len(self.store.uri) + 1 :]
            base = FileEntry(
                path=name,
                size=output.size,
                crc32=output.crc32,
                state=chain.state,
                key_groups=chain.key_groups,
                kind="base",
                epoch=chain.files[-1].epoch,
            )
            if writer.replace_prefix(chain.state, chain.files, base):
                done += 1
        return done

    def _cut_if_too_long(self, writer: SubtaskWriter, state: str, deltas: int) -> None:
        """A chain that failed compaction keeps growing; past ``CUT_FACTOR`` times the trigger
        its next snapshot is a full base instead, so files stay bounded even when compaction
        keeps failing (retention then deletes the old chain with its epochs)."""
        if deltas >= CUT_FACTOR * self.settings.delta_trigger:
            writer.cut(state)
            log.warning(
                "chain of %s has %d deltas and could not be compacted: the next snapshot "
                "writes a full base",
                state,
                deltas,
            )

    def drain(self) -> None:
        """Wait for background compaction and retention to finish."""
        for future in list(self._background_jobs):
            future.result()

    def close(self) -> None:
        self._committer.shutdown(wait=True)
        self._uploads.shutdown(wait=True)
        self._background.shutdown(wait=True)
