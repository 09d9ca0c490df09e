"""CompactionService end to end: kubectl -> emulator -> real kopf operator -> Deployments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from statetier.operator.testing.processes import Sandbox
from statetier.operator.testing.processes import compaction_service_manifest as _manifest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "compactionservice.yaml"
DEPLOY = "/apis/apps/v1/namespaces/default/deployments"
CS = "/apis/statetier.io/v1alpha1/namespaces/default/compactionservices"


def _events(box: Sandbox, name: str) -> list[tuple[str, str, str]]:
    listing = box.get("/api/v1/namespaces/default/events")
    return [
        (e["type"], e["reason"], e["message"])
        for e in listing["items"]
        if e["involvedObject"]["name"] == name
    ]


def _condition(cs: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in cs["status"]["conditions"] if c["type"] == kind)


def _play_deployment_controller(box: Sandbox, name: str, ready: int) -> None:
    """The emulator runs no controllers: report the Deployment as a controller would."""
    current = box.get(f"{DEPLOY}/{name}")
    replicas = current["spec"]["replicas"]
    box.send(
        "PATCH",
        f"{DEPLOY}/{name}/status",
        {
            "status": {
                "observedGeneration": current["metadata"]["generation"],
                "replicas": replicas,
                "readyReplicas": min(ready, replicas),
                "availableReplicas": min(ready, replicas),
            }
        },
    )


def test_example_creates_deployments_service_status_and_event(sandbox: Sandbox) -> None:
    out = sandbox.kubectl("apply", "-f", str(EXAMPLE))
    assert "compactionservice.statetier.io/compaction created" in out
    gateway = sandbox.wait("gateway", lambda: sandbox.get(f"{DEPLOY}/compaction-gateway"))
    workers = sandbox.wait("workers", lambda: sandbox.get(f"{DEPLOY}/compaction-workers"))
    service = sandbox.wait(
        "service", lambda: sandbox.get("/api/v1/namespaces/default/services/compaction-gateway")
    )
    cs = sandbox.get(f"{CS}/compaction")
    for obj in (gateway, workers, service):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == cs["metadata"]["uid"] and ref["controller"] is True
    assert workers["spec"]["replicas"] == 1  # min of the example
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "statetier/compaction:0.1.0"
    assert "--allowed-prefix" in container["args"]
    assert {"name": "AWS_ENDPOINT_URL", "value": "http://seaweedfs.storage.svc:8333"} in container[
        "env"
    ]
    assert service["spec"]["ports"][0]["port"] == 8080

    cs = sandbox.wait("status", lambda: (c := sandbox.get(f"{CS}/compaction")).get("status") and c)
    status = cs["status"]
    assert status["endpoint"] == "http://compaction-gateway.default.svc:8080"
    assert status["observedGeneration"] == cs["metadata"]["generation"]
    assert status["workers"]["desired"] == 1
    assert _condition(cs, "Ready")["status"] == "False"
    assert _condition(cs, "Ready")["reason"] == "GatewayUnavailable"
    assert _condition(cs, "Degraded")["reason"] == "Progressing"
    events = sandbox.wait("Reconciled event", lambda: _events(sandbox, "compaction"))
    assert any(
        reason == "Reconciled" and "Deployment compaction-workers created" in message
        for _, reason, message in events
    )
    # kubectl get shows the printer columns (the emulator renders Tables) and the short name.
    header, row = sandbox.kubectl("get", "compsvc", "compaction").splitlines()
    assert header.split() == ["NAME", "ENDPOINT", "WORKERS", "READY", "AGE"]
    assert row.split()[:4] == [
        "compaction",
        "http://compaction-gateway.default.svc:8080",
        "0",
        "False",
    ]


def test_ready_and_degraded_follow_the_deployments(sandbox: Sandbox) -> None:
    sandbox.kubectl("apply", "-f", "-", stdin=_manifest("ready", workers={"min": 2, "max": 3}))
    sandbox.wait("workers", lambda: sandbox.get(f"{DEPLOY}/ready-workers"))
    _play_deployment_controller(sandbox, "ready-gateway", ready=1)
    _play_deployment_controller(sandbox, "ready-workers", ready=2)
    cs = sandbox.wait(
        "Ready=True",
        lambda: (
            (c := sandbox.get(f"{CS}/ready")) and _condition(c, "Ready")["status"] == "True" and c
        ),
    )
    assert _condition(cs, "Ready")["reason"] == "AllReplicasReady"
    assert _condition(cs, "Degraded")["status"] == "False"
    assert cs["status"]["workers"]["ready"] == 2 and cs["status"]["gateway"]["ready"] == 1
    # A worker goes away: below the minimum of 2 -> Degraded with a reason.
    _play_deployment_controller(sandbox, "ready-workers", ready=1)
    cs = sandbox.wait(
        "Degraded=True",
        lambda: (
            (c := sandbox.get(f"{CS}/ready"))
            and _condition(c, "Degraded")["status"] == "True"
            and c
        ),
    )
    assert _condition(cs, "Degraded")["reason"] == "WorkersBelowMinimum"
    assert _condition(cs, "Ready")["reason"] == "WorkersUnavailable"


def test_update_image_and_bounds_roll_out(sandbox: Sandbox) -> None:
    sandbox.kubectl("apply", "-f", "-", stdin=_manifest("upd", workers={"min": 1, "max": 4}))
    sandbox.wait("workers", lambda: sandbox.get(f"{DEPLOY}/upd-workers"))
    sandbox.kubectl(
        "apply",
        "-f",
        "-",
        stdin=_manifest("upd", image="statetier/compaction:2", workers={"min": 3, "max": 5}),
    )

    def rolled() -> Any:
        workers = sandbox.get(f"{DEPLOY}/upd-workers")
        gateway = sandbox.get(f"{DEPLOY}/upd-gateway")
        images = {
            d["spec"]["template"]["spec"]["containers"][0]["image"] for d in (workers, gateway)
        }
        return images == {"statetier/compaction:2"} and workers["spec"]["replicas"] == 3

    sandbox.wait("new image and min=3", rolled)
    cs = sandbox.wait(
        "status of generation 2",
        lambda: (
            (c := sandbox.get(f"{CS}/upd"))["status"]["observedGeneration"]
            == c["metadata"]["generation"]
            and c["status"]["workers"]["desired"] == 3
            and c
        ),
    )
    assert cs["metadata"]["generation"] == 2


def test_scale_subresource_is_clamped_to_bounds(sandbox: Sandbox) -> None:
    sandbox.kubectl("apply", "-f", "-", stdin=_manifest("scl", workers={"min": 1, "max": 4}))
    sandbox.wait("workers", lambda: sandbox.get(f"{DEPLOY}/scl-workers"))
    assert "scaled" in sandbox.kubectl("scale", "compactionservice/scl", "--replicas=3")
    sandbox.wait("3 workers", lambda: sandbox.get(f"{DEPLOY}/scl-workers")["spec"]["replicas"] == 3)
    sandbox.kubectl("scale", "compsvc/scl", "--replicas=10")
    sandbox.wait(
        "clamped to max 4",
        lambda: (
            sandbox.get(f"{DEPLOY}/scl-workers")["spec"]["replicas"] == 4
            and sandbox.get(f"{CS}/scl")["status"]["workers"]["desired"] == 4
        ),
    )
    scale = sandbox.get(f"{CS}/scl/scale")
    assert scale["spec"]["replicas"] == 10  # what was asked; the status says what is desired
    _play_deployment_controller(sandbox, "scl-workers", ready=4)
    sandbox.wait(
        "status replicas", lambda: sandbox.get(f"{CS}/scl/scale")["status"]["replicas"] == 4
    )
    assert "app.kubernetes.io/instance=scl" in sandbox.get(f"{CS}/scl/scale")["status"]["selector"]


def test_invalid_bounds_are_rejected_by_the_validating_webhook(sandbox: Sandbox) -> None:
    out = sandbox.kubectl(
        "apply", "-f", "-", stdin=_manifest("bad", workers={"min": 5, "max": 2}), check=False
    )
    assert "denied the request" in out and "workers.min (5) exceeds workers.max (2)" in out
    assert sandbox.get(f"{CS}/bad") is None


def test_drift_is_put_back(sandbox: Sandbox) -> None:
    sandbox.kubectl("apply", "-f", "-", stdin=_manifest("drift"))
    sandbox.wait("workers", lambda: sandbox.get(f"{DEPLOY}/drift-workers"))
    sandbox.kubectl("scale", "deployment/drift-workers", "--replicas=7")
    sandbox.wait(
        "replicas back to 1",
        lambda: sandbox.get(f"{DEPLOY}/drift-workers")["spec"]["replicas"] == 1,
    )
    sandbox.kubectl("delete", "deployment", "drift-gateway")
    sandbox.wait("gateway recreated", lambda: sandbox.get(f"{DEPLOY}/drift-gateway"))
    assert any("(drift)" in message for _, _, message in _events(sandbox, "drift"))


def test_delete_removes_owned_objects(sandbox: Sandbox) -> None:
    sandbox.kubectl("apply", "-f", "-", stdin=_manifest("gone"))
    sandbox.wait("workers", lambda: sandbox.get(f"{DEPLOY}/gone-workers"))
    sandbox.kubectl("delete", "compactionservice", "gone")
    assert sandbox.get(f"{CS}/gone") is None
    for path in (
        f"{DEPLOY}/gone-gateway",
        f"{DEPLOY}/gone-workers",
        "/api/v1/namespaces/default/services/gone-gateway",
    ):
        assert sandbox.get(path) is None, path


def test_namespaces_outside_the_watched_ones_are_left_alone(sandbox: Sandbox) -> None:
    """The operator runs with --namespace default: another namespace is not its business."""
    sandbox.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}}),
    )
    sandbox.kubectl("apply", "-f", "-", stdin=_manifest("elsewhere", namespace="other"))
    # A control object in the watched namespace proves the operator is working meanwhile.
    sandbox.kubectl("apply", "-f", "-", stdin=_manifest("control"))
    sandbox.wait("control reconciled", lambda: sandbox.get(f"{DEPLOY}/control-workers"))
    assert sandbox.get("/apis/apps/v1/namespaces/other/deployments/elsewhere-workers") is None
    other = sandbox.get("/apis/statetier.io/v1alpha1/namespaces/other/compactionservices/elsewhere")
    assert "status" not in other
