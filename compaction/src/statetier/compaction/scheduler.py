"""Jobs, workers, leases and the choice of worker: the gateway's state, without any I/O.

A job is ``queued`` until the scheduler gives it to a worker with a free slot; it is then
``running`` under a lease held by that worker for that attempt. The worker renews all its leases
with each heartbeat and reports each job's progress (input bytes read). A lease is lost when the
worker stops heartbeating for ``lease_ttl`` (dead, frozen, partitioned), when the job's progress
has not moved for ``stall_timeout`` (a stuck merge), or when the worker leaves; the job then
goes back to the head of the queue for another worker, up to ``max_attempts`` attempts. A late
answer for a lost lease is refused, so only one attempt's result is ever reported.

Which worker: ``round-robin`` cycles through the workers with a free slot; ``least-loaded``
takes the one with the fewest input bytes left to read over its running jobs (the ForSt
design's "remaining input files", in bytes), ties in round-robin order. Which job: ``fifo`` in
arrival order; ``fair`` round-robins between tenants (the checkpoint location a job writes to),
so one application with many compactions cannot starve the others.

Bounds: a job is refused (:class:`QueueFullError`, the gateway's 429) when the queue holds
``max_queued`` jobs, or its tenant already has ``max_queued_per_tenant`` jobs queued or
``max_tenant_bytes`` input bytes queued or running, so one application cannot fill the
gateway's memory or the workers' time. Finished jobs are kept ``finished_retention`` seconds,
at most ``max_finished`` of them (oldest dropped first), for late status calls.

Time comes from an injected clock, so every rule here is tested deterministically.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import time
from collections.abc import Callable
from typing import Any

from statetier.backend.config import parse_size
from statetier.backend.options import option
from statetier.backend.snapshot.compaction import CompactionRequest, CompactionResult
from statetier.backend.snapshot.compaction_jobs import ErrorKind, JobState, JobStatus
from statetier.backend.snapshot.layout import location_of

__all__ = [
    "ErrorKind",
    "Job",
    "JobEvent",
    "JobState",
    "LeaseLostError",
    "QueueFullError",
    "Scheduler",
    "SchedulerSettings",
    "UnknownWorkerError",
    "tenant_of",
]

JOB_POLICIES = ("fifo", "fair")
WORKER_POLICIES = ("round-robin", "least-loaded")


class JobEvent(enum.Enum):
    """What just happened to a job (the gateway counts them in its metrics)."""

    SUBMITTED = "submitted"
    STARTED = "started"  # an attempt began on a worker
    LEASE_LOST = "lease_lost"  # an attempt ended without a result
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ABORTED = "aborted"


class LeaseLostError(RuntimeError):
    """A worker answered for a job it no longer holds (lease expired, revoked or aborted)."""


class QueueFullError(RuntimeError):
    """The queue, or the tenant's share of it, is full: submit again later or elsewhere."""


class UnknownWorkerError(KeyError):
    """A worker the scheduler does not know (it expired, or the gateway restarted)."""


def tenant_of(request: CompactionRequest) -> str:
    """The checkpoint location a job writes under: the unit of fairness between applications."""
    return location_of(request.output_prefix)


@dataclasses.dataclass(frozen=True)
class SchedulerSettings:
    """How the gateway's scheduler hands out jobs and when it gives up on them; the fields
    declared with :func:`option` are flags of ``statetier-compaction gateway``."""

    worker_policy: str = option("least-loaded", "which worker gets a job", choices=WORKER_POLICIES)
    job_policy: str = option(
        "fair", "which queued job goes next", flag="--scheduling-policy", choices=JOB_POLICIES
    )
    lease_ttl: float = option(10.0, "seconds without heartbeat")
    stall_timeout: float = option(300.0, "seconds without progress")
    max_attempts: int = option(3, "attempts of a job before it fails")
    finished_retention: float = 3600.0
    max_finished: int = 10000
    max_queued: int = option(1000, "queued jobs in all")
    max_queued_per_tenant: int = option(100, "queued jobs of one tenant")
    max_tenant_bytes: int = option(64 << 30, "queued+running input bytes", parse=parse_size)

    def __post_init__(self) -> None:
        for name in ("max_attempts", "max_finished", "max_queued", "max_queued_per_tenant"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be at least 1")
        if self.max_tenant_bytes < 1 << 20:
            raise ValueError("max-tenant-bytes must be at least 1 MiB")
        if not 0 < self.lease_ttl <= 3600 or not 0 < self.stall_timeout <= 86400:
            raise ValueError("lease-ttl must be in (0, 3600] and stall-timeout in (0, 86400]")
        if self.worker_policy not in WORKER_POLICIES:
            raise ValueError(f"worker policy must be one of {', '.join(WORKER_POLICIES)}")
        if self.job_policy not in JOB_POLICIES:
            raise ValueError(f"job policy must be one of {', '.join(JOB_POLICIES)}")


@dataclasses.dataclass
class Job:
    """A job the scheduler holds: its request, its status as the API shows it (replaced at each
    step, never changed in place, so an answer is one consistent status) and when its progress
    last moved (for the stall check)."""

    request: CompactionRequest
    status: JobStatus
    progress_at: float = 0.0

    @property
    def job_id(self) -> str:
        return self.request.job_id

    @property
    def remaining(self) -> int:
        return max(0, self.status.bytes_total - self.status.bytes_done)


@dataclasses.dataclass
class WorkerState:
    worker_id: str
    slots: int
    last_seen: float
    jobs: set[str] = dataclasses.field(default_factory=set)
    assigned: list[str] = dataclasses.field(default_factory=list)  # not yet handed over
    revoked: set[str] = dataclasses.field(default_factory=set)  # to tell at next heartbeat
    order: int = 0


Listener = Callable[[JobEvent, Job], None]


class Scheduler:
    """All jobs and workers of one gateway; every method is quick and never blocks."""

    def __init__(
        self,
        settings: SchedulerSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_event: Listener | None = None,
    ) -> None:
        self.settings = settings or SchedulerSettings()
        self.clock = clock
        self.jobs: dict[str, Job] = {}
        self.workers: dict[str, WorkerState] = {}
        self._queues: dict[str, collections.deque[str]] = {}
        self._tenant_turn: collections.deque[str] = collections.deque()
        self._worker_turn = 0
        self._joined = 0
        self.on_event = on_event or (lambda event, job: None)

    # ------------------------------------------------------------------ jobs

    def submit(self, request: CompactionRequest) -> tuple[Job, bool]:
        """Queue ``request``; the same job id again returns the existing job (retried submit)."""
        existing = self.jobs.get(request.job_id)
        if existing is not None:
            if existing.request != request:
                raise ValueError(f"job {request.job_id} exists with a different request")
            return existing, False
        status = JobStatus(
            request.job_id,
            JobState.QUEUED,
            tenant=tenant_of(request),
            bytes_total=sum(i.size for i in request.inputs),
            submitted_at=self.clock(),
            history=("queued",),
        )
        job = Job(request, status)
        self._check_room(job)
        self.jobs[job.job_id] = job
        self._enqueue(job, front=False)
        self.on_event(JobEvent.SUBMITTED, job)
        return job, True

    def _check_room(self, job: Job) -> None:
        limits, tenant, size = self.settings, job.status.tenant, job.status.bytes_total
        if self.queued() >= limits.max_queued:
            raise QueueFullError(f"the queue holds {limits.max_queued} jobs (max-queued)")
        queue = self._queues.get(tenant) or ()
        if len(queue) >= limits.max_queued_per_tenant:
            raise QueueFullError(
                f"tenant {tenant} has {len(queue)} jobs queued (max-queued-per-tenant)"
            )
        pending = sum(
            j.status.bytes_total
            for j in self.jobs.values()
            if j.status.tenant == tenant and not j.status.state.terminal
        )
        if pending + size > limits.max_tenant_bytes:
            raise QueueFullError(
                f"tenant {tenant} has {pending} input bytes queued or running; this job's "
                f"{size} would pass {limits.max_tenant_bytes} (max-tenant-bytes)"
            )

    def _enqueue(self, job: Job, front: bool) -> None:
        queue = self._queues.get(job.status.tenant)
        if queue is None:
            queue = self._queues[job.status.tenant] = collections.deque()
            self._tenant_turn.append(job.status.tenant)
        if front:
            queue.appendleft(job.job_id)
        else:
            queue.append(job.job_id)

    def _next_queued(self) -> Job | None:
        if self.settings.job_policy == "fifo":
            heads = [self.jobs[q[0]] for q in self._queues.values() if q]
            if not heads:
                return None
            job = min(heads, key=lambda j: (j.status.attempt == 0, j.status.submitted_at))
            self._queues[job.status.tenant].popleft()
            return job
        for _ in range(len(self._tenant_turn)):
            tenant = self._tenant_turn[0]
            self._tenant_turn.rotate(-1)
            queue = self._queues[tenant]
            if queue:
                return self.jobs[queue.popleft()]
        return None

    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def running(self) -> int:
        return sum(len(w.jobs) for w in self.workers.values())

    def abort(self, job_id: str) -> Job:
        """Abort a job: a queued one at once, a running one by revoking its lease."""
        job = self.jobs[job_id]
        if job.status.state.terminal:
            return job
        if job.status.state is JobState.QUEUED:
            self._queues[job.status.tenant].remove(job_id)
        else:
            self._release(job, revoke=True)
        self._finish(job, JobState.ABORTED, error="aborted by request")
        return job

    # ------------------------------------------------------------------ workers

    def register(self, worker_id: str, slots: int) -> WorkerState:
        worker = self.workers.get(worker_id)
        if worker is None:
            self._joined += 1
            worker = WorkerState(worker_id, max(1, slots), self.clock(), order=self._joined)
            self.workers[worker_id] = worker
        worker.slots = max(1, slots)
        worker.last_seen = self.clock()
        return worker

    def leave(self, worker_id: str) -> None:
        """A worker shuts down cleanly: its jobs go to others at once."""
        worker = self.workers.pop(worker_id, None)
        if worker is not None:
            for job_id in list(worker.jobs):
                self._lose(self.jobs[job_id], f"worker {worker_id} left")

    def heartbeat(self, worker_id: str, progress: dict[str, int]) -> list[str]:
        """Renew ``worker_id``'s leases, record progress; return the job ids it must drop."""
        worker = self.workers.get(worker_id)
        if worker is None:
            raise UnknownWorkerError(worker_id)
        now = self.clock()
        worker.last_seen = now
        for job_id, done in progress.items():
            job = self.jobs.get(job_id)
            running = job is not None and job.status.worker == worker_id
            if (
                running
                and job is not None
                and job.status.state is JobState.RUNNING
                and done > job.status.bytes_done
            ):
                job.status = dataclasses.replace(job.status, bytes_done=done)
                job.progress_at = now
        drop = set(worker.revoked)
        drop |= {j for j in progress if j not in worker.jobs}
        worker.revoked.clear()
        return sorted(drop)

    def take_assigned(self, worker_id: str) -> list[Job]:
        """Jobs assigned to ``worker_id`` and not yet handed over (its poll answer)."""
        worker = self.workers.get(worker_id)
        if worker is None:
            raise UnknownWorkerError(worker_id)
        worker.last_seen = self.clock()
        jobs = [self.jobs[j] for j in worker.assigned if j in worker.jobs]
        worker.assigned.clear()
        return jobs

    # ------------------------------------------------------------------ assignment

    def schedule(self) -> list[tuple[str, Job]]:
        """Give queued jobs to workers with free slots; return the (worker, job) pairs."""
        given: list[tuple[str, Job]] = []
        while self.queued():
            worker = self._pick_worker()
            if worker is None:
                break
            job = self._next_queued()
            if job is None:
                break
            now, status = self.clock(), job.status
            attempt = status.attempt + 1
            job.status = dataclasses.replace(
                status,
                state=JobState.RUNNING,
                attempt=attempt,
                worker=worker.worker_id,
                bytes_done=0,
                started_at=status.started_at or now,
                history=(*status.history, f"attempt {attempt} on {worker.worker_id}"),
            )
            job.progress_at = now
            worker.jobs.add(job.job_id)
            worker.assigned.append(job.job_id)
            given.append((worker.worker_id, job))
            self.on_event(JobEvent.STARTED, job)
        return given

    def _pick_worker(self) -> WorkerState | None:
        free = sorted(
            (w for w in self.workers.values() if len(w.jobs) < w.slots), key=lambda w: w.order
        )
        if not free:
            return None
        # round-robin order: the first worker that joined after the last one chosen
        start = next((i for i, w in enumerate(free) if w.order > self._worker_turn), 0)
        ordered = free[start:] + free[:start]
        if self.settings.worker_policy == "least-loaded":
            load = {w.worker_id: sum(self.jobs[j].remaining for j in w.jobs) for w in ordered}
            chosen = min(ordered, key=lambda w: (load[w.worker_id], len(w.jobs)))
        else:
            chosen = ordered[0]
        self._worker_turn = chosen.order
        return chosen

    # ------------------------------------------------------------------ completion

    def complete(
        self,
        worker_id: str,
        job_id: str,
        attempt: int,
        result: CompactionResult | None,
        error: str | None = None,
        error_kind: ErrorKind = ErrorKind.SERVICE,
    ) -> Job:
        """A worker's answer for one attempt; refused with :class:`LeaseLostError` if stale."""
        job = self.jobs.get(job_id)
        if job is None or job.status.worker != worker_id or job.status.attempt != attempt:
            raise LeaseLostError(f"job {job_id} attempt {attempt} is not held by {worker_id}")
        if job.status.state is not JobState.RUNNING:
            raise LeaseLostError(f"job {job_id} is {job.status.state.value}")
        self._release(job, revoke=False)
        if result is not None:
            job.status = dataclasses.replace(
                job.status, result=result, bytes_done=job.status.bytes_total
            )
            self._finish(job, JobState.SUCCEEDED)
        elif error_kind is ErrorKind.REQUEST:
            self._finish(job, JobState.FAILED, error=error, kind=ErrorKind.REQUEST)
        else:
            self._lose(job, f"attempt {attempt} failed: {error}", released=True)
        return job

    def _release(self, job: Job, revoke: bool) -> None:
        worker = self.workers.get(job.status.worker or "")
        if worker is not None:
            worker.jobs.discard(job.job_id)
            if job.job_id in worker.assigned:
                worker.assigned.remove(job.job_id)
            elif revoke:
                worker.revoked.add(job.job_id)

    def _lose(self, job: Job, why: str, released: bool = False) -> None:
        """The running attempt is over without a result: queue the job again, or fail it."""
        if not released:
            self._release(job, revoke=True)
        status = job.status = dataclasses.replace(
            job.status, worker=None, history=(*job.status.history, why)
        )
        self.on_event(JobEvent.LEASE_LOST, job)
        if status.attempt >= self.settings.max_attempts:
            self._finish(
                job, JobState.FAILED, error=f"{why}; gave up after {status.attempt} attempts"
            )
            return
        job.status = dataclasses.replace(status, state=JobState.QUEUED, bytes_done=0)
        self._enqueue(job, front=True)

    def _finish(
        self,
        job: Job,
        state: JobState,
        error: str | None = None,
        kind: ErrorKind = ErrorKind.SERVICE,
    ) -> None:
        status = job.status
        job.status = dataclasses.replace(
            status,
            state=state,
            finished_at=self.clock(),
            worker=status.worker if state is JobState.SUCCEEDED else None,
            error=status.error if error is None else error,
            error_kind=status.error_kind if error is None else kind,
            history=(*status.history, state.value),
        )
        self.on_event(JobEvent(state.value), job)

    # ------------------------------------------------------------------ housekeeping

    def expire(self) -> list[str]:
        """Drop dead workers and revoke stalled jobs' leases; return what happened."""
        now = self.clock()
        happened: list[str] = []
        for worker in list(self.workers.values()):
            if now - worker.last_seen > self.settings.lease_ttl:
                del self.workers[worker.worker_id]
                happened.append(f"worker {worker.worker_id} expired")
                for job_id in list(worker.jobs):
                    worker.jobs.discard(job_id)
                    self._lose(
                        self.jobs[job_id],
                        f"worker {worker.worker_id} missed its heartbeats",
                        released=True,
                    )
                continue
            for job_id in list(worker.jobs):
                job = self.jobs[job_id]
                if now - job.progress_at > self.settings.stall_timeout:
                    happened.append(f"job {job_id} stalled on {worker.worker_id}")
                    self._lose(
                        job,
                        f"no progress on {worker.worker_id} for {self.settings.stall_timeout:g}s",
                    )
        finished = sorted(
            (j.status.finished_at, j.job_id)
            for j in self.jobs.values()
            if j.status.state.terminal and j.status.finished_at is not None
        )
        extra = len(finished) - self.settings.max_finished
        for index, (finished_at, job_id) in enumerate(finished):
            if index < extra or now - finished_at > self.settings.finished_retention:
                del self.jobs[job_id]
        return happened

    def stats(self) -> dict[str, Any]:
        """Numbers the autoscaler and dashboards read."""
        by_state = collections.Counter(j.status.state.value for j in self.jobs.values())
        return {
            "queued": self.queued(),
            "running": self.running(),
            "workers": len(self.workers),
            "slots": sum(w.slots for w in self.workers.values()),
            "jobs": {s.value: by_state.get(s.value, 0) for s in JobState},
            "remaining_bytes": sum(
                j.remaining for j in self.jobs.values() if not j.status.state.terminal
            ),
        }
