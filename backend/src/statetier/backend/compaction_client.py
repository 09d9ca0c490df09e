"""The backend's side of remote compaction: a :class:`Compactor` that asks a gateway.

Checkpoints call ``compact(request)`` and get a result back, whoever did the merge. This one
submits the request to a compaction gateway (``compaction.endpoints``, a comma-separated list;
endpoints can be added and removed while running), asks for the job's status at least every
``compaction.poll-interval`` (the gateway holds each call until the job finishes, up to that
interval) and returns the outputs of the succeeded job. Asking again and again is what lets a
waiting client notice quickly that a gateway died or forgot the job (it resubmits elsewhere)
instead of waiting out the whole timeout.

Failures, as in the ForSt design: a gateway that cannot be reached, a job that failed on the
service side (workers lost, storage errors) or a deadline that passed is retried on the next
endpoint up to ``compaction.retries`` times, all within ``compaction.timeout``; then
``compaction.failure-strategy`` applies: ``fallback`` compacts locally (same merge code),
``fail`` raises. A request the service refuses (any 4xx but 408, 409 and 429: paths outside its
allowed prefixes, a malformed field, a bad token, a job too big; or corrupt inputs) raises at
once: that is a bug or an attack, not an outage, retrying it elsewhere cannot help and running
it locally would hide it. A full queue (429) is an outage: the next endpoint is tried. Only
outputs of a succeeded job under the request's own output prefix are returned, so nothing a
stray worker wrote can end up in a manifest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Container, Iterable
from typing import Any

from statetier.backend.config import StatetierConfig, parse_endpoint
from statetier.backend.http_json import call_json
from statetier.backend.snapshot.compaction import (
    CompactionError,
    CompactionRequest,
    CompactionResult,
    Compactor,
    LocalCompactor,
)
from statetier.backend.snapshot.compaction_jobs import ErrorKind, JobState, JobStatus
from statetier.backend.snapshot.process_compactor import ProcessCompactor
from statetier.backend.snapshot.store import SnapshotStore
from statetier.backend.wire import MessageError

__all__ = [
    "RemoteCompactor",
    "RemoteRefusedError",
    "ServiceError",
    "compactor_for",
    "refused",
]

log = logging.getLogger(__name__)

FINAL = frozenset(s.value for s in JobState if s.terminal)  # job states that end the wait
RETRIED_4XX = frozenset({408, 409, 429})  # timeout, conflicting job id, queue full


def refused(status: int) -> bool:
    """Whether an answer says the request itself is wrong (never retried)."""
    return 400 <= status < 500 and status not in RETRIED_4XX


class ServiceError(RuntimeError):
    """The service could not do the job now (unreachable, lost it, failed it): retry."""


class RemoteRefusedError(CompactionError):
    """The service refused the request or found its inputs bad: never retried."""


def _message(body: Any) -> str:
    return str(body.get("message") or body.get("error")) if isinstance(body, dict) else str(body)


def _job(what: str, status: int, body: Any, ok: Container[int] = (200,)) -> JobStatus:
    """The gateway's answer to ``what`` (submit, status) as a job status. A status other than
    ``ok``, or a body that is no job status, is an outage of that gateway (the next endpoint is
    tried), not a refusal of the request."""
    if status not in ok:
        raise ServiceError(f"{what} answered {status}: {_message(body)}")
    try:
        return JobStatus.decode(body)
    except MessageError as exc:
        raise ServiceError(f"the gateway's answer is no job status: {exc}") from None


@dataclasses.dataclass(eq=False)
class RemoteCompactor:
    """Compacts through the gateways in ``urls`` (see :meth:`add_endpoints`); see the module
    docstring."""

    urls: dataclasses.InitVar[Iterable[str]]
    _: dataclasses.KW_ONLY
    timeout: float = 300.0
    retries: int = 2
    poll_interval: float = 0.5
    http_timeout: float = 5.0
    token: str = dataclasses.field(default="", repr=False)
    failure_strategy: str = "fallback"
    fallback: Compactor = dataclasses.field(default_factory=LocalCompactor)
    remote_jobs: int = dataclasses.field(default=0, init=False)
    fallbacks: int = dataclasses.field(default=0, init=False)

    def __post_init__(self, urls: Iterable[str]) -> None:
        if self.failure_strategy not in ("fallback", "fail"):
            raise ValueError("failure_strategy must be fallback or fail")
        self._endpoints: list[str] = []
        self._lock = threading.Lock()
        self._turn = 0
        self.add_endpoints(*urls)

    # ------------------------------------------------------------------ endpoints

    @property
    def endpoints(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._endpoints)

    def add_endpoints(self, *urls: str) -> None:
        """Start sending to ``urls`` too (comma-separated text is split); each must be an
        http(s)://host[:port] URL, as ``compaction.endpoints`` requires (ValueError)."""
        checked = [u.rstrip("/") for text in urls for u in parse_endpoint(text)]
        with self._lock:
            for url in checked:
                if url not in self._endpoints:
                    self._endpoints.append(url)

    def remove_endpoints(self, *urls: str) -> None:
        """Stop sending new jobs to ``urls``; jobs already there are still waited for."""
        with self._lock:
            gone = {u.strip().rstrip("/") for text in urls for u in text.split(",")}
            self._endpoints = [u for u in self._endpoints if u not in gone]

    def _next_endpoint(self) -> str | None:
        with self._lock:
            if not self._endpoints:
                return None
            url = self._endpoints[self._turn % len(self._endpoints)]
            self._turn += 1
            return url

    # ------------------------------------------------------------------ compaction

    def compact(self, request: CompactionRequest) -> CompactionResult:
        deadline = time.monotonic() + self.timeout
        problems: list[str] = []
        for attempt in range(self.retries + 1):
            if time.monotonic() >= deadline:
                problems.append("timed out")
                break
            endpoint = self._next_endpoint()
            if endpoint is None:
                problems.append("no endpoint configured")
                break
            job_id = request.job_id if attempt == 0 else f"{request.job_id}.r{attempt}"
            try:
                result = self._run(endpoint, dataclasses.replace(request, job_id=job_id), deadline)
            except ServiceError as exc:
                problems.append(f"{endpoint}: {exc}")
                log.warning("remote compaction %s on %s failed: %s", job_id, endpoint, exc)
                continue
            self.remote_jobs += 1
            return CompactionResult(request.job_id, result.outputs, result.entries)
        summary = "; ".join(problems)
        if self.failure_strategy == "fail":
            raise CompactionError(f"remote compaction of {request.job_id} failed: {summary}")
        log.warning("compacting %s locally: remote compaction failed: %s", request.job_id, summary)
        self.fallbacks += 1
        return self.fallback.compact(request)

    def _call(
        self, method: str, url: str, body: Any = None, timeout: float | None = None
    ) -> tuple[int, Any]:
        try:
            return call_json(
                method, url, body, token=self.token, timeout=timeout or self.http_timeout
            )
        except (OSError, TimeoutError) as exc:
            raise ServiceError(f"unreachable: {exc}") from exc

    def _run(self, endpoint: str, request: CompactionRequest, deadline: float) -> CompactionResult:
        status, body = self._call("POST", f"{endpoint}/v1/jobs", json.loads(request.to_json()))
        if refused(status):
            raise RemoteRefusedError(f"{endpoint} refused job {request.job_id}: {_message(body)}")
        job = _job("submit", status, body, ok=(200, 202))
        url = f"{endpoint}/v1/jobs/{request.job_id}"
        unreachable = polls = 0
        while True:
            if job.state is JobState.SUCCEEDED:
                return self._result(request, job)
            if job.state is JobState.FAILED:
                if job.error_kind is ErrorKind.REQUEST:
                    raise RemoteRefusedError(f"job {request.job_id} failed: {job.error}")
                raise ServiceError(f"job failed: {job.error}")
            if job.state is JobState.ABORTED:
                raise ServiceError("job was aborted on the service")
            if time.monotonic() >= deadline:
                with contextlib.suppress(ServiceError):  # free the worker: nobody waits
                    self._call("DELETE", url)
                raise ServiceError(
                    f"no result within {self.timeout:g}s (last state {job.state.value})"
                )
            try:
                status, answer = self._poll(url, deadline, polls)
            except ServiceError:
                unreachable += 1
                if unreachable >= 3:
                    raise
                continue
            finally:
                polls += 1
            if status == 404:
                raise ServiceError("the gateway no longer knows the job (restarted?)")
            unreachable, job = 0, _job("status", status, answer)

    def _poll(self, url: str, deadline: float, polls: int) -> tuple[int, Any]:
        """One status call. The gateway holds it until the job finishes (at most
        ``poll_interval``), so the result arrives at once and waiting costs a call per
        interval; a gateway that answers at once instead (an older one) is asked again on the
        old schedule: quick first polls (small jobs finish in tens of ms), then every
        ``poll_interval``."""
        wait = max(0.0, min(self.poll_interval, deadline - time.monotonic()))
        asked = time.monotonic()
        finished = False
        try:
            status, answer = self._call(
                "GET", f"{url}?wait={wait:.3f}", timeout=self.http_timeout + wait
            )
            finished = status == 200 and isinstance(answer, dict) and answer.get("state") in FINAL
            return status, answer
        finally:
            if not finished:  # a finished job's answer is not held back
                pause = min(wait, 0.02 * (2**polls))
                time.sleep(max(0.0, pause - (time.monotonic() - asked)))

    @staticmethod
    def _result(request: CompactionRequest, job: JobStatus) -> CompactionResult:
        outputs = job.result.outputs if job.result is not None else []
        prefix = request.output_prefix.rstrip("/") + "/"
        if not outputs or any(not o.url.startswith(prefix) for o in outputs):
            raise RemoteRefusedError(
                f"job {request.job_id} reported outputs outside {prefix}: "
                f"{[o.url for o in outputs]}"
            )
        entries = job.result.entries if job.result is not None else 0
        return CompactionResult(request.job_id, outputs, entries)


def compactor_for(
    config: StatetierConfig | None, store: SnapshotStore, *, own_process: bool = False
) -> Compactor:
    """The compactor a checkpointer of ``store`` uses: local (through the store's own
    filesystem) unless ``compaction.endpoints`` names gateways; then remote, falling back to
    local when ``compaction.failure-strategy`` is ``fallback``. ``own_process``: local merges
    run in a child process (for a process whose other Python work must not wait for the GIL,
    such as the Spark driver)."""
    local: Compactor = LocalCompactor(filesystem=store.fs)
    if own_process:
        local = ProcessCompactor(LocalCompactor(filesystem=store.fs))
    endpoints = tuple(config.compaction_endpoints) if config is not None else ()
    if config is None or not endpoints:
        return local
    return RemoteCompactor(
        endpoints,
        timeout=config.compaction_timeout,
        retries=config.compaction_retries,
        poll_interval=config.compaction_poll_interval,
        token=config.compaction_token,
        failure_strategy=config.compaction_failure_strategy,
        fallback=local,
    )
