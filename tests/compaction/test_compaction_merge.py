"""The merge itself: key groups no delta touches are copied as-is, the others merged, and the
new base is byte for byte what decoding, merging and re-encoding every key group gives; a merge
that fails half-way leaves nothing under the output name.

Everything runs against SeaweedFS; the first test goes through a real gateway and worker and
restores the compacted checkpoint at another parallelism.
"""

from __future__ import annotations

import random
import sys
import uuid
import zlib
from pathlib import Path
from typing import Any

import fsspec
import pytest
from statetier.backend.compaction_client import RemoteCompactor
from statetier.backend.config import load_config
from statetier.backend.keygroups import KeyGroupRange, assign_to_key_group
from statetier.backend.local_runner import LocalRunner
from statetier.backend.snapshot.compaction import (
    CompactionInput,
    CompactionRequest,
    CompactionResult,
    LocalCompactor,
)
from statetier.backend.snapshot.format import (
    BASE,
    DELTA,
    CorruptFileError,
    DataFileBuilder,
    DataFileReader,
    encode_data_file,
)
from statetier.tools.compaction_launch import Processes, SeaweedFS

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository: tests.compaction.*

from tests.compaction.compaction_support import SumAndLast, dump, odd_block

Pairs = list[tuple[bytes, bytes | None]]
MANY = 128  # key groups in the one range of a parallelism-1 runner


class Recording:
    """The remote compactor, keeping each request and result for a look at the bytes."""

    def __init__(self, inner: RemoteCompactor) -> None:
        self.inner = inner
        self.done: list[tuple[CompactionRequest, CompactionResult]] = []

    def compact(self, request: CompactionRequest) -> CompactionResult:
        result = self.inner.compact(request)
        self.done.append((request, result))
        return result


def _read(url: str, options: dict[str, Any]) -> bytes:
    fs, path = fsspec.core.url_to_fs(url, **options)
    data: bytes = fs.cat_file(path)
    return data


def _raw(reader: DataFileReader, data: bytes, key_group: int) -> bytes:
    entry = reader.index[key_group]
    return data[entry.offset : entry.offset + entry.length]


def _replay(chain: list[tuple[str, Pairs]]) -> Pairs:
    """One key group's chain replayed entry by entry, written here independently of the
    merge under test: a base starts over, later values win, tombstones remove."""
    merged: dict[bytes, bytes | None] = {}
    for kind, pairs in chain:
        if kind == BASE:
            merged = {}
        for key, value in pairs:
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
    return list(merged.items())


def _reference(request: CompactionRequest, datas: list[bytes], header: dict[str, Any]) -> bytes:
    """What compaction wrote before blocks were copied: decode, replay, encode."""
    readers = [DataFileReader(d, i.url) for i, d in zip(request.inputs, datas, strict=True)]
    blocks: list[tuple[int, Pairs]] = [
        (kg, _replay([(r.kind, r.read_block(kg)) for r in readers]))
        for kg in KeyGroupRange.parse(request.key_groups)
    ]
    return encode_data_file({k: v for k, v in header.items() if k != "format_version"}, blocks)


def _runner(uri: str, options: dict[str, Any], parallelism: int, trigger: int) -> LocalRunner:
    return LocalRunner(
        SumAndLast,
        parallelism,
        max_parallelism=MANY,
        checkpoint_uri=uri,
        storage_options=options,
        config=load_config({"compaction.delta-trigger": trigger, "compaction.size-ratio": 1e6}),
    )


def test_a_delta_touching_few_key_groups_copies_the_rest_and_restores_unchanged(
    procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    gateway, _ = procs.gateway([prefix])
    procs.worker(gateway, [prefix])
    remote = RemoteCompactor([gateway], timeout=60, poll_interval=0.05, failure_strategy="fail")
    uri = f"{prefix}/few"
    live = _runner(uri, seaweed.options, 1, trigger=1)
    assert live.checkpointer is not None
    live.checkpointer.compactor = recording = Recording(remote)
    keys = [f"key-{i}" for i in range(4000)]
    live.process([(k, 1 + i % 39) for i, k in enumerate(keys)])
    live.checkpoint()
    hot = {assign_to_key_group(k, MANY) for k in keys[:3]}
    few = [k for k in keys if assign_to_key_group(k, MANY) in hot]
    live.process([(k, 5) for k in few[1:]] + [(few[0], 0)])  # updates and a removal
    live.checkpoint()
    live.checkpointer.drain()  # the worker merges base + delta of each state
    done = list(recording.done)
    live.checkpoint()  # names the compacted bases
    live.checkpointer.drain()
    uncompacted = dump(live)
    live.close()

    assert len(done) == 2 and remote.fallbacks == 0  # total and residues
    for request, result in done:
        datas = [_read(i.url, seaweed.options) for i in request.inputs]
        base, delta = (DataFileReader(d, i.url) for i, d in zip(request.inputs, datas, strict=True))
        touched = set(delta.index)
        assert hot <= touched and len(touched) <= len(hot) + 2
        (output,) = result.outputs
        out_data = _read(output.url, seaweed.options)
        out = DataFileReader(out_data, output.url)
        untouched = set(base.index) - touched
        assert len(untouched) > 100
        for kg in untouched:  # the base's block bytes, index entry and all
            assert _raw(out, out_data, kg) == _raw(base, datas[0], kg)
            assert out.index[kg].crc32 == base.index[kg].crc32
        assert out_data == _reference(request, datas, out.header)
        assert (output.size, output.crc32) == (len(out_data), zlib.crc32(out_data))
        assert result.entries == out.verify()

    restored = _runner(uri, seaweed.options, 3, trigger=1000)
    manifest = restored.store.manifest() if restored.store else None
    assert manifest is not None
    assert all("/compacted/" in c.base.path for c in manifest.chains())
    assert dump(restored) == uncompacted
    restored.close()


def _chain(seed: int, key_groups: range, middle_base: bool) -> list[tuple[str, bytes]]:
    """A base and deltas with every case: key groups only in the base, only in deltas,
    emptied by tombstones, tombstones of absent keys, keys removed and written again; with
    ``middle_base`` key groups the middle base lacks though the files before it have them."""
    rnd = random.Random(seed)
    keyspace = [(kg, f"k{kg:03d}-{i:05d}".encode()) for kg in key_groups for i in range(300)]
    files = []
    for index in range(5):
        kind = BASE if index == 0 or (middle_base and index == 3) else DELTA
        blocks: dict[int, Pairs] = {kg: [] for kg in key_groups}
        for kg, key in keyspace:
            value = rnd.randbytes(rnd.randrange(1, 400))
            if kind == BASE:  # key groups the first base lacks, and the middle one
                if kg % 5 != 4 if index == 0 else kg % 7 != 6:
                    blocks[kg].append((key, value))
                continue
            emptied = kg % 5 == 3 and index == 4  # every key removed
            if kg % 5 == 0 or (not emptied and rnd.random() > 0.2):
                continue  # key groups no delta touches, and keys this delta does not
            blocks[kg].append((key, None if emptied or rnd.random() < 0.2 else value))
        header = {"state": "s", "key_groups": str(KeyGroupRange(key_groups[0], key_groups[-1])),
                  "epoch": index + 1, "kind": kind}  # fmt: skip
        files.append((kind, encode_data_file(header, list(blocks.items()))))
    return files


def _upload(
    seaweed: SeaweedFS, prefix: str, files: list[tuple[str, bytes]]
) -> list[CompactionInput]:
    fs = fsspec.filesystem("s3", **seaweed.options)
    inputs = []
    for i, (kind, data) in enumerate(files):
        url = f"{prefix}/in/{uuid.uuid4().hex[:6]}-{i}.kgd"
        fs.pipe_file(url[5:], data)
        inputs.append(CompactionInput(url, len(data), zlib.crc32(data), kind, i + 1))
    return inputs


@pytest.mark.parametrize("middle_base", [False, True])
def test_the_new_base_is_what_decode_merge_encode_gives(
    seaweed: SeaweedFS, prefix: str, middle_base: bool
) -> None:
    files = _chain(3, range(10, 50), middle_base)
    inputs = _upload(seaweed, prefix, files)
    request = CompactionRequest("ref", "s", "10-49", inputs, f"{prefix}/out", max_parallelism=64)
    result = LocalCompactor(**seaweed.options).compact(request)
    (output,) = result.outputs
    data = _read(output.url, seaweed.options)
    assert data == _reference(request, [d for _, d in files], DataFileReader(data, "").header)
    assert (output.size, output.crc32) == (len(data), zlib.crc32(data))
    out = DataFileReader(data, output.url)
    assert all(kg % 5 != 3 for kg in out.index)  # emptied key groups are left out
    assert result.entries == out.verify()


def test_untouched_blocks_are_copied_without_decoding(seaweed: SeaweedFS, prefix: str) -> None:
    builder = DataFileBuilder({"state": "s", "key_groups": "0-7", "epoch": 1, "kind": BASE})
    parts: list[bytes | memoryview] = [builder.head]
    odd = {}
    for kg in range(8):
        odd[kg] = odd_block([(f"k{kg}-{i}".encode(), b"v%d" % i) for i in range(50)])
        parts.append(builder.add_raw(kg, odd[kg], zlib.crc32(odd[kg]), 50))
    base = b"".join(parts) + builder.tail()
    header = {"state": "s", "key_groups": "0-7", "epoch": 2, "kind": DELTA}
    delta = encode_data_file(header, [(2, [(b"k2-0", None), (b"k2-new", b"x")])])
    request = CompactionRequest(
        "odd", "s", "0-7", _upload(seaweed, prefix, [(BASE, base), (DELTA, delta)]), f"{prefix}/o"
    )
    (output,) = LocalCompactor(**seaweed.options).compact(request).outputs
    data = _read(output.url, seaweed.options)
    out = DataFileReader(data, output.url)
    for kg in set(range(8)) - {2}:
        assert _raw(out, data, kg) == odd[kg]
    assert _raw(out, data, 2) != odd[2]  # merged, so encoded afresh
    merged = out.read_block(2)
    assert (b"k2-new", b"x") in merged and all(k != b"k2-0" for k, _ in merged)
    assert len(merged) == 50 and merged == sorted(merged)


def test_a_merge_failing_half_way_leaves_nothing(seaweed: SeaweedFS, prefix: str) -> None:
    files = _chain(4, range(0, 40), False)
    kind, last = files[-1]
    reader = DataFileReader(last, "last")
    entry = reader.index[max(reader.index)]  # the last key group: the rest is merged already
    broken = last[: entry.offset] + b"\xc1" + last[entry.offset + 1 :]  # its count, damaged
    files[-1] = (kind, broken)  # the file's checksum is the broken file's: only decoding fails
    request = CompactionRequest(
        "broken", "s", "0-39", _upload(seaweed, prefix, files), f"{prefix}/broken"
    )
    with pytest.raises(CorruptFileError, match=f"block of key group {entry.key_group}"):
        LocalCompactor(**seaweed.options).compact(request)
    fs = fsspec.filesystem("s3", **seaweed.options)
    assert not fs.exists(f"{prefix[5:]}/broken/0-39.base.kgd")
    bucket = prefix[5:].split("/", maxsplit=1)[0]
    pending = [u["Key"] for u in fs.list_multipart_uploads(bucket)]
    assert not [k for k in pending if "/broken/" in k]
