"""Checkpoint listeners on the local runner, as Flink's CheckpointListener.

Flink calls ``notifyCheckpointComplete(id)`` once the checkpoint is complete (here: the epoch's
manifest is committed) and ``notifyCheckpointAborted(id)`` for one that will not complete, both
on the task's own thread between records. A two-phase-commit sink (Flink's
TwoPhaseCommitSinkFunction) pre-commits a transaction per checkpoint and commits it on the
notification, committing on restore whatever a checkpoint left pending.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
from statetier.backend import (
    FunctionInitializationContext,
    FunctionSnapshotContext,
    ListStateDescriptor,
    ValueStateDescriptor,
)
from statetier.backend.functions import CheckpointListener, KeyedProcessFunction, RuntimeContext
from statetier.backend.local_runner import LocalRunner
from statetier.backend.snapshot import CheckpointError, SnapshotStore


class Listening(KeyedProcessFunction[str, int, Any]):
    """Records every notification with what the store shows at that moment."""

    # (what, epoch, the committed epochs then, thread)
    calls: ClassVar[list[tuple[str, int, list[int], int]]] = []
    uri: ClassVar[str] = ""

    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(ValueStateDescriptor[int]("count"))

    def process(self, key: str, value: int, context: RuntimeContext) -> list[Any]:
        self.count.update((self.count.value() or 0) + value)
        return []

    def _record(self, what: str, epoch: int) -> None:
        committed = SnapshotStore(self.uri).epochs()
        Listening.calls.append((what, epoch, committed, threading.get_ident()))

    def notify_checkpoint_complete(self, epoch: int) -> None:
        self._record("complete", epoch)

    def notify_checkpoint_aborted(self, epoch: int) -> None:
        self._record("aborted", epoch)


@pytest.fixture
def listening(tmp_path: Path) -> str:
    Listening.calls = []
    Listening.uri = f"file://{tmp_path}"
    return Listening.uri


def test_complete_is_called_after_the_manifest_is_committed(listening: str) -> None:
    assert isinstance(Listening(), CheckpointListener)
    runner = LocalRunner(Listening, 2, checkpoint_uri=listening)
    runner.run_epoch([("a", 1), ("b", 2)])
    runner.run_epoch([("a", 1)])
    runner.close()
    me = threading.get_ident()
    # once per instance and epoch, each seeing its epoch committed, on the caller's thread
    assert Listening.calls == [
        ("complete", 1, [1], me),
        ("complete", 1, [1], me),
        ("complete", 2, [1, 2], me),
        ("complete", 2, [1, 2], me),
    ]


def test_async_checkpoints_are_notified_at_the_next_call_in_epoch_order(listening: str) -> None:
    runner = LocalRunner(Listening, 1, checkpoint_uri=listening)
    runner.process([("a", 1)])
    first = runner.checkpoint_async()
    runner.process([("a", 1)])
    second = runner.checkpoint_async()
    first.result()
    second.result()
    assert Listening.calls == []  # never from the committer's thread
    runner.process([])
    assert [(what, epoch) for what, epoch, *_ in Listening.calls] == [
        ("complete", 1),
        ("complete", 2),
    ]
    assert {thread for *_, thread in Listening.calls} == {threading.get_ident()}
    runner.close()


def test_an_epoch_that_fails_to_commit_is_notified_as_aborted(listening: str) -> None:
    """A fenced writer (another runner took over the location) cannot commit: its functions
    hear that the epoch is aborted, and never that it completed."""
    old = LocalRunner(Listening, 1, checkpoint_uri=listening)
    old.run_epoch([("a", 1)])
    new = LocalRunner(Listening, 1, checkpoint_uri=listening)
    new.run_epoch([("a", 1)])  # epoch 2 by the new writer fences the old one
    Listening.calls = []
    with pytest.raises(CheckpointError, match=r"fenced|not committed"):
        old.run_epoch([("a", 5)])  # the old writer's epoch 2
    assert [(what, epoch) for what, epoch, *_ in Listening.calls] == [("aborted", 2)]
    assert SnapshotStore(listening).manifest(2).owner == new.checkpointer.owner  # type: ignore[union-attr]
    old.close()
    new.close()


# --------------------------------------------------------------------------- two-phase commit


class TwoPhaseCommitSink(KeyedProcessFunction[str, int, Any]):
    """Writes each epoch's records to an external store exactly once.

    Records go to the open transaction. ``snapshot_state`` pre-commits it: the records are
    staged under the transaction's name (epoch, instance) and the name is listed as pending in
    operator state, so the checkpoint holds it. ``notify_checkpoint_complete`` commits every
    pending transaction up to the epoch (publishes it: a rename). A restore commits what its
    checkpoint still lists as pending, since the notification may have been lost; committing
    is idempotent. ``notify_checkpoint_aborted`` drops the epoch's staged records.
    """

    root: ClassVar[Path] = Path()

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        self.pending = context.operator_state_store.get_list_state(
            ListStateDescriptor[tuple[int, int]]("pending-transactions")
        )
        self.index = context.operator_state_store.index
        self.open_records: list[str] = []
        if context.is_restored:
            for epoch, index in self.pending.get():
                self._commit(epoch, index)  # committed, but perhaps never told so
            self.pending.clear()

    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        epoch = context.checkpoint_id
        staged = self.root / f"staged-{epoch}-{self.index}"
        staged.write_text("".join(f"{line}\n" for line in self.open_records))  # pre-commit
        self.open_records = []
        self.pending.add((epoch, self.index))

    def process(self, key: str, value: int, context: RuntimeContext) -> list[Any]:
        self.open_records.append(f"{key}={value}")
        return []

    def notify_checkpoint_complete(self, epoch: int) -> None:
        pending = self.pending.get()
        for done, index in pending:
            if done <= epoch:
                self._commit(done, index)
        self.pending.update([(e, i) for e, i in pending if e > epoch])

    def notify_checkpoint_aborted(self, epoch: int) -> None:
        (self.root / f"staged-{epoch}-{self.index}").unlink(missing_ok=True)
        self.pending.update([(e, i) for e, i in self.pending.get() if e != epoch])

    def _commit(self, epoch: int, index: int) -> None:
        staged = self.root / f"staged-{epoch}-{index}"
        if staged.exists():  # a second commit finds nothing to do
            staged.rename(self.root / f"committed-{epoch}-{index}")


def committed_records(root: Path) -> list[str]:
    return sorted(line for f in root.glob("committed-*") for line in f.read_text().split())


def test_two_phase_commit_sink_writes_each_record_once(tmp_path: Path) -> None:
    TwoPhaseCommitSink.root = tmp_path / "external"
    TwoPhaseCommitSink.root.mkdir()
    uri = f"file://{tmp_path / 'ckpt'}"
    runner = LocalRunner(TwoPhaseCommitSink, 2, checkpoint_uri=uri)
    runner.run_epoch([("a", 1), ("b", 2)])
    assert committed_records(TwoPhaseCommitSink.root) == ["a=1", "b=2"]
    runner.process([("c", 3)])
    runner.checkpoint_async().result()  # committed, but the runner "crashes" before telling
    assert committed_records(TwoPhaseCommitSink.root) == ["a=1", "b=2"]
    runner.process([("lost", 4)])  # never checkpointed: must never become visible
    runner.checkpointer.close()  # type: ignore[union-attr]

    restarted = LocalRunner(TwoPhaseCommitSink, 3, checkpoint_uri=uri)  # the restore commits
    assert committed_records(TwoPhaseCommitSink.root) == ["a=1", "b=2", "c=3"]
    restarted.run_epoch([("d", 4)])
    restarted.close()
    assert committed_records(TwoPhaseCommitSink.root) == ["a=1", "b=2", "c=3", "d=4"]
    assert not list(TwoPhaseCommitSink.root.glob("staged-*"))
