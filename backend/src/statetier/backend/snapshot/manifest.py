"""The epoch manifest: the commit record and the only source of truth of a snapshot.

A snapshot is committed when its manifest exists; data files that no manifest names are ignored
by readers (they are leftovers of a failed attempt). The manifest is JSON, so it can be read by
people and tools, and carries a checksum of its own content so a damaged one is detected.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from typing import Any

from statetier.backend.snapshot.format import FORMAT_VERSION, CorruptFileError

__all__ = ["FileEntry", "Manifest"]


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One data file a manifest names. ``key_groups`` is ``"start-end"`` for keyed files;
    operator state files have ``operator_index``."""

    path: str
    size: int
    crc32: int
    state: str | None = None
    key_groups: str | None = None
    operator_index: int | None = None


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

    def to_json(self) -> bytes:
        body = dataclasses.asdict(self)
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        body["crc32"] = zlib.crc32(text.encode())
        return json.dumps(body, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, path: str) -> Manifest:
        try:
            body = json.loads(data)
            stored_crc = body.pop("crc32")
        except (ValueError, KeyError, AttributeError) as exc:
            raise CorruptFileError(
                path, f"manifest is not valid JSON with a crc32: {exc}"
            ) from None
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        if zlib.crc32(text.encode()) != stored_crc:
            raise CorruptFileError(path, "manifest fails its checksum")
        if body.get("format_version", 0) > FORMAT_VERSION:
            raise CorruptFileError(
                path, f"format version {body['format_version']} is newer than this reader"
            )
        body["keyed_files"] = [FileEntry(**f) for f in body["keyed_files"]]
        body["operator_files"] = [FileEntry(**f) for f in body["operator_files"]]
        return cls(**body)
