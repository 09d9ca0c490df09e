"""Where snapshots live: the directory layout and the file I/O, through fsspec.

Layout under the snapshot URI (names are deterministic in (state, range, epoch), so a retried
attempt writes the same names)::

    manifests/epoch-0000000007.json          the commit record of epoch 7, written last
    data/epoch-0000000007/<state>/<kg range>.kgd    keyed state of one range
    operator/epoch-0000000007/<index>-of-<parallelism>.ops  operator state of one instance

Any fsspec URL works: ``file://`` (the embedded default), ``memory://``, ``s3://``.
"""

from __future__ import annotations

import re
import urllib.parse
import zlib
from typing import Any

import fsspec
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.snapshot.format import CorruptFileError
from statetier.backend.snapshot.manifest import FileEntry, Manifest

__all__ = ["NoSnapshotError", "SnapshotStore"]

_MANIFEST = re.compile(r"epoch-(\d{10})\.json$")


class NoSnapshotError(FileNotFoundError):
    """No committed snapshot exists at the location (or not the requested epoch)."""


class SnapshotStore:
    """Reads and writes snapshot files under one URI."""

    def __init__(self, uri: str, **storage_options: Any) -> None:
        self.uri = uri
        self.fs, root = fsspec.core.url_to_fs(uri, **storage_options)
        self.root = root.rstrip("/")
        self._local = "file" in _protocols(self.fs)

    # ------------------------------------------------------------------ names

    @staticmethod
    def keyed_file_name(epoch: int, state: str, key_groups: KeyGroupRange) -> str:
        return f"data/epoch-{epoch:010d}/{urllib.parse.quote(state, safe='')}/{key_groups}.kgd"

    @staticmethod
    def operator_file_name(epoch: int, index: int, parallelism: int) -> str:
        return f"operator/epoch-{epoch:010d}/{index}-of-{parallelism}.ops"

    @staticmethod
    def manifest_name(epoch: int) -> str:
        return f"manifests/epoch-{epoch:010d}.json"

    def full_path(self, name: str) -> str:
        return f"{self.root}/{name}"

    # ------------------------------------------------------------------ I/O

    def write(self, name: str, data: bytes) -> FileEntry:
        """Write one immutable file and return its manifest entry."""
        path = self.full_path(name)
        if self._local:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe_file(path, data)
        return FileEntry(path=name, size=len(data), crc32=zlib.crc32(data))

    def read(self, entry: FileEntry) -> bytes:
        """Read a file a manifest names, checking its size and checksum."""
        path = self.full_path(entry.path)
        try:
            data: bytes = self.fs.cat_file(path)
        except FileNotFoundError:
            raise CorruptFileError(path, "named by the manifest but missing") from None
        if len(data) != entry.size:
            raise CorruptFileError(path, f"has {len(data)} bytes, the manifest says {entry.size}")
        if zlib.crc32(data) != entry.crc32:
            raise CorruptFileError(path, "fails the checksum the manifest records for it")
        return data

    def commit(self, manifest: Manifest) -> None:
        """Write the manifest: from here on the epoch is committed."""
        name = self.manifest_name(manifest.epoch)
        path = self.full_path(name)
        data = manifest.to_json()
        if self._local:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            temp = f"{path}.tmp"
            self.fs.pipe_file(temp, data)
            self.fs.mv(temp, path)  # rename: readers never see a partial manifest
        else:
            self.fs.pipe_file(path, data)

    def epochs(self) -> list[int]:
        """Committed epochs, oldest first."""
        try:
            names = self.fs.ls(self.full_path("manifests"), detail=False)
        except FileNotFoundError:
            return []
        found = (_MANIFEST.search(str(name)) for name in names)
        return sorted(int(m.group(1)) for m in found if m)

    def manifest(self, epoch: int | None = None) -> Manifest:
        """The manifest of ``epoch``, or of the latest committed epoch."""
        if epoch is None:
            epochs = self.epochs()
            if not epochs:
                raise NoSnapshotError(f"no committed snapshot under {self.uri}")
            epoch = epochs[-1]
        path = self.full_path(self.manifest_name(epoch))
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            raise NoSnapshotError(f"epoch {epoch} is not committed under {self.uri}") from None
        return Manifest.from_json(data, path)


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
