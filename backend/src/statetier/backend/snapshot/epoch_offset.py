"""Which epoch a streaming query's micro-batch is, at a location where bootstraps wrote epochs.

A query's micro-batch ``b`` is epoch ``b + 1``, unless epochs that ran no micro-batch were
committed there: a bootstrap's first epochs ``1..E`` (``write_state``, ``initial_state``)
before micro-batch 0, and an epoch ``write_state(add_epoch=True)`` committed over the query's
own (a repaired state written back between a stop and a restart). Micro-batch ``b`` is the
``b + 1``-th epoch that is none of these. The location records them in a small marker, so that
the Spark checkpoint's micro-batch ids, which know nothing of them, keep mapping to epochs
exactly once: a restarted query's next micro-batch runs on the added epoch, not as it.

The marker is written before the epoch's manifest (a query that sees the epoch also knows what
it is); an added epoch whose commit then failed is dropped by the next query that takes the
location's writer lease (:func:`pruned_offsets`), before a micro-batch of its own commits that
epoch number. The marker travels with the state: a savepoint of the location carries it (and
names its Spark micro-batch with it), and a location restored from that savepoint gets it too.
"""

from __future__ import annotations

import dataclasses
import time

from statetier.backend.snapshot.format import CorruptFileError
from statetier.backend.snapshot.manifest import checked_json, checksummed_json
from statetier.backend.snapshot.store import SnapshotStore, read_whole

__all__ = [
    "MARKER",
    "EpochOffsets",
    "bootstrap_epoch",
    "carry_bootstrap_marker",
    "epoch_offsets",
    "pruned_offsets",
    "record_added_epoch",
    "write_bootstrap_marker",
]

MARKER = "bootstrap.json"


@dataclasses.dataclass(frozen=True)
class EpochOffsets:
    """The epochs of a location that no micro-batch ran: ``1..first`` and ``added``."""

    first: int = 0
    added: tuple[int, ...] = ()

    def written(self) -> list[int]:
        """Every epoch a bootstrap wrote, ascending."""
        return sorted({*range(1, self.first + 1), *self.added})

    def epoch_of(self, batch_id: int) -> int:
        """The epoch of micro-batch ``batch_id``: the ``batch_id + 1``-th epoch no bootstrap
        wrote."""
        epoch = batch_id + 1
        for written in self.written():
            if written <= epoch:
                epoch += 1
        return epoch

    def micro_batch_of(self, epoch: int) -> int:
        """The last micro-batch whose records ``epoch``'s state holds; -1 when none ran."""
        return epoch - 1 - sum(1 for written in self.written() if written <= epoch)


def epoch_offsets(store: SnapshotStore) -> EpochOffsets:
    """The marker of ``store``; no epoch written by a bootstrap without one."""
    path = store.full_path(MARKER)
    try:
        data = read_whole(store.fs, path)
    except FileNotFoundError:
        return EpochOffsets()
    body = checked_json(data, path, "bootstrap marker")
    first, added = body.get("epoch"), body.get("added", [])
    if not isinstance(first, int) or first < 0:
        raise CorruptFileError(path, f"bootstrap marker has no epoch: {body}")
    if not isinstance(added, list) or not all(isinstance(e, int) and e > 0 for e in added):
        raise CorruptFileError(path, f"bootstrap marker has a bad list of added epochs: {body}")
    return EpochOffsets(first, tuple(added))


def bootstrap_epoch(store: SnapshotStore) -> int:
    """The epoch a bootstrap committed first at ``store`` (its marker), 0 without one."""
    return epoch_offsets(store).first


def _write(store: SnapshotStore, offsets: EpochOffsets) -> None:
    body: dict[str, object] = {"epoch": offsets.first, "created_ms": int(time.time() * 1000)}
    if offsets.added:
        body["added"] = list(offsets.added)
    store.put(MARKER, checksummed_json(body))


def write_bootstrap_marker(store: SnapshotStore, epoch: int) -> None:
    """Record that micro-batch 0 follows ``epoch`` at ``store``; written before that epoch's
    manifest, so a query that sees the epoch also sees the marker."""
    _write(store, EpochOffsets(epoch))


def record_added_epoch(store: SnapshotStore, epoch: int) -> None:
    """Record that ``epoch``, about to be committed over a query's epochs, ran no micro-batch;
    before its manifest, under the location's writer lease."""
    offsets = epoch_offsets(store)
    _write(store, dataclasses.replace(offsets, added=(*offsets.added, epoch)))


def pruned_offsets(store: SnapshotStore) -> EpochOffsets:
    """The marker of ``store`` less the added epochs that were never committed (a bootstrap
    that failed between its marker and its manifest), rewritten so: for a query that just
    took the writer lease, before it commits those epoch numbers itself."""
    offsets = epoch_offsets(store)
    if not offsets.added:
        return offsets
    epochs = store.epochs()
    latest = epochs[-1] if epochs else 0
    kept = tuple(e for e in offsets.added if e <= latest)
    if kept != offsets.added:
        offsets = dataclasses.replace(offsets, added=kept)
        _write(store, offsets)
    return offsets


def carry_bootstrap_marker(source: SnapshotStore, dest: SnapshotStore) -> int:
    """Give ``dest`` the marker of ``source`` if it has one (a savepoint, a restore from one);
    the first epoch it records, 0 without one."""
    offsets = epoch_offsets(source)
    if offsets.first or offsets.added:
        _write(dest, offsets)
    return offsets.first
