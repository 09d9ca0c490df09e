"""The state host: a long-lived process per executor task slot that keeps key-group ranges warm.

Spark gives Python code no partition affinity (a partition lands on any Python worker, and idle
workers die), so the state does not live in the workers. The first task of an application on an
executor starts its hosts (one per task slot, see slots) detached, each listening on a Unix
socket under the executor's local dir; every task then streams its records to the host that owns
its range and reads the outputs back.

The host keeps one :class:`~statetier.backend.runtime.FunctionInstance` per (pipeline,
parallelism, range). A task for epoch N names the committed base (epoch N-1 and the token of the
task attempt whose files that epoch committed for the range); the host uses its warm instance only
when it is at exactly that version, otherwise it restores the range from tier 2 at the base. That
makes task retries, speculative attempts, driver re-runs and rescales correct: anything not proven
current is restored. After processing, the host returns the outputs and ends the task, then (still
holding the range) writes the range's snapshot files under a per-attempt owner and sends the driver
the range's result over its registry link (a result file the driver reads from the store only when
the driver did not acknowledge it; an error file if the snapshot failed); the driver commits the
epoch once every range has its result. Writing the snapshot after the task returned lets it overlap
the next tasks instead of holding a Spark core.

The host exits after ``spark.host-idle-timeout`` without tasks, when the executor process it
watches is gone, or on a ``shutdown`` request.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import faulthandler
import gc
import hashlib
import json
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar, cast

import pyarrow as pa
from statetier.backend.config import StatetierConfig, load_config, warn_if_spill_off
from statetier.backend.functions import KeyedProcessFunction
from statetier.backend.metrics import serve_metrics
from statetier.backend.runtime import FunctionInstance
from statetier.backend.snapshot import (
    CorruptFileError,
    SnapshotError,
    SnapshotStore,
    SubtaskSnapshot,
)
from statetier.backend.snapshot.chain_compaction import apply_update
from statetier.backend.snapshot.chain_update import ChainUpdate
from statetier.backend.snapshot.handoff import HandOff
from statetier.backend.snapshot.layout import error_name, result_name
from statetier.backend.spark import protocol
from statetier.backend.spark.channel import Endpoint, Server
from statetier.backend.spark.frozen_imports import freeze_imports
from statetier.backend.spark.functions import SparkTask, set_current_task
from statetier.backend.spark.gathering import GatherError, Gatherings, PieceMemory
from statetier.backend.spark.handoff import (
    HANDOFF_TIMEOUT_S,
    HandOffRequest,
    fetch_handoff,
    send_handoff,
)
from statetier.backend.spark.kept import Kept
from statetier.backend.spark.listeners import notify_aborted, notify_committed
from statetier.backend.spark.membership import RegistryLink
from statetier.backend.spark.messages import TaskHeader
from statetier.backend.spark.processing import as_batches, count_records, process
from statetier.backend.spark.protocol import ProcessWatch, read_batch, write_batch
from statetier.backend.spark.refusals import REFUSALS, TAG, refused_line
from statetier.backend.spark.registry import HostInfo, HostOrder, OrderKind
from statetier.backend.spark.results import RangeResult, RangeStart
from statetier.backend.spark.slots import host_config
from statetier.backend.spark.task_time import EpochClock, timers_after, timers_before
from statetier.backend.spill import default_spill_dirs
from statetier.backend.timers import TimeDomain
from statetier.backend.wire import Fields, MessageError

__all__ = ["NotOwnerError", "StateHost", "main"]

log = logging.getLogger("statetier.spark.host")

K = TypeVar("K")
V = TypeVar("V")

# the starts whose restored bytes a result reports (tier 2's: 0 for a hand-off without union
# operator state)
_STARTED_FROM = (RangeStart.RESTORED, RangeStart.HANDED_OFF)

# How long a retry of a gathered range's completing task waits for the run under way (a task
# that is gone is seen at once: its connection closes).
GATHER_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class TaskRun:
    """How a task's processing went, for its result."""

    state: RangeStart
    started: float
    restore_s: float
    process_s: float
    records: int  # input records (a combiner's rows stand for several)
    rows: int  # rows received


@dataclasses.dataclass(frozen=True)
class RangeSnapshot:
    """A range's snapshot files, uploaded: the manifest's part and what it cost."""

    snapshot: SubtaskSnapshot
    upload_bytes: int
    upload_cpu_s: float  # the upload threads' CPU
    # it wrote a base that stands for a compaction (the chain trigger of
    # compaction.mode=executor, or a cut of a chain the driver could not compact)
    compaction_base: bool


@dataclasses.dataclass
class HostedRange:
    instance: FunctionInstance
    epoch: int | None = None  # the epoch whose state the instance holds; None: unknown/dirty
    token: str | None = None  # the task attempt that produced it
    attempt_id: int | None = None  # that attempt's Spark task attempt id
    notified: int = 0  # the latest epoch the function was told is committed
    # (heap, spilled) bytes of its keyed state after its latest snapshot (the heartbeat's)
    state_bytes: tuple[int, int] = (0, 0)
    registry: Endpoint | None = None  # the registry that routed its latest task here

    @property
    def lock(self) -> threading.RLock:
        """Held from a task's start to its snapshot's end: the instance's own lock, so the
        process's memory governor moves this range's key groups only between tasks."""
        return self.instance.lock


class NotOwnerError(RuntimeError):
    """A task reached a host that does not own its range (a stale route): refused, retried."""


class SupersededAttemptError(RuntimeError):
    """A task attempt reached a range that a later attempt of the same epoch already
    processed: an attempt Spark gave up on (its task failed on another range while this one's
    request was on its way), refused so that it does not replace the later attempt's state."""


def superseded(hosted: HostedRange, header: TaskHeader) -> bool:
    """Whether ``header``'s attempt is older than the one whose state of the same epoch the
    range holds. Spark numbers task attempts in the order it launches them, in the whole
    application: a retry, a re-run of the epoch and a speculative copy come later. A gathered
    range's pieces come from several tasks, so only a range sent whole is judged."""
    return (
        header.pieces == 1
        and hosted.epoch == header.epoch
        and hosted.attempt_id is not None
        and header.task_attempt_id < hosted.attempt_id
    )


class StateHost:
    """Serves tasks of its application on a Unix socket and a TCP endpoint until idle,
    orphaned or told to stop; registered with the driver's host registry meanwhile."""

    def __init__(
        self,
        socket_path: str,
        idle_timeout: float,
        watch_pid: int | None,
        secret: bytes,
        bind: str = "127.0.0.1",
        port: int = 0,
        hosts: int = 1,
    ) -> None:
        self.socket_path = socket_path
        self.hosts = hosts  # of its executor: its state budget is its share (see slots)
        self.idle_timeout = idle_timeout
        self.watch_pid = watch_pid
        self.executor = ProcessWatch(watch_pid) if watch_pid is not None else None
        self.host_id = uuid.uuid4().hex[:16]
        self.ranges: dict[tuple[str, int, int], HostedRange] = {}
        self.functions: Kept[str, Callable[[], Any]] = Kept()
        self.stores: Kept[str, SnapshotStore] = Kept()
        self.configs: Kept[str, StatetierConfig] = Kept()  # by the tasks' settings, as JSON
        self.pools: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
        self.gatherings = Gatherings()  # ranges whose pieces come from several tasks
        self.lock = threading.Lock()
        self.active = 0
        self.last_activity = time.monotonic()
        self.stopping = threading.Event()
        self.tasks = 0
        self.warm = 0
        self.restored = 0
        self.handed_off = 0  # ranges taken from their old hosts (see handoff)
        self.handed_over = 0  # ranges given to their new hosts
        self.secret = secret
        # connections are served once the host is whole: a task takes the socket file's
        # presence for readiness and may connect before ``info`` and ``link`` below exist
        self._built = threading.Event()
        self.server = Server(secret, self._connection, "statetier-host")
        self.server.bind_tcp(bind, port)
        self.server.bind_unix(socket_path)  # last: tasks take its presence for readiness
        self.info = HostInfo(
            host_id=self.host_id,
            pid=os.getpid(),
            executor=os.environ.get("SPARK_EXECUTOR_ID", str(watch_pid or "")),
            node=socket.gethostname(),
            endpoints=list(self.server.endpoints),
        )
        self.link = RegistryLink(self.info, secret, self._order, self.state_bytes, self._lost)
        self._built.set()

    def state_bytes(self) -> tuple[int, int]:
        """(heap, spilled) bytes of the keyed state of every range here, as of their latest
        snapshots."""
        hosted = list(self.ranges.values())
        return sum(h.state_bytes[0] for h in hosted), sum(h.state_bytes[1] for h in hosted)

    # ------------------------------------------------------------------ serving

    def serve(self) -> None:
        """Serve until stopped (the listeners run on their own threads)."""
        log.info(
            "state host %s listens on %s", self.host_id, ", ".join(map(str, self.server.endpoints))
        )
        try:
            self._watchdog()
        finally:
            self.link.close()
            self.server.close()
            self.close()
            if self.executor is not None:
                self.executor.close()

    def _watchdog(self) -> None:
        """Wait for a reason to stop: the executor's process gone (noticed at once, see
        :class:`ProcessWatch`), the socket file removed, idle too long, or a shutdown order."""
        while not self.stopping.is_set():
            orphaned = self.executor is not None and self.executor.wait(0.5)
            idle = time.monotonic() - self.last_activity
            gone = not os.path.exists(self.socket_path)
            if orphaned or gone or (self.active == 0 and idle > self.idle_timeout):
                log.info("state host stops (orphaned=%s, idle %.0fs)", orphaned, idle)
                self.stopping.set()
            elif self.executor is None:
                self.stopping.wait(0.5)

    def _orphaned(self) -> bool:
        """Whether this host must serve no more: stopping, or its executor is gone (checked on
        every request too, so that no request slips in before the watchdog wakes)."""
        if self.executor is not None and self.executor.gone():
            self.stopping.set()
        return self.stopping.is_set()

    def _order(self, order: HostOrder, registry: Endpoint) -> None:
        """An order from a coordinator's registry. A shutdown stops the host when that
        registry is its only one; else it ends that coordinator's use of it (its registration
        and its ranges) and the host serves the others on."""
        if order.kind is OrderKind.SHUTDOWN:
            others = [r for r in self.link.registries() if r != registry]
            if not others:
                self.stopping.set()
                return
            # its ranges first: the registry's shutdown returns when this host has left it, and
            # by then nothing of that coordinator's may be hosted here
            self._lost(registry)
            self.link.leave(registry)
        elif order.kind is OrderKind.RELEASE:
            for key in order.ranges:
                self._release(key)

    def _lost(self, registry: Endpoint) -> None:
        """Drop the ranges ``registry`` routed here: its coordinator ended or counts this host
        gone, so their next tasks (if any) are routed afresh and restore them."""
        with self.lock:
            keys = [k for k, hosted in self.ranges.items() if hosted.registry == registry]
        for key in keys:
            self._release(key)

    def _release(self, key: tuple[str, int, int]) -> None:
        with self.lock:
            hosted = self.ranges.pop(key, None)
        if hosted is not None:
            with hosted.lock, contextlib.suppress(Exception):
                hosted.instance.close()

    def _connection(self, conn: Connection) -> None:
        self._built.wait()
        with self.lock:
            self.active += 1
        try:
            self._request(conn)
        except (EOFError, OSError):
            pass
        finally:
            with self.lock:
                self.active -= 1
                self.last_activity = time.monotonic()

    def _request(self, conn: Connection) -> None:
        """One connection's request: its first frame says which (``op``)."""
        try:
            request = Fields.parse("statetier host request", conn.recv_bytes())
            op = request.text("op")
            registry = Endpoint.from_json(request.items("registry")) if op == "join" else None
        except (ValueError, TypeError) as e:  # a MessageError, bad JSON, a bad endpoint
            conn.send_bytes(protocol.ERROR + f"a malformed request: {e}".encode())
            return
        if self._orphaned() and op != "stats":
            # a task or the registry's probe must find this host gone, not half-alive
            conn.send_bytes(
                protocol.ERROR + f"state host {self.host_id}{protocol.STOPPING}".encode()
            )
            return
        if op == "task":
            self._task(conn, request.data)
        elif op == "handoff":
            self._hand_over(conn, request)
        elif registry is not None:
            try:
                self.link.join(registry)
            except (OSError, ValueError) as e:  # refused, a handshake timeout, a bad answer
                why = f"state host {self.host_id} could not register with the driver at {registry}"
                conn.send_bytes(protocol.ERROR + f"{why}: {e!r}".encode())
                return
            conn.send_bytes(protocol.RESULT + json.dumps(self.info.to_json()).encode())
        elif op in ("ping", "shutdown"):
            conn.send_bytes(protocol.RESULT + json.dumps({"pid": os.getpid()}).encode())
            if op == "shutdown":
                self.stopping.set()
        elif op == "stats":
            conn.send_bytes(protocol.RESULT + json.dumps(self.stats()).encode())
        else:
            conn.send_bytes(protocol.ERROR + f"unknown request {op!r}".encode())

    def stats(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "tasks": self.tasks,
            "warm": self.warm,
            "restored": self.restored,
            "handed_off": self.handed_off,
            "handed_over": self.handed_over,
            "ranges": len(self.ranges),
            "ranges_by_pipeline": dict(Counter(key[0] for key in list(self.ranges))),
            "frozen_objects": gc.get_freeze_count(),  # its imports (see frozen_imports)
        }

    def close(self) -> None:
        with self.lock:
            ranges, self.ranges = list(self.ranges.values()), {}
        for hosted in ranges:
            with contextlib.suppress(Exception):
                hosted.instance.close()

    # ------------------------------------------------------------------ one task

    def _task(self, conn: Connection, raw: dict[str, Any]) -> None:
        function_bytes = conn.recv_bytes()
        batches: list[pa.RecordBatch] = []
        while True:
            data = conn.recv_bytes()
            if not data:
                break
            batches.append(read_batch(data))
        try:
            header = TaskHeader.decode(raw)
        except MessageError as e:  # a task of another version, or not a task at all
            conn.send_bytes(protocol.ERROR + str(e).encode())
            return
        if header.pieces > 1:
            self._gathered_task(conn, header, function_bytes, batches)
            return
        try:
            outputs, finish = self.start_task(header, function_bytes, batches)
        except Exception as e:
            conn.send_bytes(_error_frame(e))
            return
        try:
            _send_outputs(conn, outputs)
        finally:
            finish()

    def _gathered_task(
        self,
        conn: Connection,
        header: TaskHeader,
        function_bytes: bytes,
        piece: list[pa.RecordBatch],
    ) -> None:
        """One piece of a range gathered from every task of a micro-batch (see gathering): the
        piece that completes the range runs it and gets its outputs; any other gets an end."""
        key = (header.state.pipeline, header.state.parallelism, header.index)
        gatherings = self.gatherings
        try:
            self._check_owner(header)  # before filing: a stray piece would never complete
            gathering, records = gatherings.add(
                key,
                header.gather_attempt,
                header.piece,
                header.pieces,
                piece,
                _piece_memory(self._config(header)),
            )
            if records is None:
                if not gatherings.returns_outputs(gathering, header.piece):
                    _send_outputs(conn, [])
                else:  # a retry of the completing task
                    _send_outputs(conn, gathering.wait(conn, GATHER_TIMEOUT_S), completed=True)
                return
        except (GatherError, NotOwnerError) as e:
            conn.send_bytes(protocol.ERROR + str(e).encode())
            return
        try:
            outputs, finish = self.start_task(header, function_bytes, records)
        except Exception as e:
            frame = _error_frame(e)
            gatherings.failed(gathering, _error_text(e))  # the other pieces' tasks fail alike
            conn.send_bytes(frame)
            return
        gatherings.finish(gathering, outputs)
        try:
            _send_outputs(conn, outputs, completed=True)
        finally:
            finish()

    def _kept(self, table: Kept[K, V], key: K, make: Callable[[], V]) -> V:
        """``table``'s value of ``key``, made by ``make`` when it is not kept: what the host keeps
        between tasks (functions, stores, settings) is made once while it is used (see kept),
        under the host's lock."""
        with self.lock:
            return table.get(key, make)

    def _factory(self, function_bytes: bytes) -> Callable[[], Any]:
        digest = hashlib.sha256(function_bytes).hexdigest()
        return self._kept(self.functions, digest, lambda: pickle.loads(function_bytes))

    def _upload_pool(self, workers: int) -> concurrent.futures.ThreadPoolExecutor:
        """The host's upload threads (``checkpoint.upload-concurrency``), kept between tasks:
        one pool per setting, and never dropped (a range may be using it)."""
        with self.lock:
            pool = self.pools.get(workers)
            if pool is None:
                pool = self.pools[workers] = concurrent.futures.ThreadPoolExecutor(
                    workers, thread_name_prefix="statetier-upload"
                )
        return pool

    def _config(self, header: TaskHeader) -> StatetierConfig:
        """The settings of ``header``'s pipeline, resolved once (every task and every gathered
        piece carries them; resolving costs about 0.16 ms)."""
        key = json.dumps(header.state.config, sort_keys=True)
        return self._kept(self.configs, key, lambda: _loaded(header.state.config, self.hosts))

    def _store(self, uri: str, options: dict[str, Any]) -> SnapshotStore:
        key = json.dumps([uri, options], sort_keys=True)
        return self._kept(self.stores, key, lambda: SnapshotStore(uri, **options))

    def start_task(
        self, header: TaskHeader, function_bytes: bytes, batches: list[pa.RecordBatch]
    ) -> tuple[list[pa.RecordBatch], Callable[[], None]]:
        """Process a task's records: its outputs, and ``finish`` that snapshots the range.

        The range stays locked until ``finish`` ran (call it exactly once): its state is the
        epoch's until the snapshot copied it. ``finish`` writes the data files, then the result
        the driver waits for, or an error file the driver reports.
        """
        started = time.perf_counter()
        index = header.index
        self._check_owner(header)
        factory = self._factory(function_bytes)
        store = self._store(header.state.checkpoint_uri, header.state.storage_options)
        config = self._config(header)
        hosted, state, restore_s = self._acquire(header, factory, store, config)
        hosted.registry = header.registry
        try:
            hosted.epoch = hosted.token = None  # dirty until this attempt succeeds
            set_current_task(
                SparkTask(header.epoch, index, header.attempt_number, header.task_attempt_id)
            )
            try:
                out_schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(header.state.schema)))
                instance = hosted.instance
                outputs = as_batches(timers_before(instance, header.time), out_schema)
                outputs += process(instance, batches, header.state.key_columns, index, out_schema)
                outputs += as_batches(timers_after(instance, header.time), out_schema)
                if instance.spill is not None:
                    # a vectorized function touches each key once per batch: a range's records
                    # may never reach the 64 per key group that poll the governor otherwise
                    instance.spill.poll()
            finally:
                set_current_task(None)
        except BaseException:
            hosted.lock.release()
            raise
        run = TaskRun(
            state=state,
            started=started,
            restore_s=restore_s,
            process_s=time.perf_counter() - started - restore_s,
            records=count_records(batches),
            rows=sum(b.num_rows for b in batches),
        )

        def finish() -> None:
            try:
                self._finish(hosted, header, store, config, run)
            finally:
                hosted.lock.release()

        return outputs, finish

    def _check_owner(self, header: TaskHeader) -> None:
        """Refuse a task (or a piece of one) the driver routed to another host."""
        if header.owner_host != self.host_id:
            raise NotOwnerError(
                f"range {header.index} of pipeline {header.state.pipeline} is routed to state "
                f"host {header.owner_host}; this is host {self.host_id}, which does not own it"
            )

    def _acquire(
        self, header: TaskHeader, factory: Callable[[], Any], store: SnapshotStore, config: Any
    ) -> tuple[HostedRange, RangeStart, float]:
        """The range's instance, locked: warm when at the task's base, else restored or fresh."""
        base = header.base_epoch
        parallelism = header.state.parallelism
        key = (header.state.pipeline, parallelism, header.index)
        with self.lock:
            hosted = self.ranges.get(key)
            if hosted is None:
                # drop this pipeline's ranges of another parallelism: ownership moved
                for other in [k for k in self.ranges if k[0] == key[0] and k[1] != parallelism]:
                    with contextlib.suppress(Exception):
                        self.ranges.pop(other).instance.close()
        if hosted is not None:
            hosted.lock.acquire()
            try:
                if superseded(hosted, header):
                    raise SupersededAttemptError(
                        f"task attempt {header.task_attempt_id} of epoch {header.epoch} reached "
                        f"range {header.index} after attempt {hosted.attempt_id} had processed "
                        "it: refused (a task attempt Spark already retried)"
                    )
                if hosted.epoch == base and hosted.token == header.base_token and base > 0:
                    hosted.notified = notify_committed(hosted.instance, base, hosted.notified)
                    return hosted, RangeStart.WARM, 0.0
                if hosted.epoch == base == 0 and header.base_token is None:
                    return hosted, RangeStart.FRESH, 0.0
                notify_aborted(hosted.instance, hosted.epoch, base, hosted.notified)
            except BaseException:
                hosted.lock.release()
                raise
            hosted.lock.release()
            with contextlib.suppress(Exception):
                hosted.instance.close()
        serve_metrics(config.metrics_port)  # the host process's endpoint, from its first range
        t0 = time.perf_counter()
        instance, start = self._new_instance(header, factory, store, config)
        restore_s = time.perf_counter() - t0
        hosted = HostedRange(instance)
        hosted.lock.acquire()
        with self.lock:
            self.ranges[key] = hosted
        return hosted, start, restore_s

    def _new_instance(
        self, header: TaskHeader, factory: Callable[[], Any], store: SnapshotStore, config: Any
    ) -> tuple[FunctionInstance, RangeStart]:
        """The range's instance at the task's base: fresh at epoch 0, else handed off by its
        old host when rebalancing moved it here and that host is alive, else restored from
        tier 2 (also when the hand-off's files fail their checks)."""
        base = header.base_epoch

        def make(handoff: HandOff | None) -> FunctionInstance:
            return FunctionInstance(
                cast(Callable[[], KeyedProcessFunction[Any, Any, Any]], factory),
                header.index,
                header.state.parallelism,
                header.state.max_parallelism,
                store=store,
                restore_epoch=base if base > 0 and handoff is None else None,
                clock=EpochClock(header.time.processing_time),
                config=config,
                handoff=handoff,
            )

        if base <= 0:
            return make(None), RangeStart.FRESH
        handoff = self._fetch_handoff(header, store)
        if handoff is not None:
            try:
                return make(handoff), RangeStart.HANDED_OFF
            except (CorruptFileError, SnapshotError) as e:
                log.warning("range %s: the hand-off failed its checks (%s)", header.index, e)
        return make(None), RangeStart.RESTORED

    def _fetch_handoff(self, header: TaskHeader, store: SnapshotStore) -> HandOff | None:
        """The range's committed state from the host that owned it before rebalancing moved it
        here, if that host is alive (see handoff); None: restore it from tier 2."""
        if header.base_token is None:
            return None
        key = (header.state.pipeline, header.state.parallelism, header.index)
        if header.registry is None:
            return None
        try:
            previous = self.link.previous_owner(header.registry, key)
        except (OSError, EOFError, MessageError) as e:
            log.warning("range %s: the driver did not name its old host (%s)", header.index, e)
            return None
        if previous is None or previous.host_id == self.host_id:
            return None
        request = HandOffRequest(key, header.base_epoch, header.base_token)
        return fetch_handoff(previous, self.secret, request, store.manifest(header.base_epoch))

    def _hand_over(self, conn: Connection, fields: Fields) -> None:
        """Give a range that rebalancing moved away to its new host (see handoff), at the
        committed version it asks for only, and drop it here: it is the new host's now."""
        try:
            request = HandOffRequest.decode(fields)
        except MessageError as e:
            conn.send_bytes(protocol.ERROR + str(e).encode())
            return
        with self.lock:
            hosted = self.ranges.get(request.key)
        if hosted is None or not hosted.lock.acquire(timeout=HANDOFF_TIMEOUT_S):
            conn.send_bytes(protocol.ERROR + f"range {request.key[2]} is not held here".encode())
            return
        try:
            with self.lock:
                if self.ranges.get(request.key) is hosted:
                    del self.ranges[request.key]
            instance = hosted.instance
            if (hosted.epoch, hosted.token) != (request.epoch, request.token) or not instance.store:
                message = f"range {request.key[2]} is at epoch {hosted.epoch}, not {request.epoch}"
                conn.send_bytes(protocol.ERROR + message.encode())
                return
            sent = send_handoff(conn, instance, instance.store, request.epoch)
            with self.lock:
                self.handed_over += 1
            log.info("range %s handed over to its new host (%d bytes)", request.key[2], sent)
        finally:
            hosted.lock.release()
            with contextlib.suppress(Exception):
                hosted.instance.close()

    def _finish(
        self,
        hosted: HostedRange,
        header: TaskHeader,
        store: SnapshotStore,
        config: Any,
        run: TaskRun,
    ) -> None:
        """Snapshot the range and write its result (or an error file the driver reports)."""
        epoch, index, token = header.epoch, header.index, header.token
        parallelism = header.state.parallelism
        name = result_name(epoch, header.owner, index, parallelism)
        instance, registry = hosted.instance, header.registry
        try:
            t1, cpu1 = time.perf_counter(), time.thread_time()
            done = self._snapshot(instance, store, epoch, token, config, header.chain_updates)
            snapshot_s = time.perf_counter() - t1
            snapshot_cpu_s = time.thread_time() - cpu1 + done.upload_cpu_s
            if instance.spill is not None:
                # the poll after processing came while the epoch's other ranges were busy
                # too (all at once when one task sent them all, pipeline.exchange), and the
                # governor measures and moves only idle ranges: the last range to get here
                # finds the others done
                instance.spill.settle()
            spilled = len(instance.spill.spilled_key_groups()) if instance.spill else 0
            hosted.state_bytes = instance.state_bytes()  # for the heartbeat
            result = RangeResult(
                index=index,
                parallelism=parallelism,
                epoch=epoch,
                token=token,
                state=run.state,
                records=run.records,
                spilled_key_groups=spilled,
                key_groups=len(instance.keyed.key_groups),
                restore_s=run.restore_s,
                snapshot_s=snapshot_s,
                total_s=time.perf_counter() - run.started,
                upload_bytes=done.upload_bytes,
                snapshot=done.snapshot,
                host_pid=os.getpid(),
                host_socket=self.socket_path,
                process_s=run.process_s,
                rows=run.rows,
                host_id=self.host_id,
                restored_bytes=(instance.restored_bytes if run.state in _STARTED_FROM else 0),
                snapshot_cpu_s=snapshot_cpu_s,
                compaction_base=done.compaction_base,
                next_event_timer=instance.timers.earliest(TimeDomain.EVENT_TIME),
                next_processing_timer=instance.timers.earliest(TimeDomain.PROCESSING_TIME),
            )
            body = result.encode()
            if not self.link.deliver(registry, store.url(name), body):  # the driver lacks it
                store.put(name, body)
                self.link.tell_written(registry, store.url(name), body)
        except Exception:
            log.exception("the snapshot of range %s of epoch %s failed", index, epoch)
            error = traceback.format_exc().encode()
            with contextlib.suppress(Exception):
                store.put(error_name(name), error)
            self.link.tell_written(registry, store.url(error_name(name)), error)
            return
        hosted.epoch, hosted.token, hosted.attempt_id = epoch, token, header.task_attempt_id
        with self.lock:
            self.tasks += 1
            self.warm += run.state is RangeStart.WARM
            self.restored += run.state is RangeStart.RESTORED
            self.handed_off += run.state is RangeStart.HANDED_OFF
            self.last_activity = time.monotonic()

    def _snapshot(
        self,
        instance: FunctionInstance,
        store: SnapshotStore,
        epoch: int,
        owner: str,
        config: Any,
        updates: tuple[ChainUpdate, ...],
    ) -> RangeSnapshot:
        """The range's snapshot files, uploaded (a :class:`RangeSnapshot`: whether it wrote a
        compaction's base says where the executor's compaction CPU went)."""
        instance.before_snapshot(epoch)
        writer = instance.writer
        mine = [u for u in updates if u.key_groups == str(instance.keyed.key_groups)]
        for update in mine:
            apply_update(writer, update)  # the driver's compactions of this range
        cut = any(update.base is None for update in mine)
        full = False
        if config.compaction_mode == "executor":  # compaction in the host, to compare
            chains = writer.chains()
            full = any(len(files) > config.compaction_delta_trigger for files in chains.values())
        prepared = writer.prepare(store, epoch, owner, full=full)
        try:
            upload_cpu_s = self._upload(store, prepared.uploads, config)
        except BaseException:
            instance.writer.reset()
            raise
        return RangeSnapshot(
            prepared.snapshot, prepared.upload_bytes, upload_cpu_s, compaction_base=full or cut
        )

    def _upload(self, store: SnapshotStore, uploads: list[Any], config: Any) -> float:
        """Upload the snapshot's files; the CPU the upload threads spent on them (other than
        this one: the caller measures its own thread)."""
        if len(uploads) <= 1:
            for f in uploads:
                store.put(f.entry.path, f.data)
            return 0.0

        def put(f: Any) -> float:
            started = time.thread_time()
            store.put(f.entry.path, f.data)
            return time.thread_time() - started

        pool = self._upload_pool(config.checkpoint_upload_concurrency)
        return sum(pool.map(put, uploads))


def _loaded(settings: dict[str, Any], hosts: int) -> StatetierConfig:
    """A pipeline's settings as the host resolves them, once per pipeline: a spill tier asked
    for by its parts but switched off is logged then, in the executor's log. The state budget
    is this host's share of the executor's (one of ``hosts``)."""
    config = load_config(settings)
    warn_if_spill_off(config, log)
    return host_config(config, hosts)


def _piece_memory(config: StatetierConfig) -> PieceMemory:
    """How many bytes of gathered pieces the host keeps in memory (half of the runtime's
    allowance beside the state: the other half is the running range's), and where the rest go
    (the first spill directory, the local disk)."""
    directory = (config.spill_dirs or tuple(default_spill_dirs()))[0]
    return PieceMemory(config.memory_runtime_allowance // 2, os.path.join(directory, "pieces"))


def _error_frame(error: Exception) -> bytes:
    """What a task is told of ``error`` (being handled): a refused state as its line alone,
    which the driver shows as it is (see refusals); anything else with the host's stack."""
    if isinstance(error, REFUSALS):
        return protocol.REFUSED + refused_line(error).encode()
    return protocol.ERROR + traceback.format_exc().encode()


def _error_text(error: Exception) -> str:
    """The error a gathered range's other pieces are told (being handled), tagged if refused."""
    return TAG + refused_line(error) if isinstance(error, REFUSALS) else traceback.format_exc()


def _send_outputs(conn: Connection, outputs: list[pa.RecordBatch], completed: bool = False) -> None:
    """A task's outputs, then its end: the snapshot follows while Spark runs the next tasks.
    ``completed``: the task gets a gathered range's outputs (its piece completed the range)."""
    for batch in outputs:
        conn.send_bytes(protocol.BATCH + write_batch(batch))
    end = {"deferred": True, "completed": completed}
    conn.send_bytes(protocol.RESULT + json.dumps(end).encode())


def main(argv: list[str] | None = None) -> None:
    """Run a state host; the application's secret comes on standard input (never in argv)."""
    parser = argparse.ArgumentParser(prog="statetier-state-host")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--idle-timeout", type=float, default=600.0)
    parser.add_argument("--watch-pid", type=int, default=None)
    parser.add_argument("--hosts", type=int, default=1)  # the executor's (see slots)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    # `kill -USR1 <pid>` writes every thread's stack to the log: what a host that holds a
    # range's snapshot past host.result-timeout is doing, without stopping it
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    secret = bytes.fromhex(sys.stdin.readline().strip())
    freeze_imports()  # before it serves: its collections walk state, not modules (frozen_imports)
    host = StateHost(
        args.socket, args.idle_timeout, args.watch_pid, secret, args.bind, args.port, args.hosts
    )
    print(json.dumps({"listening": host.info.to_json()}), flush=True)
    host.serve()
    os._exit(0)  # daemon threads may be blocked in a connection: leave no process behind


if __name__ == "__main__":
    main()
