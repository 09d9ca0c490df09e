"""Verification: read every file the committed manifests name and check every block.

What ``statetier checkpoint verify`` runs. Problems are collected, not raised, so one pass tells
everything that is wrong: which manifest, which file, which block, and what is wrong with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from statetier.backend.snapshot.format import CorruptFileError, DataFileReader, decode_operator_file
from statetier.backend.snapshot.manifest import FileEntry
from statetier.backend.snapshot.savepoint import read_savepoint
from statetier.backend.snapshot.store import SnapshotStore

__all__ = ["VerifyReport", "verify_savepoint", "verify_store"]


@dataclasses.dataclass
class VerifyReport:
    epochs: list[int]
    files: int
    bytes: int
    entries: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def _plan(store: SnapshotStore, epochs: list[int], problems: list[str]) -> dict[str, FileEntry]:
    files: dict[str, FileEntry] = {}
    for epoch in epochs:
        try:
            manifest = store.manifest(epoch)
        except (CorruptFileError, FileNotFoundError) as exc:
            problems.append(f"manifest of epoch {epoch}: {exc}")
            continue
        for entry in manifest.files():
            known = files.setdefault(entry.path, entry)
            if known != entry:
                problems.append(
                    f"{store.full_path(entry.path)}: manifests of different epochs disagree "
                    "on its size or checksum"
                )
    return files


def verify_store(
    store: SnapshotStore,
    epochs: list[int] | None = None,
    progress: Callable[[int], object] | None = None,
    on_plan: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Check the manifests of ``epochs`` (default: all committed) and every file they name."""
    problems: list[str] = []
    epochs = store.epochs() if epochs is None else epochs
    files = _plan(store, epochs, problems)
    if on_plan:
        on_plan(sum(f.size for f in files.values()))
    total_bytes = entries = 0
    for entry in files.values():
        path = store.full_path(entry.path)
        try:
            data = store.read(entry)
            if entry.operator_index is not None:
                decode_operator_file(data, path)
            else:
                reader = DataFileReader(data, path)
                reader.check_every_block()  # and that no byte lies outside the blocks
                entries += reader.verify()
                reader.check_is(entry.state, entry.key_groups, entry.kind, entry.epoch)
            total_bytes += len(data)
        except CorruptFileError as exc:
            problems.append(str(exc))
        except OSError as exc:
            problems.append(f"{path}: cannot be read: {exc}")
        if progress:
            progress(entry.size)
    return VerifyReport(epochs, len(files), total_bytes, entries, problems)


def verify_savepoint(store: SnapshotStore) -> list[str]:
    """The problems of what a savepoint holds besides its epoch (which :func:`verify_store`
    checks): its marker, the epoch it names, its Spark log entries. None for a location that
    is no savepoint."""
    try:
        marker = read_savepoint(store)
    except CorruptFileError as exc:
        return [str(exc)]
    if marker is None:
        return []
    problems = []
    epochs = store.epochs()
    if epochs != [marker.epoch]:
        problems.append(
            f"{store.uri}: the savepoint is of epoch {marker.epoch}, the location holds "
            f"epochs {epochs}"
        )
    for entry in marker.spark_files:
        try:
            store.read(entry)
        except CorruptFileError as exc:
            problems.append(str(exc))
        except OSError as exc:
            problems.append(f"{store.full_path(entry.path)}: cannot be read: {exc}")
    return problems
