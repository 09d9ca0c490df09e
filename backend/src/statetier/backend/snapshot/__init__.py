"""Checkpoints of keyed and operator state in object storage (tier 2).

The file format (format), the manifest (manifest), the store and its commit (store, fencing,
retry), serialization of live state (serialize) by each instance's writer (writer), the epoch
pipeline with background uploads (checkpointer), restore at any parallelism (restore),
compaction, retention (gc) and verification (verify). See docs/checkpoints.md.

The package is imported lazily: a name is loaded from its module when it is first used, so that
importing one light module of the package (the manifest, a chain update) does not load them
all; a Spark task, which only passes chain updates on, would load the codecs, fsspec and the
metrics server with them.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from statetier.backend.snapshot.versions import CorruptFileError
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

# where each name of __all__ is loaded from
_MODULES = {
    "Chain": "manifest",
    "CheckpointError": "checkpointer",
    "CheckpointSettings": "checkpointer",
    "Checkpointer": "checkpointer",
    "CompactionRequest": "compaction",
    "CompactionResult": "compaction",
    "Compactor": "compaction",
    "CorruptFileError": "versions",
    "FencedError": "fencing",
    "FileEntry": "manifest",
    "GcReport": "gc",
    "LocalCompactor": "compaction",
    "Manifest": "manifest",
    "NoSnapshotError": "store",
    "PreparedSubtask": "writer",
    "RetryPolicy": "retry",
    "SnapshotError": "commit",
    "SnapshotStore": "store",
    "StorageError": "retry",
    "SubtaskSnapshot": "writer",
    "SubtaskWriter": "writer",
    "WriterLease": "store",
    "build_manifest": "commit",
    "collect_garbage": "gc",
    "commit_snapshot": "commit",
    "read_key_groups": "restore",
    "restore_keyed_state": "restore",
    "restore_operator_state": "restore",
    "restored_bytes": "restore",
    "snapshot_subtask": "full",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
