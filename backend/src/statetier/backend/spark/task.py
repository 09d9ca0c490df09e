"""The Spark side of a task: find (or start) the executor's state host and stream to it.

This runs inside PySpark's Python worker as the ``mapInArrow`` function of one partition, that is
one key-group range. A function with a :class:`~statetier.backend.spark.functions.Combiner` also
gets a map-side ``mapInArrow`` before the exchange (:func:`combine_function`), which
pre-aggregates each input partition per key. The state host is started detached by the first
task of the application on the executor (under a file lock, so concurrent tasks start one host),
and found again by every later task through its socket path.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Client, Connection
from typing import Any

import pyarrow as pa
from statetier.backend.spark.protocol import (
    BATCH,
    ERROR,
    RESULT,
    epoch_property,
    read_batch,
    socket_path,
    write_batch,
)

__all__ = ["combine_function", "connect_host", "partition_function"]

START_TIMEOUT_S = 60.0
COMBINE_ROWS = 1 << 20  # input rows pre-aggregated at a time (bounds a map task's memory)


def _executor_pid() -> int:
    """The JVM this worker serves (the host exits when it is gone)."""
    pid = os.getppid()
    for _ in range(4):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "java":
                    return pid
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return os.getppid()


def _try_connect(path: str) -> Connection | None:
    try:
        return Client(path, family="AF_UNIX")
    except (FileNotFoundError, ConnectionRefusedError):
        return None


def connect_host(app_id: str, idle_timeout: float) -> Connection:
    """A connection to this executor's state host, started if none runs."""
    path = socket_path(app_id)
    conn = _try_connect(path)
    if conn is not None:
        return conn
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = _try_connect(path)
        if conn is not None:
            return conn
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        with open(path + ".log", "ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "statetier.backend.spark.host",
                    "--socket",
                    path,
                    "--idle-timeout",
                    str(idle_timeout),
                    "--watch-pid",
                    str(_executor_pid()),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            conn = _try_connect(path)
            if conn is not None:
                return conn
            if process.poll() is not None:
                break
            time.sleep(0.02)
        with open(path + ".log", errors="replace") as f:
            tail = f.read()[-2000:]
        raise RuntimeError(f"the statetier state host did not start at {path}:\n{tail}")


def request(path: str, op: str) -> dict[str, Any] | None:
    """Send a control request (``ping``, ``stats``, ``shutdown``) to the host at ``path``."""
    conn = _try_connect(path)
    if conn is None:
        return None
    with contextlib.closing(conn):
        conn.send_bytes(json.dumps({"op": op}).encode())
        answer = conn.recv_bytes()
    result: dict[str, Any] = json.loads(answer[1:])
    return result


def partition_function(
    spec: dict[str, Any], function_bytes: bytes
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of one epoch: each partition is the range of its index."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        task = TaskContext.get()
        assert task is not None
        index = task.partitionId()
        header = dict(spec)
        if "epoch" not in header:  # planned once: the epoch comes with the job
            header.update(_epoch_of_job(task, spec["pipeline"]))
        header.update(
            op="task",
            index=index,
            attempt_number=task.attemptNumber(),
            task_attempt_id=task.taskAttemptId(),
            token=f"{header['owner']}-t{task.taskAttemptId()}",
            base_token=header["base_tokens"].get(str(index)),
        )
        header.pop("base_tokens")
        conn = connect_host(spec["app_id"], spec["idle_timeout"])
        with contextlib.closing(conn):
            conn.send_bytes(json.dumps(header).encode())
            conn.send_bytes(function_bytes)
            for batch in batches:
                conn.send_bytes(write_batch(batch))
            conn.send_bytes(b"")
            while True:
                message = conn.recv_bytes()
                kind, body = message[:1], memoryview(message)[1:]
                if kind == BATCH:
                    yield read_batch(body)
                elif kind == RESULT:
                    return
                elif kind == ERROR:
                    raise RuntimeError(f"statetier state host failed:\n{bytes(body).decode()}")
                else:
                    raise RuntimeError(f"statetier state host sent an unknown frame {kind!r}")

    return run


def _epoch_of_job(task: Any, pipeline: str) -> dict[str, Any]:
    """The epoch a ``write_stream`` query's driver set on this micro-batch's job."""
    raw = task.getLocalProperty(epoch_property(pipeline))
    if raw is None:
        raise RuntimeError(
            f"statetier pipeline {pipeline}: this job carries no epoch; write the output of a "
            "stream planned by StatefulPipeline.write_stream through that query only"
        )
    epoch: dict[str, Any] = json.loads(raw)
    return epoch


def combine_function(
    group_columns: list[str], partial: list[tuple[str, str]], schema_bytes: bytes
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The map-side ``mapInArrow`` of a combiner: per chunk of input, one row per group.

    ``group_columns`` are the key columns and the key-group column, ``partial`` the Arrow
    aggregates, ``schema_bytes`` the serialized output schema (groups, the aggregates, then the
    number of input rows behind each row, so that the host still counts records). Each
    chunk of up to :data:`COMBINE_ROWS` rows is aggregated on its own, so memory stays bounded;
    the host merges whatever partial rows a key has.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        schema = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
        chunk: list[pa.RecordBatch] = []
        rows = 0
        for batch in batches:
            chunk.append(batch)
            rows += batch.num_rows
            if rows >= COMBINE_ROWS:
                yield from _combine(chunk, group_columns, partial, schema)
                chunk, rows = [], 0
        if rows:
            yield from _combine(chunk, group_columns, partial, schema)

    return run


def _combine(
    chunk: list[pa.RecordBatch],
    group_columns: list[str],
    partial: list[tuple[str, str]],
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    table = pa.Table.from_batches(chunk)
    aggregates: list[tuple[Any, str]] = [*partial, ([], "count_all")]  # + the input rows
    grouped = table.group_by(group_columns, use_threads=False).aggregate(aggregates)
    columns = [grouped[name] for name in group_columns]
    columns += [grouped[f"{column}_{how}"] for column, how in partial]
    columns.append(grouped["count_all"])
    out = pa.Table.from_arrays(columns, names=schema.names).cast(schema)
    yield from out.to_batches()
