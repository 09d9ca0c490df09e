"""A flipped byte anywhere in a data file, an operator file or a manifest is found by verify and
by restore, with a message that names the file and the damaged part (block, index, header)."""

from __future__ import annotations

import dataclasses
import zlib

import msgpack
import pytest
from statetier.backend.keyed_backend import KeyedStateBackend
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.operator_state import OperatorStateBackend
from statetier.backend.snapshot import (
    CorruptFileError,
    SnapshotStore,
    restore_keyed_state,
    restore_operator_state,
)
from statetier.backend.snapshot.format import _FOOTER, END_MAGIC, DataFileReader
from statetier.backend.snapshot.manifest import FileEntry, Manifest
from statetier.backend.snapshot.verify import verify_store

from tests.checkpoint.ckpt_support import MAX_P, Location, records

PARTS = ("block of key group", "header", "index", "footer", "magic", "format version")


def committed(location: Location) -> SnapshotStore:
    live = location.runner(2)
    live.process(records(1, n=200, keys=60))
    live.checkpoint()
    live.process(records(2, n=50, keys=60))
    live.checkpoint()  # epoch 2: bases of epoch 1 plus deltas
    live.close()
    store: SnapshotStore = location.store()
    return store


def positions(size: int, extra: tuple[int, ...] = ()) -> list[int]:
    stride = max(1, size // 24)
    return sorted({*range(0, size, stride), *(p % size for p in extra), size - 1})


def restore_all(store: SnapshotStore) -> None:
    restore_keyed_state(store, KeyedStateBackend(KeyGroupRange.of(MAX_P), MAX_P))
    restore_operator_state(store, OperatorStateBackend(0, 1))


def check_flips(
    store: SnapshotStore, name: str, extra: tuple[int, ...], parts: tuple[str, ...]
) -> None:
    path = store.full_path(name)
    original: bytes = store.fs.cat_file(path)
    try:
        for pos in positions(len(original), extra):
            damaged = bytearray(original)
            damaged[pos] ^= 0x20
            store.fs.pipe_file(path, bytes(damaged))
            report = verify_store(store, [2])
            assert not report.ok, f"flip at {pos} of {name} not found by verify"
            assert any(path in p and any(part in p for part in parts) for p in report.problems), (
                pos,
                report.problems,
            )
            with pytest.raises(CorruptFileError) as err:
                restore_all(store)
            assert err.value.path == path
            assert any(part in str(err.value) for part in parts), (pos, str(err.value))
    finally:
        store.fs.pipe_file(path, original)
    assert verify_store(store).ok


def test_flipped_bytes_in_a_data_file(location: Location) -> None:
    store = committed(location)
    manifest = store.manifest(2)
    entry = max((f for f in manifest.keyed_files if f.state == "residues"), key=lambda f: f.size)
    reader = DataFileReader(store.read(entry), entry.path)
    first_block = min(e.offset for e in reader.index.values())
    check_flips(store, entry.path, (first_block, first_block + 1, -9, -17, -30), PARTS)


def test_flipped_bytes_in_a_delta_file(location: Location) -> None:
    store = committed(location)
    entry = next(f for f in store.manifest(2).keyed_files if f.kind == "delta")
    check_flips(store, entry.path, (), PARTS)


def test_flipped_bytes_in_an_operator_file(location: Location) -> None:
    store = committed(location)
    entry = store.manifest(2).operator_files[0]
    check_flips(store, entry.path, (), ("operator state", "magic", "format version"))


def test_flipped_bytes_in_a_manifest(location: Location) -> None:
    store = committed(location)
    name = store.manifest_name(2)
    path = store.full_path(name)
    original: bytes = store.fs.cat_file(path)
    for pos in positions(len(original)):
        damaged = bytearray(original)
        damaged[pos] ^= 0x01
        store.fs.pipe_file(path, bytes(damaged))
        report = verify_store(store, [2])
        assert not report.ok and path in report.problems[0], (pos, report.problems)
        with pytest.raises(CorruptFileError) as err:
            restore_all(store)
        assert err.value.path == path and "manifest" in str(err.value)
    store.fs.pipe_file(path, original)
    assert verify_store(store).ok


def test_a_missing_data_file_fails_the_restore_naming_it(location: Location) -> None:
    """On s3:// the restore reads a range's files in one bulk request; a file missing there is
    read again on its own (a 404 may be the storage lagging) before it is called missing."""
    store = committed(location)
    entry = max(store.manifest(2).keyed_files, key=lambda f: f.size)
    path = store.full_path(entry.path)
    store.fs.rm_file(path)
    with pytest.raises(CorruptFileError) as err:
        restore_keyed_state(store, KeyedStateBackend(KeyGroupRange.of(MAX_P), MAX_P))
    assert err.value.path == path and "named by the manifest but missing" in str(err.value)


def with_a_stray_byte(data: bytes) -> bytes:
    """The same data file with one byte added after its first block, and the index and footer
    rewritten to match: every part has a valid checksum, but a byte lies in no block."""
    reader = DataFileReader(data, "original")
    first = min(reader.index.values(), key=lambda e: e.offset)
    cut = first.offset + first.length
    index_offset = _FOOTER.unpack_from(data, len(data) - _FOOTER.size)[0]
    rows = [
        [e.key_group, e.offset + (e.offset >= cut), e.length, e.crc32, e.entries]
        for e in reader.index.values()
    ]
    index: bytes = msgpack.packb(rows)
    body = data[:cut] + b"\x00" + data[cut:index_offset]
    return body + index + _FOOTER.pack(len(body), len(index), zlib.crc32(index), END_MAGIC)


def replace_vouched_for(
    store: SnapshotStore, manifest: Manifest, entry: FileEntry, data: bytes
) -> None:
    """Put ``data`` under ``entry``'s name and recommit ``manifest`` with the size and checksum
    of ``data``: damage that the manifest's whole-file checksum cannot see."""
    store.fs.pipe_file(store.full_path(entry.path), data)
    forged = dataclasses.replace(entry, size=len(data), crc32=zlib.crc32(data))
    store.fs.rm_file(store.full_path(store.manifest_name(manifest.epoch)))
    store.commit(
        dataclasses.replace(
            manifest, keyed_files=[forged if f == entry else f for f in manifest.keyed_files]
        )
    )


def test_a_byte_outside_every_block_is_found_even_when_the_manifest_agrees(
    location: Location,
) -> None:
    """Restore checks a file part by part instead of also as a whole: the parts must then leave
    no byte unchecked, even in a file whose whole-file checksum the manifest vouches for."""
    store = committed(location)
    manifest = store.manifest(2)
    entry = max(manifest.keyed_files, key=lambda f: f.size)
    damaged = with_a_stray_byte(store.read(entry))
    replace_vouched_for(store, manifest, entry, damaged)
    with pytest.raises(CorruptFileError) as err:
        restore_all(store)
    assert err.value.path == store.full_path(entry.path)
    assert "are in no block of the index" in str(err.value)
    report = verify_store(store, [2])
    assert any("are in no block of the index" in p for p in report.problems), report.problems


def test_another_epochs_file_under_a_files_name_is_refused(location: Location) -> None:
    """A file that checks out part by part but is another epoch's (a stale copy, a mixed-up
    upload) is refused by restore and verify, even when the manifest's size and checksum were
    made to agree with it: its header's epoch is compared with the manifest's."""
    live = location.runner(1)
    for epoch in (1, 2, 3):
        live.process(records(epoch, n=50, keys=60))
        live.checkpoint()
    live.close()
    store: SnapshotStore = location.store()
    manifest = store.manifest(3)
    newest = {(f.state, f.kind): f for f in manifest.keyed_files if f.epoch == 3}
    older = next(f for f in manifest.keyed_files if f.epoch == 2 and (f.state, f.kind) in newest)
    entry = newest[(older.state, older.kind)]
    stale = store.read(older)
    replace_vouched_for(store, manifest, entry, stale)
    with pytest.raises(CorruptFileError) as err:
        restore_keyed_state(store, KeyedStateBackend(KeyGroupRange.of(MAX_P), MAX_P))
    assert err.value.path == store.full_path(entry.path)
    assert "header says epoch 2, the manifest says 3" in str(err.value)
    report = verify_store(store, [3])
    assert any("epoch 2" in p for p in report.problems), report.problems
