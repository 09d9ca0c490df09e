"""kopf handlers of StateSnapshots and ScheduledStateSnapshots.

A StateSnapshot is taken once: on creation (or on resume, if the operator was down when it was
created) the operator resolves its source and creates its Job (:mod:`statetier.operator.snapshot`);
the Job's events then drive its status to Succeeded or Failed, with the ``Ready`` condition
``kubectl wait --for=condition=Ready`` waits on, an Event, and the metrics. The Job is created
under a fixed name, so a handler that runs again finds it instead of taking a second copy.

Only a StateSnapshot whose files are to be deleted (``deletionPolicy: delete``) and exist
(``Succeeded``) carries kopf's finalizer: its deletion runs a cleanup Job (``statetier checkpoint
delete-savepoint``) and waits for it within ``--checkpoint-delete-timeout``, then lets go
whatever happened (a failure is a Warning Event naming the files left). Every other deletion
waits for nothing.

A ScheduledStateSnapshot's timer creates a StateSnapshot when its cron schedule is due (one for
the latest due time if the operator missed several, as a CronJob does), owned by the schedule,
and deletes the snapshots of that schedule beyond the newest ``keep`` that succeeded.
"""

from __future__ import annotations

import datetime
from typing import Any, cast

import kopf
from statetier.operator import cron, kube, metrics, settings, snapshot
from statetier.operator.snapshot import GROUP, PLURAL, SCHEDULE_PLURAL, VERSION

Obj = dict[str, Any]
RESOURCE = "statesnapshot"
SNAPSHOTS = (GROUP, VERSION, PLURAL)
SCHEDULES = (GROUP, VERSION, SCHEDULE_PLURAL)
APPS = ("sparkoperator.k8s.io", "v1beta2", "sparkapplications")
TERMINAL = ("Succeeded", "Failed")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _stamp(moment: datetime.datetime | None = None) -> str:
    return (moment or _now()).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


def _application(spec: Obj) -> str:
    """The metrics label: the application's name, else the source checkpoint URI."""
    return str(spec.get("sparkApplication") or spec.get("checkpointUri") or "")


def _ready(phase: str, reason: str, message: str, generation: int) -> Obj:
    return {
        "type": "Ready",
        "status": "True" if phase == "Succeeded" else "False",
        "reason": reason,
        "message": message[:1024],
        "observedGeneration": generation,
        "lastTransitionTime": _stamp(),
    }


def _status(body: Obj, phase: str, fields: Obj) -> Obj:
    generation = int(body["metadata"].get("generation", 1))
    reason = str(fields.get("reason") or phase)
    message = str(fields.get("message") or f"savepoint at {fields.get('uri', '')}")
    return {
        **fields,
        "phase": phase,
        "observedGeneration": generation,
        "conditions": [_ready(phase, reason, message, generation)],
    }


def _record_success(namespace: str, spec: Obj, finished: str | None) -> None:
    if finished:
        stamp = _parse_time(finished).timestamp()
        metrics.advance_last_success(namespace, _application(spec), stamp)


# ------------------------------------------------------------------ StateSnapshot


@kopf.index(GROUP, VERSION, PLURAL)
def snapshot_uris(
    namespace: str | None, name: str, status: kopf.Status, **_: Any
) -> dict[tuple[str, str], tuple[str | None, str | None]]:
    """(phase, savepoint URI) of every StateSnapshot: the webhooks resolve a
    ``statetier.io/restore-from`` name with it, without an API call during admission."""
    return {(namespace or "", name): (status.get("phase"), status.get("uri"))}


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
async def start(
    body: kopf.Body, spec: kopf.Spec, status: kopf.Status, memo: kopf.Memo, **_: Any
) -> None:
    """Create the snapshot's Job, unless it ended already (then only restore its metric)."""
    meta = body["metadata"]
    if status.get("phase") in TERMINAL:
        if status.get("phase") == "Succeeded":
            _record_success(meta["namespace"], dict(spec), status.get("finishTime"))
        return
    api = kube.of(memo)
    name = spec.get("sparkApplication")
    app = await api.read_custom(APPS, meta["namespace"], name) if name else None
    with metrics.reconciling(RESOURCE):
        try:
            source = snapshot.source_of(dict(spec), app)
        except ValueError as exc:
            await _end(api, body, "Failed", {"reason": "InvalidSource", "message": str(exc)})
            return
        image = settings.of(memo).snapshot_image
        job = snapshot.savepoint_job(dict(body), source, image)
        if await api.create(("batch", "v1", "jobs"), job):
            kopf.info(body, reason="SnapshotStarted", message=f"Job {job['metadata']['name']}")
        else:
            await _require_own_job(api, job, meta["uid"])
        fields = {
            "source": source.checkpoint_uri,
            "job": job["metadata"]["name"],
            "startTime": status.get("startTime") or _stamp(),
            "reason": "JobCreated",
            "message": f"the savepoint Job {job['metadata']['name']} is starting",
        }
        await api.patch_custom(
            SNAPSHOTS,
            meta["namespace"],
            meta["name"],
            {"status": _status(dict(body), "Pending", fields)},
            status=True,
        )


async def _require_own_job(api: kube.Kube, job: Obj, uid: str) -> None:
    """A Job of that name owned by an earlier StateSnapshot of the same name (deleted, and
    recreated before the garbage collector took its Job) is not this snapshot's: wait for it to
    go (kopf retries the handler) instead of reporting its outcome. One that is gone when it is
    read (the collector took it between the create and the read) is created by the retry: a
    handler that succeeded there left the snapshot Pending with no Job, for good."""
    meta = job["metadata"]
    found = await api.read_job(meta["namespace"], meta["name"])
    if not found:
        raise kopf.TemporaryError(
            f"Job {meta['name']} of an earlier StateSnapshot of this name was deleted just now: "
            "creating this snapshot's",
            delay=0.5,
        )
    owners = [ref.get("uid") for ref in found.get("metadata", {}).get("ownerReferences") or []]
    if uid not in owners:
        raise kopf.TemporaryError(
            f"Job {meta['name']} belongs to an earlier StateSnapshot of this name: waiting for "
            "the garbage collector to delete it",
            delay=1,
        )


async def _end(api: kube.Kube, body: kopf.Body, phase: str, fields: Obj) -> None:
    """Write a terminal status once, with its Event and metrics."""
    meta, spec = body["metadata"], dict(body.get("spec") or {})
    fields = {**fields, "finishTime": fields.get("finishTime") or _stamp()}
    new = _status(dict(body), phase, fields)
    await api.patch_custom(SNAPSHOTS, meta["namespace"], meta["name"], {"status": new}, status=True)
    outcome = "succeeded" if phase == "Succeeded" else "failed"
    metrics.SNAPSHOTS.labels(meta["namespace"], _application(spec), outcome).inc()
    if phase == "Succeeded":
        _record_success(meta["namespace"], spec, fields["finishTime"])
        message = f"epoch {fields['epoch']}, {fields['bytes']} bytes at {fields['uri']}"
        kopf.info(body, reason="SnapshotSucceeded", message=message)
    else:
        kopf.warn(body, reason="SnapshotFailed", message=f"{fields['reason']}: {fields['message']}")


@kopf.on.event("batch", "v1", "jobs", labels={snapshot.SNAPSHOT_LABEL: kopf.PRESENT})
async def job_changed(body: kopf.Body, type: str, memo: kopf.Memo, **_: Any) -> None:
    """Carry a savepoint Job's progress into its StateSnapshot's status."""
    meta = body["metadata"]
    owner = meta.get("labels", {}).get(snapshot.SNAPSHOT_LABEL)
    if type == "DELETED" or not owner or meta["name"] != snapshot.job_name(owner, "savepoint"):
        return
    api = kube.of(memo)
    current = await api.read_custom(SNAPSHOTS, meta["namespace"], owner)
    if current is None or (current.get("status") or {}).get("phase") in TERMINAL:
        return
    owners = [ref.get("uid") for ref in meta.get("ownerReferences") or []]
    if current["metadata"]["uid"] not in owners:
        return  # the Job of an earlier snapshot of that name, not yet collected
    phase, fields = snapshot.job_outcome(
        dict(body), await api.job_pods(meta["namespace"], meta["name"])
    )
    with metrics.reconciling(RESOURCE):
        if phase in TERMINAL:
            await _end(api, cast(kopf.Body, current), phase, fields)
        elif phase != (current.get("status") or {}).get("phase"):
            new = _status(current, phase, fields)
            await api.patch_custom(
                SNAPSHOTS, meta["namespace"], owner, {"status": new}, status=True
            )


def _deletes_files(spec: kopf.Spec, status: kopf.Status, **_: Any) -> bool:
    return spec.get("deletionPolicy") == "delete" and status.get("phase") == "Succeeded"


@kopf.on.delete(GROUP, VERSION, PLURAL, when=_deletes_files)
async def delete_savepoint(
    body: kopf.Body, status: kopf.Status, memo: kopf.Memo, runtime: datetime.timedelta, **_: Any
) -> None:
    """Run the cleanup Job and wait for it (kopf retries this handler every second); let go
    after ``--checkpoint-delete-timeout`` or a failure, saying which files are left."""
    api, meta = kube.of(memo), body["metadata"]
    uri = str(status["uri"])
    secret = await _secret_of(api, body)
    job = snapshot.cleanup_job(dict(body), uri, secret, settings.of(memo).snapshot_image)
    await api.create(("batch", "v1", "jobs"), job)
    found = await api.read_job(meta["namespace"], job["metadata"]["name"]) or {}
    ended = snapshot.job_finished(found)
    if ended == "Complete":
        kopf.info(body, reason="SavepointDeleted", message=f"savepoint at {uri} deleted")
        return
    timeout = settings.of(memo).checkpoint_delete_timeout
    if ended == "Failed" or runtime.total_seconds() > timeout:
        metrics.ERRORS.labels(RESOURCE, "delete").inc()
        pods = await api.job_pods(meta["namespace"], job["metadata"]["name"])
        why = (
            snapshot.job_outcome(found, pods)[1]["message"]
            if ended
            else f"not done within {timeout:g}s"
        )
        kopf.warn(
            body,
            reason="SavepointDeleteFailed",
            message=f"the savepoint at {uri} is left in place: {why}",
        )
        return
    raise kopf.TemporaryError("the cleanup Job runs", delay=1)


async def _secret_of(api: kube.Kube, body: kopf.Body) -> str | None:
    """The storage Secret of the snapshot (its own, else its application's, if it still
    exists)."""
    spec = body.get("spec") or {}
    if spec.get("storageSecret") or not spec.get("sparkApplication"):
        return spec.get("storageSecret")
    app = await api.read_custom(APPS, body["metadata"]["namespace"], spec["sparkApplication"])
    annotations = ((app or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get("statetier.io/storage-secret")


# ------------------------------------------------------------------ ScheduledStateSnapshot


def _latest_due(
    schedule: cron.Schedule, last: datetime.datetime, now: datetime.datetime
) -> datetime.datetime | None:
    """The latest scheduled time in (last, now], or None (missed runs collapse into one)."""
    due = schedule.next_after(last)
    if due > now:
        return None
    for _ in range(100_000):
        following = schedule.next_after(due)
        if following > now:
            break
        due = following
    return due


@kopf.timer(GROUP, VERSION, SCHEDULE_PLURAL, interval=1.0, idle=0)
async def scheduled(
    body: kopf.Body, spec: kopf.Spec, status: kopf.Status, memo: kopf.Memo, **_: Any
) -> None:
    """Take a snapshot when one is due; keep the newest ``keep`` that succeeded."""
    api, meta = kube.of(memo), body["metadata"]
    try:
        schedule = cron.parse(str(spec["schedule"]))
    except ValueError as exc:
        if status.get("message") != str(exc):
            kopf.warn(body, reason="InvalidSchedule", message=f"spec.schedule: {exc}")
            await api.patch_custom(
                SCHEDULES,
                meta["namespace"],
                meta["name"],
                {"status": {"message": str(exc)}},
                status=True,
            )
        return
    now = _now()
    last = _parse_time(status.get("lastScheduleTime") or meta["creationTimestamp"])
    due = None if spec.get("suspend") else _latest_due(schedule, last, now)
    patch: Obj = {
        "nextScheduleTime": _stamp(schedule.next_after(max(now, due or now))),
        "message": None,
    }
    if due is not None:
        await _take(api, dict(body), due)
        patch["lastScheduleTime"] = _stamp(due)
    patch["lastSuccessfulSnapshot"] = await _prune(api, dict(body), int(spec.get("keep", 3)))
    if any(status.get(k) != v for k, v in patch.items()):
        await api.patch_custom(
            SCHEDULES, meta["namespace"], meta["name"], {"status": patch}, status=True
        )


async def _take(api: kube.Kube, schedule: Obj, due: datetime.datetime) -> None:
    meta = schedule["metadata"]
    name = f"{meta['name']}-{due.strftime('%Y%m%d%H%M%S')}"
    owner = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ScheduledStateSnapshot",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "StateSnapshot",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": {snapshot.SCHEDULE_LABEL: meta["name"]},
            "ownerReferences": [owner],
        },
        "spec": dict(schedule["spec"]["snapshot"]),
    }
    if await api.create(SNAPSHOTS, body):
        kopf.info(
            cast(kopf.Body, schedule),
            reason="SnapshotScheduled",
            message=f"StateSnapshot {name} created",
        )


async def _prune(api: kube.Kube, schedule: Obj, keep: int) -> str | None:
    """Delete this schedule's succeeded snapshots beyond the newest ``keep`` and its failed
    ones older than the newest success; the newest success's name."""
    meta = schedule["metadata"]
    items = await api.list_custom(
        SNAPSHOTS, meta["namespace"], f"{snapshot.SCHEDULE_LABEL}={meta['name']}"
    )
    items.sort(
        key=lambda s: (s["metadata"]["creationTimestamp"], s["metadata"]["name"]), reverse=True
    )
    done = [s for s in items if (s.get("status") or {}).get("phase") == "Succeeded"]
    doomed = done[keep:]
    if done:
        newest = (done[0]["metadata"]["creationTimestamp"], done[0]["metadata"]["name"])
        doomed += [
            s
            for s in items
            if (s.get("status") or {}).get("phase") == "Failed"
            and (s["metadata"]["creationTimestamp"], s["metadata"]["name"]) < newest
        ]
    for old in doomed:
        if not old["metadata"].get("deletionTimestamp"):
            await api.delete_custom(SNAPSHOTS, meta["namespace"], old["metadata"]["name"])
    return str(done[0]["metadata"]["name"]) if done else None
