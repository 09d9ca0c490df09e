"""kopf handlers that carry a ``statetier.io/upgrade-mode: savepoint`` upgrade through.

The webhook suspended the application and wrote the upgrade record
(:mod:`statetier.operator.upgrade`). Every event of the application, of its upgrade's
StateSnapshot or of its restore Job runs one :func:`advance`: it looks at what exists and does
the next step (take the snapshot, restore the Spark part, resume the application), each under a
fixed name, so an event seen twice or a step retried finds the first result. kopf lists every
object when it starts, so an operator that was down carries on where the record says. Event
handlers only: no timer or daemon, whose finalizer would make the application's deletion wait
for an operator that may not run.
"""

from __future__ import annotations

from typing import Any, cast

import kopf
from statetier.operator import annotations as ann
from statetier.operator import kube, metrics, settings, snapshot, upgrade
from statetier.operator.sparkapp import GROUP, PLURAL, VERSION

Obj = dict[str, Any]
RESOURCE = "sparkapplication"
APPS = (GROUP, VERSION, PLURAL)
SNAPSHOTS = (snapshot.GROUP, snapshot.VERSION, snapshot.PLURAL)
JOBS = ("batch", "v1", "jobs")


def _holding(annotations: kopf.Annotations, **_: Any) -> bool:
    return upgrade.record_of(dict(annotations)).get("phase") in upgrade.HOLDING


@kopf.on.event(GROUP, VERSION, PLURAL, when=_holding)
async def upgrade_application_changed(
    body: kopf.Body, type: str, memo: kopf.Memo, **_: Any
) -> None:
    """The application's state or record changed (or the operator started)."""
    if type != "DELETED":
        await advance(kube.of(memo), dict(body), memo)


@kopf.on.event(*SNAPSHOTS, labels={upgrade.UPGRADE_LABEL: kopf.PRESENT})
async def upgrade_snapshot_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The upgrade's StateSnapshot progressed, or was deleted (a retry)."""
    await _advance_owner(body, memo)


@kopf.on.event(*JOBS, labels={upgrade.UPGRADE_LABEL: kopf.PRESENT})
async def upgrade_job_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The restore Job progressed, or was deleted (a retry)."""
    await _advance_owner(body, memo)


async def _advance_owner(body: kopf.Body, memo: kopf.Memo) -> None:
    meta = body["metadata"]
    api = kube.of(memo)
    app = await api.read_custom(APPS, meta["namespace"], meta["labels"][upgrade.UPGRADE_LABEL])
    if app is not None:
        annotations = (app.get("metadata") or {}).get("annotations") or {}
        if upgrade.record_of(annotations).get("phase") in upgrade.HOLDING:
            await advance(api, app, memo)


async def advance(api: kube.Kube, app: Obj, memo: kopf.Memo) -> None:
    """Do the upgrade's next step and record its phase."""
    meta = app["metadata"]
    namespace = meta["namespace"]
    record = upgrade.record_of(meta.get("annotations") or {})
    snap = await api.read_custom(SNAPSHOTS, namespace, record["snapshot"])
    job_name = snapshot.job_name(record["snapshot"], "restore-spark")
    job = await api.read_job(namespace, job_name) if snap else None
    message = ""
    if job is not None and snapshot.job_finished(job) == "Failed":
        pods = await api.job_pods(namespace, job_name)
        message = str(snapshot.job_outcome(job, pods)[1].get("message", ""))
    step = upgrade.next_step(app, snap, job, message)
    with metrics.reconciling(RESOURCE):
        image = settings.of(memo).snapshot_image
        if step.action == "snapshot":
            await api.create(SNAPSHOTS, upgrade.snapshot_body(app, record))
        elif step.action == "restore" and snap is not None:
            to = record["to"]["sparkCheckpointUri"]
            await api.create(JOBS, upgrade.restore_job(snap, meta["name"], to, image))
        await _record(api, app, record, step)


async def _record(api: kube.Kube, app: Obj, record: Obj, step: upgrade.Step) -> None:
    """Write the new phase (and on Done, ``suspend: false`` in the same patch), with an Event
    when the phase changes."""
    if (record.get("phase"), record.get("message")) == (step.phase, step.message):
        return
    meta = app["metadata"]
    new = {**record, "phase": step.phase, "message": step.message}
    patch: Obj = {"metadata": {"annotations": {ann.UPGRADE: upgrade.record_text(new)}}}
    if step.phase == "Done":
        patch["spec"] = {"suspend": False}
    await api.patch_custom(APPS, meta["namespace"], meta["name"], patch)
    if step.phase == record.get("phase"):
        return
    body = cast(kopf.Body, app)
    if step.phase == "Failed":
        kopf.warn(body, reason="UpgradeFailed", message=step.message)
    else:
        kopf.info(body, reason=f"Upgrade{step.phase}", message=step.message)
