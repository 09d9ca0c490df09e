"""The driver's wait for a range's result, over a real in-memory store and no registry: what a
host wrote is taken, what it could not write fails the epoch naming the range and the file."""

from __future__ import annotations

import uuid

import pytest
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.snapshot import CorruptFileError, FileEntry, SnapshotStore, SubtaskSnapshot
from statetier.backend.snapshot.layout import error_name, result_name
from statetier.backend.spark.result_wait import ResultWait
from statetier.backend.spark.results import RangeResult, RangeStart

OWNER = "driver-1"


@pytest.fixture
def store() -> SnapshotStore:
    return SnapshotStore(f"memory://result-wait-{uuid.uuid4().hex}")


def waiting(store: SnapshotStore, timeout: float = 5.0) -> ResultWait:
    return ResultWait(store, None, "wordcount", 2, OWNER, timeout)


def put(store: SnapshotStore, name: str, body: bytes) -> None:
    store.fs.pipe(store.full_path(name), body)


def a_result(epoch: int, index: int) -> RangeResult:
    snapshot = SubtaskSnapshot(
        KeyGroupRange(0, 63), 128, "str", {}, [FileEntry("d/x", 1, 2)], None, epoch
    )
    return RangeResult(
        index=index, parallelism=2, epoch=epoch, token="t1", state=RangeStart.WARM, records=10,
        spilled_key_groups=0, key_groups=64, restore_s=0.0, snapshot_s=0.1, total_s=0.2,
        upload_bytes=100, snapshot=snapshot, host_pid=7, host_socket="/s", rows=5,
    )  # fmt: skip


def test_a_result_the_host_wrote_is_read_from_the_store(store: SnapshotStore) -> None:
    result = a_result(3, 1)
    put(store, result_name(3, OWNER, 1, 2), result.encode())
    assert waiting(store).result(3, 1) == (result, False)


def test_an_error_file_fails_the_epoch_with_the_hosts_reason(store: SnapshotStore) -> None:
    name = result_name(4, OWNER, 0, 2)
    put(store, error_name(name), b"Traceback ...\nOSError: disk full\n")
    with pytest.raises(CorruptFileError, match="failed to snapshot it") as raised:
        waiting(store).result(4, 0)
    assert "OSError: disk full" in str(raised.value) and "not committing" in str(raised.value)
    assert "range 0 of epoch 4" in str(raised.value)


def test_a_result_that_is_not_ours_names_the_file_and_range(store: SnapshotStore) -> None:
    name = result_name(5, OWNER, 1, 2)
    put(store, name, b'{"index": "one"}')
    with pytest.raises(CorruptFileError, match="range 1 of epoch 5") as raised:
        waiting(store).result(5, 1)
    assert name in str(raised.value)


def test_nothing_within_the_timeout_fails_the_epoch(store: SnapshotStore) -> None:
    with pytest.raises(CorruptFileError, match=r"no result within host.result-timeout=0s"):
        waiting(store, timeout=0.05).result(6, 0)


def test_another_drivers_result_is_not_taken(store: SnapshotStore) -> None:
    put(store, result_name(7, "driver-0", 0, 2), a_result(7, 0).encode())
    with pytest.raises(CorruptFileError, match="no result within"):
        waiting(store, timeout=0.05).result(7, 0)
