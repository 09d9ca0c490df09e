"""Two writers of one checkpoint location: the lease fences the older one, an epoch's manifest
is created once, and a fenced writer's files never replace committed ones."""

from __future__ import annotations

import concurrent.futures
import dataclasses

import pytest
from statetier.backend.local_runner import LocalRunner
from statetier.backend.snapshot import (
    CheckpointError,
    FencedError,
    Manifest,
    SnapshotStore,
)
from statetier.backend.snapshot.verify import verify_store

from tests.checkpoint.ckpt_support import Location, dump_keyed, records


def make(location: Location, parallelism: int = 2) -> LocalRunner:
    return location.runner(parallelism)


def test_a_new_writer_fences_the_old_one(location: Location) -> None:
    old = make(location)
    old.process(records(1))
    old.checkpoint()
    new = make(location, 3)  # a restarted job: restores epoch 1
    new.process(records(2))
    committed = new.checkpoint()  # takes the lease
    old.process(records(2))
    old.process(records(3))
    with pytest.raises(CheckpointError) as err:
        old.checkpoint()  # epoch 2 again, from the fenced writer
    assert isinstance(err.value.__cause__, FencedError)
    assert "lost the lease" in str(err.value)
    store = location.store()
    assert store.epochs() == [1, 2]
    assert store.manifest(2).owner == committed.owner == store.current_owner()
    assert verify_store(store).ok  # the fenced writer overwrote nothing
    assert dump_keyed(make(location, 4)) == dump_keyed(new)
    with pytest.raises(CheckpointError):
        old.checkpoint()  # fenced for good


def _manifest(epoch: int, owner: str) -> Manifest:
    return Manifest(epoch, 0, 0, {}, "msgpack", [], [], 0, owner=owner)


def test_an_epoch_is_committed_once_under_a_race(location: Location) -> None:
    stores = [location.store() for _ in range(8)]

    def commit(i: int) -> bool:
        try:
            stores[i].commit(_manifest(5, f"writer-{i}"))
            return True
        except FencedError:
            return False

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        won = list(pool.map(commit, range(8)))
    assert won.count(True) == 1
    assert stores[0].manifest(5).owner == f"writer-{won.index(True)}"
    stores[0].commit(_manifest(5, f"writer-{won.index(True)}"))  # its own retry: fine
    with pytest.raises(FencedError):
        stores[0].commit(dataclasses.replace(_manifest(5, "late"), created_ms=1))


def test_only_the_last_lease_holder_commits(location: Location) -> None:
    store = location.store()
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        leases = list(pool.map(lambda _: SnapshotStore.acquire_writer(store), range(6)))
    assert sorted(lease.generation for lease in leases) == list(range(1, 7))
    outcomes = []
    for epoch, lease in enumerate(leases, start=1):
        try:
            store.commit(_manifest(epoch, lease.owner), lease)
            outcomes.append(lease.generation)
        except FencedError:
            pass
    assert outcomes == [6]
    winner_epoch = [lease.generation for lease in leases].index(6) + 1
    assert store.epochs() == [winner_epoch]
