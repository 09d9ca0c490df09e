"""Fuzzing every route of a real gateway process: whatever a caller sends, the answer is never
a 5xx (a malformed request is the caller's fault, a 4xx), and the gateway is healthy afterwards
and still runs a real job end to end.

Requests are built from the route table with ids, queries and bodies drawn by hypothesis: random
JSON, valid requests with one field replaced by a random value, and raw bytes. The example count
is bounded so the test takes seconds (``make test`` runs it)."""

from __future__ import annotations

import http.client
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings
from statetier.backend.compaction_client import RemoteCompactor
from statetier.backend.http_json import call_json
from statetier.tools.compaction_launch import Processes, SeaweedFS

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository: tests.compaction.*

from tests.compaction.compaction_support import chain_requests, wait_for

ROUTES = [
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/v1/stats"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/{job}"),
    ("DELETE", "/v1/jobs/{job}"),
    ("POST", "/v1/workers/{worker}/register"),
    ("POST", "/v1/workers/{worker}/poll"),
    ("POST", "/v1/workers/{worker}/heartbeat"),
    ("POST", "/v1/workers/{worker}/jobs/{job}/done"),
    ("DELETE", "/v1/workers/{worker}"),
]
IDS = st.one_of(
    st.sampled_from(["job-1", "w1", "x", ".", "..", "a" * 200]),
    st.text(st.characters(min_codepoint=45, max_codepoint=122), min_size=1, max_size=12),
).map(lambda s: s.replace("/", "_").replace("?", "_").replace("#", "_").replace("%", "_"))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),  # json.dumps writes NaN, not JSON; the raw bytes cover that
    st.text(max_size=20),
)
JSON = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
QUERIES = st.one_of(
    st.just(""),
    st.sampled_from(["nan", "inf", "-1", "abc", "1e309", "0", "0.01", "", "queued"]).map(
        lambda v: f"?wait={v}&state={v}"
    ),
)
VALID = {
    "job_id": "fz",
    "state": "s",
    "key_groups": "0-7",
    "max_parallelism": 16,
    "output_prefix": "s3://statetier/fuzz/app/data/out",
    "inputs": [
        {"url": "s3://statetier/fuzz/app/b.kgd", "size": 1, "crc32": 1, "kind": "base", "epoch": 1}
    ],
}
FIELDS = ["job_id", "state", "key_groups", "max_parallelism", "output_prefix", "inputs"]


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["json", "mutated", "raw", "empty"]))
    if kind == "json":
        return json.dumps(draw(JSON)).encode()
    if kind == "mutated":
        body: dict[str, Any] = json.loads(json.dumps(VALID))
        body["job_id"] = draw(IDS)
        field = draw(st.sampled_from([*FIELDS, "inputs.0.url", "inputs.0.kind", "slots"]))
        value = draw(JSON)
        if field.startswith("inputs.0."):
            body["inputs"][0][field.rsplit(".", 1)[1]] = value
        else:
            body[field] = value
        return json.dumps(body).encode()
    if kind == "raw":
        return draw(st.binary(max_size=200))
    return b""


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedFS) -> Iterator[str]:
    """A sandbox gateway with short waits (a valid long poll would only slow the test)."""
    with Processes(tmp_path_factory.mktemp("fuzz"), env=seaweed.env) as procs:
        gateway, _ = procs.gateway(
            ["s3://statetier"], "--max-poll-wait", "0.05", "--lease-ttl", "1"
        )
        yield gateway


def _send(gateway: str, method: str, path: str, body: bytes) -> int:
    host, port = gateway.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body or None, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return int(response.status)
    finally:
        conn.close()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    route=st.sampled_from(ROUTES),
    job=IDS,
    worker=IDS,
    query=QUERIES,
    body=bodies(),
)
def test_no_request_gets_a_5xx(
    fuzzed: str, route: tuple[str, str], job: str, worker: str, query: str, body: bytes
) -> None:
    method, template = route
    path = template.format(job=job, worker=worker) + query
    status = _send(fuzzed, method, path, body)
    if template == "/readyz":  # 503 is its answer while no worker is alive, not a fault
        assert status in (200, 503)
        return
    assert status < 500, (method, path, body[:200], status)


def test_the_gateway_is_healthy_after_the_fuzzing(
    fuzzed: str, procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    """Runs after the fuzz test (file order): probes answer and a real job still succeeds."""
    assert call_json("GET", f"{fuzzed}/healthz")[0] == 200
    wait_for(  # the fuzzer's fake workers expire (lease 1 s) and free their jobs
        "fake workers to expire", lambda: call_json("GET", f"{fuzzed}/v1/stats")[1]["workers"] == 0
    )
    procs.worker(fuzzed, ["s3://statetier"])
    (request,) = chain_requests(f"{prefix}/app", seaweed.options, keys=30, n=40)[:1]
    client = RemoteCompactor([fuzzed], timeout=30, poll_interval=0.05, failure_strategy="fail")
    assert client.compact(request).outputs and client.remote_jobs == 1
