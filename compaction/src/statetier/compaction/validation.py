"""The JSON bodies and parameters of the gateway API, parsed strictly and bounded.

Everything a client or worker sends is checked here before the scheduler or a merge sees it:
types (a boolean is not a number), ranges, lengths and unknown fields. A violation raises
:class:`InvalidRequestError` naming the field, which the gateway answers with 400; nothing a
caller sends can reach a code path that fails with a 500. The worker re-checks each job with the
same function: it does not trust the gateway to have done it.

The bounds that protect the service (job size, number of inputs, key groups) are
:class:`Limits`, settings of the gateway with defaults sized for real checkpoints: a chain has a
base and ``compaction.delta-trigger`` deltas, far below the limits.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

from statetier.backend.config import parse_size
from statetier.backend.descriptors import StateKind
from statetier.backend.keygroups import UPPER_BOUND_MAX_PARALLELISM
from statetier.backend.options import option
from statetier.backend.snapshot.compaction import (
    CompactionInput,
    CompactionOutput,
    CompactionRequest,
    CompactionResult,
)
from statetier.backend.snapshot.compaction_jobs import ErrorKind
from statetier.backend.snapshot.format import BASE, DELTA, FORMAT_VERSION
from statetier.backend.ttl import StateVisibility, UpdateType

__all__ = [
    "Assignment",
    "Done",
    "InvalidRequestError",
    "Limits",
    "check_id",
    "parse_assignment",
    "parse_done",
    "parse_heartbeat",
    "parse_job",
    "parse_json",
    "parse_slots",
    "parse_wait",
]

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,127}")
_KEY_GROUPS = re.compile(r"([0-9]{1,5})-([0-9]{1,5})")
_MAX_INT = (1 << 63) - 1
_MAX_TEXT = 4096
_REQUEST_FIELDS = {
    "job_id",
    "state",
    "key_groups",
    "inputs",
    "output_prefix",
    "format_version",
    "max_parallelism",
    "state_kind",
    "ttl",
    "now_ms",
}
_INPUT_FIELDS = {"url", "size", "crc32", "kind", "epoch"}
_TTL_FIELDS = {
    "ttl_ms",
    "update_type",
    "visibility",
    "incremental_cleanup_size",
    "cleanup_per_record",
    "cleanup_full_snapshot",
    "cleanup_in_compaction",
}


class InvalidRequestError(ValueError):
    """A request body or parameter is malformed or out of bounds; the message names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-job bounds (gateway settings; see docs/compaction.md)."""

    max_inputs: int = option(256, "input files per job")
    max_job_bytes: int = option(4 << 30, "input bytes per job", parse=parse_size)
    max_worker_slots: int = option(64, "jobs one worker may take at a time")

    def __post_init__(self) -> None:
        if self.max_inputs < 1 or self.max_worker_slots < 1:
            raise ValueError("max-inputs and max-worker-slots must be at least 1")
        if self.max_job_bytes < 1 << 20:
            raise ValueError("max-job-bytes must be at least 1 MiB")


def parse_json(raw: bytes, field: str = "body") -> Any:
    """JSON text; nesting too deep to parse is as invalid as broken syntax."""
    try:
        return json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError) as exc:
        raise InvalidRequestError(field, f"not valid JSON ({type(exc).__name__})") from None


def _object(value: Any, field: str, allowed: set[str] | None = None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequestError(field, f"must be a JSON object, got {_kind(value)}")
    if allowed is not None:
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise InvalidRequestError(f"{field}.{unknown[0]}", "unknown field")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def _int(value: Any, field: str, low: int = 0, high: int = _MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(field, f"must be an integer, got {_kind(value)}")
    if not low <= value <= high:
        raise InvalidRequestError(field, f"must be between {low} and {high}, got {value}")
    return value


def _text(value: Any, field: str, limit: int = _MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise InvalidRequestError(field, f"must be a string, got {_kind(value)}")
    if not value or len(value) > limit:
        raise InvalidRequestError(field, f"must be 1 to {limit} characters")
    return value


def check_id(value: Any, field: str) -> str:
    """A job or worker id: it becomes part of output names, so a strict alphabet."""
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise InvalidRequestError(
            field, "must be 1 to 128 of [A-Za-z0-9._-], starting with a letter or digit"
        )
    return value


def _input(value: Any, field: str) -> CompactionInput:
    item = _object(value, field, _INPUT_FIELDS)
    for name in _INPUT_FIELDS:
        if name not in item:
            raise InvalidRequestError(f"{field}.{name}", "is required")
    kind = item["kind"]
    if kind not in (BASE, DELTA):
        raise InvalidRequestError(f"{field}.kind", f"must be {BASE} or {DELTA}")
    return CompactionInput(
        url=_text(item["url"], f"{field}.url"),
        size=_int(item["size"], f"{field}.size"),
        crc32=_int(item["crc32"], f"{field}.crc32", 0, 0xFFFFFFFF),
        kind=kind,
        epoch=_int(item["epoch"], f"{field}.epoch"),
    )


def _key_groups(value: Any, max_parallelism: int) -> str:
    text = _text(value, "key_groups", 16)
    match = _KEY_GROUPS.fullmatch(text)
    if not match:
        raise InvalidRequestError("key_groups", f"must be start-end in ASCII digits, got {text!r}")
    start, end = int(match.group(1)), int(match.group(2))
    if not start <= end < max_parallelism:
        raise InvalidRequestError(
            "key_groups",
            f"{text!r} is not a range within the max parallelism {max_parallelism}",
        )
    return f"{start}-{end}"


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequestError(field, f"must be true or false, got {_kind(value)}")
    return value


def _choice(value: Any, field: str, allowed: list[str]) -> str:
    if value not in allowed:
        raise InvalidRequestError(field, f"must be one of {', '.join(allowed)}")
    return str(value)


def _ttl(raw: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None, int | None]:
    """The state's kind, TTL settings and the epoch's clock (all optional: older clients send
    none); a TTL that asks for cleanup in compaction needs the other two."""
    now_ms = raw.get("now_ms")
    if now_ms is not None:
        now_ms = _int(now_ms, "now_ms")
    kind = raw.get("state_kind")
    if kind is not None:
        kind = _choice(kind, "state_kind", [k.value for k in StateKind])
    if raw.get("ttl") is None:
        return kind, None, now_ms
    ttl = _object(raw["ttl"], "ttl", _TTL_FIELDS)
    if "ttl_ms" not in ttl:
        raise InvalidRequestError("ttl.ttl_ms", "is required")
    _int(ttl["ttl_ms"], "ttl.ttl_ms", 1)
    _int(ttl.get("incremental_cleanup_size", 0), "ttl.incremental_cleanup_size")
    _choice(ttl.get("update_type", UpdateType.ON_CREATE_AND_WRITE.value), "ttl.update_type",
            [u.value for u in UpdateType])  # fmt: skip
    _choice(ttl.get("visibility", StateVisibility.NEVER_RETURN_EXPIRED.value), "ttl.visibility",
            [v.value for v in StateVisibility])  # fmt: skip
    for flag in ("cleanup_per_record", "cleanup_full_snapshot", "cleanup_in_compaction"):
        _bool(ttl.get(flag, False), f"ttl.{flag}")
    if ttl.get("cleanup_in_compaction"):
        for name, value in (("now_ms", now_ms), ("state_kind", kind)):
            if value is None:
                raise InvalidRequestError(name, "is required when ttl.cleanup_in_compaction")
    return kind, dict(ttl), now_ms


def parse_job(body: Any, limits: Limits) -> CompactionRequest:
    """A compaction request, every field checked and the whole job bounded by ``limits``."""
    raw = _object(body, "body", _REQUEST_FIELDS)
    for name in ("job_id", "state", "key_groups", "inputs", "output_prefix", "max_parallelism"):
        if name not in raw:
            raise InvalidRequestError(name, "is required")
    max_p = _int(raw["max_parallelism"], "max_parallelism", 1, UPPER_BOUND_MAX_PARALLELISM)
    inputs = raw["inputs"]
    if not isinstance(inputs, list) or not inputs:
        raise InvalidRequestError("inputs", "must be a non-empty array")
    if len(inputs) > limits.max_inputs:
        raise InvalidRequestError("inputs", f"more than {limits.max_inputs} files in one job")
    parsed = [_input(item, f"inputs[{i}]") for i, item in enumerate(inputs)]
    if parsed[0].kind != BASE:
        raise InvalidRequestError("inputs[0].kind", "the first input must be a base")
    total = sum(i.size for i in parsed)
    if total > limits.max_job_bytes:
        raise InvalidRequestError(
            "inputs", f"{total} bytes in one job, more than the limit {limits.max_job_bytes}"
        )
    state_kind, ttl, now_ms = _ttl(raw)
    return CompactionRequest(
        job_id=check_id(raw["job_id"], "job_id"),
        state=_text(raw["state"], "state", 1024),
        key_groups=_key_groups(raw["key_groups"], max_p),
        inputs=parsed,
        output_prefix=_text(raw["output_prefix"], "output_prefix"),
        format_version=_int(
            raw.get("format_version", FORMAT_VERSION), "format_version", 1, FORMAT_VERSION
        ),
        max_parallelism=max_p,
        state_kind=state_kind,
        ttl=ttl,
        now_ms=now_ms,
    )


def parse_slots(body: Any, limits: Limits) -> int:
    raw = _object(body, "body", {"slots"})
    return _int(raw.get("slots", 1), "slots", 1, limits.max_worker_slots)


def parse_heartbeat(body: Any, limits: Limits) -> dict[str, int]:
    raw = _object(body, "body", {"progress"})
    progress = _object(raw.get("progress") or {}, "progress")
    if len(progress) > limits.max_worker_slots:
        raise InvalidRequestError("progress", f"more than {limits.max_worker_slots} jobs")
    return {
        check_id(job, "progress"): _int(done, f"progress.{job}") for job, done in progress.items()
    }


@dataclasses.dataclass(frozen=True)
class Assignment:
    """A job the gateway hands a worker (``POST .../poll``): one attempt of it.

    ``request`` stays the JSON the client sent: the worker parses it itself (it does not trust
    the gateway's check), and reports a bad one as the attempt's failure, named."""

    job_id: str
    attempt: int
    request: Any

    def encode(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt, "request": self.request}


def parse_assignment(body: Any) -> Assignment:
    """An assignment (fields a newer gateway adds are ignored: the worker needs these three)."""
    raw = _object(body, "job")
    return Assignment(
        job_id=check_id(raw.get("job_id"), "job.job_id"),
        attempt=_int(raw.get("attempt"), "job.attempt", 1, 1 << 20),
        request=raw.get("request"),
    )


@dataclasses.dataclass(frozen=True)
class Done:
    """A worker's answer for one attempt: its result, or why it failed."""

    attempt: int
    result: CompactionResult | None
    error: str | None = None
    error_kind: ErrorKind = ErrorKind.SERVICE

    def encode(self) -> dict[str, Any]:
        if self.result is not None:
            return {"attempt": self.attempt, "result": json.loads(self.result.to_json())}
        return {"attempt": self.attempt, "error": self.error, "error_kind": self.error_kind.value}


def _result(value: Any) -> CompactionResult:
    raw = _object(value, "result", {"job_id", "outputs", "entries"})
    outputs = raw.get("outputs")
    if not isinstance(outputs, list) or not outputs or len(outputs) > 16:
        raise InvalidRequestError("result.outputs", "must be an array of 1 to 16 outputs")
    parsed = []
    for i, item in enumerate(outputs):
        field = f"result.outputs[{i}]"
        out = _object(item, field, {"url", "size", "crc32"})
        parsed.append(
            CompactionOutput(
                url=_text(out.get("url"), f"{field}.url"),
                size=_int(out.get("size"), f"{field}.size"),
                crc32=_int(out.get("crc32"), f"{field}.crc32", 0, 0xFFFFFFFF),
            )
        )
    return CompactionResult(
        job_id=check_id(raw.get("job_id"), "result.job_id"),
        outputs=parsed,
        entries=_int(raw.get("entries", 0), "result.entries"),
    )


def parse_done(body: Any) -> Done:
    raw = _object(body, "body", {"attempt", "result", "error", "error_kind"})
    attempt = _int(raw.get("attempt"), "attempt", 1, 1 << 20)
    if raw.get("result") is not None:
        return Done(attempt, _result(raw["result"]))
    error = raw.get("error")
    kind = raw.get("error_kind", ErrorKind.SERVICE.value)
    if kind not in {k.value for k in ErrorKind}:
        raise InvalidRequestError("error_kind", "must be request or service")
    return Done(attempt, None, _text(error, "error", 1 << 16)[:_MAX_TEXT], ErrorKind(kind))


def parse_wait(text: str | None, default: float, cap: float) -> float:
    """``?wait=S``: a finite, non-negative number of seconds, capped at ``cap``."""
    if text is None:
        return min(default, cap)
    try:
        value = float(text)
    except ValueError:
        raise InvalidRequestError(
            "wait", f"must be a number of seconds, got {text[:40]!r}"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise InvalidRequestError("wait", f"must be a finite number >= 0, got {text[:40]!r}")
    return min(value, cap)
