"""What the mutating webhook does to an opted-in SparkApplication, as a pure function.

:func:`mutate` takes the application and returns the fields to change: the spill volume (named
``spark-local-dir-statetier`` so that Spark uses it as a local dir, as the Spark Operator
documents for volumes with that prefix), its mount on the executors, and the backend settings
in ``spec.sparkConf`` under exactly the keys of :mod:`statetier.backend.config`, and the
executors' ``memoryOverhead`` raised to cover the state host (:mod:`statetier.operator.memory`:
the budget and the overhead follow one formula; the status annotation shows its arithmetic).
Each value is parsed by the backend's own parser before it is written, so the operator cannot
write anything the backend would refuse. Applying it to its own output changes nothing
(idempotent), which is what lets the apiserver call the webhook again on every update.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from statetier.backend.config import SETTINGS, Setting
from statetier.operator import compaction_token, memory
from statetier.operator.annotations import STATUS, AppSettings

__all__ = [
    "GROUP",
    "PLURAL",
    "DEFAULT_EXECUTOR_METRICS_PORT",
    "ON_DEMAND",
    "POD_LABEL",
    "VERSION",
    "VOLUME_NAME",
    "Mutation",
    "mutate",
    "pod_template_volume",
    "spark_key",
    "without_claim_options",
]

Obj = dict[str, Any]
# The Kubeflow Spark Operator's resource, which the webhooks and the handlers both name.
GROUP, VERSION, PLURAL = "sparkoperator.k8s.io", "v1beta2", "sparkapplications"
VOLUME_NAME = "spark-local-dir-statetier"
ON_DEMAND = "OnDemand"  # Spark's claim name for "create a PVC per executor pod"
_CLAIM_OPTIONS = f"spark.kubernetes.executor.volumes.persistentVolumeClaim.{VOLUME_NAME}.options."
DEFAULT_EXECUTOR_METRICS_PORT = 9108
"""The backend's metrics port in drivers and executors: the chart's executor PodMonitor scrapes
it (``executorMetrics.podMonitor.port``, which the chart also passes to the operator)."""
POD_LABEL = "statetier.io/enabled"
_SETTINGS: dict[str, Setting[Any]] = {s.name: s for s in SETTINGS}


def spark_key(name: str) -> str:
    """The Spark conf key of a backend setting (KeyError for a name the schema lacks)."""
    return _SETTINGS[name].spark_key


def _checked(name: str, value: Any) -> str:
    """Render a setting's value after the backend's own parser accepted it."""
    parsed = _SETTINGS[name].parse(value, f"operator value for {name}")
    if isinstance(parsed, tuple):
        return ",".join(parsed)
    if isinstance(parsed, bool):
        return "true" if parsed else "false"
    return str(parsed)


def _previous_summary(body: Obj) -> Obj:
    """The status annotation an earlier mutation wrote, or {} (absent or not ours)."""
    text = ((body.get("metadata") or {}).get("annotations") or {}).get(STATUS)
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _original_overhead(executor: Obj, previous: Obj) -> str | None:
    """The application's own executor memoryOverhead: the one recorded by an earlier mutation
    while the field still holds what that mutation wrote, else the field as it is (the user
    set or changed it since)."""
    current = executor.get("memoryOverhead")
    written = previous.get("memoryOverheadWritten")
    if written is not None and current is not None and str(current) == written:
        original = previous.get("memoryOverheadOriginal")
        return None if original is None else str(original)
    return None if current is None else str(current)


def _volume(settings: AppSettings) -> Obj:
    """The spill volume, of a kind the Spark Operator's submission maps to Spark conf for a
    ``spark-local-dir-*`` volume (emptyDir, hostPath, nfs, persistentVolumeClaim; any other kind
    fails the submission with ``unsupported volume type``). ``ephemeral`` is Spark's on-demand
    claim: ``claimName: OnDemand`` makes Spark create one PVC per executor pod, of the storage
    class and size that :func:`_on_demand_claim_conf` writes into sparkConf."""
    if settings.spill_volume == "ephemeral":
        return {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": ON_DEMAND}}
    if settings.spill_volume == "hostPath":
        return {
            "name": VOLUME_NAME,
            "hostPath": {"path": settings.host_path, "type": "DirectoryOrCreate"},
        }
    empty: Obj = {"sizeLimit": settings.spill_size} if settings.spill_size else {}
    return {"name": VOLUME_NAME, "emptyDir": empty}


def pod_template_volume(settings: AppSettings) -> Obj:
    """The spill volume as a pod template carries it (``render-app --pod-template``): a pod
    template takes any volume kind, so ``ephemeral`` is a generic ephemeral volume there (a
    PVC per executor pod that lives and dies with the pod), not Spark's on-demand claim, which
    only Spark conf can ask for."""
    if settings.spill_volume != "ephemeral":
        return _volume(settings)
    claim: Obj = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": settings.spill_size}},
    }
    if settings.storage_class:
        claim["storageClassName"] = settings.storage_class
    template = {
        "metadata": {"labels": {"app.kubernetes.io/managed-by": "statetier-operator"}},
        "spec": claim,
    }
    return {"name": VOLUME_NAME, "ephemeral": {"volumeClaimTemplate": template}}


def without_claim_options(conf: Obj) -> Obj:
    """``conf`` without the on-demand claim's options of the spill volume."""
    return {k: v for k, v in conf.items() if not k.startswith(_CLAIM_OPTIONS)}


def _on_demand_claim_conf(conf: Obj, settings: AppSettings) -> Obj:
    """``conf`` with the on-demand claim's options (storage class, size) when the spill volume
    is ``ephemeral``, and without them otherwise: a leftover option of a volume that is no
    longer a claim would make Spark parse a volume with no mount path and refuse to start."""
    conf = without_claim_options(conf)
    if settings.spill_volume == "ephemeral":
        conf[_CLAIM_OPTIONS + "sizeLimit"] = str(settings.spill_size)
        if settings.storage_class:
            conf[_CLAIM_OPTIONS + "storageClass"] = settings.storage_class
    return conf


def _with_secret_env(pod: Obj, secret: str | None) -> Obj:
    """``pod`` (spec.driver or spec.executor) with the Secret's keys as environment variables
    (envFrom), once; the object-store credentials reach every process of the pod that way."""
    pod = dict(pod)
    if secret is None:
        return pod
    ref = {"secretRef": {"name": secret}}
    sources = list(pod.get("envFrom") or [])
    if ref not in sources:
        pod["envFrom"] = [*sources, ref]
    return pod


def _with_env_var(pod: Obj, var: Obj | None) -> Obj:
    """``pod`` with ``var`` in its ``env``, replacing any variable of that name (so a second
    mutation, or a service whose Secret changed, leaves exactly one)."""
    pod = dict(pod)
    if var is None:
        return pod
    others = [e for e in pod.get("env") or [] if e.get("name") != var["name"]]
    pod["env"] = [*others, var]
    return pod


class Mutation:
    """The result of :func:`mutate`: changed top-level spec fields, annotations, a summary."""

    def __init__(
        self, spec_changes: Obj, annotations: dict[str, str], summary: Obj, warnings: list[str]
    ) -> None:
        self.spec_changes = spec_changes
        self.annotations = annotations
        self.summary = summary
        self.warnings = warnings

    @property
    def empty(self) -> bool:
        return not self.spec_changes and not self.annotations


def _spark_conf(
    spec: Obj,
    settings: AppSettings,
    sizing: memory.MemoryPlan | None,
    compaction_endpoint: str | None,
    metrics_port: int,
) -> Obj:
    """The application's sparkConf with every backend setting the tiers need: the spill tier
    on (its default is off), its dirs on the volume, the budget, the metrics port the chart
    scrapes, the checkpoint URI and the compaction endpoint."""
    conf = _on_demand_claim_conf(dict(spec.get("sparkConf") or {}), settings)
    conf[spark_key("spill.enabled")] = _checked("spill.enabled", "true")
    conf[spark_key("spill.dirs")] = _checked("spill.dirs", settings.mount_path)
    conf[spark_key("metrics.port")] = _checked("metrics.port", metrics_port)
    if sizing is not None:
        conf[spark_key("memory.budget")] = _checked("memory.budget", sizing.budget)
    if settings.checkpoint_uri:
        conf[spark_key("checkpoint.uri")] = _checked("checkpoint.uri", settings.checkpoint_uri)
    if settings.spark_checkpoint_uri:
        spark_uri = _checked("checkpoint.spark-uri", settings.spark_checkpoint_uri)
        conf[spark_key("checkpoint.spark-uri")] = spark_uri
    if compaction_endpoint:
        endpoint = _checked("compaction.endpoints", compaction_endpoint)
        conf[spark_key("compaction.endpoints")] = endpoint
    return conf


def _restore_conf(conf: Obj, restore_from: str | None, previous: Obj) -> Obj:
    """``conf`` with ``checkpoint.restore-from`` set to the resolved savepoint URI, or without
    the value an earlier mutation wrote once the annotation is gone (a value the user wrote in
    sparkConf is theirs and stays)."""
    key = spark_key("checkpoint.restore-from")
    if restore_from:
        return {**conf, key: _checked("checkpoint.restore-from", restore_from)}
    if previous.get("restoreFrom") and conf.get(key) == previous["restoreFrom"]:
        return {k: v for k, v in conf.items() if k != key}
    return conf


def mutate(
    body: Obj,
    settings: AppSettings,
    compaction_endpoint: str | None,
    compaction_problem: str | None = None,
    compaction_token_ref: tuple[str, str] | None = None,
    metrics_port: int = DEFAULT_EXECUTOR_METRICS_PORT,
    restore_from: str | None = None,
) -> Mutation:
    """Compute what to change in ``body`` (a SparkApplication) for statetier.

    ``compaction_token_ref`` is the (Secret, key) of the CompactionService's API token: with an
    endpoint, the driver and executors get it as ``STATETIER_COMPACTION_TOKEN`` from the
    Secret (``env`` ``valueFrom``), never as a value in ``sparkConf``. ``metrics_port`` is the
    port the chart's executor PodMonitor scrapes (the operator's ``--executor-metrics-port``).
    ``restore_from`` is the savepoint URI of ``statetier.io/restore-from``, a StateSnapshot name
    already resolved to its ``status.uri``.
    """
    spec = copy.deepcopy(body.get("spec") or {})
    warnings: list[str] = []

    volume = _volume(settings)
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") != VOLUME_NAME] + [volume]
    token_ref = compaction_token_ref if compaction_endpoint else None
    token = compaction_token.env(*token_ref) if token_ref else None
    executor = _with_secret_env(spec.get("executor") or {}, settings.storage_secret)
    driver = _with_secret_env(spec.get("driver") or {}, settings.storage_secret)
    executor, driver = _with_env_var(executor, token), _with_env_var(driver, token)
    mount = {"name": VOLUME_NAME, "mountPath": settings.mount_path}
    mounts = [m for m in executor.get("volumeMounts") or [] if m.get("name") != VOLUME_NAME]
    executor["volumeMounts"] = [*mounts, mount]
    # The Spark Operator puts these labels on the pods: a PodMonitor selects the drivers and
    # executors of opted-in applications by it (the driver exports the checkpoint metrics).
    for role in (driver, executor):
        role["labels"] = {**(role.get("labels") or {}), POD_LABEL: "true"}

    original = _original_overhead(executor, _previous_summary(body))
    try:
        sizing: memory.MemoryPlan | None = memory.plan(spec, settings, original)
    except ValueError as exc:
        sizing = None
        warnings.append(f"executor memory left as it is, no state budget set: {exc}")
    conf = _spark_conf(spec, settings, sizing, compaction_endpoint, metrics_port)
    conf = _restore_conf(conf, restore_from, _previous_summary(body))
    if sizing is not None:
        executor["memoryOverhead"] = sizing.spark_overhead
    if not settings.checkpoint_uri:
        warnings.append(
            "no statetier.io/checkpoint-uri: checkpoints go to the backend default, "
            "which is local to each pod"
        )
    if not compaction_endpoint and settings.compaction_service:
        warnings.append(
            compaction_problem
            or f"CompactionService {settings.compaction_service} has no endpoint yet: "
            "compaction runs locally"
        )

    summary: Obj = {
        "spillVolume": settings.spill_volume,
        "spillEnabled": True,
        "metricsPort": metrics_port,
        "spillDirs": settings.mount_path,
        "memoryBudget": sizing.budget if sizing else None,
        "memoryBudgetFrom": sizing.budget_from if sizing else None,
        "memoryOverhead": sizing.explanation if sizing else None,
        "memoryOverheadOriginal": original,
        "memoryOverheadWritten": sizing.spark_overhead if sizing else None,
        "checkpointUri": settings.checkpoint_uri,
        "sparkCheckpointUri": settings.spark_checkpoint_uri,
        "checkpointRetention": settings.retention,
        "compactionEndpoint": compaction_endpoint,
        "storageSecret": settings.storage_secret,
        "restoreFrom": restore_from,
        "compactionTokenSecret": "/".join(token_ref) if token_ref else None,
    }
    if warnings:
        summary["warnings"] = warnings

    changes: Obj = {}
    old = body.get("spec") or {}
    if old.get("volumes") != volumes:
        changes["volumes"] = volumes
    if old.get("executor") != executor:
        changes["executor"] = executor
    if old.get("driver") != driver:
        changes["driver"] = driver
    if old.get("sparkConf") != conf:
        changes["sparkConf"] = conf
    status_text = json.dumps(summary, sort_keys=True, separators=(",", ":"))
    annotations = {}
    if ((body.get("metadata") or {}).get("annotations") or {}).get(STATUS) != status_text:
        annotations[STATUS] = status_text
    return Mutation(changes, annotations, summary, warnings)
