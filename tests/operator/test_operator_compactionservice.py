"""CompactionService end to end: kubectl -> emulator -> real kopf operator -> Deployments.

The emulator behaves as a real control plane here: the Deployment controller reports status
within a second of every change (no Pod is ever ready unless a test plays the kubelet), the
garbage collector removes dependents a moment after their owner, and built-in objects come
back from their typed round trip (quantities canonical, empty lists gone).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from statetier.kubetest.processes import Sandbox
from statetier.kubetest.processes import compaction_service_manifest as _manifest

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


def _play_kubelet(box: Sandbox, name: str, ready: int) -> None:
    """There are no Pods: report ``ready`` of them ready, as the kubelet would; the emulator's
    Deployment controller derives the rest of the status (conditions, availability)."""
    box.send(
        "PATCH",
        f"{DEPLOY}/{name}/status",
        {"status": {"readyReplicas": ready, "availableReplicas": ready}},
    )


def _reported(box: Sandbox, name: str) -> bool:
    """The Deployment controller has reported on the Deployment's current generation."""
    deployment = box.get(f"{DEPLOY}/{name}")
    status = deployment.get("status") or {}
    return bool(status.get("observedGeneration") == deployment["metadata"]["generation"])


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
    assert _condition(cs, "Degraded")["status"] == "False"
    events = sandbox.wait("Reconciled event", lambda: _events(sandbox, "compaction"))
    assert any(
        reason == "Reconciled" and "Deployment compaction-workers created" in message
        for _, reason, message in events
    )
    # kubectl get shows the printer columns (the emulator renders Tables) and the short name,
    # once the status counts the worker Pod: the Deployment controller reports it
    # asynchronously, after the reconcile that created it (read at once, the column said 0)
    sandbox.wait(
        "workers current",
        lambda: sandbox.get(f"{CS}/compaction")["status"]["workers"].get("current") == 1,
    )
    header, row = sandbox.kubectl("get", "compsvc", "compaction").splitlines()
    assert header.split() == ["NAME", "ENDPOINT", "WORKERS", "READY", "AGE"]
    assert row.split()[:4] == [
        "compaction",
        "http://compaction-gateway.default.svc:8080",
        "1",  # the Deployment controller reports the worker Pod (never ready: no kubelet)
        "False",
    ]


def test_ready_and_degraded_follow_the_deployments(sandbox: Sandbox) -> None:
    sandbox.kubectl("apply", "-f", "-", stdin=_manifest("ready", workers={"min": 2, "max": 3}))
    sandbox.wait("workers", lambda: sandbox.get(f"{DEPLOY}/ready-workers"))
    _play_kubelet(sandbox, "ready-gateway", ready=1)
    _play_kubelet(sandbox, "ready-workers", ready=2)
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
    _play_kubelet(sandbox, "ready-workers", ready=1)
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
    _play_kubelet(sandbox, "scl-workers", ready=4)
    sandbox.wait(
        "status replicas", lambda: sandbox.get(f"{CS}/scl/scale")["status"]["replicas"] == 4
    )
    assert "app.kubernetes.io/instance=scl" in sandbox.get(f"{CS}/scl/scale")["status"]["selector"]


def test_invalid_bounds_are_rejected_by_the_crd_rule(sandbox: Sandbox) -> None:
    """The CRD's CEL rule refuses min > max before any validating webhook is called, as on a
    real apiserver; the webhook's own message for it is never seen."""
    out = sandbox.kubectl(
        "apply", "-f", "-", stdin=_manifest("bad", workers={"min": 5, "max": 2}), check=False
    )
    assert 'spec.workers: Invalid value: "object": workers.min must not exceed workers.max' in out
    assert "denied the request" not in out
    assert sandbox.get(f"{CS}/bad") is None
    # Only one bound given: the other is defaulted (max 4) before the rule runs.
    out = sandbox.kubectl(
        "apply", "-f", "-", stdin=_manifest("bad", workers={"min": 6}), check=False
    )
    assert "workers.min must not exceed workers.max" in out


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
    # The garbage collector works in the background: the dependents go a moment later.
    for path in (
        f"{DEPLOY}/gone-gateway",
        f"{DEPLOY}/gone-workers",
        "/api/v1/namespaces/default/services/gone-gateway",
    ):
        sandbox.wait(f"{path} collected", lambda path=path: sandbox.get(path) is None)


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


def test_a_fresh_service_is_progressing_not_degraded(sandbox: Sandbox) -> None:
    """The Deployment controller reports at once, long before any Pod is ready: while the
    rollout is under way the service is Progressing, and nobody is paged."""
    sandbox.kubectl("apply", "-f", "-", stdin=_manifest("fresh"))
    for part in ("gateway", "workers"):
        sandbox.wait(f"{part} reported", lambda part=part: _reported(sandbox, f"fresh-{part}"))
    deployments = [sandbox.get(f"{DEPLOY}/fresh-{p}") for p in ("gateway", "workers")]

    def observed() -> Any:
        cs = sandbox.get(f"{CS}/fresh")
        ready = (cs.get("status") or {}).get("conditions") and _condition(cs, "Ready")
        return ready and ready["message"] == "no gateway replica is ready" and cs

    cs = sandbox.wait("a status computed from the reported Deployments", observed)
    assert all(d["status"]["observedGeneration"] == 1 for d in deployments)
    assert _condition(cs, "Degraded")["status"] == "False", cs["status"]
    progressing = _condition(cs, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut")
    # Ready at last: the rollout completes, Progressing turns False.
    _play_kubelet(sandbox, "fresh-gateway", ready=1)
    _play_kubelet(sandbox, "fresh-workers", ready=1)
    cs = sandbox.wait(
        "rollout complete",
        lambda: (
            (c := sandbox.get(f"{CS}/fresh"))
            and _condition(c, "Progressing")["reason"] == "RolloutComplete"
            and c
        ),
    )
    assert _condition(cs, "Ready")["status"] == "True"
    assert _condition(cs, "Degraded")["reason"] == "AsExpected"


def test_no_drift_storm_on_canonical_quantities_and_empty_lists(sandbox: Sandbox) -> None:
    """The apiserver stores cpu "0.5" as 500m and 1024Mi as 1Gi: status changes of the
    Deployments must not turn into writes or "Reconciled ... (drift)" events."""
    resources = {"requests": {"cpu": "0.5", "memory": "1024Mi"}}
    sandbox.kubectl(
        "apply",
        "-f",
        "-",
        stdin=_manifest("calm", workers={"min": 2, "max": 3, "resources": resources}),
    )
    for part in ("gateway", "workers"):
        sandbox.wait(f"{part} reported", lambda part=part: _reported(sandbox, f"calm-{part}"))
    workers = sandbox.get(f"{DEPLOY}/calm-workers")
    container = workers["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}
    # Only the token's reference: no storage settings, and no empty list written for them.
    assert [e["name"] for e in container["env"]] == ["STATETIER_COMPACTION_TOKEN"]
    for ready in (1, 2, 1, 2):  # the kubelet reports, the controller follows, four times over
        _play_kubelet(sandbox, "calm-workers", ready=ready)
        _play_kubelet(sandbox, "calm-gateway", ready=1)
        sandbox.wait(
            f"{ready} ready workers in the status",
            lambda ready=ready: sandbox.get(f"{CS}/calm")["status"]["workers"]["ready"] == ready,
        )
    drift = [m for _, _, m in _events(sandbox, "calm") if "(drift)" in m or "updated" in m]
    assert drift == []
    for part in ("gateway", "workers"):
        assert sandbox.get(f"{DEPLOY}/calm-{part}")["metadata"]["generation"] == 1


def test_owned_objects_are_applied_by_the_statetier_operator_field_manager(
    sandbox: Sandbox,
) -> None:
    sandbox.kubectl("apply", "-f", "-", stdin=_manifest("owned"))
    sandbox.wait("workers", lambda: sandbox.get(f"{DEPLOY}/owned-workers"))
    sandbox.wait(
        "status", lambda: (sandbox.get(f"{CS}/owned").get("status") or {}).get("conditions")
    )
    for path in (
        f"{DEPLOY}/owned-gateway",
        f"{DEPLOY}/owned-workers",
        "/api/v1/namespaces/default/services/owned-gateway",
    ):
        entries = sandbox.get(path)["metadata"]["managedFields"]
        spec_owners = {(e["manager"], e["operation"]) for e in entries if "f:spec" in e["fieldsV1"]}
        assert spec_owners == {("statetier-operator", "Apply")}, (path, entries)
    managers = {e["manager"] for e in sandbox.get(f"{CS}/owned")["metadata"]["managedFields"]}
    assert "statetier-operator" in managers and "Python" not in managers


def test_a_new_service_is_created_once_without_conflicts(sandbox: Sandbox) -> None:
    """The reconcile handler and the Deployment-event handler both act on a new service;
    neither may lose a race to the other (HTTP 409, a lost Service POST)."""
    names = [f"race{i}" for i in range(4)]
    for name in names:
        sandbox.kubectl("apply", "-f", "-", stdin=_manifest(name))
    for name in names:
        sandbox.wait(
            f"{name} settled",
            lambda name=name: (
                _reported(sandbox, f"{name}-workers")
                and (sandbox.get(f"{CS}/{name}").get("status") or {}).get("conditions")
            ),
        )
    log = sandbox.logs()
    assert "HTTP 409" not in log and "already exists" not in log


SECRETS = "/api/v1/namespaces/default/secrets"


def _token_refs(box: Sandbox, name: str) -> list[Any]:
    """The STATETIER_COMPACTION_TOKEN source of the gateway and worker containers."""
    refs = []
    for part in ("gateway", "workers"):
        container = box.get(f"{DEPLOY}/{name}-{part}")["spec"]["template"]["spec"]["containers"][0]
        (var,) = [e for e in container["env"] if e["name"] == "STATETIER_COMPACTION_TOKEN"]
        assert "value" not in var  # never the token itself in the Deployment
        refs.append(var["valueFrom"]["secretKeyRef"])
    return refs


def _owned_secrets(box: Sandbox, uid: str) -> list[Any]:
    return [
        s
        for s in box.get(SECRETS)["items"]
        if any(ref["uid"] == uid for ref in s["metadata"].get("ownerReferences") or [])
    ]


def _images(box: Sandbox, name: str) -> set[str]:
    return {
        box.get(f"{DEPLOY}/{name}-{part}")["spec"]["template"]["spec"]["containers"][0]["image"]
        for part in ("gateway", "workers")
    }


def _observed(box: Sandbox, name: str, generation: int) -> bool:
    status = box.get(f"{CS}/{name}").get("status") or {}
    return bool(status.get("observedGeneration") == generation)


def test_a_token_secret_is_generated_once_and_survives_reconciles_and_restarts(
    sandbox: Sandbox,
) -> None:
    sandbox.kubectl("apply", "-f", "-", stdin=_manifest("tok"))
    sandbox.wait("workers", lambda: sandbox.get(f"{DEPLOY}/tok-workers"))
    uid = sandbox.get(f"{CS}/tok")["metadata"]["uid"]
    (secret,) = _owned_secrets(sandbox, uid)
    assert secret["metadata"]["name"] == "tok-compaction-token"
    (owner,) = secret["metadata"]["ownerReferences"]
    assert owner["kind"] == "CompactionService" and owner["controller"] is True
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) >= 43 and token.isascii()  # token_urlsafe(32)
    expected = {"name": "tok-compaction-token", "key": "token"}
    assert _token_refs(sandbox, "tok") == [expected, expected]
    # A reconcile (a spec change, seen applied in the Deployments) keeps the Secret as it is.
    sandbox.kubectl("apply", "-f", "-", stdin=_manifest("tok", image="statetier/compaction:2"))
    sandbox.wait("new image applied", lambda: _images(sandbox, "tok") == {"statetier/compaction:2"})
    # So does a restart of the operator (its resume handler reconciles every service) and a
    # reconcile by the new process.
    sandbox.stop_operator()
    sandbox.start_operator_process()
    sandbox.wait_for_operator()
    sandbox.kubectl("apply", "-f", "-", stdin=_manifest("tok", image="statetier/compaction:3"))
    sandbox.wait("image 3 applied", lambda: _images(sandbox, "tok") == {"statetier/compaction:3"})
    (after,) = _owned_secrets(sandbox, uid)
    assert after["data"] == secret["data"]
    assert after["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
    assert _token_refs(sandbox, "tok") == [expected, expected]
    # The Secret goes with its service.
    sandbox.kubectl("delete", "compactionservice", "tok")
    sandbox.wait("secret collected", lambda: sandbox.get(f"{SECRETS}/tok-compaction-token") is None)


def test_a_token_secret_given_by_the_user_is_used_and_none_generated(sandbox: Sandbox) -> None:
    sandbox.kubectl(
        "apply",
        "-f",
        "-",
        stdin=_manifest("usr", tokenSecretRef={"name": "team-token", "key": "api"}),
    )
    sandbox.wait("status", lambda: _observed(sandbox, "usr", 1))
    assert _token_refs(sandbox, "usr") == [{"name": "team-token", "key": "api"}] * 2
    uid = sandbox.get(f"{CS}/usr")["metadata"]["uid"]
    assert _owned_secrets(sandbox, uid) == []
    assert sandbox.get(f"{SECRETS}/usr-compaction-token") is None


def test_the_crd_refuses_a_relative_file_prefix(sandbox: Sandbox) -> None:
    """The gateway refuses to start on a prefix it cannot check: the schema refuses it first."""
    refused = ("file://relative", "file://tmp/x", "memory:///x", "s3://bucket/../x", "FILE:///x")
    for prefix in refused:
        storage = {"allowedPrefixes": ["s3://bucket/ok", prefix]}
        out = sandbox.kubectl(
            "apply", "-f", "-", stdin=_manifest("rel", objectStorage=storage), check=False
        )
        field = "spec.objectStorage.allowedPrefixes[1]"
        assert f'{field}: Invalid value: "{prefix}": {field} in body should match' in out, out
        assert sandbox.get(f"{CS}/rel") is None
    storage = {"allowedPrefixes": ["s3://bucket/ckpt/", "file:///data/ckpt", "memory://test"]}
    out = sandbox.kubectl("apply", "-f", "-", stdin=_manifest("canon", objectStorage=storage))
    assert "created" in out
