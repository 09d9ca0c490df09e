"""Storage faults injected under fsspec (the ``faulty://`` wrapper around SeaweedFS or local
files): transient ones are retried and the checkpoint succeeds; persistent ones fail it cleanly,
commit nothing, and the next epoch is written in full."""

from __future__ import annotations

import pytest
from statetier.backend.config import load_config
from statetier.backend.local_runner import LocalRunner
from statetier.backend.snapshot import CheckpointError, RetryPolicy, SnapshotStore
from statetier.backend.snapshot.verify import verify_store

from tests.checkpoint.ckpt_faults import FaultPlan
from tests.checkpoint.ckpt_support import MAX_P, Accumulate, Location, dump_keyed, records

FAST = RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.01)


def faulty_runner(location: Location, plan: FaultPlan, parallelism: int = 4) -> LocalRunner:
    options = {**location.faulty_options(plan), "retry": FAST}
    return LocalRunner(
        Accumulate,
        parallelism,
        max_parallelism=MAX_P,
        checkpoint_uri=location.faulty_uri,
        storage_options=options,
        config=load_config({"compaction.delta-trigger": 100, "compaction.size-ratio": 100.0}),
    )


def test_transient_faults_are_retried(location: Location) -> None:
    plan = FaultPlan()
    plan.add("write", "/data/", "transient", times=3)  # three failed PUTs of data files
    plan.add("write", "/operator/", "transient", times=2)
    plan.add("commit", "manifests/", "transient", times=2)  # the conditional manifest PUT
    plan.add("commit", "writer.json", "transient", times=1)
    plan.add("read", "/data/", "transient", times=2)
    live = faulty_runner(location, plan)
    live.process(records(1))
    live.checkpoint()
    live.process(records(2))
    manifest = live.checkpoint()
    assert plan.injected == 3 + 2 + 2 + 1
    assert manifest.epoch == 2
    restored = faulty_runner(location, plan, 3)  # reads fail twice, then pass
    assert plan.injected == 10
    assert dump_keyed(restored) == dump_keyed(live)
    assert verify_store(location.store()).ok


@pytest.mark.parametrize("where", ["/data/", "manifests/"])
def test_persistent_faults_fail_the_checkpoint_cleanly(location: Location, where: str) -> None:
    plan = FaultPlan()
    live = faulty_runner(location, plan)
    live.process(records(1))
    live.checkpoint()
    committed = dump_keyed(live)
    live.process(records(2))
    plan.add("write" if where == "/data/" else "commit", where, "persistent")
    with pytest.raises(CheckpointError) as err:
        live.checkpoint()
    assert "epoch 2" in str(err.value) and "injected persistent fault" in str(err.value)
    store = location.store()
    assert store.epochs() == [1]  # nothing of epoch 2 committed
    restored = LocalRunner(
        Accumulate, 2, checkpoint_uri=location.uri, storage_options=location.options
    )
    assert dump_keyed(restored) == committed
    plan.rules.clear()  # the storage heals: the next epoch commits, in full
    live.process(records(3))
    manifest = live.checkpoint()
    assert {f.kind for f in manifest.keyed_files} == {"base"}
    assert {f.epoch for f in manifest.keyed_files} == {3}
    assert dump_keyed(
        LocalRunner(Accumulate, 3, checkpoint_uri=location.uri, storage_options=location.options)
    ) == dump_keyed(live)
    assert verify_store(store).ok


def test_transient_faults_past_the_retry_budget_fail_cleanly(location: Location) -> None:
    plan = FaultPlan()
    plan.add("write", "/data/", "transient", times=1000)
    live = faulty_runner(location, plan)
    live.process(records(1))
    with pytest.raises(CheckpointError) as err:
        live.checkpoint()
    assert "still failing after 4 attempts" in str(err.value)
    assert SnapshotStore(location.uri, **location.options).epochs() == []


def test_uploads_run_in_the_background(location: Location) -> None:
    """checkpoint_async returns before the uploads finish: processing goes on meanwhile."""
    plan = FaultPlan()
    gate = __import__("threading").Event()
    live = faulty_runner(location, plan)
    original = live.store.fs.pipe_file  # type: ignore[union-attr]

    def slow_pipe(path: str, value: bytes, **kwargs: object) -> None:
        gate.wait(10)
        original(path, value, **kwargs)

    live.store.fs.pipe_file = slow_pipe  # type: ignore[union-attr]
    live.process(records(1))
    future = live.checkpoint_async()
    live.process(records(2))  # runs while epoch 1 is still uploading
    assert not future.done()
    gate.set()
    assert future.result(30).epoch == 1
    assert live.checkpoint().epoch == 2
    assert dump_keyed(
        LocalRunner(Accumulate, 2, checkpoint_uri=location.uri, storage_options=location.options)
    ) == dump_keyed(live)
