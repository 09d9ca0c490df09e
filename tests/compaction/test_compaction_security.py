"""Refused paths and the shared token, through the real gateway and worker processes (and the
gateway's app in process, for which routes need the token)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from statetier.backend.compaction_client import RemoteCompactor, RemoteRefusedError
from statetier.backend.http_json import call_json
from statetier.backend.snapshot.compaction import CompactionInput, LocalCompactor
from statetier.compaction.gateway import Gateway, GatewaySettings
from statetier.tools.compaction_launch import BUCKET, Processes, SeaweedFS

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository: tests.compaction.*

from tests.compaction.compaction_support import chain_requests, wait_for

TOKEN = "s3cr3t-token"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"output_prefix": f"s3://{BUCKET}/elsewhere/out"}, "outside the allowed prefixes"),
        ({"output_prefix": "s3://foreign-bucket/ckpt/out"}, "outside the allowed prefixes"),
        ({"input0": "{prefix}/app/../../other/secret.kgd"}, "'..' path segment"),
        ({"input0": "{prefix}-sibling/x.kgd"}, "outside the allowed prefixes"),
        ({"input0": "file:///etc/passwd"}, "outside the allowed prefixes"),
    ],
)
def test_paths_outside_the_allowed_prefixes_are_refused(
    procs: Processes, seaweed: SeaweedFS, prefix: str, change: dict[str, str], why: str
) -> None:
    gateway, _ = procs.gateway([prefix])
    (request,) = chain_requests(f"{prefix}/app", seaweed.options, keys=30, n=40)[:1]
    if "input0" in change:
        url = change["input0"].format(prefix=prefix)
        first = dataclasses.replace(request.inputs[0], url=url)
        request = dataclasses.replace(request, inputs=[first, *request.inputs[1:]])
    else:
        request = dataclasses.replace(request, output_prefix=change["output_prefix"])
    status, body = call_json("POST", f"{gateway}/v1/jobs", json.loads(request.to_json()))
    assert status == 403 and body["error"] == "refused" and why in body["message"]
    # the client raises instead of falling back: a refused request is a bug, not an outage
    client = RemoteCompactor([gateway], timeout=10, fallback=LocalCompactor(**seaweed.options))
    with pytest.raises(RemoteRefusedError, match="refused"):
        client.compact(request)
    assert client.fallbacks == 0
    _, listing = call_json("GET", f"{gateway}/v1/jobs")
    assert listing["jobs"] == []


def test_a_worker_checks_paths_itself(procs: Processes, seaweed: SeaweedFS, prefix: str) -> None:
    """A worker allowed less than the gateway refuses the job, which fails without retries."""
    gateway, _ = procs.gateway([f"s3://{BUCKET}"])
    procs.worker(gateway, [f"{prefix}/narrow"])
    (request,) = chain_requests(f"{prefix}/app", seaweed.options, keys=30, n=40)[:1]
    client = RemoteCompactor([gateway], timeout=20, poll_interval=0.05)
    with pytest.raises(RemoteRefusedError, match="outside the allowed prefixes"):
        client.compact(request)
    _, job = call_json("GET", f"{gateway}/v1/jobs/{request.job_id}")
    assert job["state"] == "failed" and job["attempt"] == 1 and job["error_kind"] == "request"


def test_the_shared_token_is_required(procs: Processes, seaweed: SeaweedFS, prefix: str) -> None:
    env = {"STATETIER_COMPACTION_TOKEN": TOKEN}
    gateway, _ = procs.gateway([prefix], env=env)
    (request,) = chain_requests(f"{prefix}/app", seaweed.options, keys=30, n=40)[:1]
    body = json.loads(request.to_json())
    assert call_json("POST", f"{gateway}/v1/jobs", body)[0] == 401
    assert call_json("POST", f"{gateway}/v1/jobs", body, token="wrong")[0] == 401
    assert call_json("GET", f"{gateway}/v1/jobs")[0] == 401
    assert call_json("GET", f"{gateway}/v1/stats")[0] == 200  # counts only, for the autoscaler
    assert call_json("GET", f"{gateway}/healthz")[0] == 200  # probes stay open
    wrong = RemoteCompactor([gateway], timeout=10, token="wrong")
    with pytest.raises(RemoteRefusedError, match="bearer token"):
        wrong.compact(request)
    procs.worker(gateway, [prefix], env=env)
    right = RemoteCompactor([gateway], timeout=20, token=TOKEN, failure_strategy="fail")
    result = right.compact(request)
    assert result.outputs and right.remote_jobs == 1
    # a worker without the token cannot even register
    stranger = procs.worker(gateway, [prefix], env={"STATETIER_COMPACTION_TOKEN": ""})
    wait_for("the stranger to give up", lambda: stranger.poll() is not None, timeout=10)
    assert stranger.returncode == 3
    logs = [p.read_text() for p in procs.workdir.glob("worker-*.log")]
    refused = [text for text in logs if "registering with" in text]
    assert refused and "failed (401): missing or wrong bearer token" in refused[0]
    assert "Traceback" not in refused[0]  # one clear line, not a traceback


def test_inputs_that_do_not_match_their_checksum_fail_the_job(
    procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    gateway, _ = procs.gateway([prefix])
    procs.worker(gateway, [prefix])
    (request,) = chain_requests(f"{prefix}/app", seaweed.options, keys=30, n=40)[:1]
    bad = CompactionInput(**{**dataclasses.asdict(request.inputs[0]), "crc32": 12345})
    request = dataclasses.replace(request, inputs=[bad, *request.inputs[1:]])
    client = RemoteCompactor([gateway], timeout=20, poll_interval=0.05)
    with pytest.raises(RemoteRefusedError, match="checksum"):
        client.compact(request)


def test_only_the_probe_and_count_routes_are_served_without_the_token() -> None:
    """Every route of the gateway's app, called without a token: 401 unless it is one of the
    four that carry no job data. A route added to the wrong group fails here."""

    async def answers() -> dict[str, int]:
        gateway = Gateway(GatewaySettings(allowed_prefixes=("s3://b/p",), token=TOKEN))
        app = gateway.app()
        routes = [(r.method, r.resource.canonical) for r in app.router.routes() if r.resource]
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            statuses = {}
            for method, path in routes:
                if method == "HEAD":
                    continue
                url = path.replace("{job_id}", "j1").replace("{worker_id}", "w1")
                async with client.request(method, url) as response:
                    statuses[f"{method} {path}"] = response.status
            return statuses

    statuses = asyncio.run(answers())
    open_routes = {k for k, status in statuses.items() if status != 401}
    assert open_routes == {"GET /healthz", "GET /readyz", "GET /metrics", "GET /v1/stats"}
    assert len(statuses) == 13


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (f"Bearer {TOKEN}", 200),
        (f"bearer {TOKEN}", 200),
        (f"BEARER {TOKEN}", 200),
        (f"BeArEr   {TOKEN} ", 200),
        (f"Basic {TOKEN}", 401),
        (f"Bearer{TOKEN}", 401),
        (f"bearer {TOKEN.upper()}", 401),  # the token itself is compared exactly
        ("bearer", 401),
        ("", 401),
    ],
)
def test_the_bearer_scheme_is_case_insensitive_and_the_token_exact(
    header: str, status: int
) -> None:
    """RFC 7235: the authentication scheme is case-insensitive; the token is not."""

    async def answer() -> int:
        gateway = Gateway(GatewaySettings(allowed_prefixes=("s3://b/p",), token=TOKEN))
        async with TestClient(TestServer(gateway.app(), host="127.0.0.1")) as client:
            headers = {"Authorization": header} if header else {}
            async with client.get("/v1/jobs", headers=headers) as response:
                return response.status

    assert asyncio.run(answer()) == status
