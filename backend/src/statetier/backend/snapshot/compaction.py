"""Compaction: merging a range's base and deltas into a new base.

Deltas keep checkpoints cheap, but a restore reads every file of a chain; when deltas pile up
(``compaction.delta-trigger`` files, or more delta bytes than ``compaction.size-ratio`` times the
base) the chain is merged into one base with the same merge rule restore uses, so what a restore
returns never changes. Tombstones disappear in the merge. Most of a compaction is moving bytes,
so key groups that no delta touches keep their base block as-is (no decoding, no re-encoding;
see :class:`~statetier.backend.snapshot.format.DataFileBuilder`) and only the touched ones are
merged (:func:`~statetier.backend.snapshot.merge.merge_blocks`, restore's rule).

Expired TTL entries are dropped from the new base when the state's TTL asks for it
(``cleanup_in_compaction``, Flink's compaction filter; see ttl_filter) and kept otherwise. The
request carries what that needs: the state's kind and TTL settings as the manifest records them,
and the epoch's clock (``now_ms``), for the states that ask for it. A request without them (an
older client's, or a state without that cleanup) keeps every entry, and its JSON has none of
these fields, so older services accept it.

The :class:`Compactor` interface takes a JSON-serializable :class:`CompactionRequest` (input
files with their sizes and checksums, key-group range, output prefix, format version) and
returns a :class:`CompactionResult` (output files with sizes and checksums). The
:class:`LocalCompactor` runs it in this process; a remote compactor (the compaction service)
implements the same interface over HTTP with the same JSON.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import uuid
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import fsspec
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.snapshot.format import (
    BASE,
    FORMAT_VERSION,
    Block,
    CorruptFileError,
    DataFileBuilder,
    DataFileReader,
)
from statetier.backend.snapshot.layout import compacted_base_name
from statetier.backend.snapshot.lazy import bulk_allocation
from statetier.backend.snapshot.manifest import Chain, FileEntry
from statetier.backend.snapshot.merge import live_chain, merge_blocks, merge_columns
from statetier.backend.snapshot.recent_bases import RecentBases
from statetier.backend.snapshot.store import put_whole, read_whole
from statetier.backend.snapshot.ttl_filter import FlatFilter, ttl_filter

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


_OPTIONAL = ("state_kind", "ttl", "now_ms")  # left out of the JSON when None


@dataclasses.dataclass(frozen=True)
class CompactionRequest:
    """One chain to merge. ``state_kind`` and ``ttl`` are the state's kind and TTL settings
    as the manifest's state meta records them (:meth:`~statetier.backend.ttl.StateTtlConfig.
    to_json`); ``now_ms`` is the epoch's clock: the processing time the state's TTL checks use
    for the epoch whose manifest planned the compaction (the keyed backend's clock when the
    epoch's snapshot was prepared, see :func:`~statetier.backend.snapshot.writer.epoch_clock`:
    on Spark a state host's clock moved to the micro-batch's ``EpochTime.processing_time``, the
    batch timestamp of Spark's offset log; in the local runner the runner's clock)."""

    job_id: str
    state: str
    key_groups: str
    inputs: list[CompactionInput]
    output_prefix: str
    format_version: int = FORMAT_VERSION
    max_parallelism: int = 0
    state_kind: str | None = None
    ttl: dict[str, Any] | None = None
    now_ms: int | None = None

    def to_json(self) -> str:
        body = dataclasses.asdict(self)
        for name in _OPTIONAL:
            if body[name] is None:
                del body[name]
        return json.dumps(body, sort_keys=True)

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
    store_url: Any,
    state: str,
    chain_files: list[FileEntry],
    output_dir: str,
    max_p: int,
    *,
    meta: dict[str, Any] | None = None,
    now_ms: int | None = None,
) -> CompactionRequest:
    """The request to merge ``chain_files`` (URLs built by ``store_url(name)``). ``meta`` is
    the state's meta in the manifest and ``now_ms`` the epoch's clock; without them the merge
    keeps expired entries. The state's kind, TTL settings and the clock go into the request
    only for a state whose TTL asks for cleanup in compaction: every other request keeps the
    older JSON, which services from before TTL-aware compaction accept."""
    first = chain_files[0]
    assert first.key_groups is not None
    ttl = meta.get("ttl") if meta else None
    if not (ttl and ttl.get("cleanup_in_compaction")):
        ttl = None
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
        state_kind=meta.get("kind") if meta and ttl else None,
        ttl=ttl,
        now_ms=now_ms if ttl else None,
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
        recent: RecentBases | None = None,
        **storage_options: Any,
    ) -> None:
        self.filesystem = filesystem  # used for every URL when given (the store's own)
        self.check = check
        self.recent = recent  # the bases this process wrote last, read from memory
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
        try:
            expired = ttl_filter(request.state_kind, request.ttl, request.now_ms)
        except (ValueError, KeyError, TypeError) as exc:
            raise CompactionError(f"the request's TTL settings are unusable: {exc}") from None
        datas = self._read_inputs(request.inputs)
        files = [
            DataFileReader(d, i.url, verified=True)
            for i, d in zip(request.inputs, datas, strict=True)
        ]
        header = {
            "state": request.state,
            "key_groups": request.key_groups,
            "epoch": request.inputs[-1].epoch,
            "kind": BASE,
            "max_parallelism": request.max_parallelism,
            "compacted_from": len(request.inputs),
            # as the newest input: the writer's current setting (checkpoint.compression),
            # which a service that merges for many pipelines cannot know otherwise, and the
            # layout its writer reads (an older writer reads no columns, see format)
            "codec": files[-1].codec,
            "layout": files[-1].layout,
        }
        builder = DataFileBuilder(header)
        key_groups = KeyGroupRange.parse(request.key_groups)
        parts = merge_chain(builder, key_groups, files, self.check, expired)
        url = compacted_base_name(request.output_prefix, request.key_groups)
        fs, path = self._fs(url)
        with bulk_allocation():  # many small acyclic objects: no cyclic GC passes over them
            out = b"".join(parts)
        put_whole(fs, path, out)
        if self.recent is not None:
            self.recent.keep(url, out)
        return CompactionResult(
            request.job_id, [CompactionOutput(url, len(out), builder.crc32)], builder.entries
        )

    def _read_inputs(self, inputs: list[CompactionInput]) -> list[bytes]:
        """Every input's bytes, fetched concurrently, each checked against the request."""
        if len(inputs) == 1:
            return [self._read_verified(inputs[0])]
        with concurrent.futures.ThreadPoolExecutor(min(8, len(inputs))) as pool:
            return list(pool.map(self._read_verified, inputs))

    def _read_verified(self, item: CompactionInput) -> bytes:
        data = self.recent.get(item.url) if self.recent is not None else None
        if data is None:
            fs, path = self._fs(item.url)
            data = read_whole(fs, path, item.size)
        if len(data) != item.size or zlib.crc32(data) != item.crc32:
            raise CorruptFileError(item.url, "does not match the size and checksum requested")
        return data


def merge_chain(
    builder: DataFileBuilder,
    key_groups: KeyGroupRange,
    files: list[DataFileReader],
    check: Callable[[], None] | None = None,
    expired: FlatFilter | None = None,
) -> Iterator[bytes | memoryview]:
    """The bytes of the new base of a chain (its files oldest first) over ``key_groups``,
    part by part as ``builder`` lays them out.

    Every file's bytes must have been checked against its manifest checksum. A key group no
    delta after the chain's last base touches keeps that base's block as-is; the others are
    merged by :func:`~statetier.backend.snapshot.merge.merge_blocks`, the rule restore applies.
    With ``expired`` (a TTL cleanup, see ttl_filter) every key group's entries go through it;
    an untouched block that loses none is still copied as-is.
    """
    chain = live_chain(files)  # a base in the middle restarts the chain
    base = chain[0] if chain[0].kind == BASE else None
    touched = {kg for reader in chain[1 if base else 0 :] for kg in reader.index}
    yield builder.head
    for key_group in key_groups:
        if check is not None:
            check()
        if key_group in touched:
            blocks = [b for reader in chain if (b := reader.block(key_group)) is not None]
            if expired is None:  # Arrow's merge, no Python object per entry (see columns)
                merged = merge_columns(blocks)
                if len(merged):
                    block_bytes = builder.encode_columns(merged)
                    yield builder.add_block(key_group, block_bytes, len(merged))
                continue
            flat = expired(merge_blocks(blocks))
        elif base is not None and (block := base.block(key_group)) is not None:
            live = _filtered(block, expired)
            stored_otherwise = block.codec != builder.codec or block.layout != builder.layout
            if live is None and stored_otherwise:  # re-encode
                live = block.flat()
            if live is None:  # nothing to change: the block as it is
                entry = base.index[key_group]
                yield builder.add_raw(key_group, block.data, entry.crc32, entry.entries)
                continue
            flat = live
        else:
            continue
        if flat:
            yield builder.add_block(key_group, builder.encode_flat(flat), len(flat) // 2)
    yield builder.tail()


def _filtered(block: Block, expired: FlatFilter | None) -> list[Any] | None:
    """The entries of an untouched block left after the TTL filter, None when it drops none
    (or there is no filter), so the block can be copied as it is."""
    if expired is None:
        return None
    flat = block.flat()
    live = expired(flat)
    return None if live is flat else live
