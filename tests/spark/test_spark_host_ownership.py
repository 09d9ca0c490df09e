"""A real state host process: it serves only ranges routed to it, and only at their version.

The task side of the protocol is driven by hand here (no Spark): the same frames a task sends,
through the same authenticated channel, to a host started the way a task starts it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from statetier.backend.keygroups import assign_to_key_group
from statetier.backend.snapshot import SnapshotStore, commit_snapshot
from statetier.backend.snapshot.layout import result_name
from statetier.backend.spark.channel import AuthenticationError, Endpoint, connect
from statetier.backend.spark.functions import KEY_GROUP_COLUMN
from statetier.backend.spark.messages import EpochTime, StateSpec, TaskHeader
from statetier.backend.spark.protocol import (
    ERROR,
    RESULT,
    host_file,
    process_alive,
    socket_path,
)
from statetier.backend.spark.registry import HostRegistry, ask_route
from statetier.backend.spark.results import RangeResult, RangeStart
from statetier.backend.spark.task import stream

from tests.spark.spark_support import VectorWordCount

MAX_PARALLELISM = 8
SCHEMA = pa.schema([("word", pa.string()), ("count", pa.int64())])


@pytest.fixture
def registry() -> Iterator[HostRegistry]:
    made = HostRegistry(b"s" * 32, "127.0.0.1")
    yield made
    made.shutdown_hosts(5)
    made.close()


def start_host(
    registry: HostRegistry,
    socket_path: Path,
    watch_pid: int | None = None,
    log: Path | None = None,
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "statetier.backend.spark.host", "--socket", str(socket_path)]
    if watch_pid is not None:
        command += ["--watch-pid", str(watch_pid)]
    with open(log or os.devnull, "wb") as out:
        host = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out, stderr=out)
    assert host.stdin is not None
    host.stdin.write(registry.secret.hex().encode() + b"\n")
    host.stdin.close()
    join = json.dumps({"op": "join", "registry": registry.endpoint.to_json()}).encode()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            conn = connect(Endpoint("unix", str(socket_path)), registry.secret)
        except (FileNotFoundError, ConnectionRefusedError):
            time.sleep(0.05)
            continue
        with contextlib.closing(conn):
            conn.send_bytes(join)
            conn.recv_bytes()
        return host
    host.kill()
    raise AssertionError("the host did not start")


def words_batch(words: list[str]) -> pa.RecordBatch:
    kgs = [assign_to_key_group(w, MAX_PARALLELISM) for w in words]
    return pa.RecordBatch.from_pydict({"word": words, KEY_GROUP_COLUMN: pa.array(kgs, pa.int32())})


def run_task(
    registry: HostRegistry,
    uri: str,
    epoch: int,
    base_token: str | None,
    words: list[str],
    owner_host: str,
    attempt: int,
    piece: int = 0,
    pieces: int = 1,
) -> list[tuple[str, int]]:
    host = ask_route(registry.endpoint, registry.secret, ("wc", 1, 0), None)
    schema = SCHEMA.serialize().to_pybytes().hex()
    header = TaskHeader(
        state=StateSpec("wc", 1, MAX_PARALLELISM, uri, ("word",), schema),
        index=0,
        epoch=epoch,
        base_epoch=epoch - 1,
        base_token=base_token,
        owner="driver",
        token=f"driver-t{attempt}",
        attempt_number=0,
        task_attempt_id=attempt,
        owner_host=owner_host,
        time=EpochTime(None, 1_000),
        piece=piece,
        pieces=pieces,
        gather_attempt=f"{epoch}.1" if pieces > 1 else "",
        registry=registry.endpoint,
    )
    tcp = next(e for e in host.endpoints if e.kind == "tcp")
    function = bytes(cloudpickle.dumps(VectorWordCount))  # type: ignore[no-untyped-call]
    with contextlib.closing(connect(tcp, registry.secret)) as conn:
        batches = list(stream(conn, header, function, iter([words_batch(words)])))
    return [tuple(r.values()) for b in batches for r in b.to_pylist()]


def result(registry: HostRegistry, store: SnapshotStore, epoch: int, attempt: int) -> RangeResult:
    """The range's result that task attempt ``attempt`` sent the registry (which acknowledged
    it, so the host wrote no result file)."""
    name = result_name(epoch, "driver", 0, 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        told = registry.take_written((store.url(name),), 0.1)
        if told is not None:
            found = RangeResult.decode(told[1], name)
            if found.token == f"driver-t{attempt}":
                assert not store.fs.exists(store.full_path(name))
                return found
    raise AssertionError(f"no result of attempt {attempt}")


def test_a_host_refuses_a_range_routed_to_another_host_and_stale_state(
    registry: HostRegistry, tmp_path: Path
) -> None:
    uri = f"file://{tmp_path}/ckpt"
    store = SnapshotStore(uri)
    host = start_host(registry, tmp_path / "h.sock")
    try:
        owner = ask_route(registry.endpoint, registry.secret, ("wc", 1, 0), None).host_id
        with pytest.raises(RuntimeError, match="which does not own it"):
            run_task(registry, uri, 1, None, ["a"], owner_host="another-host", attempt=1)
        with pytest.raises(RuntimeError, match="which does not own it"):  # nor a piece of it
            run_task(registry, uri, 1, None, ["a"], "another-host", 1, piece=0, pieces=2)

        assert sorted(run_task(registry, uri, 1, None, ["a", "b", "a"], owner, 2)) == [
            ("a", 2),
            ("b", 1),
        ]
        first = result(registry, store, 1, 2)
        lease = store.acquire_writer()
        commit_snapshot(store, 1, [first.snapshot], lease)
        # epoch 2 at the committed base: warm
        assert run_task(registry, uri, 2, first.token, ["a"], owner, 3) == [("a", 3)]
        assert result(registry, store, 2, 3).state is RangeStart.WARM
        # epoch 2 again (a retry): the host holds epoch 2, not the base, so it restores epoch 1
        assert run_task(registry, uri, 2, first.token, ["a"], owner, 4) == [("a", 3)]
        assert result(registry, store, 2, 4).state is RangeStart.RESTORED
        # a base token the host's state did not come from: restored too, never served warm
        assert run_task(registry, uri, 2, "driver-t999", ["b"], owner, 5) == [("b", 2)]
        assert result(registry, store, 2, 5).state is RangeStart.RESTORED
    finally:
        registry.shutdown_hosts(5)
        host.wait(10)


def test_an_attempt_older_than_the_one_that_processed_the_epoch_is_refused(
    registry: HostRegistry, tmp_path: Path
) -> None:
    """A task that sends every range first (``direct``) and fails on one leaves its requests
    for the others on their way; when one arrives after Spark's retry processed its range, it
    must not replace the retry's state, or the next epoch restores a range that was warm."""
    uri = f"file://{tmp_path}/ckpt"
    store = SnapshotStore(uri)
    host = start_host(registry, tmp_path / "h.sock")
    try:
        owner = ask_route(registry.endpoint, registry.secret, ("wc", 1, 0), None).host_id
        assert run_task(registry, uri, 1, None, ["a"], owner, 2) == [("a", 1)]
        first = result(registry, store, 1, 2)
        lease = store.acquire_writer()
        commit_snapshot(store, 1, [first.snapshot], lease)
        # epoch 2's retry (attempt 4) processes the range; then attempt 3's request arrives
        assert run_task(registry, uri, 2, first.token, ["a"], owner, 4) == [("a", 2)]
        retry = result(registry, store, 2, 4)
        with pytest.raises(RuntimeError, match="after attempt 4 had processed it"):
            run_task(registry, uri, 2, first.token, ["a"], owner, 3)
        commit_snapshot(store, 2, [retry.snapshot], lease)
        # the retry's state is the one epoch 2 committed: epoch 3 is served warm
        assert run_task(registry, uri, 3, retry.token, ["a"], owner, 5) == [("a", 3)]
        assert result(registry, store, 3, 5).state is RangeStart.WARM
        # a later attempt of an epoch the range holds is a re-run: restored, as before
        assert run_task(registry, uri, 3, retry.token, ["b"], owner, 6) == [("b", 1)]
        assert result(registry, store, 3, 6).state is RangeStart.RESTORED
    finally:
        registry.shutdown_hosts(5)
        host.wait(10)


def test_a_host_refuses_connections_without_the_secret(
    registry: HostRegistry, tmp_path: Path
) -> None:
    host = start_host(registry, tmp_path / "h.sock")
    try:
        (info,) = registry.live_hosts()
        for endpoint in info.endpoints:
            with pytest.raises(AuthenticationError):
                connect(endpoint, b"x" * 32)
        assert info.tcp() is not None and info.tcp().address == "127.0.0.1"  # type: ignore[union-attr]
    finally:
        registry.shutdown_hosts(5)
        host.wait(10)


def test_a_host_answers_a_malformed_request_with_what_is_wrong(
    registry: HostRegistry, tmp_path: Path
) -> None:
    host = start_host(registry, tmp_path / "h.sock")
    try:
        (info,) = registry.live_hosts()
        tcp = next(e for e in info.endpoints if e.kind == "tcp")
        with contextlib.closing(connect(tcp, registry.secret)) as conn:
            conn.send_bytes(json.dumps({"op": "task", "pipeline": "wc"}).encode())
            conn.send_bytes(b"not a function")
            conn.send_bytes(b"")
            answer = conn.recv_bytes()
        assert answer[:1] == ERROR
        assert answer[1:].decode() == "statetier task header: field 'parallelism' is missing"
        for request, error in [
            (b'{"op": "dance"}', "unknown request 'dance'"),
            (b'["task"]', "statetier host request: expected a JSON object, got ['task']"),
            (b'{"op": "join", "registry": ["tcp"]}', "a malformed request: not enough values"),
        ]:
            with contextlib.closing(connect(tcp, registry.secret)) as conn:
                conn.send_bytes(request)
                answer = conn.recv_bytes()
            assert answer[:1] == ERROR and error in answer[1:].decode()
        assert registry.live_hosts()  # it still serves
    finally:
        registry.shutdown_hosts(5)
        host.wait(10)


def test_a_host_whose_executor_died_serves_nothing_more_and_leaves_at_once(
    registry: HostRegistry, tmp_path: Path
) -> None:
    """SIGKILL of the executor's JVM: the next task must not be served by its host (a retry
    served by a host about to notice would lose its ranges a second time), and the registry
    must see the host gone without waiting for a heartbeat to time out."""
    executor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    host = start_host(registry, tmp_path / "h.sock", watch_pid=executor.pid)
    try:
        uri = f"file://{tmp_path}/ckpt"
        owner = ask_route(registry.endpoint, registry.secret, ("wc", 1, 0), None).host_id
        assert run_task(registry, uri, 1, None, ["a"], owner, 1) == [("a", 1)]
        (info,) = registry.live_hosts()
        tcp = next(e for e in info.endpoints if e.kind == "tcp")
        executor.kill()  # not reaped yet: a zombie, as a JVM is until its worker reaps it
        _wait_until_zombie(executor.pid)  # SIGKILL lands asynchronously: the task comes after
        try:
            with contextlib.closing(connect(tcp, registry.secret)) as conn:
                conn.send_bytes(b'{"op": "ping"}')
                answer = conn.recv_bytes()
            assert answer == ERROR + f"state host {owner} is stopping".encode()
        except (OSError, EOFError):
            pass  # or already closed: either way, not served
        assert host.wait(10) == 0
        assert registry.owner(("wc", 1, 0)) is None
    finally:
        executor.kill()
        executor.wait()
        registry.shutdown_hosts(5)
        host.kill()
        host.wait(10)


def test_host_files_live_in_the_executors_local_dir_and_only_the_socket_may_not(
    tmp_path: Path,
) -> None:
    """Spark removes an executor's local dirs with the application: the host's log and lock go
    there even when the socket's path would be too long for a Unix socket (it is hashed into
    the temp dir then, and the host removes it when it stops)."""
    # a path short whatever pytest's numbered temp dir is (pytest-101/popen-gw1/... is not)
    short, long = "/tmp/ld", str(tmp_path / ("x" * 120))
    assert socket_path("app-1", f"{short},/other") == f"{short}/statetier-host-app-1.sock"
    hashed = socket_path("app/1", long)
    assert os.path.dirname(hashed) == tempfile.gettempdir() and len(hashed.encode()) <= 100
    assert hashed == socket_path("app/1", long)  # every worker of the executor finds it
    assert host_file("app/1", ".log", long) == f"{long}/statetier-host-app_1.log"
    assert host_file("app/1", ".lock", "") == f"{tempfile.gettempdir()}/statetier-host-app_1.lock"


def test_a_host_writes_its_threads_stacks_to_its_log_on_sigusr1(
    registry: HostRegistry, tmp_path: Path
) -> None:
    """How to see what a host that holds a range past host.result-timeout is doing.

    Each signal is one sample of the stacks. A sample can land while the main thread runs a
    garbage collector's weakref callback, and CPython 3.11's faulthandler then shows only that
    callback's frame (seen once in CI), so the test samples until the main thread's own stack
    shows, as an operator would send the signal again."""
    log = tmp_path / "host.log"
    host = start_host(registry, tmp_path / "h.sock", log=log)
    try:
        deadline = time.monotonic() + 10
        samples = 0
        while "in serve" not in log.read_text() and time.monotonic() < deadline:
            host.send_signal(signal.SIGUSR1)
            samples += 1
            time.sleep(0.5)
        assert "in serve" in log.read_text()  # the main thread's stack, by function
        assert log.read_text().count("most recent call first") >= samples  # one dump a signal
        assert host.poll() is None  # and the host goes on
    finally:
        registry.shutdown_hosts(5)
        host.wait(10)


def _wait_until_zombie(pid: int, timeout: float = 10.0) -> None:
    """Wait until ``pid`` has died (a zombie, not yet reaped), as the host's watch tells it."""
    deadline = time.monotonic() + timeout
    while process_alive(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not die within {timeout} s of SIGKILL")
        time.sleep(0.005)


def test_a_host_leaves_its_imports_out_of_its_collections(
    registry: HostRegistry, tmp_path: Path
) -> None:
    """The host freezes what it imported before it serves (frozen_imports): Python's
    collections in its per-record path walk the state and what tasks made, not the modules."""
    host = start_host(registry, tmp_path / "h.sock")
    try:
        with contextlib.closing(
            connect(Endpoint("unix", str(tmp_path / "h.sock")), registry.secret)
        ) as conn:
            conn.send_bytes(json.dumps({"op": "stats"}).encode())
            answer = conn.recv_bytes()
        assert answer[:1] == RESULT, answer
        stats = json.loads(answer[1:])
        assert stats["pid"] == host.pid
        assert stats["frozen_objects"] > 20_000, stats
    finally:
        host.kill()
        host.wait()
