"""The change feed of a state: what each epoch wrote and removed, from the checkpoint's deltas.

An incremental epoch writes, per (state, key-group range), a delta of exactly the keys it
touched: their new stored value, or a tombstone for a key it removed. So the changes of epoch
``e`` in a range are its manifest's delta of epoch ``e`` for that range, read as they are.
Where the manifest of ``e`` holds a base of epoch ``e`` instead (the first epoch, a full
snapshot, a rescale that cut new ranges), there is no delta to read: the base is compared with
the state of the range at ``e - 1``, key by key. A range with neither changed nothing in ``e``.

Every epoch of the feed needs its manifest (and a base comparison the one before it), so the
feed reaches back as far as ``checkpoint.retained`` keeps epochs; an epoch that is gone raises a
StateReadError naming it and the setting.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.snapshot.format import DataFileReader
from statetier.backend.snapshot.manifest import Chain, Manifest
from statetier.backend.snapshot.reading import StateReadError, check_state, read_stored
from statetier.backend.snapshot.store import NoSnapshotError, SnapshotStore

__all__ = ["Change", "UPSERT", "DELETE", "read_changes"]

UPSERT = "update"  # Spark's change feed calls a put an update
DELETE = "delete"


class Change(NamedTuple):
    """One key's change in one epoch: its new stored value, or None when it was removed."""

    epoch: int
    key_group: int
    key_bytes: bytes
    value_bytes: bytes | None


def read_changes(
    store: SnapshotStore,
    name: str,
    start: int,
    end: int,
    key_groups: KeyGroupRange,
    key_bytes: bytes | None = None,
) -> Iterator[Change]:
    """The changes of state ``name`` in ``key_groups`` made by epochs ``start`` to ``end``
    (both included), epoch by epoch; only ``key_bytes``'s when given.

    The state of ``key_groups`` before ``start`` is read first and kept up to date epoch by
    epoch: a delta is a superset of the keys an epoch changed (the key current at a snapshot
    is logged again), so a key is reported only where its stored bytes differ from before."""
    if start > end:
        raise StateReadError(
            f"changeStartEpoch {start} is after changeEndEpoch {end}; give start <= end"
        )
    current: dict[tuple[int, bytes], bytes] = {}
    if start > 1:
        before = _manifest(store, start - 1, "the state the feed starts from")
        stored = read_stored(store, before, name, key_groups, key_bytes)
        current = {(kg, key): value for kg, key, value in stored}
    for epoch in range(start, end + 1):
        manifest = _manifest(store, epoch, "in the change feed")
        check_state(manifest, name, store.uri)
        for chain in manifest.chains():
            overlap = KeyGroupRange.parse(chain.key_groups).intersection(key_groups)
            if chain.state == name and len(overlap):
                written = _written(store, manifest, chain, overlap, key_bytes)
                yield from _applied(epoch, written, current)


def _manifest(store: SnapshotStore, epoch: int, why: str) -> Manifest:
    try:
        return store.manifest(epoch)
    except NoSnapshotError:
        raise StateReadError(
            f"epoch {epoch}, {why}, is not retained under {store.uri} (committed: "
            f"{', '.join(map(str, store.epochs())) or 'none'}); start the feed later, or keep "
            "more epochs with checkpoint.retained"
        ) from None


# (the key groups a whole base replaces, or None for a delta; the entries written)
_Written = tuple[KeyGroupRange | None, list[tuple[int, bytes, bytes | None]]]


def _written(
    store: SnapshotStore,
    manifest: Manifest,
    chain: Chain,
    overlap: KeyGroupRange,
    key_bytes: bytes | None,
) -> _Written:
    """What ``chain`` of the manifest's epoch wrote in ``overlap``: its delta of that epoch,
    or all of its base of that epoch, or nothing."""
    epoch = manifest.epoch
    own = [d for d in chain.deltas if d.epoch == epoch]
    if own:
        entry = own[0]
        reader = DataFileReader(store.read(entry), store.full_path(entry.path), verified=True)
        found = [
            (key_group, key, value)
            for key_group in overlap
            for key, value in reader.read_block(key_group)
            if key_bytes is None or key == key_bytes
        ]
        return None, found
    if not chain.deltas and chain.base.epoch == epoch:
        return overlap, list(read_stored(store, manifest, chain.state, overlap, key_bytes))
    return None, []


def _applied(
    epoch: int, written: _Written, current: dict[tuple[int, bytes], bytes]
) -> Iterator[Change]:
    """The changes ``written`` makes to ``current`` (updated in place): keys whose bytes are
    new or differ, keys removed (a tombstone, or a key a whole base no longer has)."""
    replaced, entries = written
    if replaced is not None:
        kept = {(kg, key) for kg, key, _ in entries}
        gone = [k for k in current if k[0] in replaced and k not in kept]
        entries = [*entries, *((kg, key, None) for kg, key in sorted(gone))]
    for key_group, key, value in entries:
        slot = (key_group, key)
        if value is None:
            if current.pop(slot, None) is not None:
                yield Change(epoch, key_group, key, None)
        elif current.get(slot) != value:
            current[slot] = value
            yield Change(epoch, key_group, key, value)
