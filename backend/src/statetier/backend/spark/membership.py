"""A state host's membership in its application: registered with the driver, heartbeat, orders.

The host keeps one authenticated connection to the driver's registry: it registers (its id,
endpoints, pid, executor), then sends a heartbeat every second, and takes orders on the same
connection (``shutdown``; ``release`` of ranges that moved away). The heartbeat carries the host's
anonymous RSS and its keyed state's bytes by tier (heap, spilled), which the driver reports. A
range's result goes to the driver on the same connection (:meth:`RegistryLink.deliver`); only when
the driver does not acknowledge it in time does the host write it as a file the driver reads from
the checkpoint store (an error file is always written, then told). If the link breaks (a driver
registry restarted), the host registers again when a task next tells it where the registry is
(:meth:`RegistryLink.join`); until then it serves nothing new: tasks reach it only through routes
the registry gave.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection

from statetier.backend.spark.channel import Endpoint, connect
from statetier.backend.spark.registry import (
    HostInfo,
    HostOrder,
    OrderKind,
    RangeKey,
    ask_previous_owner,
)
from statetier.backend.spill.monitor import read_rss
from statetier.backend.wire import MessageError

__all__ = ["HEARTBEAT_S", "RECEIPT_S", "RegistryLink"]

log = logging.getLogger("statetier.spark.host")

HEARTBEAT_S = 1.0
RECEIPT_S = 5.0  # how long a host waits for the driver's receipt of a result before writing it


class RegistryLink:
    """The host's side of its registration; ``on_order`` gets each order the driver sends."""

    def __init__(
        self,
        host: HostInfo,
        secret: bytes,
        on_order: Callable[[HostOrder], None],
        state_bytes: Callable[[], tuple[int, int]] = lambda: (0, 0),
    ) -> None:
        self.host = host
        self.secret = secret
        self.on_order = on_order
        self.state_bytes = state_bytes  # (heap, spilled) bytes of the host's keyed state
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # the heartbeat's thread and the snapshots' send
        self._conn: Connection | None = None
        self._registry: Endpoint | None = None
        self._stopped = threading.Event()
        self._receipts: dict[str, threading.Event] = {}  # told URLs awaiting the driver's receipt

    def join(self, registry: Endpoint) -> None:
        """Be registered with ``registry`` (at once, so a route right after finds this host).

        The new registration is made before the current one is dropped: a task of a stopped
        query that still runs names the driver's previous registry, which no longer answers,
        and dropping the live registration first would make the live registry count this host
        gone (its ranges restored elsewhere, its epoch run again) for nothing."""
        with self._lock:
            if self._conn is not None and not self._conn.closed and self._registry == registry:
                return
            conn = self._register(registry)  # raises: the current registration stays
            old, self._conn, self._registry = self._conn, conn, registry
        if old is not None:
            with contextlib.suppress(OSError):
                old.close()
        threading.Thread(target=self._heartbeat, args=(conn,), daemon=True).start()
        threading.Thread(target=self._orders, args=(conn,), daemon=True).start()

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

    def previous_owner(self, key: RangeKey) -> HostInfo | None:
        """The live host that owned ``key`` before rebalancing moved it here (None: none, or
        not registered: restore the range from tier 2)."""
        registry = self._registry
        if registry is None:
            return None
        return ask_previous_owner(registry, self.secret, key, self.host.host_id)

    def _heartbeat(self, conn: Connection) -> None:
        while not self._stopped.wait(HEARTBEAT_S):
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

    def tell_written(self, url: str, body: bytes) -> None:
        """Tell the driver that the file at ``url`` is written, with its bytes (a range's
        result or error file: a few kB). Best effort: a driver that does not hear it reads the
        file from the store."""
        conn = self._conn
        if conn is None or conn.closed:
            return
        with contextlib.suppress(OSError, UnicodeDecodeError):
            self._send(conn, {"written": url, "body": body.decode()})

    def deliver(self, url: str, body: bytes, timeout: float = RECEIPT_S) -> bool:
        """Tell the driver the result that would be written at ``url``, and wait up to
        ``timeout`` for its receipt: True when the driver holds it (no file is needed), False
        when the link is down or the receipt did not come (the caller writes the file, which
        the driver reads from the store)."""
        conn = self._conn
        if conn is None or conn.closed:
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

    def _orders(self, conn: Connection) -> None:
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
                    self.on_order(order)
        except (EOFError, OSError):
            if not self._stopped.is_set() and conn is self._conn:  # not one it moved from
                log.warning("lost the driver's host registry; registering again on next task")
        with contextlib.suppress(OSError):
            conn.close()

    def _received(self, url: str) -> None:
        with self._lock:
            waiting = self._receipts.get(url)
        if waiting is not None:
            waiting.set()

    def close(self) -> None:
        self._stopped.set()
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(OSError):
                    self._conn.close()
