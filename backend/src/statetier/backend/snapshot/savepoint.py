"""Savepoints: a self-contained copy of one committed epoch that its user owns.

A checkpoint is the running query's own recovery log: retention deletes its old epochs and its
chains share files across epochs. A savepoint (Flink's word) is one epoch taken out of it, to
start a new pipeline from (new code, new parallelism, another cluster). Its location has the
layout of a checkpoint location holding that one epoch, so ``verify``, ``list``, ``inspect``
and restore read it as they read a checkpoint, plus:

- ``savepoint.json``: the marker, written last (a savepoint exists once it does), with the
  source, the epoch, the Spark micro-batch and the Spark log entries with their checksums;
- ``spark/``: Spark's log entries of the matching micro-batch (see spark_log), when the
  query's Spark checkpoint location was given.

Every file the manifest names is inside the savepoint, under the name it had in the source,
so a savepoint copied elsewhere as it is (another bucket) is still whole. A chain whose deltas
a restore would pay for (several, or many bytes: see MERGE_DELTAS) is merged into one base (by
the rule restore and compaction apply, expired TTL entries kept), which restores from one file
instead of several; other chains, and operator state, are copied by the storage. Retention
and gc of the source never see a savepoint: it is another location, and gc refuses one.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any

from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.snapshot.compaction import merge_chain, needs_compaction
from statetier.backend.snapshot.epoch_offset import carry_bootstrap_marker, epoch_offsets
from statetier.backend.snapshot.format import (
    BASE,
    CorruptFileError,
    DataFileBuilder,
    DataFileReader,
)
from statetier.backend.snapshot.layout import keyed_file_name
from statetier.backend.snapshot.lazy import bulk_allocation
from statetier.backend.snapshot.manifest import (
    Chain,
    FileEntry,
    Manifest,
    checked_json,
    checksummed_json,
)
from statetier.backend.snapshot.spark_log import save_spark_log
from statetier.backend.snapshot.store import NoSnapshotError, SnapshotStore, read_whole
from statetier.backend.snapshot.transfer import copy_files

__all__ = [
    "MARKER",
    "NotASavepointError",
    "Savepoint",
    "SavepointExistsError",
    "delete_savepoint",
    "read_savepoint",
    "require_savepoint",
    "take_savepoint",
]

MARKER = "savepoint.json"
OWNER = "savepoint"  # the writer segment of merged bases' names (no lease token looks like it)
MERGE_CONCURRENCY = 2  # chains merged at once (each holds its chain's bytes in memory)
# A chain is merged when a restore would read notably more than one base: this many deltas, or
# deltas of this fraction of the base's bytes. A merge downloads and uploads the whole chain
# where a copy moves no byte through this process (a 587 MiB state whose chains had two deltas
# of 2% each: 35 s merged, against 6 s for the store's copy), and a restore reads a small delta
# or two in the same round trips as the base.
MERGE_DELTAS = 3
MERGE_RATIO = 0.25


class NotASavepointError(NoSnapshotError):
    """The location holds no savepoint (no marker)."""


class SavepointExistsError(FileExistsError):
    """The destination of a savepoint already holds one, or a checkpoint."""


@dataclasses.dataclass(frozen=True)
class Savepoint:
    """The marker: what the savepoint holds besides the manifest of ``epoch``."""

    source: str
    epoch: int
    created_ms: int
    spark_batch: int | None
    spark_files: list[FileEntry]

    def to_json(self) -> bytes:
        return checksummed_json(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, data: bytes, path: str) -> Savepoint:
        body = checked_json(data, path, "savepoint marker")
        try:
            body["spark_files"] = [FileEntry(**f) for f in body["spark_files"]]
            return cls(**body)
        except (KeyError, TypeError) as exc:
            raise CorruptFileError(
                path, f"savepoint marker has an unexpected shape: {exc}"
            ) from None


def read_savepoint(store: SnapshotStore) -> Savepoint | None:
    """The marker of the savepoint at ``store`` (None: the location holds no savepoint)."""
    path = store.full_path(MARKER)
    try:
        data = read_whole(store.fs, path)
    except FileNotFoundError:
        return None
    return Savepoint.from_json(data, path)


def require_savepoint(store: SnapshotStore) -> Savepoint:
    found = read_savepoint(store)
    if found is None:
        raise NotASavepointError(
            f"{store.uri} holds no savepoint (no {MARKER}); take one with "
            "statetier checkpoint savepoint SOURCE_URI DEST_URI"
        )
    return found


def take_savepoint(
    source: SnapshotStore,
    dest: SnapshotStore,
    epoch: int | None = None,
    spark_checkpoint: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Savepoint:
    """Copy committed ``epoch`` (default: the latest) of ``source`` into a savepoint at
    ``dest``, with the Spark log entries of the epoch's micro-batch (``epoch - 1``, less the
    epochs bootstraps wrote up to it: see epoch_offset) from ``spark_checkpoint``."""
    _check_destination(source, dest)
    manifest = source.manifest(epoch)
    last_batch = epoch_offsets(source).micro_batch_of(manifest.epoch)
    spark_batch = None if spark_checkpoint is None else last_batch
    if spark_batch is not None and spark_batch < 0:
        raise ValueError(
            f"epoch {manifest.epoch} of {source.uri} is its bootstrap's: no micro-batch ran "
            "yet, so it has no Spark log to save; take the savepoint without a Spark checkpoint"
        )
    try:
        keyed = _keyed_files(source, dest, manifest)
        copy_files(source, dest, manifest.operator_files)
    except (FileNotFoundError, CorruptFileError) as exc:
        if manifest.epoch in source.epochs():
            raise
        raise NoSnapshotError(
            f"epoch {manifest.epoch} was deleted from {source.uri} while the savepoint was "
            f"taken (retention: checkpoint.retained); take a newer epoch ({exc})"
        ) from None
    spark_files = []
    if spark_checkpoint is not None:
        assert spark_batch is not None
        spark_files = save_spark_log(spark_checkpoint, dest, spark_batch, storage_options or {})
    carry_bootstrap_marker(source, dest)  # before the manifest, as the bootstrap wrote it
    dest.commit(dataclasses.replace(manifest, keyed_files=keyed, owner=OWNER))
    marker = Savepoint(source.uri, manifest.epoch, _now_ms(), spark_batch, spark_files)
    if dest.conditional.create(dest.full_path(MARKER), marker.to_json()) is None:
        raise SavepointExistsError(f"{dest.uri} got a savepoint from another writer meanwhile")
    return marker


def _now_ms() -> int:
    return int(time.time() * 1000)


def _check_destination(source: SnapshotStore, dest: SnapshotStore) -> None:
    """Refuse a destination that holds a savepoint or a checkpoint, or lies in the source."""
    if dest.uri == source.uri or dest.uri.startswith(source.uri + "/"):
        raise ValueError(f"the savepoint {dest.uri} may not lie inside its source {source.uri}")
    if read_savepoint(dest) is not None:
        raise SavepointExistsError(
            f"{dest.uri} already holds a savepoint; give another destination or delete it "
            f"first (statetier checkpoint delete-savepoint {dest.uri})"
        )
    if dest.epochs():
        raise SavepointExistsError(
            f"{dest.uri} holds a checkpoint (or a savepoint that was never finished); give an "
            "empty destination"
        )


def _keyed_files(source: SnapshotStore, dest: SnapshotStore, manifest: Manifest) -> list[FileEntry]:
    """The savepoint's keyed files: the chains worth merging merged, the others copied."""
    chains = manifest.chains()
    merge = [needs_compaction(c, MERGE_DELTAS, MERGE_RATIO) for c in chains]
    kept = [f for chain, m in zip(chains, merge, strict=True) if not m for f in chain.files]
    copy_files(source, dest, kept)
    with concurrent.futures.ThreadPoolExecutor(MERGE_CONCURRENCY) as pool:
        todo = [chain for chain, m in zip(chains, merge, strict=True) if m]
        merged = list(pool.map(lambda c: _merged(source, dest, manifest, c), todo))
    return [*kept, *merged]


def _merged(
    source: SnapshotStore, dest: SnapshotStore, manifest: Manifest, chain: Chain
) -> FileEntry:
    """One chain merged into one base written to ``dest`` (every input checked as read)."""
    datas = source.read_many(chain.files)
    readers = [
        DataFileReader(data, source.full_path(f.path), verified=True)
        for f, data in zip(chain.files, datas, strict=True)
    ]
    last = chain.files[-1]
    builder = DataFileBuilder(
        {
            "state": chain.state,
            "key_groups": chain.key_groups,
            "epoch": last.epoch,
            "kind": BASE,
            "max_parallelism": manifest.max_parallelism,
            "compacted_from": len(chain.files),
            "codec": readers[-1].codec,
            "layout": readers[-1].layout,
        }
    )
    with bulk_allocation():
        parts = merge_chain(builder, KeyGroupRange.parse(chain.key_groups), readers)
        data = b"".join(parts)
    name = keyed_file_name(manifest.epoch, chain.state, chain.key_groups, BASE, OWNER)
    dest.put(name, data)
    return FileEntry(
        path=name,
        size=len(data),
        crc32=builder.crc32,
        state=chain.state,
        key_groups=chain.key_groups,
        kind=BASE,
        epoch=last.epoch,
    )


def delete_savepoint(store: SnapshotStore) -> list[str]:
    """Delete the savepoint at ``store``: exactly the files its marker and manifest name, the
    marker first (from then on it is no savepoint, and a half-deleted one is never read)."""
    marker = require_savepoint(store)
    names = [f.path for f in marker.spark_files]
    try:
        manifest = store.manifest(marker.epoch)
        names += [f.path for f in manifest.files()] + [store.manifest_name(marker.epoch)]
    except NoSnapshotError:
        pass  # a savepoint whose manifest is gone: the rest of it is still ours to delete
    # (a damaged manifest raises here, before anything is deleted: its names are unknown)
    store.delete([MARKER])
    store.delete(names)
    return [MARKER, *names]
