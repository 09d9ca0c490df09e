"""The driver's host registry and the authenticated channel, without Spark: real sockets on
127.0.0.1, real registrations, hosts that die."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import pytest
from statetier.backend.spark.channel import (
    MAGIC,
    AuthenticationError,
    Endpoint,
    Server,
    connect,
    new_secret,
)
from statetier.backend.spark.host import HostedRange, StateHost
from statetier.backend.spark.membership import (
    HostStoppingError,
    JoinError,
    RegistryLink,
    ask_to_join,
)
from statetier.backend.spark.messages import PipelineSpec, StateSpec
from statetier.backend.spark.protocol import process_alive, socket_path
from statetier.backend.spark.registry import (
    HostInfo,
    HostOrder,
    HostRegistry,
    OrderKind,
    RouteError,
    ask_route,
)
from statetier.backend.spark.task import _join as join_host
from statetier.backend.spark.task import local_host
from statetier.backend.wire import MessageError


@pytest.fixture
def registry() -> Iterator[HostRegistry]:
    made = HostRegistry(new_secret(), "127.0.0.1", liveness_timeout=1.5)
    yield made
    made.close()


class FakeHost:
    """A registered host: a real server that answers pings, and its registry link."""

    def __init__(self, registry: HostRegistry, name: str) -> None:
        self.server = Server(registry.secret, self._serve, name)
        self.server.bind_tcp("127.0.0.1")
        self.info = HostInfo(name, 0, name, "node", list(self.server.endpoints))
        self.orders: list[HostOrder] = []
        self.answer = b"R{}"
        self.registry = registry.endpoint
        self.lost: list[Endpoint] = []
        self.link = RegistryLink(
            self.info,
            registry.secret,
            lambda order, _: self.orders.append(order),
            on_lost=self.lost.append,
        )
        self.link.join(registry.endpoint)

    def _serve(self, conn: Connection) -> None:
        conn.recv_bytes()
        conn.send_bytes(self.answer)

    def die(self) -> None:
        self.link.close()
        self.server.close()


def route(registry: HostRegistry, index: int, local: str, unreachable: str | None = None) -> str:
    host = ask_route(registry.endpoint, registry.secret, ("p", 4, index), local, unreachable)
    return host.host_id


def test_ranges_stay_with_their_first_owner_whoever_asks(registry: HostRegistry) -> None:
    a, b = FakeHost(registry, "a"), FakeHost(registry, "b")
    registry.executors = 2
    first = {i: route(registry, i, "a" if i % 2 else "b") for i in range(4)}
    assert first == {0: "b", 1: "a", 2: "b", 3: "a"}  # each task's own host, within its share
    for asker in ("a", "b"):  # later tasks run anywhere: the owner does not follow them
        assert {i: route(registry, i, asker) for i in range(4)} == first
    a.die()
    b.die()


def test_a_host_takes_no_more_than_its_share(registry: HostRegistry) -> None:
    hosts = [FakeHost(registry, name) for name in "abc"]
    registry.executors = 3
    owners = [route(registry, i, "a") for i in range(4)]  # every task runs beside host a
    assert sorted(owners.count(h) for h in "abc") == [1, 1, 2]
    for h in hosts:
        h.die()


def test_new_ranges_wait_briefly_for_executors_whose_hosts_have_not_joined(
    registry: HostRegistry,
) -> None:
    a = FakeHost(registry, "a")
    registry.executors = 2
    registry.join_wait = 30.0  # b joins after 0.3 s: a loaded machine must not make it late
    joined: list[FakeHost] = []
    joiner = threading.Timer(0.3, lambda: joined.append(FakeHost(registry, "b")))
    joiner.start()
    owners = [route(registry, i, "a") for i in range(4)]
    assert owners.count("a") == 2 and owners.count("b") == 2
    joiner.join()  # b's ranges can be routed before the timer's thread keeps b here
    a.die()
    joined[0].die()


def test_a_dead_host_loses_its_ranges_at_once(registry: HostRegistry) -> None:
    a, b = FakeHost(registry, "a"), FakeHost(registry, "b")
    registry.executors = 2
    assert route(registry, 0, "a") == "a"
    a.die()
    deadline = time.monotonic() + 5
    while registry.owner(("p", 4, 0)) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert registry.owner(("p", 4, 0)) is None  # no heartbeat timeout needed: the link closed
    assert route(registry, 0, "a") == "b"
    assert registry.moves == 1
    b.die()


def test_a_join_naming_a_registry_that_stopped_keeps_the_live_registration(
    registry: HostRegistry,
) -> None:
    # a task of a stopped query (its driver's registry closed since) still runs and tells the
    # host to join that registry: the host must stay registered with the live one
    a = FakeHost(registry, "a")
    registry.executors = 1
    assert route(registry, 0, "a") == "a"
    stopped = HostRegistry(registry.secret, "127.0.0.1")
    stopped.close()
    with pytest.raises(OSError):
        a.link.join(stopped.endpoint)
    time.sleep(registry.liveness_timeout + 1)  # a dropped link: its heartbeats stop
    assert registry.owner(("p", 4, 0)) is not None
    assert registry.moves == 0
    # one that answers (another coordinator of the application, as each query's on a Connect
    # server): the host serves both, each hears its heartbeat, and a result goes to the one
    # that routed its task
    other = HostRegistry(registry.secret, "127.0.0.1")
    try:
        a.link.join(other.endpoint)
        assert a.link.registries() == [registry.endpoint, other.endpoint]
        time.sleep(registry.liveness_timeout + 1)
        assert registry.owner(("p", 4, 0)) is not None
        assert [h.host_id for h in other.live_hosts()] == ["a"]
        assert [h.host_id for h in registry.live_hosts()] == ["a"]
        assert a.link.deliver(other.endpoint, "s3://b/other.json", b"o", timeout=10)
        assert other.take_written(("s3://b/other.json",), 0.05) == ("s3://b/other.json", b"o")
        assert registry.take_written(("s3://b/other.json",), 0.05) is None
        # that coordinator ends: the host hears it lost, and stays with the live one
        other.close()
        deadline = time.monotonic() + 5
        while not a.lost and time.monotonic() < deadline:
            time.sleep(0.01)
        assert a.link.registries() == [registry.endpoint]
        assert a.lost == [other.endpoint]
        assert registry.owner(("p", 4, 0)) is not None
    finally:
        a.die()
        other.close()


def test_a_silent_host_is_gone_after_the_liveness_timeout(registry: HostRegistry) -> None:
    silent = HostInfo("silent", 0, "x", "node", [Endpoint("tcp", "127.0.0.1", 9)])
    conn = connect(registry.endpoint, registry.secret)
    conn.send_bytes(json.dumps({"op": "register", "host": silent.to_json()}).encode())
    assert json.loads(conn.recv_bytes()) == {"registered": True}
    assert route(registry, 0, "silent") == "silent"
    time.sleep(0.5)
    assert registry.owner(("p", 4, 0)) is not None
    time.sleep(1.5)  # liveness_timeout=1.5 s, and no heartbeat was sent
    assert registry.owner(("p", 4, 0)) is None
    conn.close()


def test_an_owner_a_task_cannot_reach_is_probed_by_the_registry(registry: HostRegistry) -> None:
    a, b = FakeHost(registry, "a"), FakeHost(registry, "b")
    registry.executors = 2
    assert route(registry, 0, "a") == "a"
    with pytest.raises(RouteError, match="answers the driver but not this task"):
        route(registry, 0, "b", unreachable="a")  # a answers the registry: not moved
    assert registry.owner(("p", 4, 0)) is not None
    a.server.close()  # a's endpoint is gone, its registration not yet
    assert route(registry, 0, "b", unreachable="a") == "b"
    a.die()
    b.die()


def test_a_host_that_refuses_the_probe_is_gone(registry: HostRegistry) -> None:
    """A host whose executor died answers with an error while it stops: not reachable."""
    a, b = FakeHost(registry, "a"), FakeHost(registry, "b")
    registry.executors = 2
    assert route(registry, 0, "a") == "a"
    a.answer = b"Xstate host a is stopping"
    assert route(registry, 0, "b", unreachable="a") == "b"
    assert not next(h for h in registry.hosts.values() if h.host_id == "a").alive
    a.die()
    b.die()


def test_connections_without_the_secret_are_refused(
    registry: HostRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(AuthenticationError):
        connect(registry.endpoint, new_secret())
    with socket.create_connection(("127.0.0.1", registry.endpoint.port), timeout=5) as raw:
        raw.recv(64)  # the challenge
        raw.sendall(b"x" * 64)  # a wrong answer
        assert raw.recv(64) == b""  # closed without a word
    with caplog.at_level(logging.WARNING, logger="statetier.spark.channel"):
        with contextlib.suppress(AuthenticationError):
            connect(registry.endpoint, b"not the secret")
        time.sleep(0.2)
    assert "does not hold the application's secret" in caplog.text
    # nothing reached the registry: no host registered, no range routed
    assert registry.hosts == {} and registry.owners == {}


def test_a_peer_that_connects_and_says_nothing_holds_no_one_up(registry: HostRegistry) -> None:
    with socket.create_connection(("127.0.0.1", registry.endpoint.port), timeout=5):
        a = FakeHost(registry, "a")  # registers while the silent peer is still connected
        assert route(registry, 0, "a") == "a"
        a.die()


def test_a_client_refuses_a_server_that_does_not_hold_the_secret() -> None:
    """An impostor that takes any answer still cannot prove the secret: the task never sends."""
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def impostor() -> None:
        peer, _ = listener.accept()
        with peer:
            peer.sendall(MAGIC + b"n" * 32)
            peer.recv(64)
            peer.sendall(b"p" * 32)  # a proof made without the secret
            received.append(peer.recv(1024))

    thread = threading.Thread(target=impostor)
    thread.start()
    try:
        with pytest.raises(AuthenticationError, match="does not hold"):
            connect(Endpoint("tcp", "127.0.0.1", listener.getsockname()[1]), new_secret())
        thread.join(5)
        assert received == [b""]  # the client closed without sending a frame
    finally:
        listener.close()


def test_a_finished_pipeline_releases_its_ranges_on_their_hosts(registry: HostRegistry) -> None:
    a, b = FakeHost(registry, "a"), FakeHost(registry, "b")
    registry.executors = 2
    owners = {i: route(registry, i, "a" if i < 2 else "b") for i in range(4)}
    other = ask_route(registry.endpoint, registry.secret, ("q", 4, 0), "a").host_id
    assert registry.release_pipeline("p") == 4
    deadline = time.monotonic() + 5
    while len(a.orders) + len(b.orders) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    released = {h.info.host_id: h.orders for h in (a, b)}
    for host_id, orders in released.items():
        mine = tuple(("p", 4, i) for i, o in owners.items() if o == host_id)
        assert orders == [HostOrder(OrderKind.RELEASE, mine)]
    assert registry.owners == {("q", 4, 0): other}  # another pipeline keeps its ranges
    a.die()
    b.die()


def test_a_released_pipeline_is_not_told_later_of_a_host_lost_before(
    registry: HostRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = FakeHost(registry, "a"), FakeHost(registry, "b")
    registry.executors = 2
    assert route(registry, 0, "a") == "a"
    assert ask_route(registry.endpoint, registry.secret, ("q", 4, 0), "a").host_id == "a"
    a.die()
    deadline = time.monotonic() + 5
    while registry.owner(("p", 4, 0)) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert registry.release_pipeline("p") == 0  # the query ended; its range had no owner
    # heard on the module's logger itself: another test may have configured its parents
    logger = logging.getLogger("statetier.spark.registry")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger=logger.name):
            assert route(registry, 0, "b") == "b"  # the query runs again: no news of a
            assert "is gone" not in caplog.text
            # another pipeline that ran on the lost host hears of it when it routes again
            assert ask_route(registry.endpoint, registry.secret, ("q", 4, 0), "b").host_id == "b"
            assert "state host a (executor a) is gone" in caplog.text
    finally:
        logger.removeHandler(caplog.handler)
    b.die()


def test_a_host_tells_the_registry_the_files_it_wrote(registry: HostRegistry) -> None:
    host = FakeHost(registry, "a")
    result = json.dumps({"range": 3, "note": "é€😀"}).encode()
    assert registry.take_written(("s3://b/r/3.json",), 0.05) is None  # nothing told yet
    waiting = concurrent.futures.ThreadPoolExecutor(1).submit(
        registry.take_written, ("s3://b/r/3.error.txt", "s3://b/r/3.json"), 10.0
    )
    time.sleep(0.1)
    host.link.tell_written(host.registry, "s3://b/r/3.json", result)
    assert waiting.result(timeout=10) == ("s3://b/r/3.json", result)  # woke when told
    assert registry.take_written(("s3://b/r/3.json",), 0.05) is None  # taken once
    # the files of attempts no one waited for are forgotten after the commit
    host.link.tell_written(host.registry, "s3://b/e2/r/1.json", b"{}")
    host.link.tell_written(host.registry, "s3://b/e3/r/1.json", b"{}")
    deadline = time.monotonic() + 5
    while len(registry.written) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    registry.discard_written("s3://b/e2/")
    assert list(registry.written) == ["s3://b/e3/r/1.json"]
    host.die()


def test_a_result_the_registry_acknowledged_needs_no_file(registry: HostRegistry) -> None:
    host = FakeHost(registry, "a")
    assert host.link.deliver(host.registry, "s3://b/r/1.json", b'{"range": 1}', timeout=10)
    assert registry.take_written(("s3://b/r/1.json",), 0.05) == ("s3://b/r/1.json", b'{"range": 1}')
    assert host.orders == []  # the receipt is the link's own, not an order for the host
    host.die()
    # a link that is down: the host must write the file (the driver reads it from the store)
    assert not host.link.deliver(host.registry, "s3://b/r/2.json", b"{}", timeout=10)


def test_at_its_bound_the_registry_drops_only_what_a_file_also_holds(
    registry: HostRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("statetier.backend.spark.registry.MAX_WRITTEN", 2)
    host = FakeHost(registry, "a")
    host.link.tell_written(host.registry, "s3://b/f1.json", b"file")  # written as a file too
    assert host.link.deliver(host.registry, "s3://b/r1.json", b"1", timeout=10)
    assert host.link.deliver(host.registry, "s3://b/r2.json", b"2", timeout=10)  # f1 made room
    assert set(registry.written) == {"s3://b/r1.json", "s3://b/r2.json"}
    # full of results only the registry holds: no receipt, so the host writes the file
    assert not host.link.deliver(host.registry, "s3://b/r3.json", b"3", timeout=0.5)
    assert set(registry.written) == {"s3://b/r1.json", "s3://b/r2.json"}
    assert registry.take_written(("s3://b/r1.json",), 1) == ("s3://b/r1.json", b"1")
    assert host.link.deliver(host.registry, "s3://b/r3.json", b"3", timeout=10)  # room again
    host.die()


def test_a_result_a_registry_does_not_acknowledge_is_written_after_the_wait() -> None:
    """A driver of an older version hears the result but sends no receipt: the host waits
    ``timeout``, then writes the file."""
    secret = new_secret()
    heard: list[bytes] = []

    def older_registry(conn: Connection) -> None:
        conn.recv_bytes()  # the registration
        conn.send_bytes(b'{"registered": true}')
        with contextlib.suppress(EOFError, OSError):
            while True:
                heard.append(conn.recv_bytes())

    server = Server(secret, older_registry, "older")
    link = RegistryLink(HostInfo("a", 0, "a", "node", []), secret, lambda order, _: None)
    try:
        endpoint = server.bind_tcp("127.0.0.1")
        link.join(endpoint)
        started = time.monotonic()
        assert not link.deliver(endpoint, "s3://b/r/1.json", b"{}", timeout=0.3)
        assert time.monotonic() - started >= 0.3
        assert any(json.loads(m).get("written") == "s3://b/r/1.json" for m in heard)
    finally:
        link.close()
        server.close()


def test_the_registry_answers_a_malformed_request_with_what_is_wrong(
    registry: HostRegistry,
) -> None:
    for request, error in [
        (b"{", "not JSON"),
        (b'{"op": "steal"}', "unknown request 'steal'"),
        (b'{"op": "route", "pipeline": "p", "parallelism": "4", "index": 0}', "'parallelism'"),
        (
            b'{"op": "register", "host": {"host_id": "h", "pid": 1, "executor": "e", "node": "n"}}',
            "statetier host info: field 'endpoints' is missing",
        ),
    ]:
        with contextlib.closing(connect(registry.endpoint, registry.secret)) as conn:
            conn.send_bytes(request)
            answer = json.loads(conn.recv_bytes())
        assert error in answer["error"]
    assert registry.hosts == {}


def test_a_host_order_decodes_what_it_encodes_and_names_a_bad_field() -> None:
    for order in (
        HostOrder(OrderKind.SHUTDOWN),
        HostOrder(OrderKind.RELEASE, (("p", 4, 1),)),
        HostOrder(OrderKind.RECEIVED, file="s3://b/r/1.json"),
    ):
        assert HostOrder.decode(order.encode()) == order
    with pytest.raises(MessageError, match=r"field 'op' must be shutdown, release or received"):
        HostOrder.decode(b'{"op": "x"}')
    with pytest.raises(MessageError, match=r"field 'file' is missing"):
        HostOrder.decode(b'{"op": "received"}')
    with pytest.raises(MessageError, match=r"field 'ranges\[0\]' must be \[pipeline, par"):
        HostOrder.decode(b'{"op": "release", "ranges": [["p", "4", 1]]}')


def test_a_lost_host_is_told_once_when_its_ranges_move(
    registry: HostRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning comes with the move it causes; a host that ends with its application (a
    script's spark.stop() without stop_hosts()) moves nothing, and is not reported."""
    a, b = FakeHost(registry, "a"), FakeHost(registry, "b")
    registry.executors = 2
    assert [route(registry, i, "a") for i in (0, 1)] == ["a", "a"]
    caplog.set_level(logging.WARNING, "statetier.spark.registry")
    a.die()
    deadline = time.monotonic() + 5
    while registry.owner(("p", 4, 0)) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert registry.owner(("p", 4, 0)) is None
    assert [r.getMessage() for r in caplog.records] == []  # nothing moved yet
    assert route(registry, 0, "b") == route(registry, 1, "b") == "b"
    (told,) = [r.getMessage() for r in caplog.records]
    assert told.startswith("state host a (executor a) is gone: ")
    assert "its 2 ranges get new owners (range 0 -> state host b)" in told
    b.die()


def test_a_host_that_cannot_register_tells_the_task_why(tmp_path: Path) -> None:
    # on a busy machine a host's registration can fail (a handshake timeout); the task is told
    # why, where it used to see the connection close (an EOFError naming nothing)
    secret = new_secret()
    path = str(tmp_path / "host.sock")
    host = StateHost(path, idle_timeout=60, watch_pid=None, secret=secret)
    serving = threading.Thread(target=host.serve, daemon=True)
    serving.start()
    stopped = HostRegistry(secret, "127.0.0.1")
    stopped.close()
    live = HostRegistry(secret, "127.0.0.1")
    try:
        with pytest.raises(JoinError, match=r"could not register with the driver at 127\.0\.0\.1"):
            join_host(path, secret, stopped.endpoint)
        joined = join_host(path, secret, live.endpoint)
        assert joined is not None and joined.host_id == host.host_id
        assert [h.host_id for h in live.live_hosts()] == [host.host_id]
    finally:
        host.stopping.set()
        serving.join(10)
        live.close()


def test_a_task_that_joins_as_soon_as_the_socket_appears_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task takes the socket file's presence for the host's readiness (see local_host). The
    host used to bind it before its registration link existed, so a join in that window found
    no ``link``: the host's connection thread died and the task saw an EOFError naming nothing
    (a CI run of the demo's restart, on a busy machine). A join that early waits and is
    answered."""
    built = threading.Event()

    class SlowLink(RegistryLink):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.wait(10)  # the host's construction, held between its binding and its link
            super().__init__(*args, **kwargs)

    monkeypatch.setattr("statetier.backend.spark.host.RegistryLink", SlowLink)
    secret = new_secret()
    path = str(tmp_path / "host.sock")
    made: list[StateHost] = []
    building = threading.Thread(
        target=lambda: made.append(StateHost(path, 60, watch_pid=None, secret=secret))
    )
    building.start()
    registry = HostRegistry(secret, "127.0.0.1")
    try:
        while not Path(path).exists():
            time.sleep(0.005)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            joining = pool.submit(join_host, path, secret, registry.endpoint)
            time.sleep(0.3)  # the join is sent while the host is still being built
            assert not joining.done()
            built.set()
            joined = joining.result(10)
        building.join(10)
        assert joined is not None and joined.host_id == made[0].host_id
        assert [h.host_id for h in registry.live_hosts()] == [made[0].host_id]
    finally:
        built.set()
        building.join(10)
        for host in made:
            host.link.close()
            host.server.close()
        registry.close()


def test_a_host_that_closes_the_join_unanswered_is_named_to_the_task(tmp_path: Path) -> None:
    # a host that stops or fails while a task joins it: a JoinError naming it (the start of a
    # host retries on it), not the bare EOFError of the closed connection
    secret = new_secret()
    path = str(tmp_path / "host.sock")

    def read_and_close(conn: Connection) -> None:  # a host's end between request and answer
        conn.recv_bytes()

    mute = Server(secret, read_and_close, "mute-host")
    mute.bind_unix(path)
    registry = HostRegistry(secret, "127.0.0.1")
    try:
        with pytest.raises(JoinError, match=r"host\.sock closed the connection without answering"):
            join_host(path, secret, registry.endpoint)
    finally:
        mute.close()
        registry.close()


def test_a_server_leaves_the_socket_file_of_the_one_that_replaced_it(tmp_path: Path) -> None:
    # a new state host binds the path of one that is stopping; the old one's close must not
    # remove the new one's socket file (its host would take that for its end, and tasks would
    # find no host)
    secret = new_secret()
    path = str(tmp_path / "host.sock")
    old, new = Server(secret, lambda conn: None, "old"), Server(secret, lambda conn: None, "new")
    try:
        old.bind_unix(path)
        new.bind_unix(path)
        old.close()
        assert Path(path).exists()
        connect(Endpoint("unix", path), secret).close()  # the new one still serves there
        new.close()
        assert not Path(path).exists()  # its own file goes with it
    finally:
        old.close()
        new.close()


def test_a_task_starts_a_new_host_in_place_of_one_that_is_stopping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host stops once idle for ``host.idle-timeout``; a task that comes in the moments of
    its stopping used to fail on its refusal (a query on ``local[N]``, which retries no task,
    failed with it). The task starts a new host in its place, which keeps its socket file when
    the old one's close comes after."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    registry = HostRegistry(new_secret(), "127.0.0.1")
    spec = PipelineSpec(
        app_id="app-stopping",
        idle_timeout=60.0,
        registry=registry.endpoint,
        secret=registry.secret,
        host_bind="127.0.0.1",
        host_port=0,
        state=StateSpec("wc", 1, 8, f"file://{tmp_path}/ckpt", ("word",), ""),
    )
    old = StateHost(socket_path(spec.app_id), 60, watch_pid=None, secret=registry.secret)
    old.stopping.set()  # it still listens, and refuses as it stops
    new: HostInfo | None = None
    try:
        where = Endpoint("unix", socket_path(spec.app_id))
        with pytest.raises(HostStoppingError, match="is stopping"):
            ask_to_join(where, registry.secret, registry.endpoint)
        assert join_host(where.address, registry.secret, registry.endpoint) is None  # no host
        new = local_host(spec)
        assert new.host_id != old.host_id and new.pid != os.getpid()
        old.server.close()  # the old host's end comes after
        assert Path(where.address).exists()
        again = join_host(where.address, registry.secret, registry.endpoint)
        assert again is not None and again.host_id == new.host_id
        assert [h.host_id for h in registry.live_hosts()] == [new.host_id]
    finally:
        old.link.close()
        old.server.close()
        registry.shutdown_hosts(10)
        registry.close()
        deadline = time.monotonic() + 10
        while new is not None and process_alive(new.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert new is None or not process_alive(new.pid)


class _Instance:
    """What a hosted range needs of its function instance to be dropped: its lock, ``close``."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.closed = False

    def close(self) -> None:
        self.closed = True


@contextlib.contextmanager
def host_of_two_registries(
    tmp_path: Path,
) -> Iterator[tuple[StateHost, threading.Thread, HostRegistry, HostRegistry]]:
    """A state host serving on a thread, joined to two registries (two coordinators), in that
    order; the host and both registries are stopped afterwards."""
    secret = new_secret()
    path = str(tmp_path / "host.sock")
    host = StateHost(path, idle_timeout=60, watch_pid=None, secret=secret)
    serving = threading.Thread(target=host.serve, daemon=True)
    serving.start()
    first, second = HostRegistry(secret, "127.0.0.1"), HostRegistry(secret, "127.0.0.1")
    try:
        for registry in (first, second):
            joined = join_host(path, secret, registry.endpoint)
            assert joined is not None and joined.host_id == host.host_id
        assert host.link.registries() == [first.endpoint, second.endpoint]
        yield host, serving, first, second
    finally:
        host.stopping.set()
        serving.join(10)
        first.close()
        second.close()


def test_a_host_of_two_coordinators_serves_on_when_one_of_them_stops_it(tmp_path: Path) -> None:
    """On a Connect server each query's coordinator has a registry of its own, and all of them
    share the executors' hosts: one coordinator's shutdown ends that coordinator's use of the
    host (its registration, its ranges), not the host; the last one's stops it."""
    with host_of_two_registries(tmp_path) as (host, serving, first, second):
        ranges = {("p", 2, 0): first.endpoint, ("p", 2, 1): first.endpoint}
        ranges[("q", 2, 0)] = second.endpoint
        instances = {key: _Instance() for key in ranges}
        for key, endpoint in ranges.items():
            host.ranges[key] = HostedRange(cast(Any, instances[key]), registry=endpoint)
        assert [h.host_id for h in first.shutdown_hosts(10)] == [host.host_id]
        assert not host.stopping.is_set()
        assert host.link.registries() == [second.endpoint]
        assert list(host.ranges) == [("q", 2, 0)]
        assert [k for k, i in instances.items() if i.closed] == [("p", 2, 0), ("p", 2, 1)]
        assert [h.host_id for h in second.live_hosts()] == [host.host_id]
        second.shutdown_hosts(10)
        assert second.live_hosts() == []  # it saw the host hang up, not its own timeout
        serving.join(10)
        assert host.stopping.is_set() and not serving.is_alive()


def test_a_host_sees_at_once_a_coordinator_that_closes_without_a_shutdown(
    tmp_path: Path,
) -> None:
    """A registry that closes (its coordinator ended without stopping its hosts) hangs up on
    its hosts, whose order readers are blocked on those links: each host drops that registry
    and its ranges now, not when the coordinator's process exits."""
    with host_of_two_registries(tmp_path) as (host, _, first, second):
        instance = _Instance()
        host.ranges[("p", 2, 0)] = HostedRange(cast(Any, instance), registry=first.endpoint)
        first.close()
        deadline = time.monotonic() + 5
        while host.link.registries() != [second.endpoint] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert host.link.registries() == [second.endpoint]
        assert instance.closed and list(host.ranges) == []
        assert not host.stopping.is_set()
