"""The driver's host registry: which state host owns which key-group range, and who is alive.

Spark runs a task on whatever executor has a free core, so a range's task lands on a different
executor from one micro-batch to the next. State stays warm anyway because ownership is the
driver's decision, not Spark's placement: every state host registers here when it starts
(its endpoints, pid, executor) and keeps one connection open with a heartbeat; every task asks
here which host owns its range (:meth:`HostRegistry.route`) and streams its records to that host;
every task of a gathered epoch reports here which ranges it delivered (see deliveries).

Ownership is sticky. A range is assigned once, to the asking task's own host while that host owns
fewer than its share (``ceil(parallelism / hosts)``, hosts being the live ones or, while some have
not joined yet, executors x hosts per executor), else to the least loaded host of the task's
executor below its share, else to the least loaded live host, and it stays there until:

- its host is gone: its registry connection closed (the process died: noticed at once) or
  went ``host.liveness-timeout`` without a heartbeat (a hung or cut-off host);
- a task could not reach its host and the registry cannot either (probed on the spot);
- the pipeline runs at another parallelism (other ranges altogether).

A moved range is restored by its new host from the last committed epoch; its old host, if still
alive, is told to release it. Nothing uncommitted ever moves.

Hosts that join late (a new executor) get ranges by rebalancing (:meth:`HostRegistry.rebalance`,
see rebalancing): at an epoch boundary the driver moves a few ranges from the most loaded live
hosts to them. The old owner of such a range is alive, so the new owner asks for it here
(``previous``) and takes its committed state from it directly (see host's hand-off); the old
owner drops the range once it handed it over, or when it is told to release it at the next
boundary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from statetier.backend.spark.channel import Endpoint, Server, connect, hang_up, new_secret
from statetier.backend.spark.deliveries import Deliveries, DeliveryReport
from statetier.backend.spark.protocol import RESULT
from statetier.backend.spark.rebalancing import Move, plan_moves
from statetier.backend.wire import LOCAL, Fields, MessageError, decode_fields, encode_fields

__all__ = [
    "HostInfo",
    "HostOrder",
    "HostRegistry",
    "OrderKind",
    "RangeKey",
    "RouteError",
    "RouteRequest",
    "ask_previous_owner",
    "ask_route",
    "registry_for",
]

log = logging.getLogger("statetier.spark.registry")

RangeKey = tuple[str, int, int]  # (pipeline, parallelism, index)
PROBE_TIMEOUT_S = 2.0
JOIN_WAIT_S = 2.0  # how long a new assignment waits for executors whose hosts have not joined
MAX_WRITTEN = 4096  # results held for the driver: a bound, far above ranges per epoch


class RouteError(RuntimeError):
    """A range's owner is alive but out of a task's reach: the task fails and Spark retries."""


@dataclasses.dataclass
class HostInfo:
    """A registered state host, as the registry sees it."""

    host_id: str
    pid: int
    executor: str
    node: str
    endpoints: list[Endpoint]
    # the registry's view, not sent
    alive: bool = dataclasses.field(default=True, metadata=LOCAL)
    last_seen: float = dataclasses.field(default_factory=time.monotonic, metadata=LOCAL)
    rss: int = dataclasses.field(default=0, metadata=LOCAL)  # anonymous resident bytes (heartbeat)
    # its keyed state's bytes on heap (estimated) and spilled (heartbeat)
    state_heap: int = dataclasses.field(default=0, metadata=LOCAL)
    state_spilled: int = dataclasses.field(default=0, metadata=LOCAL)
    link: Connection | None = dataclasses.field(default=None, repr=False, metadata=LOCAL)

    def tcp(self) -> Endpoint | None:
        return next((e for e in self.endpoints if e.kind == "tcp"), None)

    def to_json(self) -> dict[str, Any]:
        return encode_fields(self, endpoints=lambda endpoints: [e.to_json() for e in endpoints])

    @classmethod
    def from_json(cls, data: Any) -> HostInfo:
        return decode_fields(cls, Fields("statetier host info", data), endpoints=_endpoints)


def _endpoints(fields: Fields) -> list[Endpoint]:
    endpoints = []
    for i, item in enumerate(fields.items("endpoints")):
        try:
            endpoints.append(Endpoint.from_json(item))
        except (ValueError, TypeError) as e:
            fields.fail(f"endpoints[{i}]", "[kind, address, port]", f"{item!r} ({e})")
    return endpoints


class OrderKind(enum.Enum):
    SHUTDOWN = "shutdown"  # the application is done with its state hosts
    RELEASE = "release"  # drop these ranges: their pipeline ended
    RECEIVED = "received"  # the driver holds the result the host told it (at URL ``file``)


@dataclasses.dataclass(frozen=True)
class HostOrder:
    """An order the registry sends a host on its registration's connection."""

    kind: OrderKind
    ranges: tuple[RangeKey, ...] = ()  # of a release
    file: str = ""  # of a receipt: the URL the host told

    def encode(self) -> bytes:
        data: dict[str, Any] = {"op": self.kind.value}
        if self.kind is OrderKind.RELEASE:
            data["ranges"] = [list(key) for key in self.ranges]
        if self.kind is OrderKind.RECEIVED:
            data["file"] = self.file
        return json.dumps(data).encode()

    @classmethod
    def decode(cls, raw: bytes) -> HostOrder:
        fields = Fields.parse("statetier host order", raw)
        kind = fields.choice("op", OrderKind)
        ranges = []
        for i, item in enumerate(fields.items("ranges", [])):
            if not _range_key(item):
                fields.fail(f"ranges[{i}]", "[pipeline, parallelism, index]", item)
            ranges.append((item[0], item[1], item[2]))
        file = fields.text("file") if kind is OrderKind.RECEIVED else ""
        return cls(kind, tuple(ranges), file)


@dataclasses.dataclass(frozen=True)
class RouteRequest:
    """A task's question to the registry: which host owns range ``key``."""

    key: RangeKey
    local_host: str | None  # the asking task's own host (preferred for a new assignment)
    unreachable: str | None = None  # the owner the task could not reach

    def encode(self) -> bytes:
        pipeline, parallelism, index = self.key
        return json.dumps(
            {
                "op": "route",
                "pipeline": pipeline,
                "parallelism": parallelism,
                "index": index,
                "local_host": self.local_host,
                "unreachable": self.unreachable,
            }
        ).encode()

    @classmethod
    def decode(cls, fields: Fields) -> RouteRequest:
        key = (fields.text("pipeline"), fields.integer("parallelism"), fields.integer("index"))
        return cls(key, fields.maybe_text("local_host"), fields.maybe_text("unreachable"))


@dataclasses.dataclass
class _Loss:
    """A host that was lost with ranges, until the first of them is routed again."""

    host: HostInfo
    why: str
    ranges: int
    told: bool = False


def _range_key(item: Any) -> bool:
    return (
        isinstance(item, list)
        and len(item) == 3
        and isinstance(item[0], str)
        and all(type(v) is int for v in item[1:])
    )


class HostRegistry:
    """Registrations, liveness and range ownership of one Spark application's state hosts."""

    def __init__(
        self, secret: bytes, bind: str, port: int = 0, liveness_timeout: float = 10.0
    ) -> None:
        self.secret = secret
        self.liveness_timeout = liveness_timeout
        self.hosts: dict[str, HostInfo] = {}
        self.owners: dict[RangeKey, str] = {}
        self.moves = 0  # ranges that changed owner (a host lost or unreachable)
        self.executors = 0  # executors the application has (the driver updates it each epoch)
        self.hosts_per_executor = 1  # state hosts each executor runs (see slots)
        self.join_wait = JOIN_WAIT_S
        self.written: dict[str, bytes] = {}  # results and error files the hosts told
        self.deliveries = Deliveries()  # which gathered ranges' outputs tasks delivered
        self._only_here: set[str] = set()  # of those, results no file holds (acknowledged)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._send_lock = threading.Lock()  # orders to a host come from several threads
        self.closed = False
        self.stopping = False  # hosts are told to stop: their ends are no news
        self._losses: dict[RangeKey, _Loss] = {}  # released ranges not routed again yet
        self.rebalanced = 0  # ranges moved to spread the ranges over hosts that joined
        self.previous: dict[RangeKey, str] = {}  # moved by rebalancing: range -> old owner
        # told the live hosts whenever one registers or is lost while the registry runs (a
        # Connect driver's coordinators keep them in their roster, see host_roster)
        self.on_hosts: Callable[[list[HostInfo]], None] | None = None
        # last: a connection is served from the moment it listens
        self._server = Server(secret, self._connection, "statetier-registry")
        self.endpoint = self._server.bind_tcp(bind, port)

    # ------------------------------------------------------------------ connections

    def _connection(self, conn: Connection) -> None:
        try:
            request = Fields.parse("statetier registry request", conn.recv_bytes(1 << 20))
            op = request.text("op")
            if op == "register":
                self._host_link(conn, HostInfo.from_json(request.mapping("host")))
                return
            if op == "previous":
                conn.send_bytes(self._previous_answer(request))
                return
            if op == "delivered":
                refusal = self.deliveries.report(DeliveryReport.decode(request))
                conn.send_bytes(json.dumps({"refused": refusal}).encode())
                return
            if op != "route":
                raise MessageError(f"unknown request {op!r}")
            route = RouteRequest.decode(request)
        except MessageError as e:
            conn.send_bytes(json.dumps({"error": str(e)}).encode())
            return
        try:
            host = self.route(route.key, route.local_host, route.unreachable)
            answer: dict[str, Any] = {"host": host.to_json()}
        except RouteError as e:
            answer = {"error": str(e)}
        conn.send_bytes(json.dumps(answer).encode())

    def _previous_answer(self, request: Fields) -> bytes:
        """The answer to a new owner's ``previous`` request (see :meth:`previous_owner`)."""
        key = (request.text("pipeline"), request.integer("parallelism"), request.integer("index"))
        previous = self.previous_owner(key, request.text("asker"))
        return json.dumps({"host": previous.to_json() if previous is not None else None}).encode()

    def _host_link(self, conn: Connection, host: HostInfo) -> None:
        """A host's registration: kept open, a heartbeat a second; its end is the host's end."""
        host.link = conn
        with self._lock:
            old = self.hosts.get(host.host_id)
            if old is not None and old.link is not None:
                hang_up(old.link)
            self.hosts[host.host_id] = host
            self._changed.notify_all()
        log.info(
            "state host %s registered (executor %s, pid %s)", host.host_id, host.executor, host.pid
        )
        conn.send_bytes(b'{"registered": true}')
        self._hosts_changed()
        why = "its connection closed"
        try:
            while True:
                if not conn.poll(self.liveness_timeout):
                    why = f"no heartbeat for {self.liveness_timeout:.0f}s"
                    break
                beat = json.loads(conn.recv_bytes(1 << 20))
                host.last_seen = time.monotonic()
                if "written" in beat:
                    path, receipt = str(beat["written"]), bool(beat.get("receipt"))
                    held = self._written(path, str(beat.get("body", "")).encode(), receipt)
                    if held and receipt:  # the host writes no file once it has this
                        self._send(conn, HostOrder(OrderKind.RECEIVED, file=path))
                else:
                    host.rss = int(beat.get("rss", 0))
                    host.state_heap = int(beat.get("state_heap", 0))
                    host.state_spilled = int(beat.get("state_spilled", 0))
        except (EOFError, OSError, ValueError):
            pass
        self._lost(host, why)

    def _written(self, path: str, body: bytes, receipt: bool = False) -> bool:
        """Hold what a host told for the driver; whether it is held. At the bound the oldest
        result a file also holds goes; one only this registry holds (``receipt``: the host
        wrote no file) never does, and when every result held is such a one, the new one is
        not held (the host gets no receipt and writes the file)."""
        with self._lock:
            if path not in self.written and len(self.written) >= MAX_WRITTEN:
                spare = next((p for p in self.written if p not in self._only_here), None)
                if spare is None:
                    return False
                del self.written[spare]
            self.written[path] = body
            if receipt:
                self._only_here.add(path)
            else:
                self._only_here.discard(path)
            self._changed.notify_all()
            return True

    def take_written(self, paths: tuple[str, ...], timeout: float) -> tuple[str, bytes] | None:
        """The first of ``paths`` a host said it wrote, with its bytes, waiting at most
        ``timeout`` seconds; None if none was (yet)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for path in paths:
                    if path in self.written:
                        self._only_here.discard(path)
                        return path, self.written.pop(path)
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    return None
                self._changed.wait(left)

    def discard_written(self, prefix: str) -> None:
        """Forget the files under ``prefix`` no one took (an epoch's results after its
        commit: those of attempts that lost)."""
        with self._lock:
            for path in [p for p in self.written if p.startswith(prefix)]:
                del self.written[path]
                self._only_here.discard(path)

    def _lost(self, host: HostInfo, why: str) -> None:
        """``host`` is gone: its ranges have no owner until a task routes them again. The loss
        is told then (:meth:`_report_loss`), with the range's new owner: a host that ends with
        its application (``spark.stop()``, the script's end) moves nothing and is no news."""
        with self._lock:
            if not host.alive:
                return
            host.alive = False
            released = [key for key, owner in self.owners.items() if owner == host.host_id]
            loss = _Loss(host, why, len(released))
            for key in released:
                del self.owners[key]
                self._losses[key] = loss
            self.moves += len(released)
            self._changed.notify_all()
        if host.link is not None:
            hang_up(host.link)
        if not self.stopping and not self.closed:  # hosts that leave with it stay on a roster
            self._hosts_changed()

    def _hosts_changed(self) -> None:
        """Tell :attr:`on_hosts` the live hosts; its failure is logged, never the host's."""
        if self.on_hosts is not None:
            try:
                self.on_hosts(self.live_hosts())
            except Exception:
                log.exception("the registry's hosts could not be told")

    def _report_loss(self, key: RangeKey, new_owner: HostInfo) -> None:
        """Warn once per lost host, when the first of its ranges gets a new owner."""
        with self._lock:
            loss = self._losses.pop(key, None)
            if loss is None or loss.told:
                return
            loss.told = True
        if not self.stopping:
            log.warning(
                "state host %s (executor %s) is gone: %s; its %d ranges get new owners "
                "(range %s -> state host %s)",
                loss.host.host_id,
                loss.host.executor,
                loss.why,
                loss.ranges,
                key[2],
                new_owner.host_id,
            )

    # ------------------------------------------------------------------ ownership

    def route(self, key: RangeKey, local_host: str | None, unreachable: str | None) -> HostInfo:
        """The host that owns range ``key``, assigned now if it has no live owner.

        ``local_host`` is the asking task's own host (preferred for a new assignment);
        ``unreachable`` a host the task could not connect to, which the registry then probes.
        """
        if unreachable is not None:
            self._check_reachable(key, unreachable)
        with self._lock:
            owner = self.owners.get(key)
            if owner is not None and self.hosts[owner].alive:
                return self.hosts[owner]
            chosen = self._choose(key, local_host)
            self.owners[key] = chosen.host_id
        self._report_loss(key, chosen)
        log.info("range %s of pipeline %s -> state host %s", key[2], key[0], chosen.host_id)
        return chosen

    def _check_reachable(self, key: RangeKey, host_id: str) -> None:
        with self._lock:
            host = self.hosts.get(host_id)
            if host is None or not host.alive or self.owners.get(key) != host_id:
                return  # already gone or moved: route afresh
            tcp = host.tcp()
        if tcp is None:
            self._lost(host, "it registered no TCP endpoint")
            return
        try:
            with contextlib.closing(connect(tcp, self.secret, PROBE_TIMEOUT_S)) as conn:
                conn.send_bytes(b'{"op": "ping"}')
                answer = conn.recv_bytes()
            if not answer.startswith(RESULT):  # a host that stops refuses the probe
                raise OSError(bytes(answer[1:]).decode(errors="replace"))
        except (OSError, EOFError) as e:
            self._lost(host, f"unreachable from a task and from the driver ({e})")
            return
        raise RouteError(
            f"range {key[2]}: its state host {host_id} at {tcp} answers the driver but not this "
            "task's executor (check the NetworkPolicy between executors)"
        )

    def _choose(self, key: RangeKey, local_host: str | None) -> HostInfo:
        """A new owner for ``key`` (lock held): the asking task's host while it owns fewer than
        its share, else a host of the task's executor below its share, else the least loaded
        live host. While fewer hosts are registered than the application's executors run
        (the first micro-batch starts them), wait a moment for the others rather than pile
        every range on the first."""
        deadline = time.monotonic() + self.join_wait
        while True:
            live = [h for h in self.hosts.values() if h.alive]
            expected = max(len(live), self.expected_hosts())
            share = math.ceil(key[1] / expected) if expected else key[1]
            loads = {h.host_id: 0 for h in live}
            for (pipeline, parallelism, _), owner in self.owners.items():
                if (pipeline, parallelism) == key[:2] and owner in loads:
                    loads[owner] += 1
            beside = self._beside(live, local_host, loads, share)
            if beside is not None:
                return beside
            left = deadline - time.monotonic()
            if live and (len(live) >= expected or left <= 0):
                return min(
                    live, key=lambda h: (loads[h.host_id], h.host_id != local_host, h.host_id)
                )
            if left <= 0:
                raise RouteError("no live state host is registered")
            self._changed.wait(left)

    def expected_hosts(self) -> int:
        """The state hosts the application's executors run when all have started theirs."""
        return self.executors * max(1, self.hosts_per_executor)

    def _beside(
        self, live: list[HostInfo], local_host: str | None, loads: dict[str, int], share: int
    ) -> HostInfo | None:
        """The asking task's own host while it owns fewer than ``share`` ranges, else the least
        loaded host of its executor below its share, else None."""
        local = self.hosts.get(local_host) if local_host is not None else None
        if local is None or not local.alive:
            return None
        if loads[local.host_id] < share:
            return local
        siblings = [
            h
            for h in live
            if (h.executor, h.node) == (local.executor, local.node) and loads[h.host_id] < share
        ]
        return min(siblings, key=lambda h: (loads[h.host_id], h.host_id), default=None)

    def rebalance(self, pipeline: str, parallelism: int, limit: int) -> list[Move]:
        """Move up to ``limit`` of the pipeline's ranges toward an even spread over the live
        hosts (see rebalancing), at an epoch boundary (no task of the pipeline runs). The new
        owners take the moved ranges' state from the old ones (:meth:`previous_owner`); the
        ranges moved at the boundary before are released on their old owners now (a hand-off
        that did not happen restored from tier 2 instead)."""
        with self._lock:
            releases = self._take_previous(pipeline)
            live = [h.host_id for h in self.hosts.values() if h.alive]
            owners = {
                key[2]: owner
                for key, owner in self.owners.items()
                if key[:2] == (pipeline, parallelism)
            }
            moves = plan_moves(owners, live, limit)
            for move in moves:
                key = (pipeline, parallelism, move.index)
                self.owners[key] = move.target
                self.previous[key] = move.source
            self.rebalanced += len(moves)
        for link, keys in releases:
            self._send(link, HostOrder(OrderKind.RELEASE, keys))
        for move in moves:
            log.info(
                "range %s of pipeline %s moves from state host %s to %s (rebalancing)",
                move.index,
                pipeline,
                move.source,
                move.target,
            )
        return moves

    def _take_previous(self, pipeline: str) -> list[tuple[Connection, tuple[RangeKey, ...]]]:
        """(lock held) Forget the old owners of the pipeline's ranges moved at the last
        boundary; the release orders for those alive that may still hold them (no hand-off)."""
        by_host: dict[str, list[RangeKey]] = {}
        for key in [k for k in self.previous if k[0] == pipeline]:
            host = self.previous.pop(key)
            if self.owners.get(key) != host:
                by_host.setdefault(host, []).append(key)
        releases = []
        for host_id, keys in by_host.items():
            old = self.hosts.get(host_id)
            if old is not None and old.alive and old.link is not None:
                releases.append((old.link, tuple(keys)))
        return releases

    def previous_owner(self, key: RangeKey, asker: str) -> HostInfo | None:
        """The live old owner of ``key`` when rebalancing moved it to ``asker``; None when
        there is none to take its state from (the new owner restores it from tier 2)."""
        with self._lock:
            previous = self.previous.get(key)
            if previous is None or self.owners.get(key) != asker:
                return None
            host = self.hosts.get(previous)
            return host if host is not None and host.alive else None

    def owner(self, key: RangeKey) -> HostInfo | None:
        """The live owner of ``key``, None when it has none (its host is gone)."""
        with self._lock:
            owner = self.owners.get(key)
            host = self.hosts.get(owner) if owner is not None else None
            return host if host is not None and host.alive else None

    def live_hosts(self) -> list[HostInfo]:
        with self._lock:
            return [h for h in self.hosts.values() if h.alive]

    # ------------------------------------------------------------------ stopping

    def release_pipeline(self, pipeline: str) -> int:
        """Tell the hosts to drop every range of ``pipeline`` (its query ended); how many.
        The old owners of ranges that rebalancing moved at the last boundary are told too:
        without a hand-off they still hold them, and no next boundary would release them.
        The pipeline's losses are forgotten: a later run of it is not told of a host that
        was lost in this one."""
        with self._lock:
            releases = self._take_previous(pipeline)
            for lost in [key for key in self._losses if key[0] == pipeline]:
                del self._losses[lost]
            keys = [key for key in self.owners if key[0] == pipeline]
            by_host: dict[str, list[RangeKey]] = {}
            for key in keys:
                by_host.setdefault(self.owners.pop(key), []).append(key)
            links = {h: self.hosts[h].link for h in by_host if self.hosts[h].alive}
        for host_id, link in links.items():
            if link is not None:
                self._send(link, HostOrder(OrderKind.RELEASE, tuple(by_host[host_id])))
        for link, moved in releases:
            self._send(link, HostOrder(OrderKind.RELEASE, moved))
        return len(keys)

    def _send(self, link: Connection, order: HostOrder) -> None:
        """Send ``order`` on a host's link; a link that broke is the host's end, which its
        reading thread reports."""
        with self._send_lock, contextlib.suppress(OSError):
            link.send_bytes(order.encode())

    def shutdown_hosts(self, timeout: float = 10.0) -> list[HostInfo]:
        """Ask every live host to stop, and wait until their connections closed."""
        self.stopping = True
        hosts = self.live_hosts()
        for host in hosts:
            if host.link is not None:
                self._send(host.link, HostOrder(OrderKind.SHUTDOWN))
        deadline = time.monotonic() + timeout
        with self._lock:
            while any(h.alive for h in hosts) and time.monotonic() < deadline:
                self._changed.wait(max(0.0, deadline - time.monotonic()))
        return hosts

    def close(self) -> None:
        self.closed = self.stopping = True
        self._server.close()
        for host in self.live_hosts():
            if host.link is not None:
                hang_up(host.link)


# --------------------------------------------------------------------------- one per application

_SECRETS: dict[str, bytes] = {}
_REGISTRIES: dict[str, HostRegistry] = {}
_GUARD = threading.Lock()


def registry_for(
    app_id: str,
    bind: str,
    port: int,
    liveness_timeout: float,
    make_secret: Callable[[], bytes] = new_secret,
) -> HostRegistry:
    """The application's registry in this driver, started on first use.

    Its secret is made once per application (by ``make_secret``: a new one, or the one this
    process shares with others, see driver_secret) and kept for the driver's life: the
    application's hosts hold it, so a registry started again (after
    :meth:`HostRegistry.close`) must use it too.
    """
    with _GUARD:
        registry = _REGISTRIES.get(app_id)
        if registry is None or registry.closed:
            if app_id not in _SECRETS:
                _SECRETS[app_id] = make_secret()
            secret = _SECRETS[app_id]
            registry = _REGISTRIES[app_id] = HostRegistry(secret, bind, port, liveness_timeout)
        return registry


def ask_previous_owner(
    registry: Endpoint, secret: bytes, key: RangeKey, asker: str
) -> HostInfo | None:
    """A new owner's question to the driver: the live old owner of a range rebalancing moved
    to it (None: none, restore it from tier 2)."""
    pipeline, parallelism, index = key
    request = {"op": "previous", "pipeline": pipeline, "parallelism": parallelism}
    request.update(index=index, asker=asker)
    with contextlib.closing(connect(registry, secret)) as conn:
        conn.send_bytes(json.dumps(request).encode())
        answer = Fields.parse("the registry's previous owner", conn.recv_bytes())
    host = answer.data.get("host")
    return HostInfo.from_json(host) if host is not None else None


def ask_route(
    registry: Endpoint,
    secret: bytes,
    key: RangeKey,
    local_host: str | None,
    unreachable: str | None = None,
) -> HostInfo:
    """A task's question to the driver: which host owns its range (RouteError: none it can use)."""
    with contextlib.closing(connect(registry, secret)) as conn:
        conn.send_bytes(RouteRequest(key, local_host, unreachable).encode())
        answer = Fields.parse("the registry's route", conn.recv_bytes())
    if "error" in answer.data:
        raise RouteError(f"the driver's host registry at {registry}: {answer.text('error')}")
    return HostInfo.from_json(answer.mapping("host"))
