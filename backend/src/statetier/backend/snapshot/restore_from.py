"""``checkpoint.restore-from``: a pipeline's first start from a savepoint.

A pipeline whose own checkpoint location holds no committed epoch starts from the savepoint. Its
restore reads the savepoint's epoch where it is, while the savepoint's files are copied into the
pipeline's location under their names in the background (by the storage itself when both are on
one object store, see transfer). Once the restore succeeded and the copy is done, the
savepoint's manifest is committed there, under the pipeline's writer lease, as the location's
first epoch, just before the pipeline's own first checkpoint (Flink's "no claim" mode, whose
first checkpoint is full, made simple: the copy is the first checkpoint). Copy and restore thus
overlap: a copy on the restore's path doubled the start (587 MiB on SeaweedFS: 9.4 s of copy,
then 8 s of restore), and the store's copy is bound by the store (4 files at once copied no
faster than one after the other), not by requests in flight.

From its first commit on the location is the pipeline's own: restored, checkpointed, compacted
and retained as usual, at any parallelism (restore reads key groups, whatever ranges wrote them),
and never referring to the savepoint, so deleting it later breaks nothing. The savepoint is only
read. A copy that fails (the savepoint deleted meanwhile) fails the first checkpoint and commits
nothing; the next start tries the savepoint again.

A location that has epochs already is resumed as it is and the setting is ignored (logged): a
restarted pipeline must not go back to the savepoint. A damaged savepoint fails the start: the
manifest and marker by their checksums here, a data file when the restore checks its blocks.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from typing import Any

from statetier.backend.snapshot.epoch_offset import carry_bootstrap_marker
from statetier.backend.snapshot.manifest import Manifest
from statetier.backend.snapshot.savepoint import MARKER, read_savepoint, require_savepoint
from statetier.backend.snapshot.store import SnapshotStore, WriterLease
from statetier.backend.snapshot.transfer import copy_files

__all__ = ["SavepointLocationError", "Seeding", "seed_from_savepoint", "start_from_savepoint"]

log = logging.getLogger(__name__)


class SavepointLocationError(ValueError):
    """A pipeline was pointed at a savepoint as its own checkpoint location."""


@dataclasses.dataclass(frozen=True)
class Seeding:
    """A start from a savepoint under way: restore ``manifest`` from ``savepoint`` now, while
    ``copied`` copies its files into ``store``; :meth:`commit` once the restore succeeded and
    before the location's next commit."""

    manifest: Manifest  # the savepoint's epoch, owned by the new location's lease
    savepoint: SnapshotStore  # where the epoch's files are read until the copy is committed
    store: SnapshotStore
    lease: WriterLease
    copied: concurrent.futures.Future[int]  # the bytes copied

    def commit(self) -> Manifest:
        """Wait for the copy (its error if it failed), then commit the savepoint's epoch as
        the location's first. Only after the restore: a savepoint whose restore found damage
        must not become the location's epoch, or the next start would resume the damage."""
        self.copied.result()
        carry_bootstrap_marker(self.savepoint, self.store)  # its micro-batches' epochs
        self.store.commit(self.manifest, self.lease)
        log.info("%s holds its own copy of savepoint %s", self.store.uri, self.savepoint.uri)
        return self.manifest


def seed_from_savepoint(
    store: SnapshotStore, savepoint_uri: str, lease: WriterLease, **storage_options: Any
) -> Manifest | None:
    """Start ``store`` from the savepoint, wait for the copy and commit it: the committed
    manifest; None when ``store`` has epochs already (the setting is ignored). For a restore
    that reads ``store`` (the Spark driver's tasks)."""
    seeding = start_from_savepoint(store, savepoint_uri, lease, **storage_options)
    return None if seeding is None else seeding.commit()


def start_from_savepoint(
    store: SnapshotStore, savepoint_uri: str, lease: WriterLease, **storage_options: Any
) -> Seeding | None:
    """Start copying the savepoint at ``savepoint_uri`` into ``store``, which ``lease`` holds,
    and committing it there; None when ``store`` has epochs already (the setting is ignored)."""
    if read_savepoint(store) is not None:
        raise SavepointLocationError(
            f"checkpoint.uri={store.uri} holds a savepoint ({MARKER}), which a pipeline never "
            "writes: give the pipeline a new checkpoint.uri and checkpoint.restore-from="
            f"{store.uri}"
        )
    epochs = store.epochs()
    if epochs:
        log.info(
            "%s has committed epochs (latest %d): resuming it; checkpoint.restore-from=%s is "
            "ignored",
            store.uri,
            epochs[-1],
            savepoint_uri,
        )
        return None
    savepoint = SnapshotStore(savepoint_uri, **storage_options)
    if savepoint.uri == store.uri:
        raise SavepointLocationError(
            f"checkpoint.restore-from and checkpoint.uri are both {store.uri}: give the "
            "pipeline a new checkpoint.uri"
        )
    marker = require_savepoint(savepoint)
    seeded = dataclasses.replace(savepoint.manifest(marker.epoch), owner=lease.owner)
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="statetier-seed")
    copied = pool.submit(copy_files, savepoint, store, seeded.files())
    pool.shutdown(wait=False)  # the thread ends with the copy
    log.info(
        "%s starts from savepoint %s (epoch %d of %s)",
        store.uri,
        savepoint_uri,
        marker.epoch,
        marker.source,
    )
    return Seeding(seeded, savepoint, store, lease, copied)
