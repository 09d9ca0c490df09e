"""Ranges gathered from several tasks: every partition of a micro-batch sends its piece of each.

Spark's exchange is the largest cost a pipeline adds to a micro-batch on a cluster (the executors
serialize, write, fetch and read back every record), and it exists only to bring each key-group
range to one task. A state host can gather a range itself: each of the micro-batch's P tasks
cuts its partition into the ranges and sends piece ``p`` of ``P`` of every range to the range's
host (see task), all under one attempt name (the epoch and Spark's stage).

The host runs a range once it holds all P pieces, in piece order (the same records in the same
order whichever tasks came first: the input is replayable), with the header of the piece that
completed it, and sends the outputs back to that piece's task only; every other piece gets an
end at once, so no task holds a Spark slot waiting for a task Spark has not started. Each output
row thus leaves Spark through exactly one task, the completer, whatever the timing:

- a retried or speculative attempt of a task replaces its piece while the range has not run;
- after the range ran, an attempt of the completer's partition gets the same outputs again (the
  host keeps them until the next attempt of the range supersedes them), any other partition's
  attempt gets an end;
- a range whose run failed waits again: the completer's retry completes and runs it (restored,
  as its state is dirty).

Pieces sent to a host that dies are lost with it, and so are the outputs a completing task got
before its executor died; the tasks that sent or got them are done, so Spark does not send them
again. Each task tells the driver which ranges' outputs it passed on, and the driver fails the
job (then runs the epoch again) rather than let it succeed without a range (see deliveries).

A micro-batch of more partitions than the cluster runs at once has pieces waiting for tasks
Spark has not started yet. The pieces a host holds in memory are bounded (``PieceMemory``): the
rest go to a file on the local disk, mapped back when their range runs, as Spark's shuffle
writes its blocks to the local disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import threading
import time
import uuid
from multiprocessing.connection import Connection

import pyarrow as pa
from statetier.backend import metrics

__all__ = ["GatherError", "Gathering", "Gatherings", "Piece", "PieceMemory"]

POLL_S = 0.5  # how often a piece waiting for a run already under way looks at its connection


class GatherError(RuntimeError):
    """A gathered range failed, or a piece does not fit its gathering: the task fails."""


@dataclasses.dataclass(frozen=True)
class PieceMemory:
    """How many bytes of pieces a host keeps in memory, and where it writes the others."""

    limit: int
    directory: str = dataclasses.field(default_factory=tempfile.gettempdir)


@dataclasses.dataclass
class Piece:
    """One task's records of a range: in memory (``batches``, ``nbytes`` of them), or in the
    Arrow IPC file ``path``."""

    batches: list[pa.RecordBatch] | None
    path: str | None = None
    nbytes: int = 0

    def records(self) -> list[pa.RecordBatch]:
        """The records, a file's mapped (its pages stay the kernel's to drop)."""
        if self.path is None:
            return list(self.batches or [])
        table = pa.ipc.open_file(pa.memory_map(self.path)).read_all()
        batches: list[pa.RecordBatch] = table.to_batches()
        return batches

    def release(self) -> None:
        """Forget the records (a file goes; a mapping made of it lasts while it is used)."""
        self.batches = None
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def write_piece(batches: list[pa.RecordBatch], directory: str) -> Piece:
    """``batches`` written to a new Arrow IPC file in ``directory``."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"statetier-piece-{uuid.uuid4().hex}.arrow")
    schema = batches[0].schema
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return Piece(None, path)


@dataclasses.dataclass
class Gathering:
    """The pieces of one range for one attempt (``attempt``), and its run once they are in."""

    attempt: str
    pieces: list[Piece | None]
    completer: int | None = None  # the piece that completed the range (its run under way)
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    outputs: list[pa.RecordBatch] = dataclasses.field(default_factory=list)
    error: str | None = None

    def missing(self) -> int:
        return sum(piece is None for piece in self.pieces)

    def wait(self, conn: Connection, timeout: float) -> list[pa.RecordBatch]:
        """The outputs of the run under way, for another attempt of the completer's task.
        EOFError when this attempt's task is gone (it sends nothing after its records, so
        anything readable is its connection closing); GatherError when the run failed or took
        more than ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        done = self.done  # a failed run replaces the event after it set this one
        while not done.wait(POLL_S):
            if conn.poll():
                raise EOFError("the task of this piece is gone")
            if time.monotonic() > deadline:
                raise GatherError(f"the range's run did not end within {timeout:.0f}s")
        if self.error is not None:
            raise GatherError(self.error)
        return self.outputs


RangeKey = tuple[str, int, int]  # (pipeline, parallelism, range index)


class Gatherings:
    """The ranges a host gathers: one :class:`Gathering` per range, the latest attempt's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranges: dict[RangeKey, Gathering] = {}
        self._in_memory = 0  # bytes of the pieces held in memory

    def add(
        self,
        key: RangeKey,
        attempt: str,
        piece: int,
        pieces: int,
        batches: list[pa.RecordBatch],
        memory: PieceMemory,
    ) -> tuple[Gathering, list[pa.RecordBatch] | None]:
        """File ``piece`` of ``pieces`` of range ``key`` for ``attempt`` (in memory within
        ``memory``, else on disk): its gathering, and the range's records in piece order when
        this piece completed it (the caller runs the range, then calls :meth:`finish` or
        :meth:`failed`), else None (see the module's rules)."""
        if not 0 <= piece < pieces:
            raise GatherError(f"piece {piece} of {pieces} is not a piece of a range")
        with self._lock:
            gathering = self._ranges.get(key)
            if gathering is None or gathering.attempt != attempt:
                if gathering is not None:
                    self._release(gathering)
                gathering = self._ranges[key] = Gathering(attempt, [None] * pieces)
            elif len(gathering.pieces) != pieces:
                raise GatherError(
                    f"range {key[2]} came in {pieces} pieces and in {len(gathering.pieces)} "
                    f"in attempt {attempt}"
                )
            if gathering.completer is not None:
                return gathering, None  # ran or running: the caller answers (returns_outputs)
            nbytes = sum(batch.nbytes for batch in batches)
            spill = bool(batches) and self._in_memory + nbytes > memory.limit
            if not spill:
                self._in_memory += nbytes
        filed = write_piece(batches, memory.directory) if spill else Piece(batches, None, nbytes)
        metrics.gathered_piece(nbytes, on_disk=spill)
        with self._lock:
            if self._ranges.get(key) is not gathering or gathering.completer is not None:
                self._drop(filed)  # superseded or completed while the piece was written
                return gathering, None
            earlier, gathering.pieces[piece] = gathering.pieces[piece], filed
            if earlier is not None:
                self._drop(earlier)
            if gathering.missing():
                return gathering, None
            gathering.completer = piece
            # mapped under the lock: a newer attempt may release the files next
            records = [b for p in gathering.pieces if p is not None for b in p.records()]
        return gathering, records

    def finish(self, gathering: Gathering, outputs: list[pa.RecordBatch]) -> None:
        """The range ran: its records go, its outputs stay for the completer's retries."""
        with self._lock:
            self._release(gathering)
            gathering.outputs, gathering.error = outputs, None
        gathering.done.set()

    def failed(self, gathering: Gathering, error: str) -> None:
        """The range's run failed: it waits for its completer's retry (the pieces stay), and
        attempts that wait for the run fail with ``error``."""
        with self._lock:
            gathering.completer = None
            gathering.error = error
            done, gathering.done = gathering.done, threading.Event()
        done.set()

    def returns_outputs(self, gathering: Gathering, piece: int) -> bool:
        """Whether ``piece``'s task gets the range's outputs: it completed the range."""
        with self._lock:
            return gathering.completer == piece

    def in_memory(self) -> int:
        """Bytes of pieces held in memory (not on disk)."""
        with self._lock:
            return self._in_memory

    def _release(self, gathering: Gathering) -> None:
        for piece in gathering.pieces:
            if piece is not None:
                self._drop(piece)
        gathering.pieces = [None] * len(gathering.pieces)

    def _drop(self, piece: Piece) -> None:
        self._in_memory -= piece.nbytes
        piece.nbytes = 0
        piece.release()
