"""What a range's writer changes in a state's chain after a compaction (see chain_compaction):
a module of its own, light to import, because the Spark tasks that carry the driver's updates to
the state hosts load no compaction and no file format."""

from __future__ import annotations

import dataclasses
from typing import Any

from statetier.backend.snapshot.manifest import Chain, FileEntry, Manifest

__all__ = ["ChainUpdate"]


@dataclasses.dataclass(frozen=True)
class ChainUpdate:
    """What a range's writer changes in one state's chain: ``inputs`` (a prefix of the chain)
    become ``base``; with no ``base``, the chain is cut (the next snapshot is a full base)."""

    state: str
    key_groups: str
    inputs: tuple[FileEntry, ...]
    base: FileEntry | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChainUpdate:
        base = data["base"]
        return cls(
            state=data["state"],
            key_groups=data["key_groups"],
            inputs=tuple(FileEntry(**f) for f in data["inputs"]),
            base=FileEntry(**base) if base is not None else None,
        )

    def applies_to(self, chain: Chain) -> bool:
        """Whether ``chain`` still starts with this update's inputs (nothing replaced it)."""
        files = chain.files
        return (
            chain.state == self.state
            and chain.key_groups == self.key_groups
            and files[: len(self.inputs)] == list(self.inputs)
        )

    def named_by(self, manifest: Manifest) -> bool:
        """Whether ``manifest`` names this update's compacted base (it took effect)."""
        return self.base is not None and any(f.path == self.base.path for f in manifest.files())
