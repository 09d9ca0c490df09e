"""Checkpoint listeners on Spark: a hosted range hears when its epochs are committed or dropped.

The driver commits epoch E after the range's task returned, so the host learns of the commit
from the next task of the range: its header names E as the committed base (and the task attempt
whose files were committed). A warm instance at exactly that version is told
``notify_checkpoint_complete(E)`` before the next epoch's records, on the thread that holds the
range. An instance that snapshotted an epoch the next task does not build on (the driver did
not commit it, or runs it again) is told ``notify_checkpoint_aborted`` before it is discarded.
A restored instance is told nothing about the epoch it restored, as in Flink: whatever a
notification would have done, a function also does on restore (notifications can be lost).
"""

from __future__ import annotations

import logging

from statetier.backend.runtime import FunctionInstance

log = logging.getLogger("statetier.spark.listeners")

__all__ = ["notify_aborted", "notify_committed"]


def notify_committed(instance: FunctionInstance, epoch: int, notified: int) -> int:
    """Tell ``instance`` that ``epoch`` (its current version) is committed, once; returns the
    latest epoch it has been told of."""
    if epoch > notified:
        instance.notify_checkpoint_complete(epoch)
        return epoch
    return notified


def notify_aborted(
    instance: FunctionInstance, snapshotted: int | None, base: int, notified: int
) -> None:
    """``instance`` snapshotted epoch ``snapshotted``, but the range goes on from ``base``:
    that snapshot will never be committed as this instance's (unless it already was). The
    instance is discarded next whatever the function does: a failure is logged, not raised."""
    if snapshotted is not None and snapshotted > base and snapshotted > notified:
        try:
            instance.notify_checkpoint_aborted(snapshotted)
        except Exception:
            log.exception("notify_checkpoint_aborted(%s) failed", snapshotted)
