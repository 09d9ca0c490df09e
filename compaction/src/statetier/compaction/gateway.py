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
needs no address the gateway can reach: pods behind any network setup work. Every API call but
the probes and metrics needs ``Authorization: Bearer <token>`` when a token is configured.
Requests whose paths are outside the allowed prefixes are refused with 403 and the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from statetier.backend.snapshot.compaction import CompactionRequest, CompactionResult
from statetier.compaction.metrics import GatewayMetrics
from statetier.compaction.paths import PathPolicy, RefusedPathError
from statetier.compaction.scheduler import (
    Job,
    LeaseLostError,
    Scheduler,
    SchedulerSettings,
    UnknownWorkerError,
)

__all__ = ["Gateway", "GatewaySettings"]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_OPEN_PATHS = ("/healthz", "/readyz", "/metrics", "/v1/stats")  # counts only, no job data
_JOB_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class GatewaySettings:
    def __init__(
        self,
        allowed_prefixes: tuple[str, ...],
        token: str = "",
        scheduler: SchedulerSettings | None = None,
        heartbeat_interval: float = 2.0,
        max_poll_wait: float = 20.0,
        target_queue_per_worker: int = 4,
    ) -> None:
        self.target_queue_per_worker = target_queue_per_worker
        self.allowed_prefixes = allowed_prefixes
        self.token = token
        self.scheduler = scheduler or SchedulerSettings()
        self.heartbeat_interval = heartbeat_interval
        self.max_poll_wait = max_poll_wait


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"error": kind, "message": message}, status=status)


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

    # ------------------------------------------------------------------ app

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=16 << 20)
        app.add_routes(
            [
                web.get("/healthz", self.healthz),
                web.get("/readyz", self.readyz),
                web.get("/metrics", self.metrics_endpoint),
                web.get("/v1/stats", self.stats),
                web.post("/v1/jobs", self.submit),
                web.get("/v1/jobs", self.list_jobs),
                web.get("/v1/jobs/{job_id}", self.status),
                web.delete("/v1/jobs/{job_id}", self.abort),
                web.post("/v1/workers/{worker_id}/register", self.register),
                web.post("/v1/workers/{worker_id}/poll", self.poll),
                web.post("/v1/workers/{worker_id}/heartbeat", self.heartbeat),
                web.post("/v1/workers/{worker_id}/jobs/{job_id}/done", self.done),
                web.delete("/v1/workers/{worker_id}", self.leave),
            ]
        )
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

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
        token = self.settings.token
        if token and request.path not in _OPEN_PATHS:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                self.metrics.refused.labels("token").inc()
                return _error(401, "unauthorized", "missing or wrong bearer token")
        return await handler(request)

    # ------------------------------------------------------------------ events

    def _on_event(self, event: str, job: Job) -> None:
        m = self.metrics
        if event == "submitted":
            m.submitted.inc()
        elif event == "lease_lost":
            m.leases_lost.inc()
        elif event in ("succeeded", "failed", "aborted"):
            m.finished.labels(event).inc()
            if job.finished_at is not None:
                m.duration.labels(event).observe(job.finished_at - job.submitted_at)
            if event == "succeeded" and job.result is not None:
                m.input_bytes.inc(job.bytes_total)
                m.output_bytes.inc(sum(o.size for o in job.result.outputs))
            log.info("job %s %s (%s)", job.job_id, event, job.error or "ok")
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
        stats = self.scheduler.stats()
        load = stats["queued"] + stats["running"]
        target = max(1, self.settings.target_queue_per_worker)
        stats["target_queue_per_worker"] = target
        stats["suggested_workers"] = -(-load // target)
        return web.json_response(stats)

    # ------------------------------------------------------------------ client API

    async def submit(self, request: web.Request) -> web.Response:
        try:
            body = await request.read()
            job_request = CompactionRequest.from_json(body)
            if not job_request.job_id or not set(job_request.job_id) <= _JOB_ID_CHARS:
                raise ValueError("job_id must be 1..128 of [A-Za-z0-9._-]")
            if len(job_request.job_id) > 128 or not job_request.inputs:
                raise ValueError("job_id too long, or no inputs")
        except (ValueError, TypeError, KeyError) as exc:
            self.metrics.refused.labels("invalid").inc()
            return _error(400, "invalid", f"not a compaction request: {exc}")
        try:
            self.policy.check_request(job_request)
        except RefusedPathError as exc:
            self.metrics.refused.labels("path").inc()
            return _error(403, "refused", str(exc))
        try:
            job, created = self.scheduler.submit(job_request)
        except ValueError as exc:
            return _error(409, "conflict", str(exc))
        self._schedule()
        return web.json_response(job.view(), status=202 if created else 200)

    async def list_jobs(self, request: web.Request) -> web.Response:
        state = request.query.get("state")
        jobs = [j.view() for j in self.scheduler.jobs.values() if state is None or j.state == state]
        return web.json_response({"jobs": jobs})

    def _job(self, request: web.Request) -> Job | None:
        return self.scheduler.jobs.get(request.match_info["job_id"])

    async def status(self, request: web.Request) -> web.Response:
        """A job's status; ``?wait=S`` holds the answer until the job finishes or S seconds
        pass, so a waiting client learns of the result at once, with one call instead of many
        polls."""
        job = self._job(request)
        if job is None:
            return _error(404, "not_found", f"no job {request.match_info['job_id']}")
        try:
            wait = min(float(request.query.get("wait", "0")), self.settings.max_poll_wait)
        except ValueError:
            return _error(400, "invalid", "wait must be a number of seconds")
        await self._until_finished(job, wait)
        return web.json_response(job.view())

    async def _until_finished(self, job: Job, wait: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not job.state.terminal and (left := deadline - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._finished.wait(), left)

    async def abort(self, request: web.Request) -> web.Response:
        job = self._job(request)
        if job is None:
            return _error(404, "not_found", f"no job {request.match_info['job_id']}")
        self.scheduler.abort(job.job_id)
        self._schedule()
        return web.json_response(job.view())

    # ------------------------------------------------------------------ worker API

    async def register(self, request: web.Request) -> web.Response:
        body = await _json(request)
        worker_id = request.match_info["worker_id"]
        self.scheduler.register(worker_id, int(body.get("slots", 1)))
        self._wakeups.setdefault(worker_id, asyncio.Event())
        log.info("worker %s joined (%s slots)", worker_id, body.get("slots", 1))
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
        wait = min(float(request.query.get("wait", "10")), self.settings.max_poll_wait)
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
        return web.json_response(
            {
                "jobs": [
                    {
                        "job_id": j.job_id,
                        "attempt": j.attempt,
                        "request": json.loads(j.request.to_json()),
                    }
                    for j in jobs
                ]
            }
        )

    async def heartbeat(self, request: web.Request) -> web.Response:
        body = await _json(request)
        worker_id = request.match_info["worker_id"]
        progress = {str(k): int(v) for k, v in dict(body.get("progress") or {}).items()}
        try:
            drop = self.scheduler.heartbeat(worker_id, progress)
        except UnknownWorkerError:
            return _error(404, "unknown_worker", f"worker {worker_id} must register")
        return web.json_response({"drop": drop})

    async def done(self, request: web.Request) -> web.Response:
        body = await _json(request)
        worker_id, job_id = request.match_info["worker_id"], request.match_info["job_id"]
        result = None
        error, error_kind = body.get("error"), str(body.get("error_kind") or "service")
        if body.get("result") is not None:
            result = CompactionResult.from_json(json.dumps(body["result"]))
            try:  # a worker must not name files outside the prefixes either
                for output in result.outputs:
                    self.policy.check_url(output.url, "output")
            except RefusedPathError as exc:
                result, error, error_kind = None, str(exc), "request"
        try:
            job = self.scheduler.complete(
                worker_id, job_id, int(body.get("attempt", 0)), result, error, error_kind
            )
        except LeaseLostError as exc:
            return _error(409, "lease_lost", str(exc))
        self._schedule()
        return web.json_response(job.view())

    async def leave(self, request: web.Request) -> web.Response:
        worker_id = request.match_info["worker_id"]
        self.scheduler.leave(worker_id)
        self._wakeups.pop(worker_id, None)
        log.info("worker %s left", worker_id)
        self._schedule()
        return web.json_response({"ok": True})


async def _json(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    body = await request.json()
    return dict(body) if isinstance(body, dict) else {}


async def serve(gateway: Gateway, host: str, port: int) -> None:
    """Run until cancelled; prints the URL once listening (tests and the CLI read it)."""
    runner = web.AppRunner(gateway.app())
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server: Any = site._server
    sockets = server.sockets if server is not None else []
    bound = sockets[0].getsockname()[1] if sockets else port
    print(f"http://{host}:{bound}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
