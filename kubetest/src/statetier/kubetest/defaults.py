"""The defaults a real apiserver fills into built-in objects, as far as the operator meets them.

A Deployment or Service read back from a real cluster carries many fields nobody sent: the
rollout strategy, revision history, progress deadline, DNS and restart policy, termination
message path, probe timings, a cluster IP, protocols. A controller that compared what it sent
with what it reads would see them; one that applies (server-side apply) does not care. The
emulator fills them in so tests see stored objects as a cluster stores them.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

__all__ = ["apply_builtin_defaults"]

Obj = dict[str, Any]

_PROBE = {"timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}


def _container(container: Obj) -> None:
    image = str(container.get("image", ""))
    tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
    latest = tag in ("", "latest") and "@" not in image
    container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    for port in container.get("ports") or []:
        port.setdefault("protocol", "TCP")
    for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = container.get(kind)
        if isinstance(probe, dict):
            for field, value in _PROBE.items():
                probe.setdefault(field, value)
            if isinstance(probe.get("httpGet"), dict):
                probe["httpGet"].setdefault("scheme", "HTTP")


def _pod_spec(pod: Obj) -> None:
    pod.setdefault("restartPolicy", "Always")
    pod.setdefault("terminationGracePeriodSeconds", 30)
    pod.setdefault("dnsPolicy", "ClusterFirst")
    pod.setdefault("schedulerName", "default-scheduler")
    pod.setdefault("securityContext", {})
    for group in ("containers", "initContainers"):
        for container in pod.get(group) or []:
            if isinstance(container, dict):
                _container(container)


def _deployment(spec: Obj) -> None:
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
    if strategy.get("type", "RollingUpdate") == "RollingUpdate":
        strategy.setdefault("type", "RollingUpdate")
        rolling = strategy.setdefault("rollingUpdate", {})
        rolling.setdefault("maxUnavailable", "25%")
        rolling.setdefault("maxSurge", "25%")
    template = spec.get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        _pod_spec(template["spec"])


def _job(obj: Obj, spec: Obj) -> None:
    """The Job defaults of the batch/v1 API (1.31) and what its registry strategy adds on
    create: a selector on the Job's uid and the four labels its Pods carry."""
    spec.setdefault("completions", 1)
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    meta = obj.get("metadata") or {}
    uid, name = meta.get("uid"), meta.get("name")
    template = spec.get("template")
    if uid and not spec.get("selector") and isinstance(template, dict):
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        labels = template.setdefault("metadata", {}).setdefault("labels", {})
        for prefix in ("batch.kubernetes.io/", ""):
            labels[prefix + "controller-uid"] = uid
            labels[prefix + "job-name"] = name
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        _pod_spec(template["spec"])


def _service(spec: Obj) -> None:
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec["type"] != "ExternalName" and "clusterIP" not in spec:
        address = f"10.96.{secrets.randbelow(256)}.{1 + secrets.randbelow(254)}"
        spec["clusterIP"] = address
        spec.setdefault("clusterIPs", [address])
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))


def _secret(obj: Obj) -> None:
    """``stringData`` is write-only: the apiserver merges it into ``data`` (base64, its keys
    winning) and never stores it; ``type`` defaults to Opaque."""
    obj.setdefault("type", "Opaque")
    plain = obj.pop("stringData", None)
    if isinstance(plain, dict) and plain:
        encoded = {k: base64.b64encode(str(v).encode()).decode() for k, v in plain.items()}
        obj["data"] = {**(obj.get("data") or {}), **encoded}


def apply_builtin_defaults(obj: Obj) -> Obj:
    """``obj`` (a Deployment, Service, Job, Pod or Secret; others untouched) with the apiserver's
    defaults."""
    if obj.get("kind") == "Secret":
        _secret(obj)
        return obj
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return obj
    kind = obj.get("kind")
    if kind == "Deployment":
        _deployment(spec)
    elif kind == "Service":
        _service(spec)
    elif kind == "Job":
        _job(obj, spec)
    elif kind == "Pod":
        _pod_spec(spec)
    return obj
