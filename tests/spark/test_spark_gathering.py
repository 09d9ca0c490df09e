"""The rules by which a state host gathers a range from the pieces of several tasks: the range
runs once all pieces of one attempt are in, its outputs go to the completing piece's task only,
retries replace pieces or get the outputs again, a failed run waits for the completer's retry."""

from __future__ import annotations

import socket
import threading
from multiprocessing.connection import Connection
from pathlib import Path

import pyarrow as pa
import pytest
from statetier.backend.spark.gathering import GatherError, Gatherings, PieceMemory

KEY = ("wordcount", 4, 1)
MEMORY = PieceMemory(1 << 30)  # every piece in memory


def piece(*words: str) -> list[pa.RecordBatch]:
    return [pa.record_batch({"word": list(words)})]


def words(records: list[pa.RecordBatch] | None) -> list[str]:
    assert records is not None
    return [w for batch in records for w in batch.column("word").to_pylist()]


def test_a_range_runs_once_every_piece_is_in_in_piece_order() -> None:
    gatherings = Gatherings()
    assert gatherings.add(KEY, "3.7", 2, 3, piece("c"), MEMORY)[1] is None
    assert gatherings.add(KEY, "3.7", 0, 3, piece("a", "b"), MEMORY)[1] is None
    gathering, records = gatherings.add(KEY, "3.7", 1, 3, piece("x"), MEMORY)
    assert words(records) == ["a", "b", "x", "c"]  # the same order whoever came last
    outputs = piece("out")
    gatherings.finish(gathering, outputs)
    # only the piece that completed the range returns its outputs
    assert [gatherings.returns_outputs(gathering, p) for p in range(3)] == [False, True, False]


def test_a_retried_piece_replaces_its_earlier_attempt_until_the_range_runs() -> None:
    gatherings = Gatherings()
    gatherings.add(KEY, "3.7", 0, 2, piece("first attempt"), MEMORY)
    gatherings.add(KEY, "3.7", 0, 2, piece("retry"), MEMORY)
    _, records = gatherings.add(KEY, "3.7", 1, 2, piece("b"), MEMORY)
    assert words(records) == ["retry", "b"]


def test_after_the_run_the_completers_retry_gets_the_outputs_again_and_no_one_else_does() -> None:
    gatherings = Gatherings()
    gatherings.add(KEY, "3.7", 1, 2, piece("b"), MEMORY)
    gathering, records = gatherings.add(KEY, "3.7", 0, 2, piece("a"), MEMORY)
    assert records is not None
    outputs = piece("a=1", "b=1")
    gatherings.finish(gathering, outputs)
    for again in (0, 1):  # a retry or a speculative attempt of either task
        same, rerun = gatherings.add(
            KEY, "3.7", again, 2, piece("a" if again == 0 else "b"), MEMORY
        )
        assert same is gathering and rerun is None  # the range does not run twice
    assert gatherings.returns_outputs(gathering, 0) and not gatherings.returns_outputs(gathering, 1)
    left, right = socket.socketpair()
    with left, right:
        assert gathering.wait(Connection(left.detach()), timeout=1.0) == outputs


def test_a_failed_run_waits_for_the_completers_retry_and_runs_again() -> None:
    gatherings = Gatherings()
    gatherings.add(KEY, "3.7", 0, 2, piece("a"), MEMORY)
    gathering, records = gatherings.add(KEY, "3.7", 1, 2, piece("b"), MEMORY)
    assert records is not None
    gatherings.failed(gathering, "RuntimeError: injected")
    assert not gatherings.returns_outputs(gathering, 1)  # no completer until it runs again
    _, again = gatherings.add(KEY, "3.7", 1, 2, piece("b"), MEMORY)  # Spark retries the failed task
    assert words(again) == ["a", "b"]


def test_an_attempt_waiting_for_a_run_under_way_gets_its_failure() -> None:
    gatherings = Gatherings()
    gatherings.add(KEY, "3.7", 0, 2, piece("a"), MEMORY)
    gathering, _ = gatherings.add(KEY, "3.7", 1, 2, piece("b"), MEMORY)  # runs (in another thread)
    left, right = socket.socketpair()
    errors: list[Exception] = []

    def speculative_attempt() -> None:
        try:
            gathering.wait(Connection(left.detach()), timeout=10.0)
        except GatherError as e:
            errors.append(e)

    waiter = threading.Thread(target=speculative_attempt)
    waiter.start()
    gatherings.failed(gathering, "RuntimeError: injected")
    waiter.join(5.0)
    right.close()
    assert not waiter.is_alive() and "injected" in str(errors[0])


def test_a_waiting_attempt_whose_task_is_gone_stops_waiting() -> None:
    gatherings = Gatherings()
    gatherings.add(KEY, "3.7", 0, 2, piece("a"), MEMORY)
    gathering, _ = gatherings.add(KEY, "3.7", 1, 2, piece("b"), MEMORY)
    left, right = socket.socketpair()
    right.close()  # the task's worker was killed
    with pytest.raises(EOFError):
        gathering.wait(Connection(left.detach()), timeout=10.0)


def test_a_new_attempt_drops_the_pieces_of_the_earlier_one() -> None:
    gatherings = Gatherings()
    gatherings.add(KEY, "3.7", 0, 2, piece("old"), MEMORY)  # its job failed before piece 1 came
    assert gatherings.add(KEY, "3.9", 1, 2, piece("b"), MEMORY)[1] is None
    _, records = gatherings.add(KEY, "3.9", 0, 2, piece("a"), MEMORY)
    assert words(records) == ["a", "b"]


@pytest.mark.parametrize(
    ("piece_index", "pieces", "error"),
    [(2, 2, "piece 2 of 2 is not a piece"), (-1, 2, "piece -1 of 2"), (0, 3, "in 3 pieces")],
)
def test_a_piece_that_does_not_fit_its_gathering_is_refused(
    piece_index: int, pieces: int, error: str
) -> None:
    gatherings = Gatherings()
    gatherings.add(KEY, "3.7", 1, 2, piece("b"), MEMORY)
    with pytest.raises(GatherError, match=error):
        gatherings.add(KEY, "3.7", piece_index, pieces, piece("a"), MEMORY)


def test_pieces_beyond_the_memory_limit_wait_on_disk_and_go_when_their_range_ran(
    tmp_path: Path,
) -> None:
    """A micro-batch of more partitions than the cluster runs at once: the pieces that wait for
    tasks not started yet are bounded in memory, the rest wait in files."""
    gatherings = Gatherings()
    first = piece(*(f"w{i}" for i in range(1000)))
    limit = PieceMemory(first[0].nbytes + 1, str(tmp_path / "pieces"))
    gatherings.add(KEY, "3.7", 0, 3, first, limit)  # within the limit: in memory
    assert gatherings.in_memory() == first[0].nbytes
    gatherings.add(KEY, "3.7", 1, 3, piece("x", "y"), limit)  # beyond it: on disk
    assert gatherings.in_memory() == first[0].nbytes
    assert len(list((tmp_path / "pieces").iterdir())) == 1
    gathering, records = gatherings.add(KEY, "3.7", 2, 3, piece("z"), limit)
    assert words(records)[-3:] == ["x", "y", "z"] and len(words(records)) == 1003
    gatherings.finish(gathering, [])
    assert gatherings.in_memory() == 0
    assert list((tmp_path / "pieces").iterdir()) == []  # its file went with the range's run


def test_a_superseded_attempt_frees_its_memory_and_its_files(tmp_path: Path) -> None:
    gatherings = Gatherings()
    on_disk = PieceMemory(0, str(tmp_path))
    gatherings.add(KEY, "3.7", 0, 2, piece("a"), MEMORY)
    gatherings.add(KEY, "3.7", 0, 2, piece("a", "again"), MEMORY)  # a retry replaces it
    assert gatherings.in_memory() == piece("a", "again")[0].nbytes
    other = ("wordcount", 4, 2)
    gatherings.add(other, "3.7", 0, 2, piece("c"), on_disk)
    assert len(list(tmp_path.iterdir())) == 1
    gatherings.add(KEY, "3.9", 1, 2, piece("b"), MEMORY)  # the next job's attempt
    gatherings.add(other, "3.9", 1, 2, piece("d"), MEMORY)
    assert gatherings.in_memory() == piece("b")[0].nbytes + piece("d")[0].nbytes
    assert list(tmp_path.iterdir()) == []
