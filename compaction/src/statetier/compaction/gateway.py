"""The compaction gateway: the HTTP/JSON API in front of the scheduler.

Clients (the backend's remote compactor)::

    POST   /v1/jobs                 CompactionRequest JSON -> 202 {"job_id", "state"}
    GET    /v1/jobs                 list (?state=queued|running|...)
    GET    /v1/jobs/{id}?wait=S     status: state, progress, attempt, result when succeeded;
                                    with wait, answers once the job has finished (or after S)
    DELETE /v1/jobs/{id}            abort
    GET    /v1/stats                queue depth, running, workers (what the autoscaler reads)

Workers::

    POST   /v1/workers/{id}/register        {"slots"} -> lease and heartbeat timing
    POST   /v1/workers/{id}/poll?wait=S     long poll: jobs assigned to this worker
    POST   /v1/workers/{id}/heartbeat       {"progress": {job: bytes}} -> {"drop": [...]}
    POST   /v1/workers/{id}/jobs/{job}/done {"attempt", "result"} or {"error", "error_kind"}
    DELETE /v1/workers/{id}                 clean leave: its jobs go to others at once

Plus ``/healthz`` (the process answers), ``/readyz`` (at least one worker is alive, so a
submitted job can run) and ``/metrics``. Workers pull their jobs by long polling, so a worker
needs no address the gateway can reach: pods behind any network setup work.

Security: every API call but the probes, metrics and stats needs ``Authorization: Bearer
<token>``. A gateway started without a token refuses those calls (401, saying how to set one),
because whoever registers as a worker receives jobs and their storage paths; only
``insecure=True`` (``--insecure-no-token``, for a sandbox) serves them without one. Paths outside
the allowed prefixes are refused with 403 and the reason; every malformed body or parameter
with 400 naming the field (see :mod:`statetier.compaction.validation`); a full queue with 429.

Bounds: the request body size, the time to send the headers of a first request and the body of
any, idle keep-alive connections, poll waits, the jobs and input bytes queued per tenant and in
all (see :class:`GatewaySettings` and docs/compaction.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from statetier.backend.config import parse_size
from statetier.backend.options import option
from statetier.backend.snapshot.compaction import CompactionResult
from statetier.compaction.metrics import GatewayMetrics
from statetier.compaction.paths import PathPolicy, RefusedPathError
from statetier.compaction.scheduler import (
    ErrorKind,
    Job,
    JobEvent,
    JobState,
    LeaseLostError,
    QueueFullError,
    Scheduler,
    SchedulerSettings,
    UnknownWorkerError,
)
from statetier.compaction.validation import (
    Assignment,
    InvalidRequestError,
    Limits,
    check_id,
    parse_done,
    parse_heartbeat,
    parse_job,
    parse_json,
    parse_slots,
    parse_wait,
)

__all__ = ["Gateway", "GatewaySettings"]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
NO_TOKEN = (
    "this gateway has no token: set STATETIER_COMPACTION_TOKEN (or --token-file) on the "
    "gateway, its workers and clients, or start it with --insecure-no-token in a sandbox"
)


def bearer_credentials(header: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, else "". The scheme is
    case-insensitive (RFC 7235: ``bearer`` and ``BEARER`` are ``Bearer``), and spaces around
    the token are not part of it; clients differ in both."""
    scheme, _, credentials = header.strip().partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else ""


@dataclasses.dataclass(frozen=True)
class GatewaySettings:
    """Everything a gateway is started with; every bound has a default (docs/compaction.md).

    The fields declared with :func:`option` are flags of ``statetier-compaction gateway``,
    their defaults and help taken from here."""

    allowed_prefixes: tuple[str, ...]
    token: str = ""
    insecure: bool = option(
        False,
        "serve the API without a token (a sandbox only: anyone reaching the port can "
        "register as a worker and receive jobs)",
        flag="--insecure-no-token",
    )
    scheduler: SchedulerSettings = dataclasses.field(default_factory=SchedulerSettings)
    limits: Limits = dataclasses.field(default_factory=Limits)
    host: str = option("0.0.0.0", "address to listen on")
    port: int = option(8080, "0 picks a free port (printed)")
    heartbeat_interval: float = option(2.0, "seconds between a worker's heartbeats")
    max_body_bytes: int = option(1 << 20, "bytes of a request's body", parse=parse_size)
    header_timeout: float = option(
        10.0, "seconds a new connection may take to send a request's headers"
    )
    body_timeout: float = option(10.0, "seconds a request may take to send its whole body")
    max_poll_wait: float = option(20.0, "seconds a poll may wait for a job or a result")
    keepalive_timeout: float = 30.0  # an idle kept-alive connection is closed after it

    def __post_init__(self) -> None:
        for name in (
            "heartbeat_interval",
            "max_poll_wait",
            "header_timeout",
            "body_timeout",
            "keepalive_timeout",
        ):
            if not 0 < getattr(self, name) <= 3600:
                raise ValueError(f"{name.replace('_', '-')} must be in (0, 3600] seconds")
        if not 1 << 10 <= self.max_body_bytes <= 1 << 30:
            raise ValueError("max-body-bytes must be between 1 KiB and 1 GiB")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is not between 0 and 65535")
        if self.token and self.insecure:
            raise ValueError("a token and --insecure-no-token contradict each other")


def _error(status: int, kind: str, message: str, field: str | None = None) -> web.Response:
    body = {"error": kind, "message": message}
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status)


class Gateway:
    """One gateway process's state and routes (build with :meth:`app`)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.policy = PathPolicy(settings.allowed_prefixes)
        self.metrics = GatewayMetrics()
        self.scheduler = Scheduler(settings.scheduler, on_event=self._on_event)
        self._wakeups: dict[str, asyncio.Event] = {}
        self._finished = asyncio.Event()  # set (and replaced) whenever a job finishes
        self._expiry: asyncio.Task[None] | None = None
        self.started: weakref.WeakSet[Any] = weakref.WeakSet()  # transports past their headers
        self._open_paths = frozenset(route.path for route in self._open_routes())

    # ------------------------------------------------------------------ app

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._auth, self._invalid],
            client_max_size=self.settings.max_body_bytes,
        )
        app.add_routes(self._open_routes() + self._job_routes() + self._worker_routes())
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    def _open_routes(self) -> list[web.RouteDef]:
        """Probes, Prometheus and the counts: served without the token (no job data)."""
        return [
            web.get("/healthz", self.healthz),
            web.get("/readyz", self.readyz),
            web.get("/metrics", self.metrics_endpoint),
            web.get("/v1/stats", self.stats),
        ]

    def _job_routes(self) -> list[web.RouteDef]:
        """What a client (a Spark driver, an operator) does with its compaction jobs."""
        return [
            web.post("/v1/jobs", self.submit),
            web.get("/v1/jobs", self.list_jobs),
            web.get("/v1/jobs/{job_id}", self.status),
            web.delete("/v1/jobs/{job_id}", self.abort),
        ]

    def _worker_routes(self) -> list[web.RouteDef]:
        """A worker's life: joining, asking for work, staying alive, reporting, leaving."""
        return [
            web.post("/v1/workers/{worker_id}/register", self.register),
            web.post("/v1/workers/{worker_id}/poll", self.poll),
            web.post("/v1/workers/{worker_id}/heartbeat", self.heartbeat),
            web.post("/v1/workers/{worker_id}/jobs/{job_id}/done", self.done),
            web.delete("/v1/workers/{worker_id}", self.leave),
        ]

    async def _start(self, _: web.Application) -> None:
        self._expiry = asyncio.create_task(self._expire_loop())

    async def _stop(self, _: web.Application) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry

    async def _expire_loop(self) -> None:
        period = max(0.05, min(1.0, self.settings.scheduler.lease_ttl / 4))
        while True:
            await asyncio.sleep(period)
            for what in self.scheduler.expire():
                log.warning("%s", what)
            self._schedule()

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.transport is not None:
            self.started.add(request.transport)
        if request.path in self._open_paths or self.settings.insecure:
            return await handler(request)
        token = self.settings.token
        if not token:
            self.metrics.refused.labels("token").inc()
            return _error(401, "unauthorized", NO_TOKEN)
        given = bearer_credentials(request.headers.get("Authorization", ""))
        if not hmac.compare_digest(given.encode(), token.encode()):
            self.metrics.refused.labels("token").inc()
            return _error(401, "unauthorized", "missing or wrong bearer token")
        return await handler(request)

    @web.middleware
    async def _invalid(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A malformed body or parameter is the caller's fault: 400 naming the field."""
        try:
            return await handler(request)
        except InvalidRequestError as exc:
            self.metrics.refused.labels("invalid").inc()
            return _error(400, "invalid", str(exc), exc.field)

    async def _body(self, request: web.Request) -> Any:
        """The parsed JSON body, read within ``body_timeout``: a client that announces a
        body and never sends it does not hold the connection (408)."""
        if not request.can_read_body:
            return {}
        try:
            raw = await asyncio.wait_for(request.read(), self.settings.body_timeout)
        except TimeoutError:
            raise web.HTTPRequestTimeout(
                text=json.dumps(
                    {
                        "error": "timeout",
                        "message": f"body not received within {self.settings.body_timeout:g}s",
                    }
                ),
                content_type="application/json",
            ) from None
        return parse_json(raw)

    # ------------------------------------------------------------------ events

    def _on_event(self, event: JobEvent, job: Job) -> None:
        m = self.metrics
        if event is JobEvent.SUBMITTED:
            m.submitted.inc()
        elif event is JobEvent.LEASE_LOST:
            m.leases_lost.inc()
        elif event in (JobEvent.SUCCEEDED, JobEvent.FAILED, JobEvent.ABORTED):
            m.finished.labels(event.value).inc()
            status = job.status
            m.tenant_finished.labels(status.tenant, event.value).inc()
            if status.finished_at is not None:
                m.duration.labels(event.value).observe(status.finished_at - status.submitted_at)
            if event is JobEvent.SUCCEEDED and status.result is not None:
                m.input_bytes.inc(status.bytes_total)
                m.output_bytes.inc(sum(o.size for o in status.result.outputs))
            log.info("job %s %s (%s)", job.job_id, event.value, status.error or "ok")
            self._finished.set()
            self._finished = asyncio.Event()

    def _schedule(self) -> None:
        for worker_id, _job in self.scheduler.schedule():
            self._wake(worker_id)

    def _wake(self, worker_id: str) -> None:
        event = self._wakeups.get(worker_id)
        if event is not None:
            event.set()

    # ------------------------------------------------------------------ probes and metrics

    async def healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(self, _: web.Request) -> web.Response:
        alive = len(self.scheduler.workers)
        return web.json_response(
            {"ready": alive > 0, "workers": alive}, status=200 if alive else 503
        )

    async def metrics_endpoint(self, _: web.Request) -> web.Response:
        m, s = self.metrics, self.scheduler
        m.queue_depth.set(s.queued())
        m.running.set(s.running())
        m.workers_alive.set(len(s.workers))
        return web.Response(body=m.render(), content_type="text/plain", charset="utf-8")

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response(self.scheduler.stats())

    # ------------------------------------------------------------------ client API

    async def submit(self, request: web.Request) -> web.Response:
        job_request = parse_job(await self._body(request), self.settings.limits)
        try:
            self.policy.check_request(job_request)
        except RefusedPathError as exc:
            self.metrics.refused.labels("path").inc()
            return _error(403, "refused", str(exc))
        try:
            job, created = self.scheduler.submit(job_request)
        except QueueFullError as exc:
            self.metrics.refused.labels("queue_full").inc()
            return _error(429, "queue_full", str(exc))
        except ValueError as exc:
            return _error(409, "conflict", str(exc))
        self._schedule()
        return web.json_response(job.status.encode(), status=202 if created else 200)

    async def list_jobs(self, request: web.Request) -> web.Response:
        wanted = request.query.get("state")
        if wanted is not None and wanted not in {s.value for s in JobState}:
            raise InvalidRequestError(
                "state", f"must be one of {', '.join(s.value for s in JobState)}"
            )
        state = JobState(wanted) if wanted is not None else None
        jobs = [
            j.status.encode()
            for j in self.scheduler.jobs.values()
            if state is None or j.status.state is state
        ]
        return web.json_response({"jobs": jobs})

    def _job(self, request: web.Request) -> Job | None:
        return self.scheduler.jobs.get(request.match_info["job_id"])

    async def status(self, request: web.Request) -> web.Response:
        """A job's status; ``?wait=S`` holds the answer until the job finishes or S seconds
        pass, so a waiting client learns of the result at once, with one call instead of many
        polls."""
        wait = parse_wait(request.query.get("wait"), 0.0, self.settings.max_poll_wait)
        job = self._job(request)
        if job is None:
            return _error(404, "not_found", f"no job {request.match_info['job_id']}")
        await self._until_finished(job, wait)
        return web.json_response(job.status.encode())

    async def _until_finished(self, job: Job, wait: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not job.status.state.terminal and (left := deadline - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._finished.wait(), left)

    async def abort(self, request: web.Request) -> web.Response:
        job = self._job(request)
        if job is None:
            return _error(404, "not_found", f"no job {request.match_info['job_id']}")
        self.scheduler.abort(job.job_id)
        self._schedule()
        return web.json_response(job.status.encode())

    # ------------------------------------------------------------------ worker API

    async def register(self, request: web.Request) -> web.Response:
        slots = parse_slots(await self._body(request), self.settings.limits)
        worker_id = check_id(request.match_info["worker_id"], "worker_id")
        self.scheduler.register(worker_id, slots)
        self._wakeups.setdefault(worker_id, asyncio.Event())
        log.info("worker %s joined (%s slots)", worker_id, slots)
        self._schedule()
        return web.json_response(
            {
                "lease_ttl": self.settings.scheduler.lease_ttl,
                "heartbeat_interval": self.settings.heartbeat_interval,
                "allowed_prefixes": list(self.settings.allowed_prefixes),
            }
        )

    async def poll(self, request: web.Request) -> web.Response:
        worker_id = request.match_info["worker_id"]
        wait = parse_wait(request.query.get("wait"), 10.0, self.settings.max_poll_wait)
        await self._body(request)  # read (and bound) whatever was sent; a poll needs nothing
        event = self._wakeups.setdefault(worker_id, asyncio.Event())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            try:
                jobs = self.scheduler.take_assigned(worker_id)
            except UnknownWorkerError:
                return _error(404, "unknown_worker", f"worker {worker_id} must register")
            if jobs or loop.time() >= deadline:
                break
            event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), deadline - loop.time())
        assignments = [
            Assignment(j.job_id, j.status.attempt, json.loads(j.request.to_json())) for j in jobs
        ]
        return web.json_response({"jobs": [a.encode() for a in assignments]})

    async def heartbeat(self, request: web.Request) -> web.Response:
        progress = parse_heartbeat(await self._body(request), self.settings.limits)
        worker_id = request.match_info["worker_id"]
        try:
            drop = self.scheduler.heartbeat(worker_id, progress)
        except UnknownWorkerError:
            return _error(404, "unknown_worker", f"worker {worker_id} must register")
        return web.json_response({"drop": drop})

    async def done(self, request: web.Request) -> web.Response:
        answer = parse_done(await self._body(request))
        worker_id, job_id = request.match_info["worker_id"], request.match_info["job_id"]
        result: CompactionResult | None = answer.result
        error, error_kind = answer.error, answer.error_kind
        if result is not None:
            try:  # a worker must not name files outside the prefixes either
                for output in result.outputs:
                    self.policy.check_url(output.url, "output")
            except RefusedPathError as exc:
                result, error, error_kind = None, str(exc), ErrorKind.REQUEST
        try:
            job = self.scheduler.complete(
                worker_id, job_id, answer.attempt, result, error, error_kind
            )
        except LeaseLostError as exc:
            return _error(409, "lease_lost", str(exc))
        self._schedule()
        return web.json_response(job.status.encode())

    async def leave(self, request: web.Request) -> web.Response:
        worker_id = request.match_info["worker_id"]
        self.scheduler.leave(worker_id)
        self._wakeups.pop(worker_id, None)
        log.info("worker %s left", worker_id)
        self._schedule()
        return web.json_response({"ok": True})


def _header_deadline(gateway: Gateway, factory: Callable[[], Any]) -> Callable[[], Any]:
    """A protocol factory that closes a connection whose first request's headers did not
    arrive within ``header_timeout`` (aiohttp has no such limit: a client that connects and
    sends nothing, or half a header, would hold the connection for good)."""
    loop = asyncio.get_running_loop()

    def check(protocol: Any) -> None:
        transport = protocol.transport
        if transport is not None and transport not in gateway.started:
            log.info("closing a connection that sent no request headers in time")
            transport.close()

    def make() -> Any:
        protocol = factory()
        loop.call_later(gateway.settings.header_timeout, check, protocol)
        return protocol

    return make


async def serve(gateway: Gateway, host: str, port: int) -> None:
    """Run until cancelled; prints the URL once listening (tests and the CLI read it)."""
    if not gateway.settings.token and not gateway.settings.insecure:
        log.warning("%s; until then every API call is refused", NO_TOKEN)
    runner = web.AppRunner(gateway.app(), keepalive_timeout=gateway.settings.keepalive_timeout)
    await runner.setup()
    assert runner.server is not None
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_header_deadline(gateway, runner.server), host, port)
    bound = server.sockets[0].getsockname()[1] if server.sockets else port
    print(f"http://{host}:{bound}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        server.close()
        await runner.cleanup()
