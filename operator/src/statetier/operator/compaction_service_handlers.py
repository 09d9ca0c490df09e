"""kopf handlers that reconcile CompactionService resources.

One reconciliation creates the generated token Secret if it is missing (create only, never
rewritten), applies the three owned objects with server-side apply (field manager
``statetier-operator``, forced, as a controller owns what it creates) and then writes the
status. There is no hand comparison of specs: the apiserver merges, defaults and canonicalises
(``"0.5"`` CPU is stored as ``500m``, ``env: []`` vanishes), and an apply that changes nothing
changes nothing, so a Deployment's status updates never turn into writes. Applying is create-or-
update in one request, so the reconcile handler and the Deployment-event handler can both apply
without racing to a 409. Deployment events refresh the status too, so conditions follow the
rollout without polling. Deletion needs no finalizer: the owned objects carry owner references
and the garbage collector removes them, a moment after their owner is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, cast

import kopf
from statetier.operator import compaction_service, compaction_token, kube, metrics
from statetier.operator.compaction_service import GROUP, PLURAL, VERSION

Obj = dict[str, Any]
RESOURCE = "compactionservice"


def _version(obj: Obj | None) -> Any:
    """What changes when the apiserver changed the object's desired state: a Deployment's
    generation (its status writes leave it alone), a Service's resourceVersion."""
    if obj is None:
        return None
    meta = obj["metadata"]
    return meta.get("generation") if obj.get("kind") == "Deployment" else meta["resourceVersion"]


async def _apply(api: kube.Kube, desired: Obj) -> str:
    """Server-side apply ``desired``; returns created/updated/unchanged for the event."""
    before = _version(await api.read(desired))
    created, after = await api.apply(desired)
    if created:
        return "created"
    return "unchanged" if _version(after) == before else "updated"


async def _apply_all(api: kube.Kube, objects: list[Obj]) -> list[str]:
    """Apply the owned objects concurrently (they do not depend on each other); what changed."""
    outcomes = await asyncio.gather(*(_apply(api, desired) for desired in objects))
    return [
        f"{desired['kind']} {desired['metadata']['name']} {outcome}"
        for desired, outcome in zip(objects, outcomes, strict=True)
        if outcome != "unchanged"
    ]


async def _ensure_token(api: kube.Kube, body: Obj) -> list[str]:
    """Create the generated token Secret if the service names none and it does not exist yet,
    before the Deployments that read it; an existing one is kept (see compaction_token)."""
    secret = compaction_service.token_secret(body)
    if secret is None or not await api.create_if_absent(secret):
        return []
    return [f"Secret {secret['metadata']['name']} created"]


def _edited_by_others(deployment: Obj) -> bool:
    """Whether a field manager other than the operator (``kubectl scale``, ``kubectl edit``)
    owns part of the Deployment's spec: the one sign of drift a watch event carries. The
    Deployment controller's status writes are no such sign, so they cause no writes."""
    return any(
        entry.get("manager") != kube.FIELD_MANAGER
        and entry.get("subresource") != "status"
        and "f:spec" in (entry.get("fieldsV1") or {})
        for entry in (deployment.get("metadata") or {}).get("managedFields") or []
    )


class StatusLocks:
    """One lock per CompactionService for :func:`refresh_status`, shared by every handler
    through kopf's memo (the startup handler puts one in)."""

    def __init__(self) -> None:
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def of(self, namespace: str, name: str) -> asyncio.Lock:
        return self._locks.setdefault((namespace, name), asyncio.Lock())

    def forget(self, namespace: str, name: str) -> None:
        self._locks.pop((namespace, name), None)


def _status_locks(memo: Any) -> StatusLocks:
    found = memo.get("status_locks")
    if not isinstance(found, StatusLocks):
        raise RuntimeError("no status locks in kopf's memo: the startup handler did not run")
    return found


async def refresh_status(memo: Any, namespace: str, name: str) -> Obj | None:
    """Recompute the status from the owned Deployments and write it if it changed.

    kopf runs the handlers of different objects concurrently: the gateway's and the workers'
    Deployment events, and the service's own reconcile, each refresh the same status. Reading
    and writing under one lock per service, from a fresh read of the service, keeps a refresh
    that read the Deployments earlier from writing its older status last (the stale status
    would stay until the next event)."""
    async with _status_locks(memo).of(namespace, name):
        return await _refresh_status(kube.of(memo), namespace, name)


async def _refresh_status(api: kube.Kube, namespace: str, name: str) -> Obj | None:
    cs = await api.read_compaction_service(namespace, name)
    if cs is None or cs["metadata"].get("deletionTimestamp"):
        return None
    spec = compaction_service.with_defaults(cs.get("spec"))
    problems = compaction_service.spec_problems(spec)
    names = compaction_service.names(name)
    gateway, workers = await asyncio.gather(
        api.read_deployment(namespace, names["gateway"]),
        api.read_deployment(namespace, names["workers"]),
    )
    old = dict(cs.get("status") or {})
    worker_status = (workers or {}).get("status") or {}
    desired = 0 if problems else compaction_service.desired_workers(spec)
    status: Obj = {
        "observedGeneration": cs["metadata"].get("generation", 1),
        "endpoint": compaction_service.endpoint(name, namespace, spec),
        "gateway": {"ready": ((gateway or {}).get("status") or {}).get("readyReplicas", 0)},
        "workers": {
            "desired": desired,
            "current": worker_status.get("replicas", 0),
            "ready": worker_status.get("readyReplicas", 0),
            "selector": compaction_service.worker_selector(name),
        },
        "conditions": compaction_service.conditions(
            spec,
            problems,
            gateway,
            workers,
            cs["metadata"].get("generation", 1),
            old.get("conditions"),
        ),
    }
    metrics.WORKERS_DESIRED.labels(namespace, name).set(desired)
    metrics.WORKERS_CURRENT.labels(namespace, name).set(status["workers"]["current"])
    if {k: old.get(k) for k in status} != status:
        await api.patch_compaction_service(namespace, name, {"status": status}, status=True)
    return status


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def reconcile(
    body: kopf.Body,
    name: str,
    namespace: str | None,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """Bring the gateway, its Service and the workers in line with the spec."""
    namespace = namespace or "default"
    with metrics.reconciling(RESOURCE):
        spec = compaction_service.with_defaults(body.get("spec"))
        problems = compaction_service.spec_problems(spec)
        raw = dict(body)
        if problems:
            message = "; ".join(problems)
            kopf.warn(body, reason="InvalidSpec", message=message)
            await refresh_status(memo, namespace, name)
            logger.warning("not reconciling %s/%s: %s", namespace, name, message)
            return
        api = kube.of(memo)
        try:
            changes = await _ensure_token(api, raw)
            changes += await _apply_all(api, compaction_service.desired_objects(raw))
            await refresh_status(memo, namespace, name)
        except kube.ApiError as exc:
            metrics.ERRORS.labels(RESOURCE, "reconcile").inc()
            kopf.warn(body, reason="ReconcileFailed", message=str(exc))
            raise kopf.TemporaryError(str(exc), delay=5) from exc
        if changes:
            desired_workers = compaction_service.desired_workers(spec)
            message = "; ".join(changes) + (
                f" (workers {desired_workers} within {spec['workers']['min']}.."
                f"{spec['workers']['max']})"
            )
            kopf.info(body, reason="Reconciled", message=message)
            logger.info("reconciled %s/%s: %s", namespace, name, message)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
async def forget(
    name: str, namespace: str | None, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Drop the per-service metric series; owner references take care of the objects."""
    namespace = namespace or "default"
    for gauge in (
        metrics.WORKERS_DESIRED,
        metrics.WORKERS_CURRENT,
        metrics.AUTOSCALER_RECOMMENDED,
        metrics.AUTOSCALER_LOAD,
    ):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)
    _status_locks(memo).forget(namespace, name)
    logger.info("CompactionService %s/%s deleted; its objects go with it", namespace, name)


@kopf.on.event(
    "apps",
    "v1",
    "deployments",
    labels={"app.kubernetes.io/managed-by": compaction_service.MANAGED_BY},
)
async def deployment_changed(
    type: str | None,  # kopf passes the event type under this name
    body: kopf.Body,
    labels: kopf.Labels,
    namespace: str | None,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """A Deployment of a CompactionService changed or went away.

    Edits by hand (replicas, image: another field manager now owns part of the spec) and
    deletions are put back by applying again, as any controller does with what it owns; then
    the status follows the Deployment's. When the CompactionService itself is gone or going,
    nothing is recreated: the Deployments are being garbage-collected.
    """
    owner = labels.get(compaction_service.SERVICE_LABEL)
    if not owner or not namespace:
        return
    api = kube.of(memo)
    try:
        cs = await api.read_compaction_service(namespace, owner)
        if cs is None or cs["metadata"].get("deletionTimestamp"):
            return
        spec = compaction_service.with_defaults(cs.get("spec"))
        drifted = type == "DELETED" or _edited_by_others(dict(body))
        if drifted and not compaction_service.spec_problems(spec):
            for change in await _apply_all(api, compaction_service.desired_objects(cs)):
                message = f"{change} (drift)"
                kopf.info(kopf.Body(cast(kopf.RawBody, cs)), reason="Reconciled", message=message)
                logger.info("reconciled %s/%s: %s", namespace, owner, message)
        await refresh_status(memo, namespace, owner)
    except kube.ApiError:
        metrics.ERRORS.labels(RESOURCE, "status").inc()
        raise


@kopf.index(GROUP, VERSION, PLURAL)
def compaction_endpoints(
    name: str, namespace: str | None, status: kopf.Status, **_: Any
) -> dict[tuple[str, str], str | None]:
    """Endpoint of every CompactionService, for the mutating webhook (no API call there)."""
    endpoint = status.get("endpoint")
    return {(namespace or "", name): str(endpoint) if endpoint else None}


@kopf.index(GROUP, VERSION, PLURAL)
def compaction_tokens(
    name: str, namespace: str | None, spec: kopf.Spec, **_: Any
) -> dict[tuple[str, str], tuple[str, str]]:
    """(Secret, key) of every CompactionService's token, for the mutating webhook: the Spark
    pods of an application naming the service read the token from that Secret."""
    return {(namespace or "", name): compaction_token.secret_ref(name, dict(spec))}
