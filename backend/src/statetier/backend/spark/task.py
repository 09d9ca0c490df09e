"""The Spark side of a task: find the state host that owns its range and stream to it.

This runs inside PySpark's Python worker as the ``mapInArrow`` function of one partition: after
Spark's exchange, one key-group range (:func:`partition_function`); without it, a micro-batch
of one partition, which the task cuts into every range itself (:func:`direct_function`). A
function with a :class:`~statetier.backend.spark.functions.Combiner` also gets a map-side
``mapInArrow`` before the exchange (:func:`combine_function`), which pre-aggregates each input
partition per key.

Each task first makes sure its own executor has its state hosts, one per host slot (see slots;
the first task of the application on the executor starts them, detached, each under a file lock
so concurrent tasks start one) and that its slot's host is registered with the driver. Then it
asks the driver's registry which host owns its range (see registry) and streams its records
there: over the host's Unix socket when the owner runs on the task's executor, else over TCP to
the owner's executor. Every connection is authenticated with
the application's secret (see channel).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import itertools
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pyarrow as pa
from statetier.backend.integer_columns import int64_values
from statetier.backend.spark.channel import Endpoint, connect
from statetier.backend.spark.deliveries import DeliveryReport, report_delivered
from statetier.backend.spark.frozen_imports import leaves_imports_out_of_collections
from statetier.backend.spark.functions import KEY_GROUP_COLUMN
from statetier.backend.spark.membership import HostStoppingError, JoinError, ask_to_join
from statetier.backend.spark.messages import EpochSpec, PipelineSpec, TaskHeader
from statetier.backend.spark.protocol import (
    BATCH,
    ERROR,
    REFUSED,
    RESULT,
    epoch_property,
    host_file,
    read_batch,
    socket_path,
    write_batch,
)
from statetier.backend.spark.refusals import StateRefusedError
from statetier.backend.spark.registry import HostInfo, ask_route
from statetier.backend.spark.slots import slot_of

__all__ = [
    "bind_address",
    "combine_function",
    "direct_function",
    "endpoint_to",
    "epoch_of_job",
    "gather_function",
    "local_host",
    "partition_function",
    "receive_outputs",
    "send_task",
    "split_ranges",
    "stream",
]

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


def _join(path: str, secret: bytes, registry: Endpoint) -> HostInfo | None:
    """The host at ``path``, registered with ``registry``; None when no host serves there (none
    listens, or the one there is stopping: a new one may take its place); :class:`JoinError`
    when it could not register, or closed the connection unanswered."""
    try:
        return ask_to_join(Endpoint("unix", path), secret, registry)
    except (FileNotFoundError, ConnectionRefusedError, HostStoppingError):
        return None
    except (EOFError, BrokenPipeError, ConnectionResetError):
        raise JoinError(
            f"the state host at {path} closed the connection without answering: it stopped or "
            "failed meanwhile (its statetier-host-*.log is in the executor's first local dir, "
            "else the temp dir)"
        ) from None


def bind_address(configured: str, registry: Endpoint) -> str:
    """Where this executor's host listens for tasks of other executors: the configured address,
    else the pod's IP (Spark on Kubernetes sets it), else the local address that routes to the
    driver (the interface the cluster reaches this executor on). Never a wildcard."""
    if configured:
        return configured
    pod_ip = os.environ.get("SPARK_EXECUTOR_POD_IP")
    if pod_ip:
        return pod_ip
    family = socket.AF_INET6 if ":" in registry.address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((registry.address, registry.port or 9))  # no packet is sent
        address: str = probe.getsockname()[0]
    return address


def local_host(spec: PipelineSpec, slot: int = 0) -> HostInfo:
    """This executor's state host of ``slot`` (see slots), registered with the driver. When it
    does not run, every missing host of the executor is started at once (each under its own
    file lock, so concurrent tasks start one of each): the driver spreads ranges over them
    all, and waits for the executors' hosts that have not joined."""
    host = _join(socket_path(spec.app_id, slot=slot), spec.secret, spec.registry)
    if host is not None:
        return host
    with contextlib.ExitStack() as locks:
        starting: dict[int, subprocess.Popen[bytes] | None] = {}
        for s in range(max(slot + 1, spec.hosts)):  # in slot order: no two tasks deadlock
            lock = locks.enter_context(open(host_file(spec.app_id, ".lock", slot=s), "w"))
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = socket_path(spec.app_id, slot=s)
            running = _join(path, spec.secret, spec.registry) is not None
            starting[s] = None if running else _start_host(spec, s)
        for s, process in starting.items():
            if process is not None:
                _wait_started(spec, s, process)
    host = _join(socket_path(spec.app_id, slot=slot), spec.secret, spec.registry)
    if host is None:
        raise RuntimeError(f"the statetier state host of slot {slot} stopped as it started")
    return host


def _wait_started(spec: PipelineSpec, slot: int, process: subprocess.Popen[bytes]) -> None:
    """Wait until the host of ``slot`` listens; an error with its log's end if it does not."""
    path = socket_path(spec.app_id, slot=slot)
    deadline = time.monotonic() + START_TIMEOUT_S
    refused: JoinError | None = None
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if _join(path, spec.secret, spec.registry) is not None:
                return
        except JoinError as e:  # it listens, but its registration failed: once more
            refused = e
            time.sleep(0.5)
        time.sleep(0.02)
    if refused is not None and process.poll() is None:
        raise refused
    status = process.poll()
    log_path = host_file(spec.app_id, ".log", slot=slot)
    with open(log_path, errors="replace") as f:
        tail = f.read()[-2000:]
    why = (
        f"it exited with status {status}"
        if status is not None
        else f"it did not listen within {START_TIMEOUT_S:.0f}s"
    )
    raise RuntimeError(
        f"the statetier state host did not start at {path}: {why}; its log "
        f"({log_path}) ends with:\n{tail}"
    )


def _start_host(spec: PipelineSpec, slot: int) -> subprocess.Popen[bytes]:
    """Start the state host of ``slot``, detached (it outlives the task's Python worker)."""
    path = socket_path(spec.app_id, slot=slot)
    log_path = host_file(spec.app_id, ".log", slot=slot)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    command = [
        sys.executable,
        "-m",
        "statetier.backend.spark.host",
        "--socket",
        path,
        "--bind",
        bind_address(spec.host_bind, spec.registry),
        "--port",
        str(spec.host_port),
        "--idle-timeout",
        str(spec.idle_timeout),
        "--watch-pid",
        str(_executor_pid()),
        "--hosts",
        str(spec.hosts),
    ]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        process.stdin.write(spec.secret.hex().encode() + b"\n")
        process.stdin.close()
    return process


def endpoint_to(owner: HostInfo, local: HostInfo) -> Endpoint:
    """Where a task reaches the range's ``owner`` from beside ``local``: the owner's Unix
    socket when it runs on the task's executor (any of its hosts), else its TCP endpoint."""
    beside = owner.host_id == local.host_id or (
        bool(owner.executor) and (owner.executor, owner.node) == (local.executor, local.node)
    )
    kind = "unix" if beside else "tcp"
    return next(e for e in owner.endpoints if e.kind == kind)


def _open(owner: HostInfo, local: HostInfo, secret: bytes) -> Connection:
    return connect(endpoint_to(owner, local), secret)


def _owner_connection(
    spec: PipelineSpec, index: int, local: HostInfo
) -> tuple[HostInfo, Connection]:
    """The owner of range ``index`` as the driver assigns it, connected. An owner this task
    cannot reach is reported: the driver probes it and assigns a new owner if it is gone."""
    registry, secret = spec.registry, spec.secret
    key = (spec.state.pipeline, spec.state.parallelism, index)
    owner = ask_route(registry, secret, key, local.host_id)
    try:
        return owner, _open(owner, local, secret)
    except OSError:
        owner = ask_route(registry, secret, key, local.host_id, unreachable=owner.host_id)
        return owner, _open(owner, local, secret)


def partition_function(
    spec: PipelineSpec, epoch: EpochSpec | None, function_bytes: bytes
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of one epoch: each partition is the range of its index,
    streamed to the state host that owns the range and its outputs read back. ``epoch`` None:
    a query planned once, whose epoch comes with each job (see :func:`epoch_of_job`)."""

    @leaves_imports_out_of_collections
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        task = TaskContext.get()
        assert task is not None
        index = task.partitionId()
        this_epoch = epoch or epoch_of_job(task, spec.state.pipeline)
        local = local_host(spec, slot_of(index, spec.hosts))
        owner, conn = _owner_connection(spec, index, local)
        header = _header(spec, this_epoch, task, index, owner)
        with contextlib.closing(conn), _host_lost(owner, index):
            yield from stream(conn, header, function_bytes, batches)

    return run


@dataclasses.dataclass(frozen=True)
class Gather:
    """A task's part in a gathered epoch: its piece of every range, of how many."""

    piece: int = 0
    pieces: int = 1
    attempt: str = ""


def _header(
    spec: PipelineSpec,
    epoch: EpochSpec,
    task: Any,
    index: int,
    owner: HostInfo,
    gather: Gather = Gather(),
) -> TaskHeader:
    """The header of range ``index`` (of this task's piece of it: ``gather``) sent by this
    Spark task attempt to its ``owner``."""
    return TaskHeader.for_task(
        spec,
        epoch,
        index=index,
        attempt_number=task.attemptNumber(),
        task_attempt_id=task.taskAttemptId(),
        owner_host=owner.host_id,
        piece=gather.piece,
        pieces=gather.pieces,
        gather_attempt=gather.attempt,
    )


def stream(
    conn: Connection,
    header: TaskHeader,
    function_bytes: bytes,
    batches: Iterable[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """Send a task to a state host: its header, function and records; yield its outputs."""
    send_task(conn, header, function_bytes, batches)
    yield from receive_outputs(conn)


def send_task(
    conn: Connection,
    header: TaskHeader,
    function_bytes: bytes,
    batches: Iterable[pa.RecordBatch],
) -> None:
    """A task's header, function and records, then the empty frame that ends them: the host
    starts on the range once it has them all."""
    conn.send_bytes(json.dumps(header.encode()).encode())
    conn.send_bytes(function_bytes)
    for batch in batches:
        conn.send_bytes(write_batch(batch))
    conn.send_bytes(b"")


def receive_outputs(conn: Connection) -> Generator[pa.RecordBatch, None, dict[str, Any]]:
    """The outputs of the task sent on ``conn``, until the host says it is done; then what the
    host said at the end."""
    while True:
        message = conn.recv_bytes()
        kind, body = message[:1], memoryview(message)[1:]
        if kind == BATCH:
            yield read_batch(body)
        elif kind == RESULT:
            end: dict[str, Any] = json.loads(bytes(body)) if len(body) else {}
            return end
        elif kind == ERROR:
            raise RuntimeError(f"statetier state host failed:\n{bytes(body).decode()}")
        elif kind == REFUSED:
            raise StateRefusedError(bytes(body).decode())
        else:
            raise RuntimeError(f"statetier state host sent an unknown frame {kind!r}")


@dataclasses.dataclass(frozen=True)
class Combining:
    """A combiner's aggregation as a task applies it in Arrow: the columns it groups by (the
    key columns and the key-group column), its partial aggregates, and the output schema
    (serialized: the groups, the aggregates, then the input rows behind each row)."""

    group_columns: list[str]
    partial: list[tuple[str, str]]
    schema_bytes: bytes

    @functools.cached_property
    def schema(self) -> pa.Schema:
        """The output schema, parsed once per task (not once per chunk)."""
        return pa.ipc.read_schema(pa.py_buffer(self.schema_bytes))

    def apply(self, batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return []
        return list(_combine(batches, self.group_columns, self.partial, self.schema))


def direct_function(
    spec: PipelineSpec,
    epoch: EpochSpec | None,
    function_bytes: bytes,
    combining: Combining | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of an epoch without Spark's exchange: its one partition is the
    whole micro-batch, which the task cuts into the key-group ranges (by the key-group column
    the plan added) and sends to each range's state host, every range first, so that the hosts
    work on them side by side; then it reads back their outputs, range by range.

    With ``combining`` (a function's combiner, applied in Spark SQL after an exchange) the task
    aggregates the micro-batch first: it holds every record of it, so its rows are final, one
    per key, as the Spark SQL aggregation's are.

    A retry of this task is a retry of every range (each host finds its range dirty or at
    another epoch and restores it), as a retry of one range's task is with the exchange."""

    @leaves_imports_out_of_collections
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        task = TaskContext.get()
        assert task is not None
        this_epoch = epoch or epoch_of_job(task, spec.state.pipeline)
        records = list(batches)
        if combining is not None:
            records = combining.apply(records)
        slices = split_ranges(records, spec.state.parallelism, spec.state.max_parallelism)
        yield from _send_ranges(spec, this_epoch, task, slices, function_bytes)

    return run


def gather_function(
    spec: PipelineSpec,
    epoch: EpochSpec | None,
    function_bytes: bytes,
    pieces: int,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of an epoch the state hosts gather (see gathering): the task
    of partition ``p`` of the micro-batch's ``pieces`` cuts it into the key-group ranges and
    sends piece ``p`` of every range to the range's host, then reads back the outputs of the
    ranges its piece completed, and before it ends tells the driver which ranges those were:
    the driver fails it when a range can no longer be delivered (see deliveries), so that the
    sink's job never succeeds without a range. The epoch and Spark's stage name the pieces of
    one run, so that a host never mixes them with those of another job over the same epoch."""

    @leaves_imports_out_of_collections
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        task = TaskContext.get()
        assert task is not None
        this_epoch = epoch or epoch_of_job(task, spec.state.pipeline)
        slices = split_ranges(list(batches), spec.state.parallelism, spec.state.max_parallelism)
        gather = Gather(
            piece=task.partitionId(),
            pieces=pieces,
            attempt=f"{this_epoch.epoch}.{task.stageId()}",
        )
        ranges = yield from _send_ranges(spec, this_epoch, task, slices, function_bytes, gather)
        report = DeliveryReport(
            pipeline=spec.state.pipeline,
            epoch=this_epoch.epoch,
            stage=task.stageId(),
            piece=gather.piece,
            pieces=pieces,
            ranges=spec.state.parallelism,
            delivered=tuple(ranges),
        )
        report_delivered(spec.registry, spec.secret, report)

    return run


def _send_ranges(
    spec: PipelineSpec,
    epoch: EpochSpec,
    task: Any,
    slices: list[list[pa.RecordBatch]],
    function_bytes: bytes,
    gather: Gather = Gather(),
) -> Generator[pa.RecordBatch, None, list[int]]:
    """Send range ``i``'s records ``slices[i]`` to its host, every range first (the hosts work
    on them side by side); then read back each range's outputs, range by range. Returns the
    ranges whose hosts said this task completed them (gathered ranges)."""
    with contextlib.ExitStack() as open_connections:
        sent: list[tuple[HostInfo, int, Connection]] = []
        # once for the task, not once per range
        local = local_host(spec, slot_of(task.partitionId(), spec.hosts))
        for index, records in enumerate(slices):
            owner, conn = _owner_connection(spec, index, local)
            open_connections.callback(conn.close)
            header = _header(spec, epoch, task, index, owner, gather)
            with _host_lost(owner, index):
                send_task(conn, header, function_bytes, records)
            sent.append((owner, index, conn))
        completed = []
        for owner, index, conn in sent:
            with _host_lost(owner, index):
                end = yield from receive_outputs(conn)
            if end.get("completed"):
                completed.append(index)
        return completed


def split_ranges(
    batches: list[pa.RecordBatch], parallelism: int, max_parallelism: int
) -> list[list[pa.RecordBatch]]:
    """The records of each of ``parallelism`` ranges, by the key-group column: range ``i``
    holds key groups ``kg`` with ``kg * parallelism // max_parallelism == i``, as the exchange
    (``repartitionById``) assigns them."""
    batches = [b for b in batches if b.num_rows]
    if not batches:
        return [[] for _ in range(parallelism)]
    table = pa.Table.from_batches(batches)
    owners = int64_values(table.column(KEY_GROUP_COLUMN)) * parallelism // max_parallelism
    order = np.argsort(owners, kind="stable")
    bounds = np.searchsorted(owners[order], np.arange(parallelism + 1)).tolist()
    table = table.take(pa.Array.from_buffers(pa.int64(), len(order), [None, pa.py_buffer(order)]))
    return [
        table.slice(start, end - start).to_batches() for start, end in itertools.pairwise(bounds)
    ]


@contextlib.contextmanager
def _host_lost(owner: HostInfo, index: int) -> Iterator[None]:
    """A connection that breaks is a lost state host: the task fails and Spark retries it."""
    try:
        yield
    except (EOFError, OSError) as e:
        raise RuntimeError(
            f"lost the state host {owner.host_id} (executor {owner.executor}) of range "
            f"{index}: {e!r}; the task fails and Spark retries it"
        ) from e


def epoch_of_job(task: Any, pipeline: str) -> EpochSpec:
    """The epoch a ``write_stream`` query's driver set on this micro-batch's job."""
    raw = task.getLocalProperty(epoch_property(pipeline))
    if raw is None:
        raise RuntimeError(
            f"statetier pipeline {pipeline}: this job carries no epoch; write the output of a "
            "stream planned by StatefulPipeline.write_stream through that query only"
        )
    return EpochSpec.decode(json.loads(raw))


def combine_function(
    combining: Combining,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The map-side ``mapInArrow`` of a combiner: per chunk of input, one row per group.

    Each chunk of up to :data:`COMBINE_ROWS` rows is aggregated on its own, so memory stays
    bounded; the host merges whatever partial rows a key has (their last column, the number of
    input rows behind each, lets the host still count records).
    """

    @leaves_imports_out_of_collections
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        chunk: list[pa.RecordBatch] = []
        rows = 0
        for batch in batches:
            chunk.append(batch)
            rows += batch.num_rows
            if rows >= COMBINE_ROWS:
                yield from combining.apply(chunk)
                chunk, rows = [], 0
        if rows:
            yield from combining.apply(chunk)

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
