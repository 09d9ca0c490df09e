"""What the gateway and workers refuse, and what can never wedge them (issue 20), through real
gateway and worker processes: the default without a token, relative and differently spelled
paths, malformed bodies (400 naming the field, never retried), bounds on key groups, queue,
waits and connections, and remote compaction of a ``file://`` checkpoint with retention."""

from __future__ import annotations

import base64
import dataclasses
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from statetier.backend.compaction_client import RemoteCompactor, RemoteRefusedError
from statetier.backend.http_json import call_json
from statetier.backend.snapshot.compaction import (
    CompactionError,
    CompactionRequest,
    LocalCompactor,
)
from statetier.compaction.worker import JobDroppedError
from statetier.operator import compaction_service
from statetier.tools.compaction_launch import Processes, SeaweedFS

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository: tests.compaction.*

from tests.compaction.compaction_support import (
    chain_requests,
    dump,
    expected,
    records,
    runner,
    wait_for,
)

FAST = ("--lease-ttl", "1.5", "--heartbeat-interval", "0.3")


def _request(prefix: str, job_id: str = "job-1", size: int = 10) -> dict[str, Any]:
    """A well-formed request body (its files need not exist: nothing runs it)."""
    return {
        "job_id": job_id,
        "state": "s",
        "key_groups": "0-7",
        "max_parallelism": 16,
        "output_prefix": f"{prefix}/app/data/out",
        "inputs": [
            {
                "url": f"{prefix}/app/data/b.kgd",
                "size": size,
                "crc32": 1,
                "kind": "base",
                "epoch": 1,
            },
            {
                "url": f"{prefix}/app/data/d.kgd",
                "size": size,
                "crc32": 2,
                "kind": "delta",
                "epoch": 2,
            },
        ],
    }


def body_url(body: dict[str, Any], where: str) -> str:
    """The URL of a request body's first input or its output prefix."""
    url: str = body["inputs"][0]["url"] if where == "input" else body["output_prefix"]
    return url


def _refusals(gateway: str, reason: str) -> float:
    with socket.create_connection(("127.0.0.1", int(gateway.rsplit(":", 1)[1])), 5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        text = b"".join(iter(lambda: s.recv(65536), b"")).decode()
    key = f'statetier_compaction_requests_refused_total{{reason="{reason}"}} '
    return float(next(line for line in text.splitlines() if line.startswith(key)).split()[-1])


# ----------------------------------------------------------------------------- authentication


def test_the_operator_default_gateway_refuses_a_worker_without_a_token(tmp_path: Path) -> None:
    """A CompactionService with default values (no tokenSecretRef): the operator generates a
    token Secret and the gateway reads it; run with exactly the operator's arguments and that
    token, it refuses a fake worker and every API call without it. Without any token at all
    (a Secret not there yet), it refuses everything as well."""
    body = {
        "metadata": {"name": "svc", "namespace": "ns", "uid": "u-1"},
        "spec": {"image": "i", "objectStorage": {"allowedPrefixes": ["s3://bucket/ckpt"]}},
    }
    deployment = next(
        o
        for o in compaction_service.desired_objects(body)
        if o["metadata"]["name"] == "svc-gateway"
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    (var,) = [e for e in container["env"] if e["name"] == "STATETIER_COMPACTION_TOKEN"]
    assert var["valueFrom"]["secretKeyRef"] == {"name": "svc-compaction-token", "key": "token"}
    secret = compaction_service.token_secret(body)
    assert secret is not None and secret["metadata"]["name"] == "svc-compaction-token"
    token = base64.b64decode(secret["data"]["token"]).decode()  # as the kubelet passes it
    args = list(container["args"][1:])
    port = args.index("--port")
    del args[port : port + 2]  # the test picks a free port on loopback
    with Processes(tmp_path, env={"STATETIER_COMPACTION_TOKEN": token}, sandbox=False) as procs:
        gateway, _ = procs.gateway([], *args)
        register = f"{gateway}/v1/workers/fake/register"
        assert call_json("POST", register, {"slots": 10**9})[0] == 401
        assert call_json("POST", register, {"slots": 10**9}, token="guess")[0] == 401
        assert call_json("POST", f"{gateway}/v1/jobs", _request("s3://bucket/ckpt"))[0] == 401
        assert call_json("GET", f"{gateway}/v1/stats")[1]["workers"] == 0
        assert call_json("POST", register, {"slots": 1}, token=token)[0] == 200
    (tmp_path / "none").mkdir()
    with Processes(
        tmp_path / "none", env={"STATETIER_COMPACTION_TOKEN": ""}, sandbox=False
    ) as procs:
        gateway, _ = procs.gateway([], *args)
        status, answer = call_json("POST", f"{gateway}/v1/workers/fake/register", {"slots": 10**9})
        assert status == 401 and "no token" in answer["message"]
        assert "--insecure-no-token" in answer["message"]
        assert call_json("POST", f"{gateway}/v1/workers/fake/poll?wait=0", {})[0] == 401
        assert call_json("POST", f"{gateway}/v1/jobs", _request("s3://bucket/ckpt"))[0] == 401
        assert call_json("GET", f"{gateway}/v1/jobs")[0] == 401
        assert call_json("GET", f"{gateway}/healthz")[0] == 200
        assert call_json("GET", f"{gateway}/v1/stats")[1]["workers"] == 0


def test_a_sandbox_gateway_still_bounds_a_worker_s_slots(procs: Processes, prefix: str) -> None:
    gateway, _ = procs.gateway([prefix])  # --insecure-no-token (see Processes)
    status, answer = call_json("POST", f"{gateway}/v1/workers/fake/register", {"slots": 10**9})
    assert status == 400 and answer["field"] == "slots"
    assert call_json("POST", f"{gateway}/v1/workers/w1/register", {"slots": 4})[0] == 200


# ----------------------------------------------------------------------------- paths


@pytest.mark.parametrize("where", ["input", "output"])
@pytest.mark.parametrize(
    ("spell", "why"),
    [
        (lambda root: "file://" + root.lstrip("/"), "not an absolute file URL"),
        (lambda root: "FILE://" + root, "write the scheme in lower case"),
        # an fsspec chain: the worker wrote under the part before '::' and reported the rest
        (lambda root: f"file://{root}::file:{root}/../elsewhere/j1", "fsspec chain URL"),
    ],
)
def test_relative_or_differently_spelled_file_urls_are_refused(
    procs: Processes, tmp_path: Path, where: str, spell: Any, why: str
) -> None:
    """``file://tmp/.../allowed/x`` was accepted and read ``<worker cwd>/tmp/.../x``; a chain
    ``file://.../allowed/o::file:/...`` was accepted and written under ``allowed/o``. The
    refusal names the field and the value."""
    allowed = str(tmp_path / "allowed")
    gateway, _ = procs.gateway([f"file://{allowed}"])
    body = _request(f"file://{allowed}")
    if where == "input":
        body["inputs"][0]["url"] = spell(f"{allowed}/app/data/b.kgd")
    else:
        body["output_prefix"] = spell(f"{allowed}/app/out")
    status, answer = call_json("POST", f"{gateway}/v1/jobs", body)
    assert status == 403 and why in answer["message"], answer
    field = "inputs[0].url" if where == "input" else "output_prefix"
    assert answer["message"].startswith(f"{field} {body_url(body, where)!r}"), answer
    assert call_json("GET", f"{gateway}/v1/jobs")[1]["jobs"] == []


def test_remote_compaction_of_a_file_checkpoint_keeps_retention_bounded(
    procs: Processes, tmp_path: Path
) -> None:
    """0 of 14 jobs used to succeed (the worker did not create its output directory), and each
    failure skipped retention: 15 epochs and 14-delta chains remained."""
    root = f"file://{tmp_path / 'ckpt'}"
    gateway, _ = procs.gateway([root], *FAST)
    procs.worker(gateway, [root])
    live = runner(f"{root}/app", {})
    assert live.checkpointer is not None
    client = RemoteCompactor([gateway], timeout=30, poll_interval=0.05, failure_strategy="fail")
    live.checkpointer.compactor = client
    for epoch in range(1, 16):
        live.process(records(5, epoch))
        manifest = live.checkpoint()
        live.checkpointer.drain()
        assert all(len(c.deltas) <= 2 for c in manifest.chains()), epoch
    assert client.remote_jobs >= 10 and client.fallbacks == 0
    assert live.store is not None and live.store.epochs() == [13, 14, 15]
    files = [n for n in live.store.list_files() if not n.startswith("manifests/")]
    assert len(files) <= 3 * 2 * 2 * 4  # epochs x states x ranges x (base, deltas, compacted)
    live.close()
    restored = runner(f"{root}/app", {}, parallelism=3)
    assert dump(restored) == expected(5, 15)
    restored.close()


# ----------------------------------------------------------------------------- malformed bodies

DEEP = b"[" * 100_000 + b"]" * 100_000


def _with(prefix: str, path: str, value: Any) -> dict[str, Any]:
    body = _request(prefix)
    target: Any = body
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last = keys[-1]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return body


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """One sandbox gateway (no workers) shared by the malformed-body cases."""
    prefix = "s3://bucket/ckpt"
    with Processes(tmp_path_factory.mktemp("sandbox")) as procs:
        gateway, _ = procs.gateway([prefix], "--body-timeout", "1", "--header-timeout", "1")
        assert call_json("POST", f"{gateway}/v1/workers/w1/register", {"slots": 1})[0] == 200
        yield gateway, prefix


def _raw(gateway: str, method: str, path: str, body: bytes) -> tuple[int, Any]:
    """One request with a raw body (call_json would encode it)."""
    host, port = gateway.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), 10) as s:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        s.sendall(head.encode() + body)
        raw = b"".join(iter(lambda: s.recv(65536), b""))
    status = int(raw.split(b" ", 2)[1])
    text = raw.split(b"\r\n\r\n", 1)[1]
    return status, json.loads(text) if text.startswith(b"{") else text


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/v1/jobs", DEEP, "body"),
        ("POST", "/v1/jobs", b"{not json", "body"),
        ("POST", "/v1/jobs", ("inputs.0.url", 42), "inputs[0].url"),
        ("POST", "/v1/jobs", ("inputs.0.url", None), "inputs[0].url"),
        ("POST", "/v1/jobs", ("output_prefix", ["s3://bucket/ckpt"]), "output_prefix"),
        ("POST", "/v1/jobs", ("job_id", 7), "job_id"),
        ("POST", "/v1/jobs", ("job_id", "../../x"), "job_id"),
        ("POST", "/v1/jobs", ("key_groups", "0-100000000000"), "key_groups"),
        ("POST", "/v1/jobs", ("key_groups", "0-16"), "key_groups"),
        ("POST", "/v1/jobs", ("key_groups", "\u0660-\u0667"), "key_groups"),  # non-ASCII digits
        ("POST", "/v1/jobs", ("key_groups", "7-0"), "key_groups"),
        ("POST", "/v1/jobs", ("max_parallelism", True), "max_parallelism"),
        ("POST", "/v1/jobs", ("inputs.0.size", -1), "inputs[0].size"),
        ("POST", "/v1/jobs", ("inputs.0.kind", "delta"), "inputs[0].kind"),
        ("POST", "/v1/jobs", ("inputs", []), "inputs"),
        ("POST", "/v1/jobs", ("surprise", 1), "body.surprise"),
        ("POST", "/v1/jobs", [1, 2], "body"),
        ("POST", "/v1/workers/w1/register", {"slots": "many"}, "slots"),
        ("POST", "/v1/workers/w1/register", {"slots": 0}, "slots"),
        ("POST", "/v1/workers/w/x/register", {"slots": 1}, None),  # no such route: 404
        ("POST", "/v1/workers/w1/heartbeat", {"progress": {"job": "x"}}, "progress.job"),
        ("POST", "/v1/workers/w1/heartbeat", {"progress": [1]}, "progress"),
        (
            "POST",
            "/v1/workers/w1/jobs/j/done",
            {"attempt": 1, "result": {"outputs": 3}},
            "result.outputs",
        ),
        ("POST", "/v1/workers/w1/jobs/j/done", {"attempt": "1", "error": "x"}, "attempt"),
        ("POST", "/v1/workers/w1/jobs/j/done", {"attempt": 1, "error": ["x"]}, "error"),
        ("POST", "/v1/workers/w1/poll?wait=abc", {}, "wait"),
        ("POST", "/v1/workers/w1/poll?wait=nan", {}, "wait"),
        ("POST", "/v1/workers/w1/poll?wait=-1", {}, "wait"),
        ("GET", "/v1/jobs/job-1?wait=inf", None, "wait"),
        ("GET", "/v1/jobs?state=nonsense", None, "state"),
    ],
)
def test_a_malformed_request_gets_a_4xx_naming_the_field(
    sandbox: tuple[str, str], method: str, path: str, body: Any, field: str | None
) -> None:
    gateway, prefix = sandbox
    if isinstance(body, tuple):
        body = _with(prefix, *body)
    raw = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
    started = time.monotonic()
    status, answer = _raw(gateway, method, path, raw)
    assert time.monotonic() - started < 3  # nan or inf waits are not held
    if field is None:
        assert status == 404
        return
    assert status == 400, answer
    assert answer["error"] == "invalid" and answer["field"] == field, answer
    assert answer["message"].startswith(field)
    assert call_json("GET", f"{gateway}/healthz")[0] == 200


def test_a_body_too_large_is_refused(sandbox: tuple[str, str]) -> None:
    gateway, _ = sandbox
    status, _ = _raw(gateway, "POST", "/v1/jobs", b" " * (2 << 20))
    assert status == 413


def test_a_refused_request_is_not_retried(sandbox: tuple[str, str]) -> None:
    """A malformed key_groups or a FILE:// scheme used to be a service error, retried 3 times."""
    gateway, prefix = sandbox
    template = CompactionRequest.from_json(json.dumps(_request(prefix, "retry-me")))
    client = RemoteCompactor([gateway], timeout=10, retries=2)
    invalid, refused = _refusals(gateway, "invalid"), _refusals(gateway, "path")
    with pytest.raises(RemoteRefusedError, match="key_groups"):
        client.compact(dataclasses.replace(template, key_groups="0-100000000000"))
    assert _refusals(gateway, "invalid") == invalid + 1
    spelled = dataclasses.replace(template, output_prefix="FILE:///tmp/x")
    with pytest.raises(RemoteRefusedError, match="lower case"):
        client.compact(spelled)
    assert _refusals(gateway, "path") == refused + 1
    assert client.fallbacks == 0


# ----------------------------------------------------------------------------- connections


def test_a_body_announced_and_never_sent_does_not_hold_the_connection(
    sandbox: tuple[str, str],
) -> None:
    gateway, _ = sandbox
    host, port = gateway.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), 10) as s:
        s.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{"
        )
        started = time.monotonic()
        answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("sent", [b"", b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-"])
def test_a_connection_without_complete_headers_is_closed(
    sandbox: tuple[str, str], sent: bytes
) -> None:
    gateway, _ = sandbox
    host, port = gateway.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), 10) as s:
        s.sendall(sent)
        started = time.monotonic()
        assert s.recv(65536) == b""  # closed by the gateway, not by the 10 s client timeout
    assert time.monotonic() - started < 5


# ----------------------------------------------------------------------------- bounds


def test_the_queue_is_bounded_per_tenant_and_in_all(procs: Processes) -> None:
    prefix = "s3://bucket/ckpt"
    gateway, _ = procs.gateway(
        [prefix],
        "--max-queued-per-tenant",
        "2",
        "--max-queued",
        "3",
        "--max-tenant-bytes",
        "1m",
    )

    def submit(job_id: str, app: str, size: int = 10) -> tuple[int, Any]:
        body = _request(f"{prefix}/{app}", job_id, size)
        return call_json("POST", f"{gateway}/v1/jobs", body)

    assert submit("a1", "a")[0] == 202 and submit("a2", "a")[0] == 202
    status, answer = submit("a3", "a")
    assert status == 429 and "max-queued-per-tenant" in answer["message"]
    status, answer = submit("b1", "b", size=600 << 10)  # 1.2 MiB of inputs
    assert status == 429 and "max-tenant-bytes" in answer["message"]
    assert submit("b2", "b")[0] == 202
    status, answer = submit("c1", "c")
    assert status == 429 and "max-queued" in answer["message"]
    assert call_json("DELETE", f"{gateway}/v1/jobs/a1")[0] == 200  # room again
    assert submit("c1", "c")[0] == 202
    assert _refusals(gateway, "queue_full") == 3


def test_a_job_too_big_is_refused(procs: Processes) -> None:
    prefix = "s3://bucket/ckpt"
    gateway, _ = procs.gateway([prefix], "--max-job-bytes", "1m", "--max-inputs", "2")
    status, answer = call_json("POST", f"{gateway}/v1/jobs", _request(prefix, size=1 << 20))
    assert status == 400 and answer["field"] == "inputs" and "limit" in answer["message"]
    body = _request(prefix)
    body["inputs"].append(dict(body["inputs"][1], epoch=3))
    status, answer = call_json("POST", f"{gateway}/v1/jobs", body)
    assert status == 400 and "more than 2 files" in answer["message"]


def test_an_aborted_job_frees_its_slot_within_seconds(
    procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    """A slow job is aborted: the worker stops it at its next read or key group, and its one
    slot takes the next job within a few seconds."""
    gateway, _ = procs.gateway([prefix], *FAST)
    (request,) = chain_requests(f"{prefix}/app", seaweed.options, keys=400, n=2000)[:1]
    total = sum(i.size for i in request.inputs)
    procs.worker(gateway, [prefix], "--max-read-rate", str(max(1, total // 60)))
    assert call_json("POST", f"{gateway}/v1/jobs", json.loads(request.to_json()))[0] == 202
    wait_for(
        "the job to run",
        lambda: call_json("GET", f"{gateway}/v1/jobs/{request.job_id}")[1]["state"] == "running",
    )
    assert call_json("DELETE", f"{gateway}/v1/jobs/{request.job_id}")[0] == 200
    aborted_at = time.monotonic()
    follow = dataclasses.replace(request, job_id="next-one")
    assert call_json("POST", f"{gateway}/v1/jobs", json.loads(follow.to_json()))[0] == 202
    wait_for(  # the worker reports reading the next job: it has left the aborted one
        "the slot to work on the next job",
        lambda: call_json("GET", f"{gateway}/v1/jobs/next-one")[1]["progress"]["bytes_done"] > 0,
        timeout=10,
    )
    assert time.monotonic() - aborted_at < 5


def test_the_merge_checks_for_cancellation_between_key_groups(tmp_path: Path) -> None:
    """A cancelled job stops inside the merge, not only between reads: a range of many key
    groups can no longer keep a slot busy after its abort."""
    root = f"file://{tmp_path}/app"
    (request,) = chain_requests(root, {}, keys=100, n=200)[:1]
    calls: list[int] = []

    def check() -> None:
        calls.append(1)
        if len(calls) == 3:
            raise JobDroppedError()

    with pytest.raises(JobDroppedError):
        LocalCompactor(check=check).compact(request)
    assert len(calls) == 3  # stopped at the third key group of 16
    assert not Path(request.output_prefix.removeprefix("file://")).exists()  # nothing written


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (("--max-inputs", "0"), "max-inputs and max-worker-slots must be at least 1"),
        (("--max-job-bytes", "1k"), "max-job-bytes must be at least 1 MiB"),
        (("--max-poll-wait", "nan"), "max-poll-wait must be in (0, 3600] seconds"),
        (("--body-timeout", "0"), "body-timeout must be in (0, 3600] seconds"),
        (("--max-queued", "-1"), "max-queued must be at least 1"),
        (("--max-body-bytes", "lots"), "expected a size"),
        (("--token-file", "/nonexistent/token"), "No such file"),
    ],
)
def test_a_gateway_with_a_nonsense_limit_does_not_start(
    tmp_path: Path, flags: tuple[str, str], why: str
) -> None:
    """One line naming the problem, exit status 2, no traceback."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "statetier.compaction.cli",
            "gateway",
            "--port",
            "0",
            "--host",
            "127.0.0.1",
            "--allowed-prefix",
            "s3://bucket/ckpt",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 2 and why in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_worker_creates_directories_below_an_allowed_prefix_only(
    procs: Processes, tmp_path: Path
) -> None:
    """An output under an allowed prefix that does not exist (a volume not mounted) is not
    created: the job fails as a service error and nothing appears above or at the prefix."""
    present, missing = tmp_path / "present", tmp_path / "missing"
    prefixes = [f"file://{present}", f"file://{missing}"]
    gateway, _ = procs.gateway(prefixes, *FAST, "--max-attempts", "1")
    procs.worker(gateway, prefixes)
    (request,) = chain_requests(f"file://{present}/app", {}, keys=30, n=40)[:1]
    elsewhere = dataclasses.replace(
        request, job_id="elsewhere", output_prefix=f"file://{missing}/app/out"
    )
    client = RemoteCompactor([gateway], timeout=20, retries=0, failure_strategy="fail")
    with pytest.raises(CompactionError, match="is not a directory on this worker"):
        client.compact(elsewhere)
    assert not missing.exists()
    assert client.compact(request).outputs  # under the present prefix: created as needed


@pytest.mark.parametrize("endpoint", ["not a url", "ftp://gw:21", "http://:8080", "gw:8080"])
def test_a_client_refuses_an_endpoint_that_is_not_an_http_url(endpoint: str) -> None:
    with pytest.raises(ValueError, match="endpoint"):
        RemoteCompactor([endpoint])
    client = RemoteCompactor(["http://127.0.0.1:1"])
    with pytest.raises(ValueError, match="endpoint"):
        client.add_endpoints(endpoint)
    assert client.endpoints == ("http://127.0.0.1:1",)
