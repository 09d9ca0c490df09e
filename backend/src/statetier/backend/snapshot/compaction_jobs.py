"""A compaction job's status as the compaction service reports it, and as its clients read it.

The service (``statetier.compaction``) encodes it in every job answer (``POST /v1/jobs``,
``GET /v1/jobs/{id}``, ``DELETE``), and the backend's remote compactor decodes it while it waits
for a result; both use :class:`JobStatus`, so the two sides cannot drift. The JSON is the
service's documented API (docs/compaction.md): its field names and state names stay as they are,
a decode ignores fields it does not know (a newer service may add some) and defaults those an
older one did not send.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, TypeVar

from statetier.backend.snapshot.compaction import CompactionOutput, CompactionResult
from statetier.backend.wire import Fields, MessageError

__all__ = ["ErrorKind", "JobState", "JobStatus"]

E = TypeVar("E", bound=enum.Enum)


class JobState(str, enum.Enum):
    """Where a job is; the last three are final."""

    QUEUED = "queued"
    RUNNING = "running"  # an attempt holds a worker's lease
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ABORTED = "aborted"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.ABORTED)


class ErrorKind(str, enum.Enum):
    """Why an attempt failed: the request (bad input: retrying cannot help) or the service
    (storage or a worker: the job is tried again, elsewhere)."""

    REQUEST = "request"
    SERVICE = "service"


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """One job as the status API shows it."""

    job_id: str
    state: JobState
    attempt: int = 0  # attempts started so far
    worker: str | None = None
    tenant: str = ""
    bytes_done: int = 0
    bytes_total: int = 0
    submitted_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    error_kind: ErrorKind | None = None
    history: tuple[str, ...] = ()  # states and attempts in words, for people
    result: CompactionResult | None = None  # once succeeded

    def encode(self) -> dict[str, Any]:
        total = self.bytes_total
        body: dict[str, Any] = {
            "job_id": self.job_id,
            "state": self.state.value,
            "attempt": self.attempt,
            "worker": self.worker,
            "tenant": self.tenant,
            "progress": {
                "bytes_done": self.bytes_done,
                "bytes_total": total,
                "fraction": round(self.bytes_done / total, 4) if total else 0.0,
            },
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "error": self.error,
            "error_kind": self.error_kind.value if self.error_kind is not None else None,
            "history": list(self.history),
        }
        if self.result is not None:
            body["result"] = {
                "job_id": self.result.job_id,
                "entries": self.result.entries,
                "outputs": [dataclasses.asdict(o) for o in self.result.outputs],
            }
        return body

    @classmethod
    def decode(cls, data: Any) -> JobStatus:
        fields = Fields("compaction job status", data)
        progress = Fields("compaction job status: field 'progress'", fields.mapping("progress", {}))
        return cls(
            job_id=fields.text("job_id"),
            state=_choice(fields, "state", JobState),
            attempt=fields.integer("attempt", 0),
            worker=fields.maybe_text("worker"),
            tenant=fields.text("tenant", ""),
            bytes_done=progress.integer("bytes_done", 0),
            bytes_total=progress.integer("bytes_total", 0),
            submitted_at=fields.number("submitted_at", 0.0),
            started_at=_maybe_number(fields, "started_at"),
            finished_at=_maybe_number(fields, "finished_at"),
            error=fields.maybe_text("error"),
            error_kind=(
                _choice(fields, "error_kind", ErrorKind)
                if fields.data.get("error_kind") is not None
                else None
            ),
            history=fields.texts("history", ()),
            result=_result(fields) if fields.data.get("result") is not None else None,
        )


def _choice(fields: Fields, name: str, kind: type[E]) -> E:
    value = fields.text(name)
    try:
        return kind(value)
    except ValueError:
        fields.fail(name, "one of " + ", ".join(str(e.value) for e in kind), value)


def _maybe_number(fields: Fields, name: str) -> float | None:
    return None if fields.data.get(name) is None else fields.number(name)


def _result(fields: Fields) -> CompactionResult:
    result = Fields("compaction job status: field 'result'", fields.mapping("result"))
    outputs = []
    for i, item in enumerate(result.items("outputs")):
        output = Fields(f"compaction job status: field 'result.outputs[{i}]'", item)
        outputs.append(
            CompactionOutput(output.text("url"), output.integer("size"), output.integer("crc32"))
        )
    if not outputs:
        raise MessageError("compaction job status: field 'result.outputs' is empty")
    return CompactionResult(result.text("job_id"), outputs, result.integer("entries", 0))
