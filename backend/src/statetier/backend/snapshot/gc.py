"""Retention: keep the last N committed epochs, delete every file none of them names.

A file is deleted only when no retained manifest names it *and* it belongs to an epoch older than
the oldest retained one (its directory says which). Files of newer epochs that no manifest names
yet are uploads or compactions in flight, so they are left alone; a running writer also passes
the files its next manifest will name (``protect``). Manifests go first, oldest first, so a crash
in the middle never leaves a retained manifest naming a deleted file; the files follow in
batches (on object storage a request deletes a batch, where a file a request was most of an
epoch's deletions).

A writer that collects after every commit need not list the whole location each time (on an
object store a listing of every retained epoch's files is most of retention's cost): given
``since``, the oldest epoch the previous collection kept, it lists only the data directories of
the epochs falling out of retention now (one request each: an epoch's operator directory is
mostly empty, and an empty prefix costs s3fs three requests), and takes the files the manifests
it drops name (a compacted base lives in the directory of an older epoch than the manifests
naming it; operator files). What neither finds (an upload of a zombie attempt landing in an epoch
already collected, an operator file of a failed attempt, a compacted base never named) waits for
the next whole listing, which the caller makes now and then.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from statetier.backend.snapshot.layout import MANIFESTS, epoch_of
from statetier.backend.snapshot.store import SnapshotStore

__all__ = ["GcReport", "collect_garbage"]

DELETE_BATCH = 1000  # files a delete call takes (one S3 DeleteObjects request)


@dataclasses.dataclass
class GcReport:
    retained_epochs: list[int]
    deleted_manifests: list[str]
    deleted_files: list[str]
    freed_bytes: int


def collect_garbage(
    store: SnapshotStore,
    retained: int,
    *,
    protect: Iterable[str] = (),
    dry_run: bool = False,
    progress: Callable[[int], object] | None = None,
    since: int | None = None,
) -> GcReport:
    """Delete what the last ``retained`` committed epochs do not need; with ``since``, look
    only at the epochs from ``since`` on that fall out of retention now (see above)."""
    if retained < 1:
        raise ValueError("at least one epoch must be retained")
    epochs = store.epochs()
    keep = epochs[-retained:]
    if not keep:
        return GcReport([], [], [], 0)
    oldest_kept = keep[0]
    named = set(protect)
    for epoch in keep:
        named.update(f.path for f in store.manifest(epoch).files())
    dropped = [e for e in epochs if e < oldest_kept]
    if since is None:
        files = store.list_files()
    else:
        files = _falling_out(store, range(since, oldest_kept), dropped)
    old_manifests = [store.manifest_name(e) for e in dropped]
    garbage = []
    for name in sorted(files):
        if name.startswith(f"{MANIFESTS}/") or name in named:
            continue
        file_epoch = epoch_of(name)
        if file_epoch is not None and file_epoch < oldest_kept:
            garbage.append(name)
    freed = sum(files.get(n, 0) for n in [*old_manifests, *garbage])
    if not dry_run:
        for name in old_manifests:
            store.delete([name])
            if progress:
                progress(1)
        for start in range(0, len(garbage), DELETE_BATCH):
            batch = garbage[start : start + DELETE_BATCH]
            store.delete(batch)
            if progress:
                progress(len(batch))
    return GcReport(keep, old_manifests, garbage, freed)


def _falling_out(store: SnapshotStore, epochs: range, dropped: list[int]) -> dict[str, int]:
    """The files a collection since ``epochs.start`` must look at: those in the data
    directories of ``epochs``, and those the ``dropped`` manifests name (name -> size)."""
    files: dict[str, int] = {}
    for epoch in epochs:
        files.update(store.list_files(epoch))
    for epoch in dropped:
        files.update({f.path: f.size for f in store.manifest(epoch).files()})
    return files
