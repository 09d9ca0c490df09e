"""Snapshots of keyed and operator state: the file format, the manifest, the store, and the
full-snapshot strategy with restore at any parallelism."""

from statetier.backend.snapshot.format import CorruptFileError
from statetier.backend.snapshot.full import (
    SnapshotError,
    SubtaskSnapshot,
    commit_snapshot,
    restore_keyed_state,
    restore_operator_state,
    snapshot_subtask,
)
from statetier.backend.snapshot.manifest import FileEntry, Manifest
from statetier.backend.snapshot.store import NoSnapshotError, SnapshotStore

__all__ = [
    "CorruptFileError",
    "FileEntry",
    "Manifest",
    "NoSnapshotError",
    "SnapshotError",
    "SnapshotStore",
    "SubtaskSnapshot",
    "commit_snapshot",
    "restore_keyed_state",
    "restore_operator_state",
    "snapshot_subtask",
]
