"""A compaction worker: takes jobs from a gateway and runs the backend's merge on them.

The worker registers, long-polls the gateway for jobs while it has a free slot, and runs each in
a thread with :class:`~statetier.backend.snapshot.compaction.LocalCompactor` (the same code as
local compaction), reading and writing through fsspec. A heartbeat thread renews its leases and
reports how many input bytes each job has read; jobs the gateway says to drop (aborted, or
given to another worker) stop at their next read or key group of the merge and write nothing,
so the slot is free again within a heartbeat interval of the abort.

Each job is checked again here before anything is read: its fields (the same validation as the
gateway's) and every URL against the worker's own allowed prefixes. The directories an output on
``file://`` needs are created under the output prefix, which the check placed inside an allowed
prefix; object stores need none.

Outputs go under ``<output prefix>/<job id>-a<attempt>/``: every attempt has its own names, so
an attempt that dies half-way or loses its lease can never overwrite or be mistaken for the
output a succeeded result names; the client names only what a succeeded result reports, and
checkpoint retention deletes the orphans like any file no manifest names.

``--max-read-rate`` caps input bytes per second, to keep a busy worker pool from saturating the
object store the pipelines also use.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
import uuid
from typing import Any, NoReturn

import fsspec
from fsspec.implementations.local import LocalFileSystem
from statetier.backend.http_json import call_json
from statetier.backend.options import option
from statetier.backend.snapshot.compaction import (
    CompactionError,
    LocalCompactor,
)
from statetier.backend.snapshot.compaction_jobs import ErrorKind
from statetier.backend.snapshot.format import CorruptFileError
from statetier.backend.snapshot.layout import attempt_prefix
from statetier.backend.snapshot.store import put_whole, read_whole
from statetier.compaction.paths import PathPolicy, RefusedPathError
from statetier.compaction.validation import (
    Assignment,
    Done,
    InvalidRequestError,
    Limits,
    parse_assignment,
    parse_job,
)

__all__ = ["JobDroppedError", "RegistrationError", "Worker", "WorkerSettings"]

log = logging.getLogger(__name__)

_CHUNK = 4 << 20
# The gateway bounds job sizes; a worker checks the shape of a job, not the gateway's limits.
_SHAPE_ONLY = Limits(max_inputs=1 << 20, max_job_bytes=1 << 62)


class RegistrationError(RuntimeError):
    """The gateway refused to register this worker (a wrong or missing token, bad slots)."""


class JobDroppedError(Exception):
    """The gateway took the job away (aborted, or its lease went to another worker)."""


class _JobFiles:
    """The filesystem a job's LocalCompactor sees: real fsspec filesystems by URL, with input
    bytes counted, the read rate capped and the job's cancellation checked at every step."""

    def __init__(self, root: str, cancelled: threading.Event, max_read_rate: float) -> None:
        self.root = root  # the allowed prefix the output lies under
        self.cancelled = cancelled
        self.max_read_rate = max_read_rate
        self.bytes_read = 0
        self._count = threading.Lock()  # the merge fetches its inputs concurrently
        self._started = time.monotonic()

    @staticmethod
    def _strip_protocol(url: str) -> str:
        return url  # keep whole URLs: each call resolves its own filesystem

    def _add(self, count: int) -> None:
        with self._count:
            self.bytes_read += count

    def check(self) -> None:
        """Raise :class:`JobDroppedError` once the job is cancelled (reads, merge, writes)."""
        if self.cancelled.is_set():
            raise JobDroppedError()

    def _throttle(self) -> None:
        if self.max_read_rate > 0:
            due = self._started + self.bytes_read / self.max_read_rate
            while (now := time.monotonic()) < due:
                self.check()
                time.sleep(min(0.05, due - now))

    def cat_file(self, url: str, start: int | None = None) -> bytes:
        """The whole file at ``url`` (``start`` is what :func:`read_whole` passes: 0)."""
        if start:
            raise ValueError(f"{url}: a job reads its inputs whole, not from byte {start}")
        self.check()
        fs, path = fsspec.core.url_to_fs(url)
        if self.max_read_rate <= 0:
            data = read_whole(fs, path)
            self._add(len(data))
            return data
        parts = []
        with fs.open(path, "rb") as f:
            while chunk := f.read(min(_CHUNK, max(1 << 16, int(self.max_read_rate / 10)))):
                parts.append(chunk)
                self._add(len(chunk))
                self._throttle()
        return b"".join(parts)

    def pipe_file(self, url: str, data: bytes) -> None:
        """Write one output whole. On a local filesystem the directories below the allowed
        prefix are created as needed, never the prefix itself or anything above it: a prefix
        that does not exist on this worker (a volume not mounted) is a service error."""
        self.check()  # an aborted job writes nothing
        fs, path = fsspec.core.url_to_fs(url)
        if isinstance(fs, LocalFileSystem):
            root = fsspec.core.url_to_fs(self.root)[1]
            if not os.path.isdir(root):
                raise NotADirectoryError(
                    f"the allowed prefix {self.root} is not a directory on this worker"
                )
        put_whole(fs, path, data)


@dataclasses.dataclass
class _Running:
    job_id: str
    attempt: int
    files: _JobFiles | None = None
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker is started with. The fields declared with :func:`option` are flags
    of ``statetier-compaction worker``, their defaults and help taken from here."""

    gateway: str = option(dataclasses.MISSING, "URL of the gateway")
    allowed_prefixes: tuple[str, ...] = ()
    token: str = ""
    slots: int = option(1, "jobs run at a time", flag="--concurrency")
    max_read_rate: float = option(0.0, "input bytes/s, 0: no cap")
    worker_id: str | None = option(None, "name of this worker (default: host, pid and a suffix)")
    poll_wait: float = 10.0

    def __post_init__(self) -> None:
        if not self.allowed_prefixes:
            raise ValueError("at least one allowed prefix is required")
        if not 1 <= self.slots <= 1024:
            raise ValueError(f"concurrency {self.slots} is not between 1 and 1024")
        if self.max_read_rate < 0:
            raise ValueError(f"max-read-rate {self.max_read_rate:g} is negative")


class Worker:
    """One worker process's loop; :meth:`run` blocks until :meth:`stop`."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.gateway = settings.gateway.rstrip("/")
        self.policy = PathPolicy(settings.allowed_prefixes)
        self.slots = settings.slots
        self.token = settings.token
        self.max_read_rate = settings.max_read_rate
        self.worker_id = (
            settings.worker_id or f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self.poll_wait = settings.poll_wait
        self.heartbeat_interval = 2.0
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()
        self._free = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(self.slots, "statetier-compaction")
        self.completed = 0

    def _url(self, suffix: str) -> str:
        return f"{self.gateway}/v1/workers/{self.worker_id}{suffix}"

    def _call(self, method: str, suffix: str, body: Any = None, timeout: float = 10.0) -> Any:
        return call_json(method, self._url(suffix), body, token=self.token, timeout=timeout)

    def register(self) -> None:
        status, body = self._call("POST", "/register", {"slots": self.slots})
        if status != 200:
            message = body.get("message") if isinstance(body, dict) else body
            raise RegistrationError(f"registering with {self.gateway} failed ({status}): {message}")
        self.heartbeat_interval = float(body.get("heartbeat_interval", 2.0))
        log.info("worker %s registered with %s", self.worker_id, self.gateway)

    # ------------------------------------------------------------------ loops

    def run(self) -> None:
        """Register, then poll for jobs until stopped (retrying while the gateway is away)."""
        heartbeat = threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True)
        registered = False
        while not self._stop.is_set():
            try:
                if not registered:
                    self.register()
                    registered = True
                    if not heartbeat.is_alive():
                        heartbeat.start()
                with self._free:
                    while len(self._running) >= self.slots and not self._stop.is_set():
                        self._free.wait(0.5)
                if self._stop.is_set():
                    break
                status, body = self._call(
                    "POST", f"/poll?wait={self.poll_wait:g}", {}, timeout=self.poll_wait + 10
                )
                if status == 404:
                    registered = False
                    continue
                for item in (body or {}).get("jobs", []):
                    try:
                        job = parse_assignment(item)
                    except InvalidRequestError as exc:  # a gateway of another version?
                        log.error(
                            "gateway %s sent a job this worker cannot read: %s", self.gateway, exc
                        )
                        continue
                    self._start(job)
            except OSError as exc:
                log.warning("gateway %s unreachable: %s", self.gateway, exc)
                registered = False
                self._stop.wait(1.0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _heartbeats(self) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            with self._lock:
                progress = {
                    r.job_id: r.files.bytes_read if r.files else 0 for r in self._running.values()
                }
            try:
                status, body = self._call("POST", "/heartbeat", {"progress": progress})
            except OSError:
                continue
            drop = set(body.get("drop", [])) if status == 200 else set(progress)
            with self._lock:
                for job_id in drop:
                    if job_id in self._running:
                        log.warning("dropping job %s: the gateway took it back", job_id)
                        self._running[job_id].cancelled.set()

    def stop(self, leave: bool = True) -> None:
        """Stop taking jobs; with ``leave`` tell the gateway, so it hands them on at once."""
        self._stop.set()
        with self._lock:
            for running in self._running.values():
                running.cancelled.set()
            self._free.notify_all()
        if leave:
            self.leave()

    def leave(self) -> None:
        """Tell the gateway this worker leaves (it hands its jobs on at once); takes no lock, so
        a process on its way out can call it whatever its threads hold."""
        with contextlib.suppress(OSError):
            self._call("DELETE", "", timeout=3)

    # ------------------------------------------------------------------ jobs

    def _start(self, job: Assignment) -> None:
        running = _Running(job.job_id, job.attempt)
        with self._lock:
            self._running[running.job_id] = running
        self._pool.submit(self._execute, job.request, running)

    def _execute(self, raw: Any, running: _Running) -> None:
        answer: Done | None
        job_id = running.job_id
        try:
            request = parse_job(raw, _SHAPE_ONLY)
            self.policy.check_request(request)
            prefix = attempt_prefix(request.output_prefix, request.job_id, running.attempt)
            root = self.policy.root_of(request.output_prefix)
            running.files = _JobFiles(root, running.cancelled, self.max_read_rate)
            compactor = LocalCompactor(filesystem=running.files, check=running.files.check)
            started = time.perf_counter()
            result = compactor.compact(dataclasses.replace(request, output_prefix=prefix))
            answer = Done(running.attempt, result)
            log.info(
                "job %s attempt %d: %d bytes in, %d out, %.3f s",
                job_id,
                running.attempt,
                running.files.bytes_read,
                sum(o.size for o in result.outputs),
                time.perf_counter() - started,
            )
        except JobDroppedError:
            answer = None
        except (
            RefusedPathError,
            InvalidRequestError,
            CorruptFileError,
            CompactionError,
            FileNotFoundError,
        ) as exc:
            error = f"{type(exc).__name__}: {exc}"
            answer = Done(running.attempt, None, error, ErrorKind.REQUEST)
        except Exception as exc:  # storage trouble: the gateway retries elsewhere
            log.exception("job %s failed", job_id)
            answer = Done(running.attempt, None, f"{type(exc).__name__}: {exc}", ErrorKind.SERVICE)
        finally:
            with self._free:
                self._running.pop(job_id, None)
                self._free.notify_all()
        if answer is None:
            return
        try:
            status, body = self._call("POST", f"/jobs/{job_id}/done", answer.encode())
        except OSError as exc:
            log.warning("could not report job %s: %s", job_id, exc)
            return
        if status == 409:
            log.warning("result of job %s discarded: %s", job_id, body.get("message"))
        elif status == 200:
            self.completed += 1


def stop_on_signals() -> None:
    """SIGTERM (pod deletion, the parent's death) raises KeyboardInterrupt in the main thread, as
    SIGINT (Ctrl-C) does; the caller then calls :func:`leave_and_exit`.

    The handler does nothing else because it runs in the main thread between two of its steps,
    which may be while that thread holds the worker's lock (its loop waits for a free slot under
    it): a handler that took the lock again deadlocked there, and the worker outlived the
    benchmark that had started it."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def leave_and_exit(worker: Worker, grace: int = 10) -> NoReturn:
    """Leave the gateway so jobs move on at once, then exit without waiting for running merges
    (a worker keeps no state; their outputs stay unnamed).

    Nothing here takes one of the worker's locks: the interrupt may have landed inside a lock's
    ``__enter__`` (a Condition's or an Event's is Python code) after the lock was taken, and
    then nothing releases it. A second signal ends the process at once, and so does an alarm
    after ``grace`` seconds, whatever the leave is stuck on."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM):
        signal.signal(signum, signal.SIG_DFL)
    signal.alarm(grace)
    worker.leave()
    logging.shutdown()
    os._exit(0)
