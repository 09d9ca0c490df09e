"""What a StateSnapshot becomes, as pure functions: its source, its Job, its status.

A StateSnapshot is taken by a ``batch/v1`` Job that runs ``statetier checkpoint savepoint
SOURCE DEST --json`` with the storage Secret as its environment: the operator pod holds no
object-store credentials, and the copy runs where the application's own credentials are. The
command's one JSON line (``{"uri", "source", "epoch", "bytes", "files", "spark_batch"}``) goes
to the container's termination message (``/dev/termination-log``), so the operator reads the
result from the Pod's status, never from logs; on failure the message is the command's last
output lines (``FallbackToLogsOnError``), which name the problem. ``backoffLimit: 0``: a failed
snapshot stays Failed with its reason (the destination may hold a partial copy a retry would
refuse); take another one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from statetier.operator import annotations as ann

__all__ = [
    "GROUP",
    "PLURAL",
    "SCHEDULE_LABEL",
    "SCHEDULE_PLURAL",
    "SNAPSHOT_LABEL",
    "VERSION",
    "Source",
    "cleanup_job",
    "job_finished",
    "job_name",
    "job_outcome",
    "restore_spark_job",
    "savepoint_job",
    "savepoint_uri",
    "source_of",
]

Obj = dict[str, Any]
GROUP, VERSION, PLURAL = "statetier.io", "v1alpha1", "statesnapshots"
SCHEDULE_PLURAL = "scheduledstatesnapshots"
SNAPSHOT_LABEL = "statetier.io/statesnapshot"
SCHEDULE_LABEL = "statetier.io/scheduledstatesnapshot"
_RESULT_PATH = "/dev/termination-log"
_NAME_MAX = 63  # the job-name label of the Job's Pods is a label value


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a snapshot reads from and with which Secret."""

    checkpoint_uri: str
    storage_secret: str | None
    spark_checkpoint: str | None


def source_of(spec: Obj, app: Obj | None) -> Source:
    """The snapshot's source from its spec and, when it names one, the SparkApplication;
    ValueError says what is missing and how to fix it."""
    secret = spec.get("storageSecret")
    spark = spec.get("sparkCheckpointUri")
    if spec.get("checkpointUri"):
        return Source(spec["checkpointUri"], secret, spark)
    name = spec.get("sparkApplication")
    if app is None:
        raise ValueError(
            f"SparkApplication {name} not found: create it or fix spec.sparkApplication"
        )
    annotations = (app.get("metadata") or {}).get("annotations") or {}
    try:
        settings = ann.parse(annotations)
    except ValueError as exc:
        raise ValueError(f"SparkApplication {name}: {exc}") from None
    if not ann.enabled(annotations) or not settings.checkpoint_uri:
        raise ValueError(
            f"SparkApplication {name} has no {ann.PREFIX}checkpoint-uri (and "
            f"{ann.PREFIX}enabled: 'true'): nothing to snapshot; set them or use spec.checkpointUri"
        )
    return Source(settings.checkpoint_uri, secret or settings.storage_secret, spark)


def savepoint_uri(spec: Obj, namespace: str, name: str) -> str:
    """``<destination>/<namespace>/<name>``: one savepoint per StateSnapshot object."""
    return f"{str(spec['destination']).rstrip('/')}/{namespace}/{name}"


def job_name(snapshot_name: str, kind: str) -> str:
    """``<snapshot>-<kind>``, shortened with a digest of the full name beyond 63 characters."""
    name = f"{snapshot_name}-{kind}"
    if len(name) <= _NAME_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: _NAME_MAX - 9].rstrip('-')}-{digest}"


def _job(snapshot: Obj, kind: str, image: str, secret: str | None, argv: list[str]) -> Obj:
    meta = snapshot["metadata"]
    container: Obj = {
        "name": kind,
        "image": image,
        # Only stdout (the one JSON line) goes to the termination message; stderr stays the log.
        "command": ["/bin/sh", "-c", f'exec "$@" > {_RESULT_PATH}', "sh", *argv],
        "terminationMessagePath": _RESULT_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if secret:
        container["envFrom"] = [{"secretRef": {"name": secret}}]
    owner = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "StateSnapshot",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    labels = {SNAPSHOT_LABEL: meta["name"], "app.kubernetes.io/managed-by": "statetier-operator"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(meta["name"], kind),
            "namespace": meta["namespace"],
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {"restartPolicy": "Never", "containers": [container]},
            },
        },
    }


def savepoint_job(snapshot: Obj, source: Source, image: str) -> Obj:
    """The Job that takes the snapshot."""
    spec, meta = snapshot["spec"], snapshot["metadata"]
    argv = ["statetier", "checkpoint", "savepoint", source.checkpoint_uri]
    argv += [savepoint_uri(spec, meta["namespace"], meta["name"]), "--json"]
    if spec.get("epoch") is not None:
        argv += ["--epoch", str(spec["epoch"])]
    if source.spark_checkpoint:
        argv += ["--spark-checkpoint", source.spark_checkpoint]
    return _job(snapshot, "savepoint", image, source.storage_secret, argv)


def cleanup_job(snapshot: Obj, uri: str, secret: str | None, image: str) -> Obj:
    """The Job that deletes the savepoint (deletionPolicy: delete)."""
    argv = ["statetier", "checkpoint", "delete-savepoint", uri]
    return _job(snapshot, "delete", image, secret, argv)


def restore_spark_job(snapshot: Obj, spark_uri: str, secret: str | None, image: str) -> Obj:
    """The Job that writes the (Succeeded) snapshot's Spark log entries into ``spark_uri``, a
    new query's empty Spark checkpoint location (an upgrade through a savepoint)."""
    argv = ["statetier", "checkpoint", "restore-spark", snapshot["status"]["uri"], spark_uri]
    return _job(snapshot, "restore-spark", image, secret, argv)


def _terminated(pods: list[Obj]) -> Obj:
    """The last Pod's terminated container state, or {}."""
    for pod in reversed(pods):
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (status.get("state") or {}).get("terminated")
            if terminated:
                return dict(terminated)
    return {}


def _waiting(pods: list[Obj]) -> str | None:
    for pod in reversed(pods):
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting")
            if waiting and waiting.get("reason") not in (None, "ContainerCreating"):
                return f"{waiting.get('reason')}: {waiting.get('message', '')}".strip()
    return None


def job_finished(job: Obj) -> str | None:
    """``Complete`` or ``Failed`` once the Job ended, else None."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition["type"] in ("Complete", "Failed") and condition["status"] == "True":
            return str(condition["type"])
    return None


def job_outcome(job: Obj, pods: list[Obj]) -> tuple[str, Obj]:
    """(phase, status fields) of a snapshot whose Job is ``job`` with ``pods``."""
    status = job.get("status") or {}
    conditions = {c["type"]: c for c in status.get("conditions") or [] if c["status"] == "True"}
    terminated = _terminated(pods)
    message = str(terminated.get("message") or "").strip()
    if "Complete" in conditions:
        try:
            result = json.loads(message.splitlines()[-1])
            fields = {
                "uri": str(result["uri"]),
                "epoch": int(result["epoch"]),
                "bytes": int(result["bytes"]),
                "files": int(result["files"]),
                "sparkBatch": result.get("spark_batch"),
            }
        except (ValueError, KeyError, TypeError, IndexError):
            return "Failed", {
                "reason": "UnreadableResult",
                "message": f"the savepoint command succeeded but printed no result: {message!r}",
            }
        return "Succeeded", {**fields, "finishTime": status.get("completionTime")}
    if "Failed" in conditions:
        code = terminated.get("exitCode")
        detail = message or conditions["Failed"].get("message", "")
        return "Failed", {
            "reason": "SavepointFailed" if code is not None else conditions["Failed"]["reason"],
            "message": f"exit code {code}: {detail}" if code is not None else detail,
            "finishTime": conditions["Failed"].get("lastTransitionTime"),
        }
    waiting = _waiting(pods)
    pending: Obj = {"reason": "JobRunning", "message": waiting or "the savepoint Job runs"}
    return ("Running" if status.get("active") else "Pending"), pending
