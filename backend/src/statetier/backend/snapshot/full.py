"""Full snapshots: every entry of every state of a backend, and their restore at any parallelism.

The writing side runs in each operator instance and returns a :class:`SubtaskSnapshot` (the files
it wrote); the committing side (the driver) gathers those of all instances into the manifest.
Restore reads the manifest and, for the backend's key-group range, the blocks of every file whose
range overlaps it, so state written at parallelism 4 restores at 1, 3 or 8 alike.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence
from typing import Any

from statetier.backend.keyed_backend import (
    KeyedStateBackend,
    RestoredState,
    check_restored_compatible,
    state_meta,
)
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.operator_state import OperatorStateBackend, Redistribution, even_split
from statetier.backend.snapshot.format import (
    DataFileReader,
    decode_operator_file,
    encode_data_file,
    encode_operator_file,
)
from statetier.backend.snapshot.manifest import FileEntry, Manifest
from statetier.backend.snapshot.store import SnapshotStore
from statetier.backend.state.table import StateTable
from statetier.backend.state.ttl_cleanup import purge_expired

__all__ = [
    "SnapshotError",
    "SubtaskSnapshot",
    "commit_snapshot",
    "restore_keyed_state",
    "restore_operator_state",
    "snapshot_subtask",
]


class SnapshotError(ValueError):
    """Snapshots of one epoch disagree (max parallelism, state kinds) or cannot be restored."""


@dataclasses.dataclass
class SubtaskSnapshot:
    """What one operator instance wrote for an epoch."""

    key_groups: KeyGroupRange | None
    max_parallelism: int | None
    key_serializer: str | None
    states: dict[str, dict[str, Any]]
    keyed_files: list[FileEntry]
    operator_file: FileEntry | None


def snapshot_subtask(
    store: SnapshotStore,
    epoch: int,
    keyed: KeyedStateBackend | None,
    operator: OperatorStateBackend | None = None,
) -> SubtaskSnapshot:
    """Write the full state of one operator instance for ``epoch``."""
    files: list[FileEntry] = []
    states: dict[str, dict[str, Any]] = {}
    if keyed is not None:
        for table in keyed.tables.values():
            states[table.name] = state_meta(table.descriptor)
            files.append(_write_table(store, epoch, keyed, table))
        for name, restored in keyed.restored.items():
            states[name] = restored.meta
            files.append(_write_restored(store, epoch, keyed.key_groups, name, restored))
    op_file = _write_operator(store, epoch, operator) if operator is not None else None
    return SubtaskSnapshot(
        key_groups=keyed.key_groups if keyed else None,
        max_parallelism=keyed.max_parallelism if keyed else None,
        key_serializer=keyed.key_serializer.id if keyed else None,
        states=states,
        keyed_files=files,
        operator_file=op_file,
    )


def _write_table(
    store: SnapshotStore, epoch: int, backend: KeyedStateBackend, table: StateTable
) -> FileEntry:
    descriptor = table.descriptor
    key_dumps = backend.key_serializer.dumps
    encode = table.codec.encode
    ttl = descriptor.ttl
    purge = ttl is not None and ttl.cleanup_full_snapshot
    now = backend.clock.now_ms()
    blocks = []
    for key_group in backend.key_groups:
        pairs = []
        for key, stored in table.map_for(key_group).items():
            kept = purge_expired(descriptor.kind, stored, ttl, now) if purge and ttl else stored
            if kept is not None:
                pairs.append((key_dumps(key), encode(kept)))
        blocks.append((key_group, pairs))
    return _write_blocks(store, epoch, backend.key_groups, table.name, blocks, backend)


def _write_restored(
    store: SnapshotStore,
    epoch: int,
    key_groups: KeyGroupRange,
    name: str,
    restored: RestoredState,
) -> FileEntry:
    blocks = [(kg, list(restored.entries.get(kg, []))) for kg in key_groups]
    return _write_blocks(store, epoch, key_groups, name, blocks, None)


def _write_blocks(
    store: SnapshotStore,
    epoch: int,
    key_groups: KeyGroupRange,
    name: str,
    blocks: list[tuple[int, list[tuple[bytes, bytes]]]],
    backend: KeyedStateBackend | None,
) -> FileEntry:
    header = {"state": name, "key_groups": str(key_groups), "epoch": epoch}
    if backend is not None:
        header["max_parallelism"] = backend.max_parallelism
    entry = store.write(
        store.keyed_file_name(epoch, name, key_groups), encode_data_file(header, blocks)
    )
    return dataclasses.replace(entry, state=name, key_groups=str(key_groups))


def _write_operator(store: SnapshotStore, epoch: int, backend: OperatorStateBackend) -> FileEntry:
    states: dict[str, dict[str, Any]] = {}
    for name, registered in backend.states.items():
        dumps = registered.descriptor.serializer.dumps
        states[name] = {
            "mode": registered.mode.value,
            "serializer": registered.descriptor.serializer.id,
            "elements": [dumps(e) for e in registered.state.elements],
        }
    for name, (mode, serializer_id, elements) in backend.restored.items():
        states[name] = {"mode": mode.value, "serializer": serializer_id, "elements": elements}
    name = store.operator_file_name(epoch, backend.index, backend.parallelism)
    entry = store.write(name, encode_operator_file(states))
    return dataclasses.replace(entry, operator_index=backend.index)


def commit_snapshot(
    store: SnapshotStore, epoch: int, subtasks: Sequence[SubtaskSnapshot]
) -> Manifest:
    """Check that the instances' snapshots fit together, then write the manifest."""
    keyed = [s for s in subtasks if s.key_groups is not None]
    max_parallelisms = {s.max_parallelism for s in keyed if s.max_parallelism is not None}
    if len(max_parallelisms) > 1:
        raise SnapshotError(f"instances disagree on max parallelism: {sorted(max_parallelisms)}")
    _check_ranges_disjoint(keyed)
    if keyed:
        _check_ranges_cover(keyed, next(iter(max_parallelisms)) or 0)
    states: dict[str, dict[str, Any]] = {}
    for subtask in keyed:
        for name, meta in subtask.states.items():
            if states.setdefault(name, meta) != meta:
                raise SnapshotError(
                    f"instances disagree on state {name!r}: {states[name]} vs {meta}"
                )
    manifest = Manifest(
        epoch=epoch,
        max_parallelism=max_parallelisms.pop() if max_parallelisms else 0,
        parallelism=len(subtasks),
        states=states,
        key_serializer=next((s.key_serializer for s in keyed if s.key_serializer), "msgpack"),
        keyed_files=[f for s in subtasks for f in s.keyed_files],
        operator_files=[s.operator_file for s in subtasks if s.operator_file is not None],
        created_ms=time.time_ns() // 1_000_000,
    )
    store.commit(manifest)
    return manifest


def _check_ranges_disjoint(subtasks: Sequence[SubtaskSnapshot]) -> None:
    ranges = sorted(r for r in (s.key_groups for s in subtasks) if r is not None)
    for left, right in itertools.pairwise(ranges):
        if right.start <= left.end:
            raise SnapshotError(f"key-group ranges {left} and {right} overlap")


def _check_ranges_cover(subtasks: Sequence[SubtaskSnapshot], max_parallelism: int) -> None:
    """A full snapshot must hold every key group: a missing range would silently drop state."""
    covered = sum(len(s.key_groups) for s in subtasks if s.key_groups is not None)
    if covered != max_parallelism:
        ranges = ", ".join(sorted(str(s.key_groups) for s in subtasks if s.key_groups))
        raise SnapshotError(
            f"the instances' key groups ({ranges}) cover {covered} of the {max_parallelism} key "
            "groups; a snapshot needs every range (is an instance's snapshot missing?)"
        )


def restore_keyed_state(
    store: SnapshotStore, backend: KeyedStateBackend, epoch: int | None = None
) -> Manifest:
    """Load the backend's key groups from the snapshot of ``epoch`` (default: the latest).

    States are kept as bytes until registered; already registered states are filled now.
    """
    manifest = store.manifest(epoch)
    if manifest.max_parallelism and manifest.max_parallelism != backend.max_parallelism:
        raise SnapshotError(
            f"snapshot of epoch {manifest.epoch} has max parallelism {manifest.max_parallelism}; "
            f"the backend has {backend.max_parallelism} (max parallelism is fixed once "
            "checkpointed)"
        )
    if manifest.key_serializer != backend.key_serializer.id:
        raise SnapshotError(
            f"snapshot keys were written with serializer {manifest.key_serializer!r}, the "
            f"backend uses {backend.key_serializer.id!r}"
        )
    restored: dict[str, RestoredState] = {
        name: RestoredState(meta, {}) for name, meta in manifest.states.items()
    }
    for entry in manifest.keyed_files:
        assert entry.key_groups is not None and entry.state is not None
        overlap = KeyGroupRange.parse(entry.key_groups).intersection(backend.key_groups)
        if not len(overlap):
            continue
        reader = DataFileReader(store.read(entry), store.full_path(entry.path))
        target = restored[entry.state].entries
        for key_group in overlap:
            pairs = reader.read_block(key_group)
            if pairs:
                target.setdefault(key_group, []).extend(pairs)
    for name, state in restored.items():
        table = backend.tables.get(name)
        if table is None:
            backend.restored[name] = state
        else:
            check_restored_compatible(state.meta, table.descriptor)
            _fill_registered(backend, table, state)
    return manifest


def _fill_registered(backend: KeyedStateBackend, table: StateTable, state: RestoredState) -> None:
    key_loads = backend.key_serializer.loads
    for key_group, pairs in state.entries.items():
        kg_map = table.map_for(key_group)
        kg_map.clear()
        for key_bytes, value_bytes in pairs:
            kg_map[key_loads(key_bytes)] = table.codec.decode(value_bytes)


def restore_operator_state(
    store: SnapshotStore, backend: OperatorStateBackend, epoch: int | None = None
) -> Manifest:
    """Redistribute the operator state of ``epoch`` to instance ``backend.index``."""
    manifest = store.manifest(epoch)
    per_state: dict[str, tuple[Redistribution, str, list[bytes]]] = {}
    for entry in sorted(manifest.operator_files, key=lambda e: e.operator_index or 0):
        decoded = decode_operator_file(store.read(entry), store.full_path(entry.path))
        for name, part in decoded.items():
            mode = Redistribution(part["mode"])
            known = per_state.setdefault(name, (mode, part["serializer"], []))
            if known[0] is not mode:
                raise SnapshotError(f"operator state {name!r} has mixed redistribution modes")
            known[2].extend(part["elements"])
    for name, (mode, serializer_id, elements) in per_state.items():
        mine = elements
        if mode is Redistribution.EVEN_SPLIT:
            mine = even_split(elements, backend.parallelism, backend.index)
        backend.restored[name] = (mode, serializer_id, mine)
    return manifest
