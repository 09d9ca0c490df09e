"""CompactionService: the objects it stands for, and its status.

A CompactionService becomes three objects, all owned by it (so deleting it garbage-collects
them): the gateway Deployment and its Service, and the worker Deployment whose replicas the
operator keeps within ``workers.min..workers.max``. This module only computes: the desired
objects from the spec, and the status from what exists. The kopf handlers that apply them live
in :mod:`statetier.operator.compaction_service_handlers`, so everything here is testable without an
apiserver and the reconciliation stays a thin, obvious loop.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

from statetier.operator import compaction_token

__all__ = [
    "GROUP",
    "PLURAL",
    "VERSION",
    "conditions",
    "rollout",
    "desired_objects",
    "desired_workers",
    "endpoint",
    "names",
    "owner_reference",
    "spec_problems",
    "token_secret",
    "with_defaults",
    "worker_selector",
]

Obj = dict[str, Any]

GROUP, VERSION, PLURAL, KIND = "statetier.io", "v1alpha1", "compactionservices", "CompactionService"
MANAGED_BY = "statetier-operator"
SERVICE_LABEL = "statetier.io/compaction-service"

# The CRD's defaults, repeated so that the operator behaves the same on an apiserver that has
# not applied them (an object stored before a default was added). A test checks they agree.
DEFAULTS: Obj = {
    "imagePullPolicy": "IfNotPresent",
    "gateway": {"replicas": 1, "port": 8080},
    "workers": {"min": 1, "max": 4, "targetQueuePerWorker": 4, "concurrency": 1},
    "scheduling": {"policy": "fair"},
}


def with_defaults(spec: Any) -> Obj:
    """The spec with every defaulted field filled in."""
    merged = copy.deepcopy(dict(spec or {}))
    for key, value in DEFAULTS.items():
        if isinstance(value, dict):
            merged[key] = {**value, **dict(merged.get(key) or {})}
        else:
            merged.setdefault(key, value)
    return merged


def names(name: str) -> dict[str, str]:
    """Names of the owned objects."""
    return {
        "gateway": f"{name}-gateway",
        "service": f"{name}-gateway",
        "workers": f"{name}-workers",
    }


def _labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "statetier-compaction",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        SERVICE_LABEL: name,
    }


def _selector(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "statetier-compaction",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": component,
    }


def worker_selector(name: str) -> str:
    """The worker pods' label selector as text, for the scale subresource."""
    return ",".join(f"{k}={v}" for k, v in sorted(_selector(name, "worker").items()))


def endpoint(name: str, namespace: str, spec: Obj) -> str:
    """URL of the gateway Service, as Spark executors reach it."""
    return f"http://{names(name)['service']}.{namespace}.svc:{spec['gateway']['port']}"


def spec_problems(spec: Obj) -> list[str]:
    """What is wrong with a (defaulted) spec that the schema alone cannot say."""
    workers = spec["workers"]
    problems = []
    if workers["min"] > workers["max"]:
        problems.append(f"workers.min ({workers['min']}) exceeds workers.max ({workers['max']})")
    if not spec.get("image"):
        problems.append("image is empty")
    if not (spec.get("objectStorage") or {}).get("allowedPrefixes"):
        problems.append("objectStorage.allowedPrefixes is empty: the service could touch nothing")
    return problems


def desired_workers(spec: Obj) -> int:
    """Requested replicas (unset: min), clamped to min..max."""
    workers = spec["workers"]
    requested = workers.get("replicas")
    if requested is None:
        requested = workers["min"]
    return int(max(workers["min"], min(workers["max"], requested)))


def _storage_env(spec: Obj) -> list[Obj]:
    storage = spec.get("objectStorage") or {}
    env: list[Obj] = []
    if storage.get("endpoint"):
        env.append({"name": "AWS_ENDPOINT_URL", "value": storage["endpoint"]})
    if storage.get("region"):
        env.append({"name": "AWS_REGION", "value": storage["region"]})
    secret = storage.get("secretRef")
    if secret:
        for var, key_field, default in (
            ("AWS_ACCESS_KEY_ID", "accessKeyIdKey", "AWS_ACCESS_KEY_ID"),
            ("AWS_SECRET_ACCESS_KEY", "secretAccessKeyKey", "AWS_SECRET_ACCESS_KEY"),
        ):
            env.append(
                {
                    "name": var,
                    "valueFrom": {
                        "secretKeyRef": {
                            "name": secret["name"],
                            "key": secret.get(key_field, default),
                        }
                    },
                }
            )
    return env


def _token_env(name: str, spec: Obj) -> list[Obj]:
    """The service's API token, from its Secret (the user's or the generated one), as the
    backend's setting ``compaction.token`` reads it (clients set the same variable)."""
    return [compaction_token.env(*compaction_token.secret_ref(name, spec))]


def _prefix_args(spec: Obj) -> list[str]:
    # Command-line flags, not STATETIER_* variables: the backend's configuration loader
    # rejects unknown variables under that prefix, and the compaction image runs it.
    args: list[str] = []
    for prefix in (spec.get("objectStorage") or {}).get("allowedPrefixes") or []:
        args += ["--allowed-prefix", prefix]
    return args


# The Pod Security Standard "restricted" profile: the image runs as UID 10001 (see
# compaction/Dockerfile), needs no capability and writes only to /tmp (an emptyDir), so the
# gateway and workers run unprivileged in namespaces that enforce that profile.
POD_SECURITY: Obj = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY: Obj = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
TMP_VOLUME = "tmp"


def _pod_spec(spec: Obj, container: Obj) -> Obj:
    scheduling = spec.get("scheduling") or {}
    container = {
        **container,
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        "volumeMounts": [{"name": TMP_VOLUME, "mountPath": "/tmp"}],
    }
    pod: Obj = {
        "securityContext": copy.deepcopy(POD_SECURITY),
        "containers": [container],
        "volumes": [{"name": TMP_VOLUME, "emptyDir": {}}],
    }
    if scheduling.get("nodeSelector"):
        pod["nodeSelector"] = dict(scheduling["nodeSelector"])
    if scheduling.get("tolerations"):
        pod["tolerations"] = list(scheduling["tolerations"])
    if scheduling.get("priorityClassName"):
        pod["priorityClassName"] = scheduling["priorityClassName"]
    if spec.get("serviceAccountName"):  # workload identity for the object store
        pod["serviceAccountName"] = spec["serviceAccountName"]
    if spec.get("imagePullSecrets"):
        pod["imagePullSecrets"] = [{"name": s["name"]} for s in spec["imagePullSecrets"]]
    return pod


def _deployment(name: str, namespace: str, component: str, replicas: int, pod: Obj) -> Obj:
    object_name = names(name)["gateway" if component == "gateway" else "workers"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": object_name,
            "namespace": namespace,
            "labels": _labels(name, component),
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": _selector(name, component)},
            "template": {"metadata": {"labels": _labels(name, component)}, "spec": pod},
        },
    }


def owner_reference(body: Obj) -> Obj:
    """The controller reference the owned objects carry (garbage-collected with ``body``)."""
    meta = body["metadata"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def token_secret(body: Obj) -> Obj | None:
    """The token Secret to create if absent (see :mod:`statetier.operator.compaction_token`),
    or None when the spec names one."""
    name = body["metadata"]["name"]
    return compaction_token.generated_secret(body, owner_reference(body), _labels(name, "token"))


def desired_objects(body: Obj) -> list[Obj]:
    """Gateway Deployment, gateway Service and worker Deployment, owned by ``body``.

    The worker Deployment's replicas are the clamped desired count; the gateway's command line
    carries the scheduling policy and port; both get the object-storage settings and
    credentials as environment variables (AWS_* as s3fs and boto3 read them) and the API token
    from its Secret (the generated one unless the spec names one: see :func:`token_secret`).
    """
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    spec = with_defaults(body.get("spec"))
    owner = owner_reference(body)
    port = spec["gateway"]["port"]
    common = {
        "image": spec["image"],
        "imagePullPolicy": spec["imagePullPolicy"],
        "env": _storage_env(spec) + _token_env(name, spec),
    }
    gateway_container: Obj = {
        **common,
        "name": "gateway",
        "args": [
            "gateway",
            "--port",
            str(port),
            "--scheduling-policy",
            spec["scheduling"]["policy"],
            *_prefix_args(spec),
        ],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5},
    }
    if spec["gateway"].get("resources"):
        gateway_container["resources"] = spec["gateway"]["resources"]
    worker_container: Obj = {
        **common,
        "name": "worker",
        "args": [
            "worker",
            "--gateway",
            endpoint(name, namespace, spec),
            "--concurrency",
            str(spec["workers"]["concurrency"]),
            *_prefix_args(spec),
        ],
    }
    if spec["workers"].get("resources"):
        worker_container["resources"] = spec["workers"]["resources"]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names(name)["service"],
            "namespace": namespace,
            "labels": _labels(name, "gateway"),
        },
        "spec": {
            "selector": _selector(name, "gateway"),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    objects = [
        _deployment(
            name,
            namespace,
            "gateway",
            spec["gateway"]["replicas"],
            _pod_spec(spec, gateway_container),
        ),
        service,
        _deployment(
            name, namespace, "worker", desired_workers(spec), _pod_spec(spec, worker_container)
        ),
    ]
    for obj in objects:
        obj["metadata"]["ownerReferences"] = [owner]
    return objects


def _condition(kind: str, status: bool, reason: str, message: str, generation: int) -> Obj:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def rollout(deployment: Obj | None) -> str:
    """Where a Deployment's rollout stands, as its controller reports it: ``pending`` (not
    reported for this generation yet, or progressing), ``complete`` (every replica of the new
    ReplicaSet was available at least once) or ``stalled`` (ProgressDeadlineExceeded)."""
    if deployment is None:
        return "pending"
    status = deployment.get("status") or {}
    if status.get("observedGeneration", 0) < deployment["metadata"].get("generation", 1):
        return "pending"
    progressing = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Progressing"), None
    )
    if progressing is None:
        return "pending"
    if progressing.get("status") == "False":
        return "stalled"
    return "complete" if progressing.get("reason") == "NewReplicaSetAvailable" else "pending"


def _degraded(
    spec: Obj, states: dict[str, str], gw_ready: int, wk_ready: int, generation: int
) -> Obj:
    stalled = [name for name, state in states.items() if state == "stalled"]
    rolling = [name for name, state in states.items() if state == "pending"]
    if stalled:
        message = f"the {' and '.join(stalled)} Deployment made no progress within its deadline"
        return _condition("Degraded", True, "ProgressDeadlineExceeded", message, generation)
    if rolling:
        message = f"rolling out: {', '.join(rolling)}"
        return _condition("Degraded", False, "Progressing", message, generation)
    if gw_ready < 1:
        message = "no gateway replica is ready"
        return _condition("Degraded", True, "GatewayUnavailable", message, generation)
    if wk_ready < spec["workers"]["min"]:
        message = f"{wk_ready} workers ready; minimum is {spec['workers']['min']}"
        return _condition("Degraded", True, "WorkersBelowMinimum", message, generation)
    return _condition("Degraded", False, "AsExpected", "", generation)


def _progressing(states: dict[str, str], generation: int) -> Obj:
    rolling = [name for name, state in states.items() if state == "pending"]
    if rolling:
        message = f"rolling out: {', '.join(rolling)}"
        return _condition("Progressing", True, "RollingOut", message, generation)
    if "stalled" in states.values():
        message = "a Deployment exceeded its progress deadline"
        return _condition("Progressing", False, "ProgressDeadlineExceeded", message, generation)
    return _condition("Progressing", False, "RolloutComplete", "", generation)


def _ready(desired: int, gw_ready: int, wk_ready: int, generation: int) -> Obj:
    if gw_ready < 1:
        message = "no gateway replica is ready"
        return _condition("Ready", False, "GatewayUnavailable", message, generation)
    if wk_ready < desired:
        message = f"{wk_ready} of {desired} workers ready"
        return _condition("Ready", False, "WorkersUnavailable", message, generation)
    message = f"gateway ready, {wk_ready} of {desired} workers ready"
    return _condition("Ready", True, "AllReplicasReady", message, generation)


def conditions(
    spec: Obj,
    problems: list[str],
    gateway: Obj | None,
    workers: Obj | None,
    generation: int,
    previous: list[Obj] | None = None,
) -> list[Obj]:
    """Ready, Progressing and Degraded from the Deployments' status.

    The Deployment controller reports within a second, long before any Pod is ready, so
    "fewer replicas ready than needed" alone means nothing while a rollout is under way:
    Progressing is True until both Deployments report their rollout complete, and Degraded
    stays False meanwhile. Degraded means something needs a person: the spec is invalid, a
    Deployment exceeded its progress deadline, or after a completed rollout the gateway has no
    ready replica or the workers fall below min.
    """
    gw_ready = ((gateway or {}).get("status") or {}).get("readyReplicas", 0)
    wk_ready = ((workers or {}).get("status") or {}).get("readyReplicas", 0)
    states = {"gateway": rollout(gateway), "workers": rollout(workers)}
    if problems:
        message = "; ".join(problems)
        result = [
            _condition(kind, kind == "Degraded", "InvalidSpec", message, generation)
            for kind in ("Ready", "Progressing", "Degraded")
        ]
    else:
        result = [
            _ready(desired_workers(spec), gw_ready, wk_ready, generation),
            _progressing(states, generation),
            _degraded(spec, states, gw_ready, wk_ready, generation),
        ]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = {c.get("type"): c for c in previous or []}
    for cond in result:
        before = old.get(cond["type"])
        same = before is not None and before.get("status") == cond["status"]
        cond["lastTransitionTime"] = (
            before.get("lastTransitionTime", now) if same and before else now
        )
    return result
