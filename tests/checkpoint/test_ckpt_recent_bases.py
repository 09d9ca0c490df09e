"""A merge process keeps the bases it wrote: a range's next merge reads its base from memory,
checked against the request like any input, and merges what reading it back would give."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from statetier.backend.config import load_config
from statetier.backend.snapshot import (
    CorruptFileError,
    LocalCompactor,
    SnapshotStore,
    process_compactor,
)
from statetier.backend.snapshot.compaction import CompactionInput, CompactionResult, make_request
from statetier.backend.snapshot.format import DataFileReader
from statetier.backend.snapshot.manifest import Chain
from statetier.backend.snapshot.process_compactor import ProcessCompactor
from statetier.backend.snapshot.recent_bases import RecentBases

from tests.checkpoint.ckpt_support import MAX_P, Location, records


def chain_of_three(tmp_path: Path) -> tuple[SnapshotStore, Chain]:
    """A location whose newest manifest has a chain of a base and two deltas."""
    location = Location("file", f"file://{tmp_path}/ckpt", str(tmp_path / "ckpt"), {})
    no_compaction = {"compaction.delta-trigger": 1000, "compaction.size-ratio": 1e6}
    live = location.runner(2, config=load_config(no_compaction))
    for epoch in range(1, 4):
        live.process(records(epoch))
        live.checkpoint()
    store = location.store()
    chain = next(c for c in store.manifest().chains() if len(c.deltas) == 2)
    return store, chain


def entries(store: SnapshotStore, result: CompactionResult) -> dict[int, list[object]]:
    """Key group -> the entries of a compaction's base."""
    output = result.outputs[0]
    path = str(store.fs._strip_protocol(output.url))
    reader = DataFileReader(store.fs.cat_file(path), output.url)
    return {kg: list(block.flat()) for kg in reader.index if (block := reader.block(kg))}


def test_the_next_merge_of_a_range_reads_the_base_the_last_one_wrote_from_memory(
    tmp_path: Path,
) -> None:
    store, chain = chain_of_three(tmp_path)
    recent = RecentBases()
    merging = LocalCompactor(filesystem=store.fs, recent=recent)
    first = merging.compact(make_request(store.url, chain.state, chain.files[:2], "a", MAX_P))
    (written,) = first.outputs
    later = make_request(store.url, chain.state, chain.files[2:], "b", MAX_P)
    later.inputs.insert(
        0, CompactionInput(written.url, written.size, written.crc32, "base", chain.deltas[0].epoch)
    )
    store.fs.rm_file(str(store.fs._strip_protocol(written.url)))  # a read would fail now
    second = merging.compact(later)
    assert recent.hits == 1
    whole = LocalCompactor(filesystem=store.fs).compact(
        make_request(store.url, chain.state, chain.files, "c", MAX_P)
    )
    assert entries(store, second) == entries(store, whole) and entries(store, whole)


def test_the_merge_process_keeps_its_bases(tmp_path: Path) -> None:
    """The Spark driver's merge child: its second merge of a range starts from the base its
    first one wrote, which is no longer in storage here."""
    store, chain = chain_of_three(tmp_path)
    merging = ProcessCompactor(LocalCompactor(filesystem=store.fs))
    try:
        first = merging.compact(make_request(store.url, chain.state, chain.files[:2], "a", MAX_P))
        (written,) = first.outputs
        later = make_request(store.url, chain.state, chain.files[2:], "b", MAX_P)
        later.inputs.insert(
            0,
            CompactionInput(
                written.url, written.size, written.crc32, "base", chain.deltas[0].epoch
            ),
        )
        store.fs.rm_file(str(store.fs._strip_protocol(written.url)))
        assert merging.compact(later).outputs
    finally:
        process_compactor.stop_merge_process()


def test_kept_bytes_that_do_not_match_the_request_fail_the_merge(tmp_path: Path) -> None:
    store, chain = chain_of_three(tmp_path)
    recent = RecentBases()
    request = make_request(store.url, chain.state, chain.files, "a", MAX_P)
    base = request.inputs[0]
    recent.keep(base.url, b"\0" * base.size)  # same size, other bytes
    with pytest.raises(CorruptFileError, match="does not match the size and checksum"):
        LocalCompactor(filesystem=store.fs, recent=recent).compact(request)
    retry = dataclasses.replace(request, job_id="again")
    assert LocalCompactor(filesystem=store.fs).compact(retry).outputs  # the file is fine


def test_recent_bases_forget_the_oldest_past_their_bound() -> None:
    recent = RecentBases(limit=10)
    recent.keep("a", b"123456")
    recent.keep("b", b"123")
    assert recent.get("a") == b"123456"  # used: now the newest
    recent.keep("c", b"1234")  # 13 bytes: the oldest, b, goes
    assert recent.get("b") is None and recent.get("a") and recent.get("c")
    recent.keep("d", b"x" * 11)  # larger than the bound: not kept, nothing dropped
    assert recent.get("d") is None and recent.get("a") and recent.get("c")
    recent.keep("a", b"12")  # replaced, counted once
    recent.keep("e", b"1234")
    assert recent.get("a") == b"12" and recent.get("c") and recent.get("e")
