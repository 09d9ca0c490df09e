"""A function instance: one function, its keyed state for one key-group range, its operator state.

This is the unit every runner drives, locally or in a Spark task: restore (optional), ``open``
the function, feed it records of its own key groups, move time and fire timers, snapshot, tell
the function when its epoch is committed. Keeping it free of partitioning and committing lets the
local runner and the Spark integration share it.

Per epoch (micro-batch) a runtime calls, on the thread that processes records::

    out = instance.advance_time(watermark, processing_time)  # the epoch's time: due timers fire
    out += instance.process(records)                # the epoch's records
    out += instance.advance_time()                  # timers the records set at or before it
    instance.snapshot(epoch) / writer.prepare(...)  # timers are keyed state: in the snapshot
    ... commit the manifest ...
    instance.notify_checkpoint_complete(epoch)      # or notify_checkpoint_aborted(epoch)

The epoch's watermark comes from earlier epochs' data, so its records arrived after it: as in
Flink, the timers it makes due fire before them. ``set_time`` moves time without firing, for a
host that wants Spark's ``transformWithState`` order (records first, then expired timers).

``end_of_input()`` fires every event-time timer (a batch run's last watermark).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from statetier.backend.config import StatetierConfig
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import key_group_range_for_instance, raise_if_unhashable
from statetier.backend.operator_state import (
    FunctionInitializationContext,
    FunctionSnapshotContext,
    OperatorStateBackend,
)
from statetier.backend.snapshot import (
    SnapshotStore,
    SubtaskSnapshot,
    SubtaskWriter,
    restore_keyed_state,
    restore_operator_state,
    restored_bytes,
)
from statetier.backend.snapshot.handoff import HandOff, restore_handoff
from statetier.backend.timers import MAX_WATERMARK, TimeDomain, TimerService
from statetier.backend.ttl import Clock, SystemClock

if TYPE_CHECKING:
    from statetier.backend.spill import SpillManager

FunctionFactory = Callable[[], KeyedProcessFunction[Any, Any, Any]]


def _ignore_timer(timestamp: int, key: Any, context: Any) -> None:
    """The ``on_timer`` of a function without one: its due timers are removed, nothing runs."""


class FunctionInstance:
    """Instance ``index`` of ``parallelism`` of a keyed function."""

    def __init__(
        self,
        factory: FunctionFactory,
        index: int,
        parallelism: int,
        max_parallelism: int,
        *,
        store: SnapshotStore | None = None,
        restore_epoch: int | None = None,
        restore_store: SnapshotStore | None = None,
        clock: Clock | None = None,
        config: StatetierConfig | None = None,
        handoff: HandOff | None = None,
    ) -> None:
        key_groups = key_group_range_for_instance(max_parallelism, parallelism, index)
        self.clock: Clock = clock or SystemClock()
        self.keyed = KeyedStateBackend(key_groups, max_parallelism, clock=self.clock)
        self.operator_state = OperatorStateBackend(index, parallelism)
        self.store = store
        # Snapshots of this instance: full, or deltas on the chains of its own range.
        self.writer = SubtaskWriter(self.keyed, self.operator_state)
        if config is not None:
            self.writer.incremental = config.checkpoint_incremental
            self.writer.codec = config.checkpoint_compression
        restored = store is not None and (restore_epoch is not None or handoff is not None)
        self.restored_bytes = 0  # downloaded by the restore (what a move of the range costs)
        if handoff is not None:
            # the committed state from the range's old owner (see snapshot.handoff)
            assert store is not None
            self.restored_bytes = restore_handoff(handoff, self.keyed, self.operator_state, store)
            self.writer.restored_from(handoff.committed)
        elif restored:
            assert store is not None
            # restore_store: a savepoint that is being copied into store (restore_from)
            source = restore_store or store
            manifest = restore_keyed_state(source, self.keyed, restore_epoch)
            restore_operator_state(source, self.operator_state, manifest.epoch)
            self.writer.restored_from(manifest)
            self.restored_bytes = restored_bytes(manifest, key_groups)
        # Held by whoever uses this instance (the Spark state host: while a task processes or
        # snapshots it); the process's memory governor moves its key groups only between uses.
        self.lock = threading.RLock()
        # The spill tier (spill.enabled): moves cold key groups of self.keyed to disk.
        self.spill: SpillManager | None = None
        if config is not None and config.spill_enabled:
            from statetier.backend.spill import SpillManager

            self.spill = SpillManager.from_config(self.keyed, config, in_use=self.lock)
        # After the restore: restored timers are indexed from their state.
        self.timers = TimerService(self.keyed, self.clock.now_ms())
        self.function = factory()
        self.context = RuntimeContext(
            self.keyed, self.operator_state, is_restored=restored, timer_service=self.timers
        )
        initialize = getattr(self.function, "initialize_state", None)
        if initialize is not None:
            initialize(FunctionInitializationContext(restored, self.operator_state, self.keyed))
        self.function.open(self.context)

    def state_bytes(self) -> tuple[int, int]:
        """This instance's keyed state: (heap bytes, estimated; bytes of its key groups spilled
        to disk). With the spill tier, its accounting as the last check left it (the Spark host
        settles each range before it asks: a refresh here would fold the hit rates again);
        without, the backend's sampled estimate. Call it where the instance is not in use."""
        if self.spill is not None:
            accounting = self.spill.accounting
            return accounting.total_heap(), accounting.total_spilled()
        keyed = self.keyed
        return sum(keyed.estimate_size(kg) for kg in keyed.key_groups), 0

    def process(self, records: Iterable[tuple[Any, Any]]) -> list[Any]:
        """Run the function over ``(key, value)`` records, all of this instance's key groups."""
        out: list[Any] = []
        records = iter(records)
        self._process_plain(records, out)  # returns early once a record needs more
        set_key = self.keyed.set_current_key
        process = self.function.process
        context = self.context
        for key, value in records:
            set_key(key)
            result = process(key, value, context)
            if result:  # None, or an empty list or tuple: nothing to add (a generator is true)
                out.extend(result)
        return out

    def _process_plain(self, records: Iterator[tuple[Any, Any]], out: list[Any]) -> None:
        """:meth:`process` while making a key current is plain (no spill counting, no
        per-record hooks): a key already in the change log is made current here, as the timer
        queue does when it fires (see ``plain_change_log``), without a call per record (that
        call cost a word count 5% of its instructions). A key first seen in this epoch is
        hashed and logged by ``log_key``, or refused as ``set_current_key`` refuses it. The
        log is taken once per call: only a snapshot's drain replaces it, and a snapshot never
        runs inside the function's ``process``. Returns when the records end, or after the
        record whose function added a per-record hook (a state with TTL cleanup per record,
        made in ``process``): the rest go through the general loop, which runs it."""
        keyed = self.keyed
        log = keyed.plain_change_log()
        if log is None:
            return
        log_key, logged = keyed.log_key, log.get
        ctx = keyed.context
        process = self.function.process
        context = self.context
        key: Any = None
        try:  # around the loop, not in it: a try in the loop runs a bytecode per record
            for key, value in records:
                slot = logged(key)
                if slot is None:  # first seen in this epoch: hashed (or refused) and logged
                    slot = log_key(key)
                ctx.index = slot
                ctx.key = key
                result = process(key, value, context)
                if result:  # None, or an empty list or tuple: nothing to add (a generator is)
                    out.extend(result)
                if ctx.per_record_work:  # a hook was added: the rest need set_current_key
                    return
        except TypeError:
            raise_if_unhashable(key)  # else the function's own error
            raise

    # ------------------------------------------------------------------ time and timers

    def set_time(self, watermark: int | None = None, processing_time: int | None = None) -> None:
        """Move event time to ``watermark`` and processing time to ``processing_time`` (ms),
        firing nothing. ``watermark`` None keeps it; ``processing_time`` None reads the clock.
        Time only moves forward: a smaller value is ignored."""
        if processing_time is None:
            processing_time = self.clock.now_ms()
        self.timers.advance(watermark, processing_time)

    def advance_time(
        self, watermark: int | None = None, processing_time: int | None = None
    ) -> list[Any]:
        """:meth:`set_time`, then fire every due timer; return what ``on_timer`` emitted.

        Processing-time timers at or before the processing time fire first, then event-time
        timers at or before the watermark, each domain in timestamp order (ties: key group, then
        key bytes). Timers registered by ``on_timer`` fire in the same call when already due.
        """
        self.set_time(watermark, processing_time)
        out: list[Any] = []
        on_timer = getattr(self.function, "on_timer", None) or _ignore_timer
        context = self.context
        for domain in (TimeDomain.PROCESSING_TIME, TimeDomain.EVENT_TIME):
            # set once per domain: between two calls only the timer service runs
            context.time_domain = domain
            try:
                out += self.timers.fire(domain, on_timer, context)
            finally:
                context.time_domain = None
        return out

    def end_of_input(self) -> list[Any]:
        """The input is exhausted (a batch run): fire every event-time timer, as Flink's final
        ``Long.MAX_VALUE`` watermark does, and the processing-time timers due now."""
        return self.advance_time(watermark=MAX_WATERMARK)

    # ------------------------------------------------------------------ checkpoint listeners

    def notify_checkpoint_complete(self, epoch: int) -> None:
        """Epoch ``epoch``'s manifest is committed: tell the function (if it listens)."""
        hook = getattr(self.function, "notify_checkpoint_complete", None)
        if hook is not None:
            hook(epoch)

    def notify_checkpoint_aborted(self, epoch: int) -> None:
        """Epoch ``epoch`` will not be committed: tell the function (if it listens)."""
        hook = getattr(self.function, "notify_checkpoint_aborted", None)
        if hook is not None:
            hook(epoch)

    # ------------------------------------------------------------------ snapshots

    def before_snapshot(self, epoch: int) -> None:
        """Let the function move its working data into state (``snapshot_state``)."""
        hook = getattr(self.function, "snapshot_state", None)
        if hook is not None:
            hook(FunctionSnapshotContext(epoch))

    def snapshot(self, epoch: int, owner: str = "w") -> SubtaskSnapshot:
        """Write this instance's full state for ``epoch`` now (not yet committed)."""
        if self.store is None:
            raise RuntimeError("this instance has no snapshot store")
        self.before_snapshot(epoch)
        prepared = self.writer.prepare(self.store, epoch, owner, full=True)
        for upload in prepared.uploads:
            self.store.put(upload.entry.path, upload.data)
        return prepared.snapshot

    def close(self) -> None:
        """Release what the instance holds outside the heap (spill files)."""
        if self.spill is not None:
            self.spill.close(load_back=False)
