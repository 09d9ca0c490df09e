"""The epoch manifest: the commit record and the only source of truth of a snapshot.

A snapshot is committed when its manifest exists; data files that no manifest names are ignored
by readers (they are leftovers of a failed attempt). The manifest is JSON, so it can be read by
people and tools, and carries a checksum of its own content so a damaged one is detected.

Keyed files form one chain per (state, key-group range): a base (every entry of the range as of
its epoch) and the deltas written after it, oldest first. The chains of one state cover every
key group exactly once, so restoring a key group means: its chain's base, then each delta.
Unchanged chains are carried from manifest to manifest, which is what makes a checkpoint's cost
follow the change: an incremental epoch adds one small delta per range and names the rest.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from typing import Any

from statetier.backend.snapshot.versions import BASE, DELTA, FORMAT_VERSION, CorruptFileError

__all__ = ["Chain", "FileEntry", "Manifest"]


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One data file a manifest names. ``key_groups`` is ``"start-end"`` for keyed files, whose
    ``kind`` is "base" or "delta"; operator state files have ``operator_index``. ``epoch`` is
    the epoch whose state the file holds (a compacted base holds its last input's epoch)."""

    path: str
    size: int
    crc32: int
    state: str | None = None
    key_groups: str | None = None
    operator_index: int | None = None
    kind: str = BASE
    epoch: int = 0


@dataclasses.dataclass(frozen=True)
class Chain:
    """The files of one state's key-group range: a base, then deltas in epoch order."""

    state: str
    key_groups: str
    base: FileEntry
    deltas: tuple[FileEntry, ...]

    @property
    def files(self) -> list[FileEntry]:
        return [self.base, *self.deltas]

    @property
    def delta_bytes(self) -> int:
        return sum(d.size for d in self.deltas)


def checksummed_json(body: dict[str, Any]) -> bytes:
    """``body`` as JSON with the crc32 of its compact form beside it (manifests, markers): a
    reader tells a torn or flipped file from a valid one."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps(
        {**body, "crc32": zlib.crc32(text.encode())}, sort_keys=True, indent=1
    ).encode()


def checked_json(data: bytes, path: str, what: str) -> dict[str, Any]:
    """The body :func:`checksummed_json` wrote, once its crc32 matches: CorruptFileError
    naming ``path`` and ``what`` it is otherwise."""
    try:
        body = json.loads(data)
        stored = body.pop("crc32")
    except (ValueError, KeyError, AttributeError, TypeError) as exc:
        raise CorruptFileError(path, f"{what} is not valid JSON with a crc32: {exc}") from None
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if zlib.crc32(text.encode()) != stored:
        raise CorruptFileError(path, f"{what} fails its checksum")
    return dict(body)


@dataclasses.dataclass(frozen=True)
class Manifest:
    epoch: int
    max_parallelism: int
    parallelism: int
    states: dict[str, dict[str, Any]]
    key_serializer: str
    keyed_files: list[FileEntry]
    operator_files: list[FileEntry]
    created_ms: int
    format_version: int = FORMAT_VERSION
    owner: str = ""  # the writer's fencing token (see snapshot.fencing)

    def chains(self) -> list[Chain]:
        """The keyed files grouped into chains, sorted by state and range."""
        return build_chains(self.keyed_files, "manifest")

    def files(self) -> list[FileEntry]:
        """Every data file the manifest names."""
        return [*self.keyed_files, *self.operator_files]

    def to_json(self) -> bytes:
        return checksummed_json(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, data: bytes, path: str) -> Manifest:
        body = checked_json(data, path, "manifest")
        if body.get("format_version", 0) > FORMAT_VERSION:
            raise CorruptFileError(
                path, f"format version {body['format_version']} is newer than this reader"
            )
        try:
            body["keyed_files"] = [FileEntry(**f) for f in body["keyed_files"]]
            body["operator_files"] = [FileEntry(**f) for f in body["operator_files"]]
            manifest = cls(**body)
        except (TypeError, KeyError) as exc:
            raise CorruptFileError(path, f"manifest has an unexpected shape: {exc}") from None
        build_chains(manifest.keyed_files, path)  # a manifest with a broken chain is refused
        return manifest


def build_chains(files: list[FileEntry], where: str) -> list[Chain]:
    """Group keyed files by (state, range): exactly one base each, deltas newer than it."""
    bases: dict[tuple[str, str], FileEntry] = {}
    deltas: dict[tuple[str, str], list[FileEntry]] = {}
    for entry in files:
        if entry.state is None or entry.key_groups is None:
            raise CorruptFileError(where, f"keyed file {entry.path} has no state or range")
        key = (entry.state, entry.key_groups)
        if entry.kind == BASE:
            if key in bases:
                raise CorruptFileError(
                    where, f"two bases for state {entry.state!r} range {entry.key_groups}"
                )
            bases[key] = entry
        elif entry.kind == DELTA:
            deltas.setdefault(key, []).append(entry)
        else:
            raise CorruptFileError(where, f"keyed file {entry.path} has kind {entry.kind!r}")
    chains = []
    for key in sorted(bases):
        base = bases[key]
        own = sorted(deltas.pop(key, []), key=lambda d: d.epoch)
        if any(d.epoch <= base.epoch for d in own):
            raise CorruptFileError(where, f"a delta of {key} is not newer than its base")
        chains.append(Chain(key[0], key[1], base, tuple(own)))
    if deltas:
        state, key_groups = next(iter(deltas))
        raise CorruptFileError(where, f"deltas of state {state!r} range {key_groups} lack a base")
    return chains
