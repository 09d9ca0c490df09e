"""State hosts per task slot, without Spark: how many an executor runs, which one a task uses,
each one's share of the executor's budget, and how the driver's registry spreads ranges over
several hosts per executor (real registrations over sockets on 127.0.0.1)."""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest
from statetier.backend.config import load_config
from statetier.backend.spark.channel import Endpoint, Server, new_secret
from statetier.backend.spark.membership import RegistryLink
from statetier.backend.spark.protocol import host_file, socket_path
from statetier.backend.spark.registry import HostInfo, HostRegistry, ask_route
from statetier.backend.spark.slots import (
    host_budget,
    host_config,
    hosts_per_executor,
    slot_of,
    task_slots,
)
from statetier.backend.spark.task import endpoint_to

GIB = 1 << 30


@pytest.mark.parametrize(
    ("master", "conf", "slots"),
    [
        ("local", {}, 1),
        ("local[2]", {}, 2),
        ("local[2,4]", {}, 2),  # the second number is task retries, not cores
        ("local[4]", {"spark.task.cpus": "2"}, 2),
        ("local[*]", {}, os.cpu_count() or 1),
        ("local-cluster[1,2,1536]", {}, 2),
        ("local-cluster[3,1,1024]", {"spark.executor.cores": "8"}, 1),  # the master's C wins
        ("k8s://https://api:6443", {"spark.executor.cores": "8"}, 8),
        ("k8s://https://api:6443", {"spark.executor.cores": "8", "spark.task.cpus": "3"}, 2),
        ("spark://m:7077", {}, 1),  # cores unknown: one
        ("yarn", {"spark.executor.cores": "4", "spark.task.cpus": "8"}, 1),
    ],
)
def test_an_executor_has_a_slot_per_core_over_task_cpus(
    master: str, conf: dict[str, str], slots: int
) -> None:
    assert task_slots(master, conf) == slots


def test_the_setting_chooses_the_hosts_and_the_ranges_bound_them() -> None:
    eight = {"spark.executor.cores": "8"}
    assert hosts_per_executor(0, "k8s://x", eight, parallelism=64) == 8  # 0: one per slot
    assert hosts_per_executor(1, "k8s://x", eight, parallelism=64) == 1  # today's one host
    assert hosts_per_executor(3, "k8s://x", eight, parallelism=64) == 3
    assert hosts_per_executor(0, "k8s://x", eight, parallelism=4) == 4  # a host per range at most


def test_tasks_side_by_side_use_different_hosts() -> None:
    assert [slot_of(p, 2) for p in range(6)] == [0, 1, 0, 1, 0, 1]
    assert {slot_of(p, 1) for p in range(6)} == {0}


def test_each_host_holds_its_share_of_the_executors_budget() -> None:
    assert host_budget(4 * GIB, 4) == GIB
    assert host_budget(4 * GIB, 1) == 4 * GIB
    assert host_budget(0, 1) == 0  # one host: the governor resolves it as before
    assert 0 < host_budget(0, 2) < os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    config = load_config({"memory.budget": "3g", "memory.runtime-allowance": "128m"}, env={})
    shared = host_config(config, 3)
    assert shared.memory_budget == GIB
    assert shared.memory_runtime_allowance == 128 << 20  # each process has its own runtime
    assert host_config(config, 1) is config


def test_slot_zero_keeps_the_one_hosts_files_and_other_slots_have_their_own() -> None:
    root = "/tmp/st"  # short: a socket path past the Unix limit is hashed (the last assert)
    assert socket_path("app-1", root) == f"{root}/statetier-host-app-1.sock"
    assert socket_path("app-1", root, slot=1) == f"{root}/statetier-host-app-1-s1.sock"
    names = {
        host_file("app-1", suffix, root, slot) for suffix in (".log", ".lock") for slot in (0, 1)
    }
    assert len(names) == 4
    long = "/tmp/" + "d" * 120
    assert socket_path("app-1", long, slot=0) != socket_path("app-1", long, slot=1)


def _host(host_id: str, executor: str, node: str = "node") -> HostInfo:
    return HostInfo(
        host_id,
        1,
        executor,
        node,
        [Endpoint("tcp", "127.0.0.1", 7000), Endpoint("unix", f"/tmp/{host_id}.sock")],
    )


def test_a_task_reaches_every_host_of_its_executor_over_its_unix_socket() -> None:
    a, b, c = _host("a", "1"), _host("b", "1"), _host("c", "2")
    assert endpoint_to(a, a).kind == "unix"
    assert endpoint_to(b, a).kind == "unix"  # another host of the same executor
    assert endpoint_to(c, a).kind == "tcp"
    assert endpoint_to(_host("d", "1", node="other"), a).kind == "tcp"
    assert endpoint_to(_host("e", ""), _host("f", "")).kind == "tcp"  # executor unknown


class SlotHost:
    """A registered host of an executor: a real server and its registry link."""

    def __init__(self, registry: HostRegistry, host_id: str, executor: str) -> None:
        self.server = Server(registry.secret, self._serve, host_id)
        self.server.bind_tcp("127.0.0.1")
        self.info = HostInfo(host_id, 0, executor, "node", list(self.server.endpoints))
        self.link = RegistryLink(self.info, registry.secret, lambda order, registry: None)
        self.link.join(registry.endpoint)

    def _serve(self, conn: Connection) -> None:
        conn.recv_bytes()
        conn.send_bytes(b"R{}")

    def close(self) -> None:
        self.link.close()
        self.server.close()


@pytest.fixture
def registry() -> Iterator[HostRegistry]:
    made = HostRegistry(new_secret(), "127.0.0.1", liveness_timeout=5.0)
    yield made
    made.close()


@pytest.fixture
def hosts(registry: HostRegistry) -> Iterator[list[SlotHost]]:
    made: list[SlotHost] = []
    yield made
    for host in made:
        host.close()


def route(registry: HostRegistry, index: int, local: str, parallelism: int = 8) -> str:
    key = ("p", parallelism, index)
    return ask_route(registry.endpoint, registry.secret, key, local).host_id


def test_ranges_spread_evenly_over_every_host_of_every_executor(
    registry: HostRegistry, hosts: list[SlotHost]
) -> None:
    """Two executors of two slots: a range goes to the asking task's slot host, and each of
    the four hosts ends with two of the eight ranges, on the executor its tasks ran on."""
    registry.executors, registry.hosts_per_executor = 2, 2
    hosts += [SlotHost(registry, f"{e}{s}", e) for e in "xy" for s in (0, 1)]
    executor_of = {h.info.host_id: h.info.executor for h in hosts}
    # range i's task runs on executor x for i < 4, else y, and uses slot i mod 2
    owners = {i: route(registry, i, f"{'xy'[i // 4]}{slot_of(i, 2)}") for i in range(8)}
    assert collections.Counter(owners.values()) == {"x0": 2, "x1": 2, "y0": 2, "y1": 2}
    assert all(executor_of[owners[i]] == "xy"[i // 4] for i in range(8))
    assert {i: route(registry, i, "y1") for i in range(8)} == owners  # sticky


def test_a_full_host_passes_a_range_to_a_host_of_its_executor_first(
    registry: HostRegistry, hosts: list[SlotHost]
) -> None:
    registry.executors, registry.hosts_per_executor = 2, 2
    # executor x runs hosts m and z, y runs a and b: ids that sort y's first
    hosts += [
        SlotHost(registry, name, executor) for name, executor in zip("mzab", "xxyy", strict=True)
    ]
    # every task asks from x's host m: it takes its share (2), then its sibling z does,
    # although y's hosts have fewer ranges; then the least loaded of all
    owners = [route(registry, i, "m") for i in range(6)]
    assert owners == ["m", "m", "z", "z", "a", "b"]


def test_new_ranges_wait_for_the_other_slot_hosts_of_the_executor(
    registry: HostRegistry, hosts: list[SlotHost]
) -> None:
    """One executor of two slots whose second host joins late (it is starting): the first
    does not take every range meanwhile."""
    registry.executors, registry.hosts_per_executor = 1, 2
    registry.join_wait = 30.0
    hosts.append(SlotHost(registry, "x0", "x"))
    joiner = threading.Timer(0.3, lambda: hosts.append(SlotHost(registry, "x1", "x")))
    joiner.start()
    owners = [route(registry, i, "x0", parallelism=4) for i in range(4)]
    joiner.join()
    assert collections.Counter(owners) == {"x0": 2, "x1": 2}
