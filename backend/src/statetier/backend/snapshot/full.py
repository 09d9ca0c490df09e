"""Full snapshots written synchronously: every entry of every state of one instance.

The simple path, used by tools and tests that snapshot one backend at a time: prepare a full
base of every state (TTL cleanup on full snapshot applies), upload it, and return the part of
the manifest it contributes. Runners use :class:`~statetier.backend.snapshot.checkpointer.
Checkpointer` instead, which uploads in the background and writes deltas.
"""

from __future__ import annotations

from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.operator_state import OperatorStateBackend
from statetier.backend.snapshot.store import SnapshotStore
from statetier.backend.snapshot.writer import SubtaskSnapshot, SubtaskWriter

__all__ = ["snapshot_subtask"]


def snapshot_subtask(
    store: SnapshotStore,
    epoch: int,
    keyed: KeyedStateBackend | None,
    operator_state: OperatorStateBackend | None = None,
    owner: str = "w",
) -> SubtaskSnapshot:
    """Write the full state of one function instance for ``epoch`` (not yet committed)."""
    prepared = SubtaskWriter(keyed, operator_state, incremental=False).prepare(store, epoch, owner)
    for upload in prepared.uploads:
        store.put(upload.entry.path, upload.data)
    return prepared.snapshot
