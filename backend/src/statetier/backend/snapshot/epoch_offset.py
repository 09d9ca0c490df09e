"""Which epoch a streaming query's micro-batch is, at a location that began with a bootstrap.

A query's micro-batch ``b`` is epoch ``b + 1``. A location whose first epoch a bootstrap wrote
(``write_state``, ``initial_state``) already holds epoch ``E`` before micro-batch 0 runs, so
there micro-batch ``b`` is epoch ``b + 1 + E``; the location records ``E`` in a small marker.
The marker travels with the state: a savepoint of the location carries it (and names its Spark
micro-batch with it), and a location restored from that savepoint gets it too.
"""

from __future__ import annotations

import time

from statetier.backend.snapshot.format import CorruptFileError
from statetier.backend.snapshot.manifest import checked_json, checksummed_json
from statetier.backend.snapshot.store import SnapshotStore, read_whole

__all__ = ["MARKER", "bootstrap_epoch", "carry_bootstrap_marker", "write_bootstrap_marker"]

MARKER = "bootstrap.json"


def bootstrap_epoch(store: SnapshotStore) -> int:
    """The epoch a bootstrap committed first at ``store`` (its marker), 0 without one: a
    streaming query's micro-batch ``b`` is epoch ``b + 1 +`` this."""
    path = store.full_path(MARKER)
    try:
        data = read_whole(store.fs, path)
    except FileNotFoundError:
        return 0
    body = checked_json(data, path, "bootstrap marker")
    epoch = body.get("epoch")
    if not isinstance(epoch, int) or epoch < 0:
        raise CorruptFileError(path, f"bootstrap marker has no epoch: {body}")
    return epoch


def write_bootstrap_marker(store: SnapshotStore, epoch: int) -> None:
    """Record that micro-batch 0 follows ``epoch`` at ``store``; written before that epoch's
    manifest, so a query that sees the epoch also sees the marker."""
    store.put(MARKER, checksummed_json({"epoch": epoch, "created_ms": int(time.time() * 1000)}))


def carry_bootstrap_marker(source: SnapshotStore, dest: SnapshotStore) -> int:
    """Give ``dest`` the marker of ``source`` if it has one (a savepoint, a restore from one);
    the epoch it records, 0 without one."""
    epoch = bootstrap_epoch(source)
    if epoch:
        write_bootstrap_marker(dest, epoch)
    return epoch
