"""A range's committed state handed from one process to another, in the checkpoint's encoding.

When a range moves to another state host while its old host is alive (rebalancing), the old host
holds exactly the committed state (heap and spilled key groups) and the new one would otherwise
download it from tier 2. The old host instead writes a full snapshot of it in memory (the
writer's own encoding: one base data file per state, the operator state's file), the new host
checks every file part by part as a restore does and takes the blocks lazily as a restore does.
The files never reach the object store: the new host's writer carries on the chains of the
committed manifest (tier 2's metadata), so its next snapshot is a delta as it would be after a
restore.

Union operator state is the one thing the old host does not hold whole (each instance's
committed lists together); a hand-off that carries some reads the operator state from tier 2.
"""

from __future__ import annotations

import dataclasses
import zlib

from statetier.backend.keyed_backend import KeyedStateBackend, RestoredState
from statetier.backend.operator_state import OperatorStateBackend, Redistribution
from statetier.backend.snapshot.commit import SnapshotError
from statetier.backend.snapshot.format import CorruptFileError, DataFileReader, decode_operator_file
from statetier.backend.snapshot.lazy import LazyEntries
from statetier.backend.snapshot.manifest import FileEntry, Manifest
from statetier.backend.snapshot.restore import restore_operator_state
from statetier.backend.snapshot.store import SnapshotStore
from statetier.backend.snapshot.writer import PreparedSubtask, SubtaskSnapshot, SubtaskWriter

__all__ = ["HandOff", "prepare_handoff", "restore_handoff"]


@dataclasses.dataclass(frozen=True)
class HandOff:
    """What a new owner restores a range from: the old owner's full snapshot of the committed
    epoch (``files``: path -> bytes, as ``snapshot`` names them) and the committed manifest
    whose chains the new owner's writer carries on."""

    snapshot: SubtaskSnapshot
    files: dict[str, bytes]
    committed: Manifest


def prepare_handoff(
    keyed: KeyedStateBackend,
    operator_state: OperatorStateBackend,
    store: SnapshotStore,
    epoch: int,
    codec: str,
) -> PreparedSubtask:
    """A full snapshot of the range's state as of committed ``epoch``, in memory: nothing is
    written to ``store`` (it only names the files). A writer of its own, so the range's own
    writer and its chains stay as they are."""
    writer = SubtaskWriter(keyed, operator_state, incremental=False, codec=codec)
    return writer.prepare(store, epoch, "handoff", full=True)


def restore_handoff(
    handoff: HandOff,
    keyed: KeyedStateBackend,
    operator_state: OperatorStateBackend,
    store: SnapshotStore,
) -> int:
    """Fill the (fresh) backends from ``handoff``; the bytes read from tier 2 (``store``) for
    it: 0, unless the range has union operator state. A file that fails its checks raises
    CorruptFileError (the caller restores from tier 2 instead)."""
    snapshot = handoff.snapshot
    if snapshot.key_serializer not in (None, keyed.key_serializer.id):
        raise SnapshotError(
            f"the handed-off keys use serializer {snapshot.key_serializer!r}, the backend "
            f"{keyed.key_serializer.id!r}"
        )
    for entry in snapshot.keyed_files:
        reader = _reader(entry, handoff.files)
        entries = LazyEntries()
        for key_group in keyed.key_groups:
            block = reader.block(key_group)
            if block is not None:
                entries.add(key_group, [block])
        assert entry.state is not None
        keyed.restored[entry.state] = RestoredState(snapshot.states[entry.state], entries)
    return _restore_operator_state(handoff, operator_state, store)


def _reader(entry: FileEntry, files: dict[str, bytes]) -> DataFileReader:
    """A reader of ``entry``'s handed-off bytes, every part checked (as a restore does)."""
    data = files.get(entry.path)
    if data is None or len(data) != entry.size or zlib.crc32(data) != entry.crc32:
        raise CorruptFileError(entry.path, "the handed-off file is missing or damaged")
    reader = DataFileReader(data, entry.path)
    reader.check_every_block()
    reader.check_is(entry.state, entry.key_groups, entry.kind, entry.epoch)
    return reader


def _restore_operator_state(
    handoff: HandOff, operator_state: OperatorStateBackend, store: SnapshotStore
) -> int:
    """The range's own operator lists from the handed-off file; union state from tier 2 (every
    instance's lists), whose bytes are returned."""
    entry = handoff.snapshot.operator_file
    if entry is None:
        return 0
    data = handoff.files.get(entry.path)
    if data is None or zlib.crc32(data) != entry.crc32:
        raise CorruptFileError(entry.path, "the handed-off operator state is missing or damaged")
    parts = decode_operator_file(data, entry.path)
    if any(Redistribution(part["mode"]) is Redistribution.UNION for part in parts.values()):
        manifest = restore_operator_state(store, operator_state, handoff.committed.epoch)
        return sum(f.size for f in manifest.operator_files)
    for name, part in parts.items():
        mode = Redistribution(part["mode"])
        operator_state.restored[name] = (mode, part["serializer"], list(part["elements"]))
    return 0
