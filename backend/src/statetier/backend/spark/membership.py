"""A state host's membership in its application: registered with the drivers' registries,
heartbeat, orders.

The host keeps one authenticated connection to each coordinator's registry that sent it a task:
on a classic driver there is one (the application's); on a Spark Connect server, each streaming
query's ``foreachBatch`` process coordinates its own pipeline with a registry of its own, and all
of them share the executors' hosts (see session_kind). On each connection the host registers
(its id, endpoints, pid, executor), then sends a heartbeat every second, and takes orders
(``shutdown``; ``release`` of ranges that moved away). The heartbeat carries the host's
anonymous RSS and its keyed state's bytes by tier (heap, spilled), which the driver reports. A
range's result goes to the registry that routed its task, on the same connection
(:meth:`RegistryLink.deliver`); only when that registry does not acknowledge it in time does the
host write it as a file the driver reads from the checkpoint store (an error file is always
written, then told). When a connection breaks (its coordinator ended, or a driver registry
restarted), ``on_lost`` hears of it; the host registers again when a task next tells it where a
registry is (:meth:`RegistryLink.join`); until then it serves that registry nothing new: tasks
reach it only through routes a registry gave.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection

from statetier.backend.process_memory import read_rss
from statetier.backend.spark.channel import HANDSHAKE_TIMEOUT_S, Endpoint, connect, hang_up
from statetier.backend.spark.protocol import RESULT, STOPPING
from statetier.backend.spark.registry import (
    HostInfo,
    HostOrder,
    OrderKind,
    RangeKey,
    ask_previous_owner,
)
from statetier.backend.wire import MessageError

__all__ = [
    "HEARTBEAT_S",
    "RECEIPT_S",
    "HostStoppingError",
    "JoinError",
    "RegistryLink",
    "ask_to_join",
]

log = logging.getLogger("statetier.spark.host")

HEARTBEAT_S = 1.0
RECEIPT_S = 5.0  # how long a host waits for the driver's receipt of a result before writing it


class JoinError(RuntimeError):
    """A state host answered but could not register with the driver's registry (the reason is
    in the message): on a busy machine a registration can time out, and a host that has just
    started is asked again until its start timeout."""


class HostStoppingError(JoinError):
    """The state host answered that it is stopping (idle too long, its executor gone, or told
    to): it serves nothing more, and a task may start a new host in its place."""


def ask_to_join(
    host: Endpoint,
    secret: bytes,
    registry: Endpoint,
    timeout: float = HANDSHAKE_TIMEOUT_S,
    answer_timeout: float | None = None,
) -> HostInfo:
    """Ask the host at ``host`` to register with ``registry`` (the ``join`` request a task
    sends, and a new coordinator on a Connect driver, see host_roster); the host, once
    registered there. :class:`JoinError` when it answered that it could not
    (:class:`HostStoppingError` when because it stops); OSError when it
    cannot be reached in ``timeout`` or does not answer in ``answer_timeout`` (None: waits)."""
    with contextlib.closing(connect(host, secret, timeout)) as conn:
        conn.send_bytes(json.dumps({"op": "join", "registry": registry.to_json()}).encode())
        if answer_timeout is not None and not conn.poll(answer_timeout):
            raise TimeoutError(f"the state host at {host} did not answer in {answer_timeout}s")
        answer = conn.recv_bytes()
    if answer[:1] != RESULT:
        reason = bytes(answer[1:]).decode(errors="replace")
        error = HostStoppingError if reason.endswith(STOPPING) else JoinError
        raise error(f"the state host at {host.address} could not join the driver: {reason}")
    return HostInfo.from_json(json.loads(answer[1:]))


class RegistryLink:
    """The host's side of its registrations; ``on_order`` gets each order a registry sends (with
    the registry), ``on_lost`` each registry whose connection broke."""

    def __init__(
        self,
        host: HostInfo,
        secret: bytes,
        on_order: Callable[[HostOrder, Endpoint], None],
        state_bytes: Callable[[], tuple[int, int]] = lambda: (0, 0),
        on_lost: Callable[[Endpoint], None] = lambda registry: None,
    ) -> None:
        self.host = host
        self.secret = secret
        self.on_order = on_order
        self.on_lost = on_lost
        self.state_bytes = state_bytes  # (heap, spilled) bytes of the host's keyed state
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # the heartbeats' threads and the snapshots' sends
        self._conns: dict[Endpoint, Connection] = {}  # by registry, in the order joined
        self._stopped = threading.Event()
        self._receipts: dict[str, threading.Event] = {}  # told URLs awaiting the driver's receipt

    def join(self, registry: Endpoint) -> None:
        """Be registered with ``registry`` (at once, so a route right after finds this host),
        keeping every other registration: a task that names a registry which no longer answers
        (of a stopped query) raises here and changes nothing, and the host's other
        coordinators go on counting it alive."""
        with self._lock:
            conn = self._conns.get(registry)
            if conn is not None and not conn.closed:
                return
            conn = self._conns[registry] = self._register(registry)
        threading.Thread(target=self._heartbeat, args=(conn,), daemon=True).start()
        threading.Thread(target=self._orders, args=(registry, conn), daemon=True).start()

    def registries(self) -> list[Endpoint]:
        """The registries this host is registered with, in the order it joined them."""
        with self._lock:
            return [r for r, conn in self._conns.items() if not conn.closed]

    def leave(self, registry: Endpoint) -> None:
        """End the registration with ``registry`` (that registry then counts the host gone)."""
        with self._lock:
            conn = self._conns.pop(registry, None)
        if conn is not None:
            hang_up(conn)

    def _register(self, registry: Endpoint) -> Connection:
        """A connection to ``registry`` on which this host is registered."""
        conn = connect(registry, self.secret)
        try:
            conn.send_bytes(json.dumps({"op": "register", "host": self.host.to_json()}).encode())
            answer = json.loads(conn.recv_bytes())
        except BaseException:
            conn.close()
            raise
        if not answer.get("registered"):
            conn.close()
            raise ConnectionError(f"the registry at {registry} refused this host: {answer}")
        return conn

    def previous_owner(self, registry: Endpoint, key: RangeKey) -> HostInfo | None:
        """The live host that owned ``key`` before ``registry`` moved it here by rebalancing
        (None: none, or not registered there: restore the range from tier 2)."""
        if registry not in self.registries():
            return None
        return ask_previous_owner(registry, self.secret, key, self.host.host_id)

    def _heartbeat(self, conn: Connection) -> None:
        while not self._stopped.wait(HEARTBEAT_S) and not conn.closed:
            heap, spilled = self._state()
            try:
                self._send(conn, {"rss": read_rss(), "state_heap": heap, "state_spilled": spilled})
            except OSError:
                return

    def _state(self) -> tuple[int, int]:
        """The state's bytes for the heartbeat; a report that fails must not stop the
        heartbeat (the driver would take the host for dead)."""
        try:
            return self.state_bytes()
        except Exception:
            log.exception("the state's size could not be read for the heartbeat")
            return 0, 0

    def _conn(self, registry: Endpoint | None) -> Connection | None:
        if registry is None:
            return None
        with self._lock:
            conn = self._conns.get(registry)
        return conn if conn is not None and not conn.closed else None

    def tell_written(self, registry: Endpoint | None, url: str, body: bytes) -> None:
        """Tell ``registry`` that the file at ``url`` is written, with its bytes (a range's
        result or error file: a few kB). Best effort: a driver that does not hear it reads the
        file from the store."""
        conn = self._conn(registry)
        if conn is None:
            return
        with contextlib.suppress(OSError, UnicodeDecodeError):
            self._send(conn, {"written": url, "body": body.decode()})

    def deliver(
        self, registry: Endpoint | None, url: str, body: bytes, timeout: float = RECEIPT_S
    ) -> bool:
        """Tell ``registry`` the result that would be written at ``url``, and wait up to
        ``timeout`` for its receipt: True when the driver holds it (no file is needed), False
        when the link is down or the receipt did not come (the caller writes the file, which
        the driver reads from the store)."""
        conn = self._conn(registry)
        if conn is None:
            return False
        received = threading.Event()
        with self._lock:
            self._receipts[url] = received
        try:
            self._send(conn, {"written": url, "body": body.decode(), "receipt": True})
            return received.wait(timeout)
        except (OSError, UnicodeDecodeError):
            return False
        finally:
            with self._lock:
                self._receipts.pop(url, None)

    def _send(self, conn: Connection, message: dict[str, object]) -> None:
        with self._send_lock:
            conn.send_bytes(json.dumps(message).encode())

    def _orders(self, registry: Endpoint, conn: Connection) -> None:
        try:
            while True:
                raw = conn.recv_bytes(1 << 20)
                try:
                    order = HostOrder.decode(raw)
                except MessageError as e:  # a driver of another version: nothing to do
                    log.warning("ignored an order of the driver's host registry: %s", e)
                    continue
                if order.kind is OrderKind.RECEIVED:
                    self._received(order.file)
                else:
                    self.on_order(order, registry)
        except (EOFError, OSError):
            pass
        with contextlib.suppress(OSError):
            conn.close()
        with self._lock:
            current = self._conns.get(registry) is conn
            if current:
                del self._conns[registry]
        if current and not self._stopped.is_set():  # not one it left
            log.warning(
                "lost the host registry at %s; registering again on its next task", registry
            )
            self.on_lost(registry)

    def _received(self, url: str) -> None:
        with self._lock:
            waiting = self._receipts.get(url)
        if waiting is not None:
            waiting.set()

    def close(self) -> None:
        self._stopped.set()
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            hang_up(conn)
