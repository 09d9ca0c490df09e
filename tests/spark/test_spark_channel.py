"""``channel.connect`` to a Unix socket whose backlog of pending connections is full: Linux
refuses such a connect at once (EAGAIN) where a TCP one waits, so the tasks of a gathered epoch
on an executor of many cores, which connect to a host's ranges all at once, could fail on a
moment's burst. The connect waits for room up to its timeout, then names the socket in a line."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from statetier.backend.spark.channel import (
    Endpoint,
    _accept_handshake,
    _as_connection,
    connect,
    new_secret,
)

SECRET = new_secret()


@contextlib.contextmanager
def full_backlog(path: Path) -> Iterator[tuple[socket.socket, list[socket.socket]]]:
    """A Unix socket listening at ``path`` that accepts nothing, and the connections that fill
    its backlog (until the kernel refuses one)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    fillers: list[socket.socket] = []
    try:
        while True:
            filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            filler.settimeout(1.0)
            try:
                filler.connect(str(path))
            except BlockingIOError:
                filler.close()
                break
            fillers.append(filler)
            assert len(fillers) < 64, "the backlog never filled"
        yield listener, fillers
    finally:
        for sock in [*fillers, listener]:
            sock.close()


def test_a_connect_waits_while_the_backlog_is_full_and_then_gets_through(tmp_path: Path) -> None:
    path = tmp_path / "host.sock"
    with full_backlog(path) as (listener, fillers):
        served: list[bytes] = []

        def accept_later() -> None:
            time.sleep(0.5)
            for _ in fillers:  # the connections ahead of ours in the queue
                listener.accept()[0].close()
            peer, _ = listener.accept()
            peer.settimeout(5)
            _accept_handshake(peer, SECRET)
            with _as_connection(peer) as conn:
                conn.send_bytes(b"hello")
                served.append(conn.recv_bytes())

        acceptor = threading.Thread(target=accept_later)
        acceptor.start()
        started = time.monotonic()
        with connect(Endpoint("unix", str(path)), SECRET, timeout=10) as conn:
            waited = time.monotonic() - started
            assert conn.recv_bytes() == b"hello"
            conn.send_bytes(b"thanks")
        acceptor.join(10)
    assert waited >= 0.4, "the connect did not wait for room in the backlog"
    assert served == [b"thanks"]


def test_a_backlog_that_stays_full_is_named_after_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "stuck.sock"
    with full_backlog(path):
        started = time.monotonic()
        with pytest.raises(ConnectionRefusedError) as refused:
            connect(Endpoint("unix", str(path)), SECRET, timeout=0.5)
        waited = time.monotonic() - started
    assert 0.5 <= waited < 5
    message = str(refused.value)
    assert str(path) in message and "backlog" in message and "0.5 s" in message
    assert "\n" not in message
