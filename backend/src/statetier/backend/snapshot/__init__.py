"""Checkpoints of keyed and operator state in object storage (tier 2).

The file format (format), the manifest (manifest), the store and its commit (store, fencing,
retry), serialization of live state (serialize) by each instance's writer (writer), the epoch
pipeline with background uploads (checkpointer), restore at any parallelism (restore),
compaction, retention (gc) and verification (verify). See docs/checkpoints.md.
"""

from statetier.backend.snapshot.checkpointer import (
    Checkpointer,
    CheckpointError,
    CheckpointSettings,
)
from statetier.backend.snapshot.commit import SnapshotError, build_manifest, commit_snapshot
from statetier.backend.snapshot.compaction import (
    CompactionRequest,
    CompactionResult,
    Compactor,
    LocalCompactor,
)
from statetier.backend.snapshot.fencing import FencedError
from statetier.backend.snapshot.format import CorruptFileError
from statetier.backend.snapshot.full import snapshot_subtask
from statetier.backend.snapshot.gc import GcReport, collect_garbage
from statetier.backend.snapshot.manifest import Chain, FileEntry, Manifest
from statetier.backend.snapshot.restore import (
    read_key_groups,
    restore_keyed_state,
    restore_operator_state,
    restored_bytes,
)
from statetier.backend.snapshot.retry import RetryPolicy, StorageError
from statetier.backend.snapshot.store import NoSnapshotError, SnapshotStore, WriterLease
from statetier.backend.snapshot.writer import PreparedSubtask, SubtaskSnapshot, SubtaskWriter

__all__ = [
    "Chain",
    "CheckpointError",
    "CheckpointSettings",
    "Checkpointer",
    "CompactionRequest",
    "CompactionResult",
    "Compactor",
    "CorruptFileError",
    "FencedError",
    "FileEntry",
    "GcReport",
    "LocalCompactor",
    "Manifest",
    "NoSnapshotError",
    "PreparedSubtask",
    "RetryPolicy",
    "SnapshotError",
    "SnapshotStore",
    "StorageError",
    "SubtaskSnapshot",
    "SubtaskWriter",
    "WriterLease",
    "build_manifest",
    "collect_garbage",
    "commit_snapshot",
    "read_key_groups",
    "restore_keyed_state",
    "restore_operator_state",
    "restored_bytes",
    "snapshot_subtask",
]
