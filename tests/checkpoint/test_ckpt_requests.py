"""What a checkpoint costs in requests on object storage (SeaweedFS here): each one is paid in
the store's CPU and, on a cloud, in money. s3fs asks an object's size (a HEAD) before a plain
read; statetier reads from offset 0, one GET a file."""

from __future__ import annotations

from typing import Any

import pytest
from statetier.backend.config import load_config
from statetier.backend.snapshot import SnapshotStore, layout
from statetier.backend.snapshot.store import read_whole

from tests.checkpoint.ckpt_support import Location, S3Server, records


def requests_of(
    store: SnapshotStore, monkeypatch: pytest.MonkeyPatch, keys: list[str] | None = None
) -> list[str]:
    """The S3 calls ``store`` makes from here on, by name (``get_object``, ``head_object``...);
    with ``keys``, the object key of each call goes there too."""
    calls: list[str] = []
    call = store.fs._call_s3

    async def counted(method: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(method)
        if keys is not None:
            keys.append(str(kwargs.get("Key", "")))
        return await call(method, *args, **kwargs)

    monkeypatch.setattr(store.fs, "_call_s3", counted)
    return calls


def test_reading_a_committed_epoch_takes_one_get_a_file(
    seaweedfs: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    location = Location.on_s3(seaweedfs)
    runner = location.runner(2)
    runner.process(records(1, n=400, keys=100))
    committed = runner.checkpoint()
    runner.close()
    store = location.store(skip_instance_cache=True)  # a reader of its own, no listing cached
    calls = requests_of(store, monkeypatch)

    manifest = store.manifest(committed.epoch)
    one = store.read(manifest.keyed_files[0])
    many = store.read_many(manifest.keyed_files)

    assert manifest == committed
    assert many[0] == one
    assert len(manifest.keyed_files) >= 2  # read_many goes the concurrent way
    assert calls == ["get_object"] * (2 + len(manifest.keyed_files))


def test_an_empty_object_reads_as_empty_and_a_missing_one_as_missing(
    seaweedfs: S3Server,
) -> None:
    store = Location.on_s3(seaweedfs).store()
    store.put("empty", b"")
    store.put("three", b"abc")
    assert read_whole(store.fs, store.full_path("empty")) == b""
    assert read_whole(store.fs, store.full_path("empty"), 0) == b""
    assert read_whole(store.fs, store.full_path("three")) == b"abc"
    with pytest.raises(FileNotFoundError):
        read_whole(store.fs, store.full_path("absent"))


def test_retention_reads_no_manifest_its_writer_committed_and_deletes_in_batches(
    seaweedfs: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention after each commit reads every retained manifest; an epoch's manifest never
    changes once committed, so the writer's store keeps the ones it wrote or read. And it
    deletes the files that fell out in batches."""
    location = Location.on_s3(seaweedfs)
    runner = location.runner(2, config=load_config({"checkpoint.retained": 2}))
    keys: list[str] = []
    checkpointer = runner.checkpointer
    assert checkpointer is not None
    calls = requests_of(checkpointer.store, monkeypatch, keys)
    for epoch in range(1, 7):
        runner.process(records(epoch, n=100, keys=50))
        runner.checkpoint()
    runner.close()  # retention has run after every commit
    manifests = [(c, k) for c, k in zip(calls, keys, strict=True) if "/manifests/" in k]
    deleted = [k for c, k in manifests if c == "delete_object"]
    assert len(deleted) == 4  # epochs 1-4 fell out of retention
    assert [c for c, _ in manifests if c in ("get_object", "head_object")] == []
    # the other files went in one request per retention, not one a file
    assert [k for c, k in zip(calls, keys, strict=True) if c == "delete_object"] == deleted
    assert 1 <= calls.count("delete_objects") <= 4
    store = location.store(skip_instance_cache=True)
    # named by a retained manifest, or by the writers' next one (a compaction's late base)
    named = {f.path for e in store.epochs() for f in store.manifest(e).files()}
    named |= checkpointer.protected()
    assert store.epochs() == [5, 6]
    assert not [n for n in store.list_files() if n not in named and layout.epoch_of(n) in (1, 2, 3)]
    assert checkpointer.store.manifest(6).epoch == 6
    assert SnapshotStore(location.uri, **location.options).manifest(6) == (
        checkpointer.store.manifest(6)
    )
