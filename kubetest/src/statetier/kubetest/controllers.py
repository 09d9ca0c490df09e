"""The Deployment controller's status, as the emulator reports it (there is no kubelet).

On a real cluster the Deployment controller writes a Deployment's status within a second of
every change, long before any Pod is ready: ``observedGeneration``, ``replicas``,
``updatedReplicas``, ``unavailableReplicas`` and the conditions ``Available`` (False,
MinimumReplicasUnavailable) and ``Progressing`` (True, NewReplicaSetCreated or
ReplicaSetUpdated; NewReplicaSetAvailable once every replica is available; False,
ProgressDeadlineExceeded after ``progressDeadlineSeconds`` without progress). The emulator
computes the same from the spec and from what the kubelet would report, which tests supply by
writing ``readyReplicas`` (and optionally ``availableReplicas``) to the status subresource.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

__all__ = ["deployment_status", "progress_deadline"]

Obj = dict[str, Any]


def _max_unavailable(spec: Obj, replicas: int) -> int:
    rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
    value = rolling.get("maxUnavailable", "25%")
    if isinstance(value, str) and value.endswith("%"):
        return math.floor(replicas * int(value[:-1]) / 100)
    return int(value)


def progress_deadline(deployment: Obj) -> int:
    """Seconds without progress after which a rollout is reported as failed (default 600)."""
    return int((deployment.get("spec") or {}).get("progressDeadlineSeconds") or 600)


def _condition(kind: str, ok: bool, reason: str, message: str, now: str, old: Obj | None) -> Obj:
    status = "True" if ok else "False"
    same = old is not None and old.get("status") == status
    unchanged = same and old is not None and old.get("reason") == reason
    return {
        "type": kind,
        "status": status,
        "lastUpdateTime": old["lastUpdateTime"] if unchanged and old else now,
        "lastTransitionTime": old["lastTransitionTime"] if same and old else now,
        "reason": reason,
        "message": message,
    }


def _progressing(
    deployment: Obj, complete: bool, now: datetime.datetime, old: Obj | None, rolled: bool
) -> tuple[bool, str, str]:
    name = deployment["metadata"]["name"]
    replica_set = f'ReplicaSet "{name}-{deployment["metadata"].get("generation", 1)}"'
    if complete or (old and old.get("reason") == "NewReplicaSetAvailable" and not rolled):
        return True, "NewReplicaSetAvailable", f"{replica_set} has successfully progressed."
    if old and rolled is False and old.get("lastUpdateTime"):
        since = datetime.datetime.strptime(old["lastUpdateTime"], "%Y-%m-%dT%H:%M:%SZ")
        age = (now.replace(tzinfo=None) - since).total_seconds()
        if age >= progress_deadline(deployment) or old.get("reason") == "ProgressDeadlineExceeded":
            return False, "ProgressDeadlineExceeded", f"{replica_set} has timed out progressing."
    reason = "ReplicaSetUpdated" if old else "NewReplicaSetCreated"
    verb = "is progressing" if old else "created"
    return True, reason, f"{replica_set} {verb}."


def deployment_status(deployment: Obj, now: datetime.datetime | None = None) -> Obj:
    """The status the Deployment controller would write now for ``deployment``."""
    moment = now or datetime.datetime.now(datetime.UTC)
    stamp = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    spec = deployment.get("spec") or {}
    old = deployment.get("status") or {}
    generation = deployment["metadata"].get("generation", 1)
    replicas = int(spec.get("replicas", 1))
    ready = min(int(old.get("readyReplicas") or 0), replicas)
    available = min(int(old.get("availableReplicas", ready) or 0), ready)
    rolled = old.get("observedGeneration") != generation  # a new spec: progress starts again
    conditions = {c["type"]: c for c in old.get("conditions") or []}
    minimum = available >= replicas - _max_unavailable(spec, replicas)
    ok, reason, message = _progressing(
        deployment, available >= replicas, moment, conditions.get("Progressing"), rolled
    )
    status: Obj = {"observedGeneration": generation, "replicas": replicas}
    status["updatedReplicas"] = replicas
    for field, value in (
        ("readyReplicas", ready),
        ("availableReplicas", available),
        ("unavailableReplicas", replicas - available),
    ):
        if value:
            status[field] = value
    status["conditions"] = [
        _condition(
            "Available",
            minimum,
            "MinimumReplicasAvailable" if minimum else "MinimumReplicasUnavailable",
            "Deployment has minimum availability."
            if minimum
            else "Deployment does not have minimum availability.",
            stamp,
            conditions.get("Available"),
        ),
        _condition("Progressing", ok, reason, message, stamp, conditions.get("Progressing")),
    ]
    return status
