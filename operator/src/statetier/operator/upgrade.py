"""What a spec change of an application with ``statetier.io/upgrade-mode`` becomes, as pure
functions: the mutating webhook applies :func:`admit`, :mod:`.upgrade_handlers` carries a
savepoint upgrade through with :func:`next_step`.

The Spark Operator v2.5.2 resubmits an application whose spec changed in anything but
``suspend`` and ``timeToLiveSeconds`` (``event_filter.go``: the run is invalidated, its driver
deleted, the new spec submitted), and with ``suspend: true`` it deletes the pods and submits
nothing until ``suspend`` is false (state ``SUSPENDED``). The modes:

* ``last-state``: nothing to do; the new run resumes the checkpoint both locations hold (the
  validating webhook refuses a change of either location, :func:`last_state_problems`).
* ``stateless``: in the same admission, both locations move to new ones and a
  ``restore-from`` of the old run is dropped, so the new run starts empty. The old locations
  are left as they are.
* ``savepoint``: in the same admission, ``suspend: true`` (the old run stops, the new one is not
  submitted), both locations move and ``restore-from`` names the savepoint to be; the operator
  then snapshots the old location once the application is ``SUSPENDED`` (nothing commits
  after), restores the Spark part into the new Spark location, and sets ``suspend: false``.

Everything the operator needs is in the ``statetier.io/upgrade`` record written at admission,
so a restarted operator carries on from the record, and names are fixed (``<app>-upgrade-<n>``)
so a step done twice finds its first result.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from statetier.operator import annotations as ann
from statetier.operator import snapshot

__all__ = [
    "HOLDING",
    "SUSPENDED",
    "UPGRADE_LABEL",
    "Plan",
    "admit",
    "Step",
    "last_state_problems",
    "next_location",
    "next_step",
    "record_of",
    "record_text",
    "restore_job",
    "snapshot_body",
    "spec_changed",
]

Obj = dict[str, Any]
HOLDING = ("Suspending", "Snapshotting", "RestoringSpark", "Failed")
"""Phases in which the application stays suspended (Failed: until a retry or an abort)."""
SUSPENDED = "SUSPENDED"  # the Spark Operator's applicationState once the old pods are gone
UPGRADE_LABEL = "statetier.io/upgrade-of"
_CKPT, _SPARK = ann.PREFIX + "checkpoint-uri", ann.PREFIX + "spark-checkpoint-uri"
_RESTORE, _MODE = ann.PREFIX + "restore-from", ann.PREFIX + "upgrade-mode"
_SUFFIX = re.compile(r"-upgrade-\d+$")
_IGNORED = ("suspend", "timeToLiveSeconds")  # changes the Spark Operator does not resubmit for


def spec_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the Spark Operator resubmits for this spec change."""
    return {k: v for k, v in old.items() if k not in _IGNORED} != {
        k: v for k, v in new.items() if k not in _IGNORED
    }


def record_of(annotations: Mapping[str, Any]) -> Obj:
    """The ``statetier.io/upgrade`` record, or {} (absent or not JSON)."""
    try:
        found = json.loads(annotations.get(ann.UPGRADE) or "{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def next_location(uri: str, number: int) -> str:
    """``<uri>-upgrade-<number>``, replacing the suffix of an earlier upgrade: a sibling of the
    old location, never inside it (retention and gc of the old location see only its own)."""
    return f"{_SUFFIX.sub('', uri.rstrip('/'))}-upgrade-{number}"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the webhook changes: annotations (None removes one) and ``spec.suspend``."""

    annotations: dict[str, str | None]
    suspend: bool = False


def _moved(old: Mapping[str, str], new: Mapping[str, str], number: int) -> dict[str, str]:
    """A new location for each one the update keeps; one the user changed is theirs."""
    return {
        key: next_location(old[key], number)
        for key in (_CKPT, _SPARK)
        if old.get(key) and new.get(key) == old[key]
    }


def admit(
    old: Mapping[str, str], new: Mapping[str, str], changed: bool, name: str, namespace: str
) -> Plan:
    """The plan for an update from annotations ``old`` to ``new``; ``changed``: whether the
    Spark Operator will resubmit (:func:`spec_changed` of the mutated spec)."""
    if record_of(new).get("phase") in HOLDING:
        return Plan({}, suspend=True)  # an upgrade under way: the new run waits for it
    mode = new.get(_MODE)
    if not changed or mode not in ("savepoint", "stateless") or not old.get(_CKPT):
        return Plan({})
    if not old.get(_SPARK):
        return Plan({})  # the old run names no Spark location: nothing to carry over
    number = int(record_of(old).get("number") or 0) + 1
    moved = _moved(old, new, number)
    record: Obj = {
        "mode": mode,
        "number": number,
        "from": {"checkpointUri": old[_CKPT], "sparkCheckpointUri": old[_SPARK]},
        "to": {
            "checkpointUri": moved.get(_CKPT, new.get(_CKPT)),
            "sparkCheckpointUri": moved.get(_SPARK, new.get(_SPARK)),
        },
    }
    if mode == "stateless":
        keep = new.get(_RESTORE) if new.get(_RESTORE) != old.get(_RESTORE) else None
        record["phase"] = "Done"
        return Plan({**moved, _RESTORE: keep, ann.UPGRADE: record_text(record)})
    destination = new[ann.PREFIX + "savepoint-destination"]
    name = f"{name}-upgrade-{number}"
    uri = snapshot.savepoint_uri({"destination": destination}, namespace, name)
    record.update(phase="Suspending", snapshot=name, destination=destination, savepoint=uri)
    return Plan({**moved, _RESTORE: uri, ann.UPGRADE: record_text(record)}, suspend=True)


def record_text(record: Obj) -> str:
    """The record as the annotation holds it."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def last_state_problems(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """last-state resumes the running checkpoint: an update may not move it."""
    if new.get(_MODE) != "last-state":
        return []
    return [
        f"annotation {key} changed from {old[key]!r} to {new.get(key)!r}, but "
        f"{_MODE} is last-state, which resumes the running checkpoint: keep {old[key]!r}, or "
        f"set {_MODE} to savepoint or stateless"
        for key in (_CKPT, _SPARK)
        if old.get(key) and new.get(key) != old[key]
    ]


def snapshot_body(app: Obj, record: Obj) -> Obj:
    """The StateSnapshot of the old run's location that a savepoint upgrade takes."""
    meta = app["metadata"]
    secret = (meta.get("annotations") or {}).get(ann.PREFIX + "storage-secret")
    spec: Obj = {
        "checkpointUri": record["from"]["checkpointUri"],
        "sparkCheckpointUri": record["from"]["sparkCheckpointUri"],
        "destination": record["destination"],
        "deletionPolicy": "keep",
    }
    if secret:
        spec["storageSecret"] = secret
    return {
        "apiVersion": f"{snapshot.GROUP}/{snapshot.VERSION}",
        "kind": "StateSnapshot",
        "metadata": {
            "name": record["snapshot"],
            "namespace": meta["namespace"],
            "labels": {UPGRADE_LABEL: meta["name"]},
        },
        "spec": spec,
    }


def restore_job(snap: Obj, app_name: str, spark_uri: str, image: str) -> Obj:
    """The Job that restores the (Succeeded) snapshot's Spark part into the new run's Spark
    location, labelled with the application so that its events find the upgrade."""
    secret = (snap.get("spec") or {}).get("storageSecret")
    job = snapshot.restore_spark_job(snap, spark_uri, secret, image)
    for meta in (job["metadata"], job["spec"]["template"]["metadata"]):
        meta["labels"] = {**meta["labels"], UPGRADE_LABEL: app_name}
    return job


@dataclasses.dataclass(frozen=True)
class Step:
    """The record's next phase, what to do to get there (None: wait), and why."""

    phase: str
    action: str | None
    message: str


def next_step(app: Obj, snap: Obj | None, job: Obj | None, job_message: str = "") -> Step:
    """Where a savepoint upgrade stands, from the application's state, its StateSnapshot and
    the restore Job (each as stored, None when absent): what the operator does next."""
    record = record_of((app.get("metadata") or {}).get("annotations") or {})
    state = ((app.get("status") or {}).get("applicationState") or {}).get("state")
    if state != SUSPENDED:
        why = f"the Spark Operator stops the old run (state {state or 'not reported'})"
        return Step("Suspending", None, f"waiting until {why}")
    name = record["snapshot"]
    if snap is None:
        return Step("Snapshotting", "snapshot", f"taking StateSnapshot {name}")
    status = snap.get("status") or {}
    if status.get("phase") == "Failed":
        why = f"{status.get('reason')}: {status.get('message')}"
        retry = f"fix the cause, then kubectl delete statesnapshot {name} to take it again"
        return Step("Failed", None, f"StateSnapshot {name} failed ({why}); {retry}")
    if status.get("phase") != "Succeeded":
        return Step("Snapshotting", None, f"StateSnapshot {name} is {status.get('phase')}")
    job_name = snapshot.job_name(name, "restore-spark")
    if job is None:
        return Step("RestoringSpark", "restore", f"Job {job_name} restores the Spark part")
    ended = snapshot.job_finished(job)
    if ended is None:
        return Step("RestoringSpark", None, f"Job {job_name} restores the Spark part")
    if ended == "Failed":
        retry = f"fix the cause, then kubectl delete job {job_name} to run it again"
        return Step("Failed", None, f"Job {job_name} failed ({job_message}); {retry}")
    epoch, uri = status.get("epoch"), status.get("uri")
    return Step("Done", "resume", f"the new run starts from epoch {epoch} of savepoint {uri}")
