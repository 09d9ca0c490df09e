"""Loopback ports for the servers the demos, benchmarks and tests start (each binds 127.0.0.1)."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A port free on 127.0.0.1 a moment ago (for a server to bind, or an address nobody
    serves): the kernel's pick, so two callers rarely collide, though nothing reserves it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
