"""What the Spark Operator's pod webhook adds to a driver or executor pod, as a pure function.

Spark creates the driver and executor pods from the pod templates the Spark Operator wrote at
submission; the Spark Operator's mutating pod webhook (v2.5.2,
``internal/webhook/sparkpod_defaulter.go``) then appends what spark-submit has no flag for: the
role's ``env`` and ``envFrom``, the volumes its ``volumeMounts`` name (all but the
``spark-local-dir-*`` ones, which Spark mounts itself from conf), the Spark and Hadoop
ConfigMaps, the role's ``configMaps`` and ``ports``. In v2.5.2 the webhook is registered for
every pod labelled ``sparkoperator.k8s.io/launched-by-spark-operator=true`` (the chart's
``objectSelector``), which submission puts on every driver and executor, with a pod template
or without; so whatever the application says in these fields reaches the container.

:func:`mutate_pod` applies those rules to a pod (a dict) of a role, so that a test can check
that, say, the storage Secret our webhook writes into ``spec.executor.envFrom`` reaches the
executor's container. The scheduling fields (affinity, tolerations, node selectors, DNS,
security contexts, sidecars, init containers, GPU and memory limits, Prometheus) are not
modelled: nothing of statetier's depends on them.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["LOCAL_DIR_PREFIX", "mutate_pod", "spark_container"]

Obj = dict[str, Any]
LOCAL_DIR_PREFIX = "spark-local-dir-"
_CONTAINER_NAMES = {
    "driver": ("spark-kubernetes-driver",),
    # Spark 3 renamed the executor's container; the webhook looks for either name.
    "executor": ("executor", "spark-kubernetes-executor"),
}
_SPARK_CONF_DIR, _HADOOP_CONF_DIR = "/etc/spark/conf", "/etc/hadoop/conf"


def spark_container(pod: Obj, role: str) -> Obj:
    """The pod's Spark container as the webhook finds it: by the role's container names, else
    the first container (upstream's ``findContainer``)."""
    containers: list[Obj] = pod["spec"]["containers"]
    for container in containers:
        if container.get("name") in _CONTAINER_NAMES[role]:
            return container
    return containers[0]


def _config_map_volume(pod: Obj, container: Obj, config_map: str, volume: str, path: str) -> None:
    """Mount a ConfigMap read-only, as ``addConfigMapVolume`` and ``addConfigMapVolumeMount``."""
    pod["spec"].setdefault("volumes", []).append(
        {"name": volume, "configMap": {"name": config_map}}
    )
    mount = {"name": volume, "readOnly": True, "mountPath": path}
    container.setdefault("volumeMounts", []).append(mount)


def _add_volumes(pod: Obj, container: Obj, spec: Obj, role_spec: Obj) -> None:
    """Each volume the role mounts, once, with its mounts; local dirs are Spark's to mount."""
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    added: set[str] = set()
    for mount in role_spec.get("volumeMounts") or []:
        name = mount["name"]
        if name.startswith(LOCAL_DIR_PREFIX) or name not in volumes:
            continue
        if name not in added:
            pod["spec"].setdefault("volumes", []).append(copy.deepcopy(volumes[name]))
            added.add(name)
        container.setdefault("volumeMounts", []).append(copy.deepcopy(mount))


def _add_config_maps(pod: Obj, container: Obj, spec: Obj, role_spec: Obj) -> None:
    """The Hadoop and Spark ConfigMaps (with their ``*_CONF_DIR``), then the role's own."""
    for field, volume, path, env in (
        ("hadoopConfigMap", "hadoop-configmap-volume", _HADOOP_CONF_DIR, "HADOOP_CONF_DIR"),
        ("sparkConfigMap", "spark-configmap-volume", _SPARK_CONF_DIR, "SPARK_CONF_DIR"),
    ):
        if spec.get(field) is not None:
            _config_map_volume(pod, container, spec[field], volume, path)
            container.setdefault("env", []).append({"name": env, "value": path})
    for item in role_spec.get("configMaps") or []:
        volume = (item["name"] + "-vol")[:63]
        _config_map_volume(pod, container, item["name"], volume, item["path"])


def mutate_pod(pod: Obj, app: Obj, role: str) -> Obj:
    """``pod`` (of ``role``, "driver" or "executor") as the webhook leaves it; a new dict.

    The order is upstream's: env, envFrom, ConfigMaps, volumes, ports; each appends.
    """
    pod = copy.deepcopy(pod)
    spec = app.get("spec") or {}
    role_spec = spec.get(role) or {}
    container = spark_container(pod, role)
    if role_spec.get("env"):
        container["env"] = [*(container.get("env") or []), *copy.deepcopy(role_spec["env"])]
    env_from = copy.deepcopy(role_spec.get("envFrom") or [])
    container["envFrom"] = [*(container.get("envFrom") or []), *env_from]
    _add_config_maps(pod, container, spec, role_spec)
    _add_volumes(pod, container, spec, role_spec)
    for port in role_spec.get("ports") or []:
        entry = {"name": port["name"], "containerPort": port["containerPort"]}
        container.setdefault("ports", []).append({**entry, "protocol": port["protocol"]})
    return pod
