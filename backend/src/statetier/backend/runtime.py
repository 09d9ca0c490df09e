"""An operator instance: one function, its keyed state for one key-group range, its operator state.

This is the unit every runner drives, locally or in a Spark task: restore (optional), ``open``
the function, feed it records of its own key groups, snapshot. Keeping it free of partitioning
and committing lets the local runner and the Spark integration share it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from statetier.backend.config import StatetierConfig
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import key_group_range_for_operator
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
from statetier.backend.ttl import Clock

if TYPE_CHECKING:
    from statetier.backend.spill import SpillManager

FunctionFactory = Callable[[], KeyedProcessFunction[Any, Any, Any]]


class OperatorInstance:
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
        clock: Clock | None = None,
        config: StatetierConfig | None = None,
    ) -> None:
        key_groups = key_group_range_for_operator(max_parallelism, parallelism, index)
        self.keyed = KeyedStateBackend(key_groups, max_parallelism, clock=clock)
        self.operator = OperatorStateBackend(index, parallelism)
        self.store = store
        # Snapshots of this instance: full, or deltas on the chains of its own range.
        incremental = config.checkpoint_incremental if config is not None else True
        self.writer = SubtaskWriter(self.keyed, self.operator, incremental=incremental)
        if config is not None and config.spill_enabled:
            # the process's governor exists before any restored state: it measures the
            # runtime's own memory when it starts
            from statetier.backend.spill.governor import MemoryGovernor

            MemoryGovernor.for_config(config)
        restored = store is not None and restore_epoch is not None
        self.restored_bytes = 0  # downloaded by the restore (what a move of the range costs)
        if restored:
            assert store is not None
            manifest = restore_keyed_state(store, self.keyed, restore_epoch)
            restore_operator_state(store, self.operator, manifest.epoch)
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
        elif config is not None and config.metrics_port:
            # No spill tier: the process still exports its checkpoint and locality metrics.
            from statetier.backend.spill.metrics import serve_metrics

            serve_metrics(config.metrics_port)
        self.function = factory()
        self.context = RuntimeContext(self.keyed, self.operator, is_restored=restored)
        initialize = getattr(self.function, "initialize_state", None)
        if initialize is not None:
            initialize(FunctionInitializationContext(restored, self.operator, self.keyed))
        self.function.open(self.context)

    def process(self, records: Iterable[tuple[Any, Any]]) -> list[Any]:
        """Run the function over ``(key, value)`` records, all of this instance's key groups."""
        out: list[Any] = []
        set_key = self.keyed.set_current_key
        process = self.function.process
        context = self.context
        for key, value in records:
            set_key(key)
            result = process(key, value, context)
            if result is not None:
                out.extend(result)
        return out

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
