"""Runs a keyed function on several function instances in one process, epoch by epoch.

This is the reference runtime: the demo, the docs and many tests use it, and the Spark
integration does the same steps across executors. Each epoch moves to the epoch's time
(watermark, processing time from the runner's clock) and fires the timers due, routes records to
the instance that owns their key group, processes them, fires the timers they set for a time
already reached, snapshots every instance and commits the epoch's manifest; then the functions
hear that the epoch is committed (or aborted). A runner started on a store with committed epochs
resumes from the latest, at any parallelism.

Checkpoint notifications are delivered on the caller's thread, never on the committer's: after
``checkpoint()`` returns, and for ``checkpoint_async()`` at the runner's next call once the
commit is done (Flink delivers them through the task's mailbox for the same reason).
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Iterable
from typing import Any

from statetier.backend.compaction_client import compactor_for
from statetier.backend.config import StatetierConfig, warn_if_spill_off
from statetier.backend.keygroups import (
    assign_to_key_group,
    check_key,
    compute_default_max_parallelism,
    instance_for_key_group,
)
from statetier.backend.metrics import serve_metrics
from statetier.backend.routing import KeyRouter
from statetier.backend.runtime import FunctionFactory, FunctionInstance
from statetier.backend.snapshot import (
    Checkpointer,
    CheckpointSettings,
    Manifest,
    SnapshotStore,
)
from statetier.backend.snapshot.location import open_location
from statetier.backend.snapshot.restore_from import Seeding, start_from_savepoint
from statetier.backend.ttl import Clock, SystemClock

log = logging.getLogger("statetier.local_runner")

__all__ = ["LocalRunner", "checkpoint_settings"]


def checkpoint_settings(config: StatetierConfig | None) -> CheckpointSettings:
    """The checkpoint pipeline's settings from the configuration (defaults without one)."""
    if config is None:
        return CheckpointSettings()
    return CheckpointSettings(
        upload_concurrency=config.checkpoint_upload_concurrency,
        retained=config.checkpoint_retained,
        delta_trigger=config.compaction_delta_trigger,
        size_ratio=config.compaction_size_ratio,
    )


class LocalRunner:
    """``parallelism`` instances of the function made by ``factory``."""

    def __init__(
        self,
        factory: FunctionFactory,
        parallelism: int,
        *,
        max_parallelism: int | None = None,
        checkpoint_uri: str | None = None,
        clock: Clock | None = None,
        config: StatetierConfig | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.store = (
            SnapshotStore(checkpoint_uri, **(storage_options or {})) if checkpoint_uri else None
        )
        epochs = open_location(self.store) if self.store else []
        # A start from a savepoint: restored from the savepoint while it is copied in
        self._seeding: Seeding | None = None
        lease = None  # the seed's commit and the checkpointer's share it (another would fence)
        if self.store is not None and config is not None and config.checkpoint_restore_from:
            lease = self.store.acquire_writer()
            options = storage_options or {}
            self._seeding = start_from_savepoint(
                self.store, config.checkpoint_restore_from, lease, **options
            )
        restore_store = self._seeding.savepoint if self._seeding else self.store
        if self._seeding is not None:
            epochs = [self._seeding.manifest.epoch]
        self.last_epoch = epochs[-1] if epochs else 0
        if epochs and restore_store is not None:
            stored_max = restore_store.manifest(self.last_epoch).max_parallelism
            if max_parallelism not in (None, stored_max):
                raise ValueError(
                    f"the checkpoint at {checkpoint_uri} has max parallelism {stored_max}, "
                    f"not {max_parallelism}"
                )
            max_parallelism = stored_max
        self.max_parallelism = max_parallelism or compute_default_max_parallelism(parallelism)
        self.parallelism = parallelism
        self.clock: Clock = clock or SystemClock()
        # Epochs begun with checkpoint_async whose outcome the functions have not heard yet.
        self._unnotified: list[tuple[int, concurrent.futures.Future[Manifest]]] = []
        restore_epoch = self.last_epoch if epochs else None
        if config is not None:
            serve_metrics(config.metrics_port)  # this process's endpoint, once
            warn_if_spill_off(config, log)
        try:
            self.instances = [
                FunctionInstance(
                    factory,
                    index,
                    parallelism,
                    self.max_parallelism,
                    store=self.store,
                    restore_epoch=restore_epoch,
                    restore_store=restore_store,
                    clock=self.clock,
                    config=config,
                )
                for index in range(parallelism)
            ]
        except BaseException:
            if self._seeding is not None:  # a failed restore: let the copy end, commit nothing
                self._seeding.copied.exception()
            raise
        self._router = KeyRouter(self.instances, self.max_parallelism)
        # The first checkpoint takes the writer lease, which fences any earlier writer.
        self.checkpointer = (
            Checkpointer(
                self.store,
                [i.writer for i in self.instances],
                checkpoint_settings(config),
                lease=lease,
                compactor=compactor_for(config, self.store),  # remote if compaction.endpoints
            )
            if self.store is not None
            else None
        )

    def close(self) -> None:
        """Finish pending commits (and tell the functions), release every instance's spill files."""
        if self._seeding is not None:
            try:  # the copy ends before the runner does; the restored epoch is committed
                self._commit_seed()
            except Exception as exc:  # closing: the next start seeds again
                log.warning("the start from checkpoint.restore-from was not committed: %s", exc)
        if self.checkpointer is not None:
            self.checkpointer.close()
        self._notify_done()
        for instance in self.instances:
            instance.close()

    @property
    def restored_epoch(self) -> int:
        """The epoch the runner resumed from (0: started empty)."""
        return self.last_epoch

    def instance_for(self, key: Any) -> FunctionInstance:
        """The instance that owns ``key``'s key group."""
        check_key(key)
        kg = assign_to_key_group(key, self.max_parallelism)
        return self.instances[instance_for_key_group(self.max_parallelism, self.parallelism, kg)]

    def process(self, records: Iterable[tuple[Any, Any]]) -> list[Any]:
        """Process records without ending the epoch (no timer fires). Each goes to the
        instance that owns its key group (see routing); the output is in the records' order
        while no per-record work (spill counting, a per-record TTL cleanup) is on."""
        self._notify_done()
        return self._router.process(records)

    # ------------------------------------------------------------------ time

    def set_time(self, watermark: int | None = None, processing_time: int | None = None) -> None:
        """Move every instance's time forward without firing (``processing_time`` None: the
        runner's clock; ``watermark`` None: unchanged)."""
        self._notify_done()
        now = self.clock.now_ms() if processing_time is None else processing_time
        for instance in self.instances:
            instance.set_time(watermark, now)

    def advance_time(
        self, watermark: int | None = None, processing_time: int | None = None
    ) -> list[Any]:
        """Move time forward and fire every due timer, instance by instance; their output."""
        self._notify_done()
        now = self.clock.now_ms() if processing_time is None else processing_time
        out: list[Any] = []
        for instance in self.instances:
            out.extend(instance.advance_time(watermark, now))
        return out

    def end_of_input(self) -> list[Any]:
        """Fire every event-time timer (and the processing-time timers due now)."""
        self._notify_done()
        out: list[Any] = []
        for instance in self.instances:
            out.extend(instance.end_of_input())
        return out

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self) -> Manifest:
        """End the epoch: snapshot every instance, upload, commit; wait for the commit, then
        tell the functions (``notify_checkpoint_complete``, or ``..._aborted`` and raise)."""
        future = self.checkpoint_async()
        try:
            manifest = future.result()
        finally:
            self._notify_done()
        return manifest

    def checkpoint_async(self) -> concurrent.futures.Future[Manifest]:
        """End the epoch: copy every instance's state out now, upload and commit it in the
        background (processing may go on); the future holds the committed manifest."""
        if self.checkpointer is None:
            raise RuntimeError("the runner has no checkpoint_uri")
        self._commit_seed()
        self._notify_done()
        self._router.forget()  # the change logs are drained with the snapshot: so is the memo
        epoch = self.last_epoch + 1
        for instance in self.instances:
            instance.before_snapshot(epoch)
        future = self.checkpointer.begin(epoch)
        self.last_epoch = epoch
        self._unnotified.append((epoch, future))
        return future

    def _commit_seed(self) -> None:
        """Commit the savepoint this runner started from, once copied: its location's first
        epoch, before any of its own (raises the copy's error: nothing is committed then)."""
        if self._seeding is not None:
            self._seeding.commit()
            self._seeding = None

    def _notify_done(self) -> None:
        """Tell the functions the outcome of every finished epoch, in epoch order; an epoch
        still committing holds back the ones after it."""
        while self._unnotified and self._unnotified[0][1].done():
            epoch, future = self._unnotified.pop(0)
            failed = future.cancelled() or future.exception() is not None
            for instance in self.instances:
                if failed:
                    instance.notify_checkpoint_aborted(epoch)
                else:
                    instance.notify_checkpoint_complete(epoch)

    def run_epoch(
        self, records: Iterable[tuple[Any, Any]], watermark: int | None = None
    ) -> list[Any]:
        """One epoch, as a Spark micro-batch: move to the epoch's time (``watermark``, the
        clock's processing time) and fire the timers it makes due, process the records, fire
        the timers they set at or before that time, commit; the output."""
        out = self.advance_time(watermark)
        out.extend(self.process(records))
        out.extend(self.advance_time())
        self.checkpoint()
        return out
