"""The compaction API's messages: a job's status (the service encodes it, the backend's client
decodes it), a worker's assignment and answer. Each decodes what it encodes, keeps the documented
JSON, and a malformed one fails naming its field."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any

import pytest
from statetier.backend.compaction_client import RemoteCompactor, RemoteRefusedError
from statetier.backend.snapshot.compaction import (
    CompactionError,
    CompactionInput,
    CompactionOutput,
    CompactionRequest,
    CompactionResult,
)
from statetier.backend.snapshot.compaction_jobs import ErrorKind, JobState, JobStatus
from statetier.backend.wire import MessageError
from statetier.compaction.scheduler import JobEvent, Scheduler
from statetier.compaction.validation import (
    Assignment,
    Done,
    InvalidRequestError,
    parse_assignment,
    parse_done,
)

RESULT = CompactionResult("j", [CompactionOutput("s3://b/ckpt/c/j-a1/x", 10, 7)], entries=3)


def over_json(data: Any) -> Any:
    return json.loads(json.dumps(data))


def request() -> CompactionRequest:
    inputs = [CompactionInput("s3://b/ckpt/d/1", 100, 1, "base", 1)]
    return CompactionRequest("j", "s", "0-7", inputs, "s3://b/ckpt/c", 1, 8)


def test_a_job_status_keeps_the_documented_json_and_decodes_what_it_encodes() -> None:
    events: list[JobEvent] = []
    scheduler = Scheduler(clock=lambda: 5.0, on_event=lambda event, job: events.append(event))
    job, _ = scheduler.submit(request())
    scheduler.register("w", 1)
    scheduler.schedule()
    scheduler.complete("w", "j", 1, RESULT)
    assert events == [JobEvent.SUBMITTED, JobEvent.STARTED, JobEvent.SUCCEEDED]
    wire = over_json(job.status.encode())
    assert wire["state"] == "succeeded" and wire["error_kind"] is None
    assert wire["progress"] == {"bytes_done": 100, "bytes_total": 100, "fraction": 1.0}
    assert wire["result"] == {
        "job_id": "j",
        "entries": 3,
        "outputs": [{"url": "s3://b/ckpt/c/j-a1/x", "size": 10, "crc32": 7}],
    }
    assert wire["history"] == ["queued", "attempt 1 on w", "succeeded"]
    assert JobStatus.decode(wire) == job.status


def test_a_failed_jobs_error_kind_crosses_as_its_name() -> None:
    status = JobStatus("j", JobState.FAILED, 1, error="bad", error_kind=ErrorKind.REQUEST)
    wire = over_json(status.encode())
    assert wire["error_kind"] == "request"
    assert JobStatus.decode(wire).error_kind is ErrorKind.REQUEST


def test_an_older_or_newer_gateways_status_decodes() -> None:
    """Fields it did not send default; fields this side does not know are ignored."""
    status = JobStatus.decode({"job_id": "j", "state": "queued", "queue_position": 3})
    assert status == JobStatus("j", JobState.QUEUED)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"state": "paused"}, "field 'state' must be one of queued, running, succeeded"),
        ({"state": None}, "field 'state' must be a string, got None"),
        ({"attempt": "1"}, "field 'attempt' must be an integer, got '1'"),
        ({"error_kind": "disk"}, "field 'error_kind' must be one of request, service, got 'disk'"),
        ({"progress": {"bytes_done": 1.5}}, "field 'progress': field 'bytes_done' must be an int"),
        ({"result": {"job_id": "j", "outputs": []}}, "field 'result.outputs' is empty"),
        (
            {"result": {"job_id": "j", "outputs": [{"url": "u", "size": 1}]}},
            "field 'result.outputs[0]': field 'crc32' is missing",
        ),
    ],
)
def test_a_malformed_job_status_names_its_field(change: dict[str, Any], error: str) -> None:
    data = {"job_id": "j", "state": "running", "progress": {}} | change
    with pytest.raises(MessageError) as raised:
        JobStatus.decode(data)
    assert error in str(raised.value)


def test_a_workers_assignment_and_answer_decode_what_they_encode() -> None:
    raw_request = json.loads(request().to_json())
    assignment = Assignment("j", 2, raw_request)
    assert parse_assignment(over_json(assignment.encode())) == assignment
    assert parse_assignment(assignment.encode() | {"lease_ttl": 10}) == assignment
    done = Done(2, RESULT)
    assert parse_done(over_json(done.encode())) == done
    failed = Done(2, None, "CorruptFileError: x", ErrorKind.REQUEST)
    assert over_json(failed.encode()) == {
        "attempt": 2,
        "error": "CorruptFileError: x",
        "error_kind": "request",
    }
    assert parse_done(over_json(failed.encode())) == failed


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"job_id": "j", "attempt": 0, "request": {}}, "job.attempt"),
        ({"job_id": "../j", "attempt": 1, "request": {}}, "job.job_id"),
        ([], "job"),
    ],
)
def test_a_malformed_assignment_names_its_field(body: Any, field: str) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        parse_assignment(body)
    assert raised.value.field == field


QUEUED = b'{"job_id": "j", "state": "queued"}'


def _gateway(submitted: tuple[int, bytes], polled: tuple[int, bytes]) -> type[Any]:
    """A gateway that answers every submit with ``submitted`` and every status call with
    ``polled`` (HTTP status, JSON body)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"] or 0))
            self._answer(*submitted)

        def do_GET(self) -> None:
            self._answer(*polled)

        def do_DELETE(self) -> None:
            self._answer(200, QUEUED)

        def log_message(self, *_: Any) -> None:
            pass

    return Handler


def _failure(handler: type[Any]) -> CompactionError:
    """What compacting through a gateway served by ``handler`` (two attempts) raises."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        compactor = RemoteCompactor([url], timeout=10, retries=1, failure_strategy="fail")
        with pytest.raises(CompactionError) as raised:
            compactor.compact(request())
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    return raised.value


def test_a_gateway_whose_answer_is_no_job_status_is_an_outage_not_a_refusal() -> None:
    garbled = b'{"job_id": "j", "state": "pondering"}'
    failure = _failure(_gateway((202, garbled), (200, garbled)))
    assert not isinstance(failure, RemoteRefusedError)  # tried again, then given up
    message = str(failure)
    assert message.count("field 'state' must be one of queued, running") == 2


@pytest.mark.parametrize(
    ("submitted", "polled", "said"),
    [
        ((503, b'{"message": "draining"}'), (200, QUEUED), "submit answered 503: draining"),
        ((202, QUEUED), (500, b'{"error": "disk on fire"}'), "status answered 500: disk on fire"),
    ],
)
def test_a_gateway_that_answers_an_error_is_an_outage_named_by_its_answer(
    submitted: tuple[int, bytes], polled: tuple[int, bytes], said: str
) -> None:
    failure = _failure(_gateway(submitted, polled))
    assert not isinstance(failure, RemoteRefusedError)
    assert str(failure).count(said) == 2  # each attempt's answer
