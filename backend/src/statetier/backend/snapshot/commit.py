"""Committing an epoch: check that the instances' snapshots fit together, write the manifest.

The driver gathers every instance's :class:`SubtaskSnapshot` (after their uploads finished) and
writes the manifest last; that write is the commit (see store and fencing). A snapshot that
would lose state (a missing range, overlapping ranges, disagreeing state kinds) is refused
before anything is committed.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

from statetier.backend.snapshot.manifest import Manifest
from statetier.backend.snapshot.store import SnapshotStore, WriterLease
from statetier.backend.snapshot.writer import SubtaskSnapshot

__all__ = ["SnapshotError", "build_manifest", "commit_snapshot"]


class SnapshotError(ValueError):
    """Snapshots of one epoch disagree (max parallelism, state kinds) or cannot be restored."""


def build_manifest(epoch: int, subtasks: Sequence[SubtaskSnapshot], owner: str = "") -> Manifest:
    """The manifest of ``epoch`` from its instances' snapshots, checked."""
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
    return Manifest(
        epoch=epoch,
        max_parallelism=max_parallelisms.pop() if max_parallelisms else 0,
        parallelism=len(subtasks),
        states=states,
        key_serializer=next((s.key_serializer for s in keyed if s.key_serializer), "msgpack"),
        keyed_files=[f for s in subtasks for f in s.keyed_files],
        operator_files=[s.operator_file for s in subtasks if s.operator_file is not None],
        created_ms=time.time_ns() // 1_000_000,
        owner=owner,
    )


def commit_snapshot(
    store: SnapshotStore,
    epoch: int,
    subtasks: Sequence[SubtaskSnapshot],
    lease: WriterLease | None = None,
) -> Manifest:
    """Check that the instances' snapshots fit together, then write the manifest."""
    manifest = build_manifest(epoch, subtasks, lease.owner if lease else "")
    store.commit(manifest, lease)
    return manifest


def _check_ranges_disjoint(subtasks: Sequence[SubtaskSnapshot]) -> None:
    ranges = sorted(r for r in (s.key_groups for s in subtasks) if r is not None)
    for left, right in itertools.pairwise(ranges):
        if right.start <= left.end:
            raise SnapshotError(f"key-group ranges {left} and {right} overlap")


def _check_ranges_cover(subtasks: Sequence[SubtaskSnapshot], max_parallelism: int) -> None:
    """A snapshot must hold every key group: a missing range would silently drop state."""
    covered = sum(len(s.key_groups) for s in subtasks if s.key_groups is not None)
    if covered != max_parallelism:
        ranges = ", ".join(sorted(str(s.key_groups) for s in subtasks if s.key_groups))
        raise SnapshotError(
            f"the instances' key groups ({ranges}) cover {covered} of the {max_parallelism} key "
            "groups; a snapshot needs every range (is an instance's snapshot missing?)"
        )
