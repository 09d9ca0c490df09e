"""``checkpoint.restore-from``: a pipeline's first start from a savepoint.

A pipeline whose own checkpoint location holds no committed epoch starts from the savepoint:
the savepoint's files are copied into the pipeline's location under their names (by the
storage itself when both are on one object store, see transfer) and its manifest is committed
there, under the pipeline's writer lease, as the location's first epoch. From then on the
pipeline restores, checkpoints, compacts and retains its own location as usual, at any
parallelism (restore reads key groups, whatever ranges wrote them). The savepoint is only read,
and the new location never refers to it, so deleting it later breaks nothing (Flink's
"no claim" mode, made simple: the copy is the first checkpoint).

A location that has epochs already is resumed as it is and the setting is ignored (logged): a
restarted pipeline must not go back to the savepoint. A damaged savepoint fails the start: the
manifest and marker by their checksums here, a data file when the restore checks its blocks.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from statetier.backend.snapshot.manifest import Manifest
from statetier.backend.snapshot.savepoint import MARKER, read_savepoint, require_savepoint
from statetier.backend.snapshot.store import SnapshotStore, WriterLease
from statetier.backend.snapshot.transfer import copy_files

__all__ = ["SavepointLocationError", "seed_from_savepoint"]

log = logging.getLogger(__name__)


class SavepointLocationError(ValueError):
    """A pipeline was pointed at a savepoint as its own checkpoint location."""


def seed_from_savepoint(
    store: SnapshotStore, savepoint_uri: str, lease: WriterLease, **storage_options: Any
) -> Manifest | None:
    """Start ``store``, which ``lease`` holds, from the savepoint at ``savepoint_uri``: the
    committed manifest; None when ``store`` has epochs already (the setting is ignored)."""
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
    manifest = savepoint.manifest(marker.epoch)
    copy_files(savepoint, store, manifest.files())
    seeded = dataclasses.replace(manifest, owner=lease.owner)
    store.commit(seeded, lease)
    log.info(
        "%s starts from savepoint %s (epoch %d of %s)",
        store.uri,
        savepoint_uri,
        marker.epoch,
        marker.source,
    )
    return seeded
