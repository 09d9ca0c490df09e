"""One active operator at a time: two replicas peer through a KopfPeering; the one with the
higher priority works, the other pauses, and takes over when the first stops."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from statetier.kubetest.processes import Sandbox, compaction_service_manifest, free_port

REPO = Path(__file__).resolve().parents[2]
DEPLOY = "/apis/apps/v1/namespaces/default/deployments"


@pytest.fixture
def peers(tmp_path: Path) -> Iterator[tuple[Sandbox, list[subprocess.Popen[bytes]], list[Path]]]:
    with Sandbox(tmp_path, operator=False, webhooks=False) as box:
        box.kubectl("apply", "-f", str(REPO / "crds"))
        box.kubectl(
            "apply",
            "-f",
            "-",
            stdin=json.dumps(
                {
                    "apiVersion": "kopf.dev/v1",
                    "kind": "KopfPeering",
                    "metadata": {"name": "statetier", "namespace": "default"},
                }
            ),
        )
        procs: list[subprocess.Popen[bytes]] = []
        logs: list[Path] = []
        env = {**os.environ, "KUBECONFIG": box.kubeconfig}
        try:
            for priority in (100, 10):
                command = [a for a in box.operator_command() if a != "--standalone"]
                command[command.index("--metrics-port") + 1] = "0"
                command[command.index("--liveness") + 1] = f"http://127.0.0.1:{free_port()}/healthz"
                command += ["--peering", "statetier", "--priority", str(priority), "--verbose"]
                log = tmp_path / f"operator-{priority}.log"
                with open(log, "wb") as handle:
                    procs.append(
                        subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
                    )
                logs.append(log)
                box.wait(
                    f"replica {priority} in the peering",
                    lambda p=priority: any(
                        peer.get("priority") == p
                        for peer in (
                            box.get(
                                "/apis/kopf.dev/v1/namespaces/default/kopfpeerings/statetier"
                            ).get("status")
                            or {}
                        ).values()
                        if isinstance(peer, dict)
                    ),
                )
            yield box, procs, logs
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait(timeout=15)


@pytest.mark.slow
def test_only_the_higher_priority_replica_works(
    peers: tuple[Sandbox, list[subprocess.Popen[bytes]], list[Path]],
) -> None:
    box, procs, logs = peers
    box.kubectl("apply", "-f", "-", stdin=compaction_service_manifest("first"))
    box.wait("first reconciled", lambda: box.get(f"{DEPLOY}/first-workers"))
    box.wait("log line", lambda: "reconciled default/first" in logs[0].read_text())
    assert "reconciled default/first" not in logs[1].read_text()
    standby = logs[1].read_text()
    assert "Pausing the watch-stream for compactionservices" in standby
    assert "Resuming operations" not in standby  # it started paused and stayed so

    procs[0].terminate()
    procs[0].wait(timeout=15)
    box.kubectl("apply", "-f", "-", stdin=compaction_service_manifest("second"))
    box.wait(
        "second reconciled by the standby", lambda: box.get(f"{DEPLOY}/second-workers"), timeout=30
    )
    box.wait("standby's log line", lambda: "reconciled default/second" in logs[1].read_text())
