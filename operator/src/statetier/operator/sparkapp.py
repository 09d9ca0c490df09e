"""What the mutating webhook does to an opted-in SparkApplication, as a pure function.

:func:`mutate` takes the application and returns the fields to change: the spill volume (named
``spark-local-dir-statetier`` so that Spark uses it as a local dir, as the Spark Operator
documents for volumes with that prefix), its mount on the executors, and the backend settings
in ``spec.sparkConf`` under exactly the keys of :mod:`statetier.backend.config`. Each value is
parsed by the backend's own parser before it is written, so the operator cannot write anything
the backend would refuse. Applying it to its own output changes nothing (idempotent), which is
what lets the apiserver call the webhook again on every update.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from statetier.backend.config import SETTINGS, Setting, parse_size
from statetier.operator.annotations import STATUS, AppSettings

__all__ = ["POD_LABEL", "VOLUME_NAME", "Mutation", "derive_memory_budget", "mutate", "spark_key"]

Obj = dict[str, Any]
VOLUME_NAME = "spark-local-dir-statetier"
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
    return str(parsed)


def _spark_memory(text: Any) -> int | None:
    """Spark memory strings (``4g``, ``512m``, bare numbers are MiB) in bytes."""
    if text is None:
        return None
    raw = str(text).strip().lower()
    return parse_size(raw if raw[-1:].isalpha() else raw + "m")


def derive_memory_budget(spec: Obj, settings: AppSettings) -> tuple[int | None, str]:
    """Budget for the state in one Python worker, and where it came from.

    The state lives in the Python workers, which Spark bounds with
    ``spark.executor.pyspark.memory`` shared by the executor's cores (one worker per core);
    without it they live in the memory overhead. The budget is ``memory-fraction`` of one
    worker's share, or the ``memory-budget`` annotation verbatim.
    """
    if settings.memory_budget is not None:
        return settings.memory_budget, "annotation statetier.io/memory-budget"
    executor = spec.get("executor") or {}
    cores = max(1, int(executor.get("cores") or 1))
    conf = spec.get("sparkConf") or {}
    pyspark = _spark_memory(conf.get("spark.executor.pyspark.memory"))
    source = "spark.executor.pyspark.memory"
    if pyspark is None:
        pyspark = _spark_memory(executor.get("memoryOverhead"))
        source = "executor.memoryOverhead"
    if pyspark is None:
        heap = _spark_memory(executor.get("memory"))
        if heap is None:
            return None, "unknown (no executor memory settings): the backend uses the cgroup limit"
        pyspark = max(384 << 20, heap // 10)
        source = "executor.memory (default overhead: max(384m, 10%))"
    budget = int(pyspark * settings.memory_fraction / cores)
    return budget, f"{settings.memory_fraction:g} x {source} / {cores} cores"


def _volume(settings: AppSettings) -> Obj:
    if settings.spill_volume == "ephemeral":
        claim: Obj = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": settings.spill_size}},
        }
        if settings.storage_class:
            claim["storageClassName"] = settings.storage_class
        return {
            "name": VOLUME_NAME,
            "ephemeral": {
                "volumeClaimTemplate": {
                    "metadata": {"labels": {"app.kubernetes.io/managed-by": "statetier-operator"}},
                    "spec": claim,
                }
            },
        }
    if settings.spill_volume == "hostPath":
        return {
            "name": VOLUME_NAME,
            "hostPath": {"path": settings.host_path, "type": "DirectoryOrCreate"},
        }
    empty: Obj = {"sizeLimit": settings.spill_size} if settings.spill_size else {}
    return {"name": VOLUME_NAME, "emptyDir": empty}


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


def mutate(
    body: Obj,
    settings: AppSettings,
    compaction_endpoint: str | None,
    compaction_problem: str | None = None,
) -> Mutation:
    """Compute what to change in ``body`` (a SparkApplication) for statetier."""
    spec = copy.deepcopy(body.get("spec") or {})
    warnings: list[str] = []

    volume = _volume(settings)
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") != VOLUME_NAME] + [volume]
    executor = _with_secret_env(spec.get("executor") or {}, settings.storage_secret)
    driver = _with_secret_env(spec.get("driver") or {}, settings.storage_secret)
    mount = {"name": VOLUME_NAME, "mountPath": settings.mount_path}
    mounts = [m for m in executor.get("volumeMounts") or [] if m.get("name") != VOLUME_NAME]
    executor["volumeMounts"] = [*mounts, mount]
    # The Spark Operator puts these labels on the pods: a PodMonitor selects the drivers and
    # executors of opted-in applications by it (the driver exports the checkpoint metrics).
    for role in (driver, executor):
        role["labels"] = {**(role.get("labels") or {}), POD_LABEL: "true"}

    budget, budget_source = derive_memory_budget(spec, settings)
    conf = dict(spec.get("sparkConf") or {})
    conf[spark_key("spill.dirs")] = _checked("spill.dirs", settings.mount_path)
    if budget is not None:
        conf[spark_key("memory.budget")] = _checked("memory.budget", budget)
    if settings.checkpoint_uri:
        conf[spark_key("checkpoint.uri")] = _checked("checkpoint.uri", settings.checkpoint_uri)
    else:
        warnings.append(
            "no statetier.io/checkpoint-uri: checkpoints go to the backend default, "
            "which is local to each pod"
        )
    if compaction_endpoint:
        conf[spark_key("compaction.endpoints")] = _checked(
            "compaction.endpoints", compaction_endpoint
        )
    elif settings.compaction_service:
        warnings.append(
            compaction_problem
            or f"CompactionService {settings.compaction_service} has no endpoint yet: "
            "compaction runs locally"
        )

    summary: Obj = {
        "spillVolume": settings.spill_volume,
        "spillDirs": settings.mount_path,
        "memoryBudget": budget,
        "memoryBudgetFrom": budget_source,
        "checkpointUri": settings.checkpoint_uri,
        "checkpointRetention": settings.retention,
        "compactionEndpoint": compaction_endpoint,
        "storageSecret": settings.storage_secret,
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
