"""The host roster of a Connect driver's coordinators (host_roster): a real state host and real
registries on 127.0.0.1, the roster file in a temp dir."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from statetier.backend.spark.channel import Endpoint, new_secret
from statetier.backend.spark.host import StateHost
from statetier.backend.spark.host_roster import (
    invite,
    read_roster,
    roster_path,
    share_hosts,
    write_roster,
)
from statetier.backend.spark.registry import HostInfo, HostRegistry
from statetier.backend.spark.task import _join as join_host

SECRET = new_secret()


@pytest.fixture
def host(tmp_path: Path) -> Iterator[StateHost]:
    """A state host serving on a Unix socket and on 127.0.0.1."""
    serving = StateHost(str(tmp_path / "host.sock"), idle_timeout=60, watch_pid=None, secret=SECRET)
    thread = threading.Thread(target=serving.serve, daemon=True)
    thread.start()
    try:
        yield serving
    finally:
        serving.stopping.set()
        thread.join(10)


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_a_new_coordinators_registry_has_the_hosts_before_any_task(
    host: StateHost, tmp_path: Path
) -> None:
    """The first coordinator's registry writes the hosts that register with it to the roster;
    a second coordinator's registry, given the roster, has them registered before a task of
    its own ever ran (before: none until its first tasks joined them)."""
    first, second = HostRegistry(SECRET, "127.0.0.1"), HostRegistry(SECRET, "127.0.0.1")
    try:
        share_hosts(first, "app-1", str(tmp_path))
        joined = join_host(host.socket_path, SECRET, first.endpoint)  # a task of the first
        assert joined is not None
        path = roster_path("app-1", str(tmp_path))
        assert _wait_for(lambda: [h.host_id for h in read_roster(path)] == [host.host_id])
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert second.live_hosts() == []
        share_hosts(second, "app-1", str(tmp_path))
        assert [h.host_id for h in second.live_hosts()] == [host.host_id]
        assert set(host.link.registries()) == {first.endpoint, second.endpoint}
        # a registry that keeps the roster already is left alone (no second invitation)
        share_hosts(second, "app-1", str(tmp_path))
        assert len(second.live_hosts()) == 1
    finally:
        first.close()
        second.close()


def test_a_host_on_the_roster_that_is_gone_is_skipped_in_time(
    host: StateHost, tmp_path: Path
) -> None:
    """A roster may name hosts that have ended (an executor lost, an earlier run): the invitation
    skips them within its timeout and the live ones join."""
    registry = HostRegistry(SECRET, "127.0.0.1")
    try:
        live = join_host(host.socket_path, SECRET, registry.endpoint)
        assert live is not None
        gone = HostInfo(
            host_id="gone",
            pid=1,
            executor="0",
            node="localhost",
            endpoints=[
                Endpoint("unix", str(tmp_path / "gone.sock")),
                Endpoint("tcp", "127.0.0.1", 9),
            ],
        )
        other = HostRegistry(SECRET, "127.0.0.1")
        try:
            started = time.monotonic()
            joined = invite([gone, live], other.endpoint, SECRET, timeout=2.0)
            assert joined == [host.host_id]
            assert time.monotonic() - started < 2.5
            assert [h.host_id for h in other.live_hosts()] == [host.host_id]
        finally:
            other.close()
    finally:
        registry.close()


def test_a_host_asked_with_another_secret_does_not_join(host: StateHost) -> None:
    registry = HostRegistry(SECRET, "127.0.0.1")
    try:
        info = join_host(host.socket_path, SECRET, registry.endpoint)
        assert info is not None
        stranger = HostRegistry(new_secret(), "127.0.0.1")
        try:
            assert invite([info], stranger.endpoint, new_secret(), timeout=1.0) == []
            assert stranger.live_hosts() == []
        finally:
            stranger.close()
    finally:
        registry.close()


def test_a_roster_others_may_read_or_that_is_no_roster_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = roster_path("app/2", str(tmp_path))
    assert os.path.basename(path) == "statetier-app_2.hosts"
    assert read_roster(path) == []  # none yet: nothing to say
    host = HostInfo("h", 7, "1", "node", [Endpoint("tcp", "127.0.0.1", 4000)])
    write_roster(path, [host])
    assert [h.to_json() for h in read_roster(path)] == [host.to_json()]
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING, logger="statetier.spark.roster"):
        assert read_roster(path) == []
    assert "is not this user's alone" in caplog.text and path in caplog.text
    os.chmod(path, 0o600)
    Path(path).write_text('{"not": "a list of hosts"}')
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="statetier.spark.roster"):
        assert read_roster(path) == []
    assert "is not a roster" in caplog.text


def test_hosts_that_never_answer_cost_one_timeout_in_all() -> None:
    """A roster's host may accept a connection and never answer (a hung process, a port reused
    by something else): the new coordinator still waits at most the invitation's timeout in
    all, however many such hosts and endpoints the roster names."""
    silent = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]
    try:
        hosts = [
            HostInfo(
                host_id=f"silent-{i}",
                pid=1,
                executor=str(i),
                node="localhost",
                endpoints=[Endpoint("tcp", "127.0.0.1", s.getsockname()[1])] * 2,
            )
            for i, s in enumerate(silent)
        ]
        registry = HostRegistry(SECRET, "127.0.0.1")
        try:
            started = time.monotonic()
            assert invite(hosts, registry.endpoint, SECRET, timeout=1.0) == []
            assert time.monotonic() - started < 1.5
        finally:
            registry.close()
    finally:
        for s in silent:
            s.close()
