"""The compaction service end to end: real gateway and worker processes, SeaweedFS, clients.

Acceptance of issue 7: many jobs from several clients restore to the uncompacted state; a worker
killed mid-job is replaced and the job completes; aborts work; a gateway that is down makes the
client fall back (or fail) within its timeout.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import fsspec
import pytest
from statetier.backend.compaction_client import RemoteCompactor
from statetier.backend.http_json import call_json
from statetier.backend.local_runner import LocalRunner
from statetier.backend.snapshot.compaction import CompactionError, LocalCompactor
from statetier.tools.compaction_launch import Processes, SeaweedFS
from statetier.tools.ports import free_port

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository: tests.compaction.*

from tests.compaction.compaction_support import (
    MAX_P,
    SumAndLast,
    chain_requests,
    dump,
    expected,
    records,
    runner,
    wait_for,
)

FAST = ("--lease-ttl", "1.5", "--heartbeat-interval", "0.3")


def _job(gateway: str, job_id: str) -> dict[str, Any]:
    """The job's status; a job not submitted yet shows as state None with no progress."""
    status, body = call_json("GET", f"{gateway}/v1/jobs/{job_id}")
    if status == 404:
        return {"state": None, "progress": {"bytes_done": 0}, "history": []}
    assert status == 200, body
    return dict(body)


def test_many_jobs_from_several_clients_restore_to_the_uncompacted_state(
    procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    gateway, _ = procs.gateway([prefix], *FAST)
    for _ in range(2):
        procs.worker(gateway, [prefix])
    compactors = [RemoteCompactor([gateway], timeout=60, poll_interval=0.1) for _ in range(3)]

    def client(seed: int) -> None:
        uri = f"{prefix}/app-{seed}"
        live = runner(uri, seaweed.options)
        assert live.checkpointer is not None
        live.checkpointer.compactor = compactors[seed]
        for epoch in range(1, 7):
            live.process(records(seed, epoch))
            live.checkpoint()
            live.checkpointer.drain()  # compaction between epochs, as with a real epoch interval
        live.close()

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        list(pool.map(client, range(3)))

    remote = sum(c.remote_jobs for c in compactors)
    assert remote >= 3 * 2 * 2  # every client compacted each state's chain at least twice
    assert all(c.fallbacks == 0 for c in compactors)
    for seed in range(3):
        restored = runner(f"{prefix}/app-{seed}", seaweed.options, parallelism=3)
        manifest = restored.store.manifest() if restored.store else None
        assert manifest is not None
        # the restored epoch reads bases the workers wrote (attempt directories)
        assert any("/compacted/" in f.path and "-a1/" in f.path for f in manifest.keyed_files)
        assert dump(restored) == expected(seed, 6)
        restored.close()
    _, stats = call_json("GET", f"{gateway}/v1/stats")
    assert stats["jobs"]["succeeded"] == remote and stats["queued"] == 0
    with urllib.request.urlopen(f"{gateway}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert f'statetier_compaction_jobs_total{{outcome="succeeded"}} {float(remote)}' in text
    assert "statetier_compaction_workers_alive 2.0" in text


def _slow_request(seaweed: SeaweedFS, prefix: str) -> Any:
    """A chain of about 1 MB of inputs: at 250 kB/s a worker needs about 4 s for it."""
    requests = chain_requests(f"{prefix}/big", seaweed.options, epochs=3, keys=6000, n=12000)
    return max(requests, key=lambda r: sum(i.size for i in r.inputs))


def test_worker_killed_mid_job_is_replaced_and_the_job_completes(
    procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    gateway, _ = procs.gateway([prefix], *FAST)
    request = _slow_request(seaweed, prefix)
    total = sum(i.size for i in request.inputs)
    victim = procs.worker(gateway, [prefix], "--max-read-rate", str(total // 4))
    compactor = RemoteCompactor([gateway], timeout=60, poll_interval=0.1, failure_strategy="fail")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(compactor.compact, request)
        wait_for(
            "the job to be half-read",
            lambda: _job(gateway, request.job_id)["progress"]["bytes_done"] > 0,
        )
        victim.send_signal(signal.SIGKILL)
        victim.wait(5)
        procs.worker(gateway, [prefix])  # the Deployment's replacement pod
        result = future.result(timeout=45)
    job = _job(gateway, request.job_id)
    assert job["state"] == "succeeded" and job["attempt"] == 2
    assert "missed its heartbeats" in " ".join(job["history"])
    (output,) = result.outputs
    assert f"/{request.job_id}-a2/" in output.url
    # byte for byte what local compaction makes of the same inputs
    local = LocalCompactor(**seaweed.options).compact(
        dataclasses.replace(request, output_prefix=f"{prefix}/local")
    )
    assert (output.size, output.crc32) == (local.outputs[0].size, local.outputs[0].crc32)
    fs, path = fsspec.core.url_to_fs(output.url, **seaweed.options)
    assert fs.size(path) == output.size


@pytest.mark.slow
def test_stalled_worker_loses_its_lease_and_drops_the_job_when_it_thaws(
    procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    gateway, _ = procs.gateway([prefix], *FAST)
    request = _slow_request(seaweed, prefix)
    total = sum(i.size for i in request.inputs)
    stalled = procs.worker(gateway, [prefix], "--max-read-rate", str(total // 3))
    submitted = call_json("POST", f"{gateway}/v1/jobs", json.loads(request.to_json()))
    assert submitted[0] == 202
    wait_for("progress", lambda: _job(gateway, request.job_id)["progress"]["bytes_done"] > 0)
    stalled.send_signal(signal.SIGSTOP)  # frozen: no heartbeats, no progress
    try:
        wait_for("requeued", lambda: _job(gateway, request.job_id)["state"] == "queued")
        procs.worker(gateway, [prefix])
        job = wait_for(
            "success on the other worker",
            lambda: (j := _job(gateway, request.job_id))["state"] == "succeeded" and j,
            timeout=30,
        )
    finally:
        stalled.send_signal(signal.SIGCONT)
    assert job["attempt"] == 2
    # the thawed worker learns at its next heartbeat that the job is gone and drops it (a late
    # answer would be refused: see the scheduler tests); the result stays the second attempt's
    log = procs.workdir / "worker-1.log"
    dropped, refused = f"dropping job {request.job_id}", f"result of job {request.job_id} discarded"
    wait_for(
        "the thawed worker to drop the job or have its late result refused",
        lambda: dropped in log.read_text() or refused in log.read_text(),
        timeout=10,
    )
    again = _job(gateway, request.job_id)
    assert again["result"] == job["result"] and again["attempt"] == 2


def test_abort_a_queued_and_a_running_job(
    procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    gateway, _ = procs.gateway([prefix], *FAST)
    request = _slow_request(seaweed, prefix)
    # queued: no worker yet
    queued = dataclasses.replace(request, job_id="queued-one")
    assert call_json("POST", f"{gateway}/v1/jobs", json.loads(queued.to_json()))[0] == 202
    status, body = call_json("DELETE", f"{gateway}/v1/jobs/queued-one")
    assert status == 200 and body["state"] == "aborted"
    # running: a slow worker has read part of it
    total = sum(i.size for i in request.inputs)
    procs.worker(gateway, [prefix], "--max-read-rate", str(total // 4))
    assert call_json("POST", f"{gateway}/v1/jobs", json.loads(request.to_json()))[0] == 202
    wait_for("progress", lambda: _job(gateway, request.job_id)["progress"]["bytes_done"] > 0)
    status, body = call_json("DELETE", f"{gateway}/v1/jobs/{request.job_id}")
    assert status == 200 and body["state"] == "aborted"
    # the worker drops it (nothing written) and is free for the next job
    follow = dataclasses.replace(request, job_id="after-abort")
    call_json("POST", f"{gateway}/v1/jobs", json.loads(follow.to_json()))
    wait_for("next job runs", lambda: _job(gateway, "after-abort")["state"] == "succeeded", 30)
    fs, root = fsspec.core.url_to_fs(request.output_prefix, **seaweed.options)
    written = [p for p in fs.find(root) if f"/{request.job_id}-a" in p]
    assert written == []
    assert _job(gateway, request.job_id)["state"] == "aborted"


@pytest.mark.parametrize("strategy", ["fallback", "fail"])
def test_gateway_down_falls_back_or_fails_within_the_timeout(
    seaweed: SeaweedFS, prefix: str, strategy: str
) -> None:
    (request,) = chain_requests(f"{prefix}/down", seaweed.options, keys=50, n=60)[:1]
    dead = f"http://127.0.0.1:{free_port()}"
    local = LocalCompactor(**seaweed.options)
    compactor = RemoteCompactor(
        [dead], timeout=5, retries=2, failure_strategy=strategy, fallback=local
    )
    started = time.monotonic()
    if strategy == "fail":
        with pytest.raises(CompactionError, match="unreachable"):
            compactor.compact(request)
    else:
        result = compactor.compact(request)
        assert compactor.fallbacks == 1
        assert result.outputs[0].url == f"{request.output_prefix}/{request.key_groups}.base.kgd"
    assert time.monotonic() - started < 5


def test_no_worker_times_out_aborts_the_job_and_falls_back(
    procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    gateway, _ = procs.gateway([prefix], *FAST)
    (request,) = chain_requests(f"{prefix}/idle", seaweed.options, keys=50, n=60)[:1]
    compactor = RemoteCompactor(
        [gateway], timeout=1.5, retries=3, fallback=LocalCompactor(**seaweed.options)
    )
    started = time.monotonic()
    result = compactor.compact(request)
    assert time.monotonic() - started < 1.5 + 1.0  # the local merge itself is quick
    assert compactor.fallbacks == 1 and result.outputs
    assert _job(gateway, request.job_id)["state"] == "aborted"  # nobody keeps a worker busy


def test_endpoints_added_and_removed_while_running(
    procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    first, _ = procs.gateway([prefix], *FAST)
    second, _ = procs.gateway([prefix], *FAST)
    procs.worker(second, [prefix])
    requests = chain_requests(f"{prefix}/eps", seaweed.options, keys=80, n=100)
    compactor = RemoteCompactor([first], timeout=20, retries=0, failure_strategy="fail")
    compactor.remove_endpoints(first)
    compactor.add_endpoints(second)
    assert compactor.endpoints == (second,)
    result = compactor.compact(requests[0])
    assert result.outputs and _job(second, requests[0].job_id)["state"] == "succeeded"
    assert call_json("GET", f"{first}/v1/jobs/{requests[0].job_id}")[0] == 404


def test_jobs_move_on_when_a_worker_leaves_cleanly(
    procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    gateway, _ = procs.gateway([prefix], *FAST, "--lease-ttl", "30")
    request = _slow_request(seaweed, prefix)
    total = sum(i.size for i in request.inputs)
    leaving = procs.worker(gateway, [prefix], "--max-read-rate", str(total // 4))
    assert call_json("POST", f"{gateway}/v1/jobs", json.loads(request.to_json()))[0] == 202
    wait_for("progress", lambda: _job(gateway, request.job_id)["progress"]["bytes_done"] > 0)
    procs.stop(leaving)  # SIGTERM: the worker tells the gateway it leaves
    # requeued at once, not after the 30 s lease
    wait_for("requeued", lambda: _job(gateway, request.job_id)["state"] == "queued", timeout=5)
    procs.worker(gateway, [prefix])
    wait_for("done", lambda: _job(gateway, request.job_id)["state"] == "succeeded", timeout=30)
    assert "left" in " ".join(_job(gateway, request.job_id)["history"])


def test_a_stop_signal_ends_the_worker_even_while_its_loop_holds_the_lock(
    procs: Processes, prefix: str, tmp_path: Path
) -> None:
    """SIGTERM lands while the main thread holds the worker's lock (here made certain by a lock
    that signals; on a busy machine it is a matter of timing): the worker still leaves the gateway
    and exits. A handler that took the lock itself deadlocked, and the worker outlived a killed
    benchmark (CI, 2026-12-01)."""
    gateway, _ = procs.gateway([prefix], "--lease-ttl", "60", "--heartbeat-interval", "0.3")
    helper = str(Path(__file__).with_name("worker_signalled_under_lock.py"))
    args = ["worker", "--gateway", gateway, "--allowed-prefix", prefix]
    with open(tmp_path / "signalled-worker.log", "w") as log:
        worker = subprocess.Popen(
            [sys.executable, helper, *args], env=procs.env, stdout=subprocess.DEVNULL, stderr=log
        )
    try:
        assert worker.wait(30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    # it left (a 60 s lease would keep an expired one counted for a minute)
    assert call_json("GET", f"{gateway}/v1/stats")[1]["workers"] == 0
    assert "left" in (tmp_path / "gateway-0.log").read_text()


def test_health_and_readiness(procs: Processes, prefix: str) -> None:
    gateway, _ = procs.gateway([prefix], *FAST)
    assert call_json("GET", f"{gateway}/healthz")[0] == 200
    assert call_json("GET", f"{gateway}/readyz")[0] == 503  # no worker: jobs could not run
    worker = procs.worker(gateway, [prefix])
    wait_for("ready", lambda: call_json("GET", f"{gateway}/readyz")[0] == 200)
    worker.send_signal(signal.SIGKILL)
    wait_for("not ready", lambda: call_json("GET", f"{gateway}/readyz")[0] == 503, timeout=10)


def test_configuration_selects_the_remote_compactor(
    procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    from statetier.backend.compaction_client import compactor_for
    from statetier.backend.config import load_config
    from statetier.backend.snapshot import SnapshotStore

    gateway, _ = procs.gateway([prefix], *FAST)
    procs.worker(gateway, [prefix])
    store = SnapshotStore(f"{prefix}/cfg", **seaweed.options)
    assert isinstance(compactor_for(load_config({}, env={}), store), LocalCompactor)
    config = load_config(
        {"compaction.endpoints": f"http://127.0.0.1:1, {gateway}", "compaction.timeout": "20s"},
        env={"STATETIER_COMPACTION_FAILURE_STRATEGY": "fail", "STATETIER_COMPACTION_RETRIES": "1"},
    )
    remote = compactor_for(config, store)
    assert isinstance(remote, RemoteCompactor)
    assert remote.endpoints == ("http://127.0.0.1:1", gateway) and remote.retries == 1
    (request,) = chain_requests(f"{prefix}/cfg", seaweed.options, keys=30, n=40)[:1]
    result = remote.compact(request)  # the dead first endpoint costs one retry
    assert result.outputs and remote.remote_jobs == 1 and remote.fallbacks == 0
    # the local runner's checkpointer takes its compactor from the same configuration
    live = runner(f"{prefix}/cfg-runner", seaweed.options)
    configured = LocalRunner(
        SumAndLast,
        2,
        max_parallelism=MAX_P,
        checkpoint_uri=f"{prefix}/cfg-runner2",
        storage_options=seaweed.options,
        config=load_config({"compaction.endpoints": gateway, "compaction.delta-trigger": 2}),
    )
    assert configured.checkpointer is not None and live.checkpointer is not None
    assert isinstance(live.checkpointer.compactor, LocalCompactor)
    chosen = configured.checkpointer.compactor
    assert isinstance(chosen, RemoteCompactor)
    for epoch in range(1, 4):
        configured.process(records(3, epoch))
        configured.checkpoint()
        configured.checkpointer.drain()
    assert chosen.remote_jobs >= 2 and chosen.fallbacks == 0
    configured.close()
    live.close()


@pytest.mark.slow
def test_benchmark_runs_and_reports_its_figures() -> None:
    from statetier.tools.bench.compaction import run

    figures = run(keys=5000, deltas=2, value_size=50, repeats=1)
    assert figures["input_bytes"] > figures["output_bytes"] > 0
    assert figures["ratio_to_raw"] > 0 and 0 < figures["cpu_share_moved_off"] <= 1


@pytest.mark.slow
def test_remote_compaction_overlapping_back_to_back_epochs_restores_exactly(
    procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    """No pause between epochs: remote compactions finish while later epochs are committed, so
    some results arrive for chains that moved on (and are then not named)."""
    gateway, _ = procs.gateway([prefix], *FAST)
    procs.worker(gateway, [prefix])
    live = runner(f"{prefix}/busy", seaweed.options)
    assert live.checkpointer is not None
    compactor = RemoteCompactor([gateway], timeout=30, poll_interval=0.1, failure_strategy="fail")
    live.checkpointer.compactor = compactor
    for epoch in range(1, 9):
        live.process(records(11, epoch))
        live.checkpoint()
    live.checkpointer.drain()
    live.close()
    assert compactor.remote_jobs > 0
    restored = runner(f"{prefix}/busy", seaweed.options, parallelism=3)
    assert restored.restored_epoch == 8
    assert dump(restored) == expected(11, 8)
    restored.close()


def test_a_status_call_with_wait_answers_when_the_job_finishes(
    procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    gateway, _ = procs.gateway([prefix], *FAST)
    request = _slow_request(seaweed, prefix)
    assert call_json("POST", f"{gateway}/v1/jobs", json.loads(request.to_json()))[0] == 202
    url = f"{gateway}/v1/jobs/{request.job_id}"
    started = time.monotonic()
    status, body = call_json("GET", f"{url}?wait=0.4", timeout=5)
    assert status == 200 and body["state"] == "queued"  # no worker: held for the whole wait
    assert 0.35 < time.monotonic() - started < 3
    assert call_json("GET", f"{url}?wait=soon")[0] == 400
    total = sum(i.size for i in request.inputs)
    procs.worker(gateway, [prefix], "--max-read-rate", str(total // 3))  # 3 s of reading
    started = time.monotonic()
    status, body = call_json("GET", f"{url}?wait=20", timeout=30)
    answered = time.monotonic() - started
    assert status == 200 and body["state"] == "succeeded" and body["result"]["outputs"]
    assert 2.0 < answered < 20  # held while the worker read, answered when it finished
    # a client asking every 5 s still gets the result as soon as the job is done: one that
    # slept between quick polls (20 ms doubling to 5 s) would learn of it seconds late
    client = RemoteCompactor([gateway], timeout=60, poll_interval=5, failure_strategy="fail")
    again = dataclasses.replace(request, job_id=f"{request.job_id}-again")
    started = time.monotonic()
    assert client.compact(again).outputs
    waited = time.monotonic() - started
    job = _job(gateway, again.job_id)
    assert waited - (job["finished_at"] - job["submitted_at"]) < 1.0
