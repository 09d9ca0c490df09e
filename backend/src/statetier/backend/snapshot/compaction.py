"""Compaction: merging a range's base and deltas into a new base.

Deltas keep checkpoints cheap, but a restore reads every file of a chain; when deltas pile up
(``compaction.delta-trigger`` files, or more delta bytes than ``compaction.size-ratio`` times the
base) the chain is merged into one base with the same merge rule restore uses, so what a restore
returns never changes. Tombstones disappear in the merge. Most of a compaction is moving bytes,
so key groups that no delta touches keep their base block as-is (no decoding, no re-encoding;
see :class:`~statetier.backend.snapshot.format.DataFileBuilder`) and only the touched ones are
merged.

Expired TTL entries are kept, even for states that drop them from full snapshots: neither the
request nor the files say whether a state asks for that (the cleanup setting is not recorded)
or what time it is for the pipeline.

The :class:`Compactor` interface takes a JSON-serializable :class:`CompactionRequest` (input
files with their sizes and checksums, key-group range, output prefix, format version) and
returns a :class:`CompactionResult` (output files with sizes and checksums). The
:class:`LocalCompactor` runs it in this process; a remote compactor (the compaction service)
implements the same interface over HTTP with the same JSON.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import json
import operator
import uuid
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import fsspec
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.snapshot.blocks import decode_block
from statetier.backend.snapshot.format import (
    BASE,
    FORMAT_VERSION,
    CorruptFileError,
    DataFileBuilder,
    DataFileReader,
)
from statetier.backend.snapshot.layout import compacted_base_name
from statetier.backend.snapshot.manifest import Chain, FileEntry
from statetier.backend.snapshot.store import put_whole

__all__ = [
    "CompactionError",
    "CompactionInput",
    "CompactionOutput",
    "CompactionRequest",
    "CompactionResult",
    "Compactor",
    "LocalCompactor",
    "needs_compaction",
]


class CompactionError(RuntimeError):
    """A compaction could not be done (bad input, unsupported version, storage failure)."""


@dataclasses.dataclass(frozen=True)
class CompactionInput:
    """One input file: its URL, and what the manifest says its size and checksum are."""

    url: str
    size: int
    crc32: int
    kind: str
    epoch: int


@dataclasses.dataclass(frozen=True)
class CompactionRequest:
    job_id: str
    state: str
    key_groups: str
    inputs: list[CompactionInput]
    output_prefix: str
    format_version: int = FORMAT_VERSION
    max_parallelism: int = 0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> CompactionRequest:
        body = json.loads(text)
        body["inputs"] = [CompactionInput(**i) for i in body["inputs"]]
        return cls(**body)


@dataclasses.dataclass(frozen=True)
class CompactionOutput:
    url: str
    size: int
    crc32: int


@dataclasses.dataclass(frozen=True)
class CompactionResult:
    job_id: str
    outputs: list[CompactionOutput]
    entries: int = 0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> CompactionResult:
        body = json.loads(text)
        body["outputs"] = [CompactionOutput(**o) for o in body["outputs"]]
        return cls(**body)


class Compactor(Protocol):
    """Merges the input files of one (state, range) into one base under the output prefix."""

    def compact(self, request: CompactionRequest) -> CompactionResult: ...


def needs_compaction(chain: Chain, delta_trigger: int, size_ratio: float) -> bool:
    """Whether ``chain`` has piled up enough deltas to be merged."""
    if not chain.deltas:
        return False
    return len(chain.deltas) >= delta_trigger or chain.delta_bytes >= size_ratio * chain.base.size


def make_request(
    store_url: Any, state: str, chain_files: list[FileEntry], output_dir: str, max_p: int
) -> CompactionRequest:
    """The request to merge ``chain_files`` (URLs built by ``store_url(name)``)."""
    first = chain_files[0]
    assert first.key_groups is not None
    return CompactionRequest(
        job_id=uuid.uuid4().hex,
        state=state,
        key_groups=first.key_groups,
        inputs=[
            CompactionInput(store_url(f.path), f.size, f.crc32, f.kind, f.epoch)
            for f in chain_files
        ],
        output_prefix=store_url(output_dir),
        max_parallelism=max_p,
    )


class LocalCompactor:
    """Compacts in this process, reading and writing through fsspec.

    ``check`` is called between key groups of the merge and may raise to stop it: a service
    worker passes its job's cancellation, so an aborted job stops within one key group's merge
    instead of running to the end."""

    def __init__(
        self,
        filesystem: Any = None,
        *,
        check: Callable[[], None] | None = None,
        **storage_options: Any,
    ) -> None:
        self.filesystem = filesystem  # used for every URL when given (the store's own)
        self.check = check
        self.storage_options = storage_options

    def _fs(self, url: str) -> tuple[Any, str]:
        if self.filesystem is not None:
            return self.filesystem, str(self.filesystem._strip_protocol(url))
        fs, path = fsspec.core.url_to_fs(url, **self.storage_options)
        return fs, path

    def compact(self, request: CompactionRequest) -> CompactionResult:
        if request.format_version > FORMAT_VERSION:
            raise CompactionError(
                f"request format version {request.format_version} is newer than {FORMAT_VERSION}"
            )
        if not request.inputs or request.inputs[0].kind != BASE:
            raise CompactionError("the first input of a compaction must be a base")
        datas = self._read_inputs(request.inputs)
        header = {
            "state": request.state,
            "key_groups": request.key_groups,
            "epoch": request.inputs[-1].epoch,
            "kind": BASE,
            "max_parallelism": request.max_parallelism,
            "compacted_from": len(request.inputs),
        }
        files = [(DataFileReader(d, i.url), d) for i, d in zip(request.inputs, datas, strict=True)]
        builder = DataFileBuilder(header)
        parts = merge_chain(builder, KeyGroupRange.parse(request.key_groups), files, self.check)
        url = compacted_base_name(request.output_prefix, request.key_groups)
        fs, path = self._fs(url)
        out = b"".join(parts)
        put_whole(fs, path, out)
        return CompactionResult(
            request.job_id, [CompactionOutput(url, len(out), zlib.crc32(out))], builder.entries
        )

    def _read_inputs(self, inputs: list[CompactionInput]) -> list[bytes]:
        """Every input's bytes, fetched concurrently, each checked against the request."""
        if len(inputs) == 1:
            return [self._read_verified(inputs[0])]
        with concurrent.futures.ThreadPoolExecutor(min(8, len(inputs))) as pool:
            return list(pool.map(self._read_verified, inputs))

    def _read_verified(self, item: CompactionInput) -> bytes:
        fs, path = self._fs(item.url)
        data: bytes = fs.cat_file(path)
        if len(data) != item.size or zlib.crc32(data) != item.crc32:
            raise CorruptFileError(item.url, "does not match the size and checksum requested")
        return data


def merge_chain(
    builder: DataFileBuilder,
    key_groups: KeyGroupRange,
    files: list[tuple[DataFileReader, bytes]],
    check: Callable[[], None] | None = None,
) -> Iterator[bytes | memoryview]:
    """The bytes of the new base of a chain (base first, then deltas in epoch order) over
    ``key_groups``, part by part as ``builder`` lays them out.

    Every file's bytes must have been checked against its manifest checksum. A key group no
    delta touches keeps its base block as-is; the others are merged (later values win,
    tombstones remove), as :func:`~statetier.backend.snapshot.serialize.merge_pairs` does.
    """
    bases = [i for i, (reader, _) in enumerate(files) if reader.kind == BASE]
    chain = files[bases[-1] if bases else 0 :]  # a base in the middle restarts the chain
    base = chain[0] if chain[0][0].kind == BASE else None
    deltas = chain[1:] if base is not None else chain
    touched = {kg for reader, _ in deltas for kg in reader.index}
    yield builder.head
    for key_group in key_groups:
        if check is not None:
            check()
        if key_group in touched:
            keys, values = _merge_key_group(key_group, base, deltas)
            if keys:
                yield builder.add_block(key_group, builder.encode_block(keys, values), len(keys))
        elif base is not None and (entry := base[0].index.get(key_group)) is not None:
            block = memoryview(base[1])[entry.offset : entry.offset + entry.length]
            yield builder.add_raw(key_group, block, entry.crc32, entry.entries)
    yield builder.tail()


def _merge_key_group(
    key_group: int,
    base: tuple[DataFileReader, bytes] | None,
    deltas: list[tuple[DataFileReader, bytes]],
) -> tuple[list[bytes], list[bytes]]:
    """The sorted keys and values of ``key_group`` after applying ``deltas`` to ``base``."""
    merged: dict[bytes, bytes | None] = {}
    for reader, data in ([base] if base is not None else []) + deltas:
        entry = reader.index.get(key_group)
        if entry is None:
            continue
        keys, values = decode_block(memoryview(data), entry, reader.kind, reader.path)
        merged.update(zip(keys, values, strict=True))
        if None in values:  # tombstones: the update above put None there
            for key in itertools.compress(keys, map(operator.is_, values, itertools.repeat(None))):
                merged.pop(key, None)
    ordered = sorted(merged)  # mostly in base order already: timsort runs through it
    return ordered, list(map(merged.__getitem__, ordered))  # type: ignore[arg-type]
