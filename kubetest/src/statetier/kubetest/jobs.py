"""A double of the Kubernetes 1.31 Job controller and of the kubelet that runs a Job's Pod.

The emulator has no nodes, so nothing would ever run a Job; the operator's StateSnapshots are
Jobs, and a test of them is worth something only if the Job's command really runs. This module
runs a Job's single container as a real local process, with the environment the kubelet would
give it, and writes the status the 1.31 Job controller writes (``pkg/controller/job``, with the
default feature gates of 1.31: JobPodReplacementPolicy and JobSuccessPolicy beta, on):

* a Pod named ``<job>-<5 characters>`` with the Job's template, its four Job labels and a
  controller ownerReference; ``status.startTime``, ``active``, ``ready`` (0: the double has no
  readiness probes), ``terminating`` and ``uncountedTerminatedPods`` on the Job;
* the Pod's phase ``Running`` while the process runs, then ``Succeeded`` or ``Failed``, its
  container status ``terminated`` with the exit code, reason ``Completed``/``Error`` and the
  termination message (the file at ``terminationMessagePath``; with
  ``FallbackToLogsOnError`` and a failure, the last 80 lines / 2048 bytes of the output when the
  file is empty);
* on success ``succeeded`` and the conditions ``SuccessCriteriaMet`` then ``Complete`` (reason
  ``CompletionsReached``) with ``completionTime``; on a failure ``failed`` and, while
  ``failed <= backoffLimit``, a new Pod after the controller's back-off (10 s doubling, capped
  at 6 min), else ``FailureTarget`` then ``Failed`` (reason ``BackoffLimitExceeded``). Since
  1.31 the terminal condition comes after the interim one, once no Pod is terminating: here
  both are written in one update, as no Pod is left running at that moment.

The container's environment is what the kubelet builds: ``env`` (values, ``$(VAR)``
references, ``secretKeyRef``/``configMapKeyRef``) and ``envFrom`` (Secrets and ConfigMaps, with
``prefix``), plus ``PATH`` and ``HOME`` of the emulator process standing for the image's (the
image is not pulled: its filesystem is this machine's). ``$(VAR)`` in ``command`` and ``args``
is expanded as the kubelet does. The one file mapped is the termination message: the kubelet
mounts a file of its own at ``terminationMessagePath``, so the double replaces that path in the
command and arguments with a file of its own.

Not modelled: parallelism and completions above 1, indexed Jobs, ``podFailurePolicy``,
``successPolicy``, ``activeDeadlineSeconds``, ``ttlSecondsAfterFinished``, suspend, init and
sidecar containers, volumes, resource limits; a Pod deleted while its process runs does not stop
the process (its result is dropped).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import os
import re
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "BACKOFF_BASE",
    "Lookup",
    "backoff",
    "container_env",
    "expand",
    "job_status",
    "new_pod",
    "owned_pods",
    "run_pod",
]

Obj = dict[str, Any]
Lookup = Callable[[str, str, str], Obj | None]
"""(plural, namespace, name) -> a stored Secret or ConfigMap, or None."""

BACKOFF_BASE = 10.0
_BACKOFF_CAP = 360.0
_MESSAGE_BYTES = 4096
_LOG_LINES, _LOG_BYTES = 80, 2048
_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


def _stamp(moment: datetime.datetime | None = None) -> str:
    return (moment or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def backoff(failed: int) -> float:
    """Seconds the controller waits before the Pod that follows ``failed`` failures."""
    return 0.0 if failed == 0 else min(BACKOFF_BASE * 2 ** (failed - 1), _BACKOFF_CAP)


def owned_pods(job: Obj, pods: list[Obj]) -> list[Obj]:
    """The Pods whose controller is ``job``, oldest first."""
    uid = job["metadata"]["uid"]
    mine = [
        p
        for p in pods
        if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])
    ]
    return sorted(mine, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))


def new_pod(job: Obj) -> Obj:
    """The Pod the controller creates for ``job``: its template, labels and owner."""
    meta = job["metadata"]
    template = copy.deepcopy(job["spec"]["template"])
    suffix = "".join(secrets.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    pod_meta = {
        **(template.get("metadata") or {}),
        "name": f"{meta['name']}-{suffix}",
        "namespace": meta["namespace"],
        "ownerReferences": [owner],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": pod_meta,
        "spec": template.get("spec") or {},
        "status": {"phase": "Pending"},
    }


def _condition(kind: str, reason: str, message: str, now: str) -> Obj:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastProbeTime": now,
        "lastTransitionTime": now,
    }


def job_status(job: Obj, pods: list[Obj], now: datetime.datetime | None = None) -> Obj:
    """The status the 1.31 Job controller writes for ``job`` given its Pods."""
    stamp = _stamp(now)
    old = job.get("status") or {}
    phases = [p.get("status", {}).get("phase") for p in pods]
    status: Obj = {
        "startTime": old.get("startTime") or stamp,
        "active": sum(1 for ph in phases if ph in ("Pending", "Running")),
        "ready": 0,
        "terminating": 0,
        "uncountedTerminatedPods": {},
    }
    succeeded, failed = phases.count("Succeeded"), phases.count("Failed")
    if succeeded:
        status["succeeded"] = succeeded
    if failed:
        status["failed"] = failed
    conditions = list(old.get("conditions") or [])
    finished = {c["type"] for c in conditions} & {"Complete", "Failed"}
    if not finished and succeeded >= int(job["spec"].get("completions", 1)):
        message = "Reached expected number of succeeded pods"
        for kind in ("SuccessCriteriaMet", "Complete"):
            conditions.append(_condition(kind, "CompletionsReached", message, stamp))
        status["completionTime"] = stamp
    elif not finished and not status["active"] and failed > int(job["spec"]["backoffLimit"]):
        message = "Job has reached the specified backoff limit"
        for kind in ("FailureTarget", "Failed"):
            conditions.append(_condition(kind, "BackoffLimitExceeded", message, stamp))
    elif "completionTime" in old:
        status["completionTime"] = old["completionTime"]
    if conditions:
        status["conditions"] = conditions
    return status


def expand(text: str, env: dict[str, str]) -> str:
    """``$(VAR)`` replaced by its value when defined (else kept), ``$$`` by ``$``."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(one, text)


def _data(obj: Obj | None) -> dict[str, str]:
    if obj is None:
        return {}
    if obj.get("kind") == "Secret":
        return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
    return dict(obj.get("data") or {})


def container_env(container: Obj, namespace: str, lookup: Lookup) -> dict[str, str]:
    """The environment the kubelet gives ``container``: ``envFrom`` first, ``env`` over it;
    a missing Secret, ConfigMap or key that is not ``optional`` raises LookupError (the kubelet
    reports CreateContainerConfigError)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        for plural, ref_key in (("secrets", "secretRef"), ("configmaps", "configMapRef")):
            ref = source.get(ref_key)
            if ref:
                obj = lookup(plural, namespace, ref["name"])
                if obj is None and not ref.get("optional"):
                    raise LookupError(f'{plural[:-1]} "{ref["name"]}" not found')
                prefix = source.get("prefix", "")
                env.update({prefix + k: v for k, v in _data(obj).items()})
    for var in container.get("env") or []:
        if "value" in var or "valueFrom" not in var:
            env[var["name"]] = expand(str(var.get("value", "")), env)
            continue
        for plural, ref_key in (("secrets", "secretKeyRef"), ("configmaps", "configMapKeyRef")):
            ref = var["valueFrom"].get(ref_key)
            if ref:
                values = _data(lookup(plural, namespace, ref["name"]))
                if ref["key"] in values:
                    env[var["name"]] = values[ref["key"]]
                elif not ref.get("optional"):
                    where = f"{plural[:-1]} {namespace}/{ref['name']}"
                    raise LookupError(f"couldn't find key {ref['key']} in {where}")
    return env


def _message(container: Obj, path: Path, log: Path, failed: bool) -> str:
    text = path.read_bytes()[:_MESSAGE_BYTES].decode("utf-8", "replace") if path.exists() else ""
    if text or not failed or container.get("terminationMessagePolicy") != "FallbackToLogsOnError":
        return text
    lines = log.read_bytes().splitlines()[-_LOG_LINES:]
    return b"\n".join(lines)[-_LOG_BYTES:].decode("utf-8", "replace")


def _terminated(code: int, message: str, started: str) -> Obj:
    state: Obj = {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",
        "startedAt": started,
        "finishedAt": _stamp(),
    }
    if message:
        state["message"] = message
    return state


async def run_pod(pod: Obj, lookup: Lookup, workdir: Path) -> Obj:
    """Run the Pod's first container to its end; the Pod's new ``status``."""
    container = pod["spec"]["containers"][0]
    started = _stamp()
    folder = Path(tempfile.mkdtemp(prefix=pod["metadata"]["name"] + "-", dir=workdir))
    message_path, log_path = folder / "termination-log", folder / "output.log"
    try:
        env = container_env(container, pod["metadata"]["namespace"], lookup)
    except LookupError as exc:
        waiting = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
        return {"phase": "Pending", "containerStatuses": [_container_status(container, waiting)]}
    mounted = container.get("terminationMessagePath", "/dev/termination-log")
    argv = [
        expand(str(part), env).replace(mounted, str(message_path))
        for part in [*(container.get("command") or []), *(container.get("args") or [])]
    ]
    image_env = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    with open(log_path, "wb") as log:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, env={**image_env, **env}, stdout=log, stderr=log, cwd=folder
            )
            try:
                code = await proc.wait()
            except asyncio.CancelledError:  # the emulator stops: so does what it started
                proc.kill()
                await proc.wait()
                raise
        except OSError as exc:  # the kubelet's StartError: no such executable
            log.write(f"exec {argv[:1]}: {exc}\n".encode())
            code = 128
    state = _terminated(code, _message(container, message_path, log_path, code != 0), started)
    return {
        "phase": "Succeeded" if code == 0 else "Failed",
        "startTime": started,
        "containerStatuses": [_container_status(container, {"terminated": state})],
    }


def _container_status(container: Obj, state: Obj) -> Obj:
    """A container status with the fields the kubelet always writes (clients require
    ``image`` and ``imageID``); the image is not pulled, so its ID is its name."""
    return {
        "name": container.get("name", ""),
        "image": container.get("image", ""),
        "imageID": container.get("image", ""),
        "ready": False,
        "started": False,
        "restartCount": 0,
        "state": state,
    }
