"""Authenticated connections between a Spark application's driver, tasks and state hosts.

State hosts take tasks from any executor of their application (over TCP, or a Unix socket when
the task runs beside the host), and the driver's host registry takes registrations and routing
questions. Every connection starts with a mutual challenge-response on the application's secret
(HMAC-SHA256 over fresh nonces of both sides): a peer that does not hold the secret is refused
before it can send a single frame, and a task never streams its records to an impostor. The
secret is made by the driver and travels only inside the pickled task closure (Spark's own
channel to its executors) and on a host's standard input; never in Spark conf, job properties
or argv, which end in logs and UIs.

After the handshake a connection is a :class:`multiprocessing.connection.Connection` (length
-prefixed frames). The handshake runs on the accepting thread's own connection thread with a
deadline, so a peer that connects and says nothing holds no one up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

__all__ = [
    "AuthenticationError",
    "Endpoint",
    "Server",
    "connect",
    "hang_up",
    "new_secret",
]

log = logging.getLogger("statetier.spark.channel")

MAGIC = b"statetier-host/1"  # protocol name and version, sent first by the accepting side
NONCE = 32
MAC = 32
HANDSHAKE_TIMEOUT_S = 10.0


class AuthenticationError(ConnectionError):
    """The peer does not hold the application's secret (or does not speak the protocol)."""


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where a server listens: ``unix`` with a socket path, or ``tcp`` with address and port."""

    kind: str
    address: str
    port: int = 0

    def to_json(self) -> list[Any]:
        return [self.kind, self.address, self.port]

    @classmethod
    def from_json(cls, data: list[Any]) -> Endpoint:
        kind, address, port = data
        return cls(str(kind), str(address), int(port))

    def __str__(self) -> str:
        return self.address if self.kind == "unix" else f"{self.address}:{self.port}"


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def _mac(secret: bytes, role: bytes, *nonces: bytes) -> bytes:
    return hmac.new(secret, role + b"".join(nonces), hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise AuthenticationError("the peer closed the connection during the handshake")
        data += chunk
    return bytes(data)


def _accept_handshake(sock: socket.socket, secret: bytes) -> None:
    """The accepting side: challenge, check the answer, prove ourselves in turn."""
    server_nonce = secrets.token_bytes(NONCE)
    sock.sendall(MAGIC + server_nonce)
    answer = _recv_exact(sock, NONCE + MAC)
    client_nonce, client_mac = answer[:NONCE], answer[NONCE:]
    if not hmac.compare_digest(client_mac, _mac(secret, b"client", server_nonce, client_nonce)):
        raise AuthenticationError("the peer does not hold the application's secret")
    sock.sendall(_mac(secret, b"server", client_nonce, server_nonce))


def _connect_handshake(sock: socket.socket, secret: bytes) -> None:
    """The connecting side: answer the challenge, then check the server's proof."""
    hello = _recv_exact(sock, len(MAGIC) + NONCE)
    if not hello.startswith(MAGIC):
        raise AuthenticationError("the peer is not a statetier state host or registry")
    server_nonce = hello[len(MAGIC) :]
    client_nonce = secrets.token_bytes(NONCE)
    sock.sendall(client_nonce + _mac(secret, b"client", server_nonce, client_nonce))
    proof = _recv_exact(sock, MAC)
    if not hmac.compare_digest(proof, _mac(secret, b"server", client_nonce, server_nonce)):
        raise AuthenticationError("the peer does not hold the application's secret")


def _as_connection(sock: socket.socket) -> Connection:
    sock.settimeout(None)
    return Connection(sock.detach())


def hang_up(conn: Connection) -> None:
    """Close ``conn`` so that its peer sees it end now. A ``close`` alone does not when another
    thread is blocked reading it (a registration's heartbeats or orders): Linux ends a
    connection only once no thread uses its socket, so the peer would count this side alive
    until its process exited. Shutting a duplicate of the socket down ends it at once, and
    wakes that reader with an end of file."""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(conn.fileno())) as same:
        same.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        conn.close()


def connect(endpoint: Endpoint, secret: bytes, timeout: float = HANDSHAKE_TIMEOUT_S) -> Connection:
    """An authenticated connection to ``endpoint`` (ConnectionError when it cannot be had within
    ``timeout`` seconds)."""
    if endpoint.kind == "unix":
        sock = _connect_unix(endpoint.address, timeout)
    else:
        sock = _connect_tcp(endpoint.address, endpoint.port, timeout)
    try:
        _connect_handshake(sock, secret)
        return _as_connection(sock)
    except OSError:
        sock.close()
        raise


def _connect_tcp(address: str, port: int, timeout: float) -> socket.socket:
    """A socket connected to ``address``:``port`` (``timeout`` for this and every later
    operation on it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout)
        sock.connect((address, port))
        return sock
    except OSError:
        sock.close()
        raise


def _connect_unix(path: str, timeout: float) -> socket.socket:
    """A socket connected to the Unix socket at ``path``, waiting up to ``timeout`` seconds
    while its backlog is full (``timeout`` for every later operation on it).

    A TCP connect waits for room in a full backlog (the kernel drops the SYN and the client sends
    it again); a Unix one refuses at once, with EAGAIN, when it has a timeout as ours do. Tasks
    that open a host's ranges all at once (a gathered epoch on an executor of many cores: a
    connection per task and range) can fill it for a moment: each try gets a new socket, after a
    pause that doubles from 2 ms to 100 ms."""
    deadline, pause = time.monotonic() + timeout, 0.002
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)  # a Unix connect does not wait: it gets in or is refused
            sock.connect(path)
            return sock
        except BlockingIOError:
            sock.close()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectionRefusedError(
                    f"{path} took no connection in {timeout:g} s: its backlog of pending "
                    f"connections stayed full (is the process that listens on it stuck?)"
                ) from None
            time.sleep(min(pause, remaining))
            pause = min(2 * pause, 0.1)
        except OSError:
            sock.close()
            raise


class Server:
    """Accepts authenticated connections on some endpoints; each runs ``handler`` on its thread.

    ``bind`` takes Unix socket paths and (address, port) pairs; :attr:`endpoints` says where it
    listens (a port 0 becomes the port the kernel chose). Refusals are logged with the peer and
    the reason and cost the server nothing but the connection's thread.
    """

    def __init__(self, secret: bytes, handler: Callable[[Connection], None], name: str) -> None:
        self.secret = secret
        self.handler = handler
        self.name = name
        self.endpoints: list[Endpoint] = []
        self._sockets: list[socket.socket] = []
        self._files: dict[str, tuple[int, int]] = {}  # socket path -> (device, inode) bound
        self._closed = threading.Event()
        self.refused = 0

    def bind_unix(self, path: str) -> Endpoint:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        os.chmod(path, 0o600)  # only this user's processes may even try
        made = os.stat(path)
        self._files[path] = (made.st_dev, made.st_ino)
        return self._listen(sock, Endpoint("unix", path))

    def bind_tcp(self, address: str, port: int = 0) -> Endpoint:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        return self._listen(sock, Endpoint("tcp", address, sock.getsockname()[1]))

    def _listen(self, sock: socket.socket, endpoint: Endpoint) -> Endpoint:
        sock.listen(socket.SOMAXCONN)  # bursts of tasks: see _connect_unix
        self._sockets.append(sock)
        self.endpoints.append(endpoint)
        threading.Thread(
            target=self._accept_loop, args=(sock,), name=f"{self.name}-accept", daemon=True
        ).start()
        return endpoint

    def _accept_loop(self, sock: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                peer, address = sock.accept()
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(peer, address), name=f"{self.name}-conn", daemon=True
            ).start()

    def _serve(self, sock: socket.socket, address: Any) -> None:
        if sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            _accept_handshake(sock, self.secret)
            conn = _as_connection(sock)
        except OSError as e:  # AuthenticationError, timeouts, resets
            self.refused += 1
            log.warning("%s refused a connection from %s: %s", self.name, address or "unix", e)
            sock.close()
            return
        try:
            self.handler(conn)
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def close(self) -> None:
        self._closed.set()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        for path, made in self._files.items():
            _remove_if_same(path, made)


def _remove_if_same(path: str, made: tuple[int, int]) -> None:
    """Remove the socket file at ``path`` if it is still the one bound (``made``): a server
    that replaced it there (a new state host in place of one that is stopping) keeps its own,
    which its host watches and tasks find it by."""
    with contextlib.suppress(FileNotFoundError):
        now = os.stat(path)
        if (now.st_dev, now.st_ino) == made:
            os.unlink(path)
