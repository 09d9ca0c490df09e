"""SparkApplication lifecycle with the running operator: compaction endpoint from the
CompactionService status, events, managed-application metric, checkpoint retention."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from statetier.kubetest.processes import Sandbox, compaction_service_manifest

SPARK = "/apis/sparkoperator.k8s.io/v1beta2/namespaces/default/sparkapplications"
CS = "/apis/statetier.io/v1alpha1/namespaces/default/compactionservices"


def _app(name: str, **annotations: str) -> str:
    return json.dumps(
        {
            "apiVersion": "sparkoperator.k8s.io/v1beta2",
            "kind": "SparkApplication",
            "metadata": {
                "name": name,
                "namespace": "default",
                "annotations": {"statetier.io/enabled": "true", **annotations},
            },
            "spec": {
                "type": "Python",
                "mode": "cluster",
                "executor": {"cores": 1, "memory": "2g", "instances": 1},
            },
        }
    )


def _events(box: Sandbox, name: str) -> list[tuple[str, str, str]]:
    return [
        (e["type"], e["reason"], e["message"])
        for e in box.get("/api/v1/namespaces/default/events")["items"]
        if e["involvedObject"]["name"] == name
    ]


def _metric(box: Sandbox, name: str) -> float | None:
    url = f"http://127.0.0.1:{box.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def test_compaction_endpoint_comes_from_the_service_status(sandbox: Sandbox) -> None:
    sandbox.kubectl(
        "apply", "-f", "-", stdin=compaction_service_manifest("cmp", gateway={"port": 9000})
    )
    sandbox.wait("endpoint", lambda: sandbox.get(f"{CS}/cmp").get("status", {}).get("endpoint"))
    # The index that feeds the webhook follows the watch stream: give it the same moment.
    sandbox.wait(
        "endpoint in the app",
        lambda: (
            sandbox.kubectl(
                "apply",
                "-f",
                "-",
                stdin=_app("uses-cmp", **{"statetier.io/compaction-service": "cmp"}),
            )
            and sandbox.get(f"{SPARK}/uses-cmp")["spec"]["sparkConf"].get(
                "spark.statetier.compaction.endpoints"
            )
            == "http://cmp-gateway.default.svc:9000"
        ),
    )
    spec = sandbox.get(f"{SPARK}/uses-cmp")["spec"]
    # The token reaches driver and executors from the service's generated Secret, never as a
    # value and never in sparkConf.
    token = {
        "name": "STATETIER_COMPACTION_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "cmp-compaction-token", "key": "token"}},
    }
    for role in ("driver", "executor"):
        assert [e for e in spec[role]["env"] if "TOKEN" in e["name"]] == [token]
    assert not [k for k, v in spec["sparkConf"].items() if "token" in k.lower()]
    secret = sandbox.get("/api/v1/namespaces/default/secrets/cmp-compaction-token")
    assert not [v for v in spec["sparkConf"].values() if secret["data"]["token"] in v]
    # A 2g Python executor: budget 0.5 x 2g; overhead max(384Mi, 0.4 x 2g) + budget + 256Mi.
    assert spec["sparkConf"]["spark.statetier.memory.budget"] == str(1 << 30)
    assert spec["executor"]["memoryOverhead"] == f"{819 + 1024 + 256}m"


def test_a_service_with_its_own_token_secret_gives_that_one(sandbox: Sandbox) -> None:
    own = compaction_service_manifest("owntok", tokenSecretRef={"name": "shared", "key": "k"})
    sandbox.kubectl("apply", "-f", "-", stdin=own)
    sandbox.wait("endpoint", lambda: sandbox.get(f"{CS}/owntok").get("status", {}).get("endpoint"))
    ref = {"statetier.io/compaction-service": "owntok"}

    def configured() -> bool:
        sandbox.kubectl("apply", "-f", "-", stdin=_app("uses-owntok", **ref))
        env = sandbox.get(f"{SPARK}/uses-owntok")["spec"]["executor"].get("env") or []
        return any(e["name"] == "STATETIER_COMPACTION_TOKEN" for e in env)

    sandbox.wait("token in the app", configured)
    spec = sandbox.get(f"{SPARK}/uses-owntok")["spec"]
    for role in ("driver", "executor"):
        (var,) = [e for e in spec[role]["env"] if e["name"] == "STATETIER_COMPACTION_TOKEN"]
        assert var["valueFrom"]["secretKeyRef"] == {"name": "shared", "key": "k"}
    assert sandbox.get("/api/v1/namespaces/default/secrets/owntok-compaction-token") is None


def test_missing_compaction_service_is_a_warning_not_a_failure(sandbox: Sandbox) -> None:
    out = sandbox.kubectl(
        "apply", "-f", "-", stdin=_app("no-cmp", **{"statetier.io/compaction-service": "nope"})
    )
    assert "created" in out
    stored = sandbox.get(f"{SPARK}/no-cmp")
    assert "spark.statetier.compaction.endpoints" not in stored["spec"]["sparkConf"]
    summary = json.loads(stored["metadata"]["annotations"]["statetier.io/status"])
    assert any("CompactionService default/nope not found" in w for w in summary["warnings"])


def _never_finalized(box: Sandbox, name: str, seconds: float = 1.5) -> bool:
    """No finalizer appears on the application for ``seconds`` after kopf first processed it
    (its StatetierConfigured event, posted in that same processing, is there); kopf adds a
    finalizer it wants at the end of that processing, well within the time."""
    box.wait("configured", lambda: any(e[1] == "StatetierConfigured" for e in _events(box, name)))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _has_finalizer(box, name):
            return False
        time.sleep(0.05)
    return True


def test_configured_event_no_finalizer_and_managed_metric(sandbox: Sandbox) -> None:
    """The default retention (retain) has nothing to do on deletion: no finalizer, so the
    deletion never waits for the operator; the operator, up, still says the checkpoints stay."""
    sandbox.kubectl("apply", "-f", "-", stdin=_app("evented"))
    events = sandbox.wait(
        "StatetierConfigured",
        lambda: [e for e in _events(sandbox, "evented") if e[1] == "StatetierConfigured"],
    )
    assert '"spillVolume":"emptyDir"' in events[0][2]
    assert _never_finalized(sandbox, "evented")
    managed = sandbox.wait(
        "gauge", lambda: _metric(sandbox, "statetier_operator_managed_applications")
    )
    assert managed >= 1
    sandbox.kubectl("delete", "sparkapplication", "evented", "--wait=false")
    sandbox.wait("deleted", lambda: sandbox.get(f"{SPARK}/evented") is None)
    sandbox.wait(
        "CheckpointsRetained",
        lambda: any(e[1] == "CheckpointsRetained" for e in _events(sandbox, "evented")),
    )


def _checkpoint_dir(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    (root / "epoch-1").mkdir(parents=True)
    (root / "epoch-1" / "manifest.json").write_text("{}")
    return root


def _has_finalizer(box: Sandbox, name: str) -> bool:
    found = box.get(f"{SPARK}/{name}")
    return found is not None and "statetier.io/finalizer" in (
        found["metadata"].get("finalizers") or []
    )


def _delete_and_wait(sandbox: Sandbox, name: str, reason: str) -> list[tuple[str, str, str]]:
    """Delete, wait until the object is gone and the event (posted by kopf in the background,
    so possibly a moment after the object) has arrived."""
    sandbox.kubectl("delete", "sparkapplication", name, "--wait=false")
    sandbox.wait("deletion", lambda: sandbox.get(f"{SPARK}/{name}") is None, timeout=30)
    return list(
        sandbox.wait(
            f"{reason} event",
            lambda: any(e[1] == reason for e in _events(sandbox, name)) and _events(sandbox, name),
        )
    )


def test_retention_retain_keeps_checkpoints(sandbox: Sandbox, tmp_path: Path) -> None:
    root = _checkpoint_dir(tmp_path, "kept")
    sandbox.kubectl(
        "apply", "-f", "-", stdin=_app("keep", **{"statetier.io/checkpoint-uri": f"file://{root}"})
    )
    assert _never_finalized(sandbox, "keep")
    events = _delete_and_wait(sandbox, "keep", "CheckpointsRetained")
    assert (root / "epoch-1" / "manifest.json").exists()
    assert (
        "Normal",
        "CheckpointsRetained",
        f"checkpoints kept at file://{root}",
    ) in events


def _deleting_app(name: str, uri: str) -> str:
    return _app(
        name,
        **{"statetier.io/checkpoint-uri": uri, "statetier.io/checkpoint-retention": "delete"},
    )


def test_retention_delete_removes_checkpoints(sandbox: Sandbox, tmp_path: Path) -> None:
    root = _checkpoint_dir(tmp_path, "dropped")
    sandbox.kubectl("apply", "-f", "-", stdin=_deleting_app("drop", f"file://{root}"))
    sandbox.wait("finalizer", lambda: _has_finalizer(sandbox, "drop"))
    events = _delete_and_wait(sandbox, "drop", "CheckpointsDeleted")
    assert not root.exists()
    assert any(reason == "CheckpointsDeleted" for _, reason, _ in events)


def test_finalizer_goes_when_retention_goes_back_to_retain(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """kopf removes its finalizer once no delete handler needs it: here on the update that
    switches retention back to retain (an application finalized by an earlier version loses
    it the same way, when the operator next processes it)."""
    root = _checkpoint_dir(tmp_path, "switched")
    sandbox.kubectl("apply", "-f", "-", stdin=_deleting_app("switch", f"file://{root}"))
    sandbox.wait("finalizer", lambda: _has_finalizer(sandbox, "switch"))
    sandbox.kubectl(
        "annotate",
        "sparkapplication",
        "switch",
        "statetier.io/checkpoint-retention=retain",
        "--overwrite",
    )
    sandbox.wait("no finalizer", lambda: not _has_finalizer(sandbox, "switch"))
    _delete_and_wait(sandbox, "switch", "CheckpointsRetained")
    assert (root / "epoch-1" / "manifest.json").exists()


def test_unreachable_object_store_never_blocks_deletion(sandbox: Sandbox) -> None:
    """The operator's object store refuses connections (see conftest): the finalizer gives up
    within its timeout, says so in a Warning event, and the application goes away."""
    pytest.importorskip("s3fs")
    sandbox.kubectl(
        "apply",
        "-f",
        "-",
        stdin=_app(
            "stuck",
            **{
                "statetier.io/checkpoint-uri": "s3://unreachable/stuck",
                "statetier.io/checkpoint-retention": "delete",
            },
        ),
    )
    sandbox.wait("finalizer", lambda: _has_finalizer(sandbox, "stuck"))
    events = _delete_and_wait(sandbox, "stuck", "CheckpointDeleteFailed")
    failed = [
        (kind, message) for kind, reason, message in events if reason == "CheckpointDeleteFailed"
    ]
    assert failed, events
    kind, message = failed[0]
    assert kind == "Warning" and "s3://unreachable/stuck" in message
