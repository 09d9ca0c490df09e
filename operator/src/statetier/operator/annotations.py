"""The ``statetier.io/*`` annotations a SparkApplication opts in and configures itself with.

SparkApplication belongs to the Kubeflow Spark Operator, so statetier cannot add fields to its
schema: annotations are the extension point. Each one is declared here once, with what it
accepts; the validating webhook rejects a bad value with a message that names the annotation
and the allowed values, and the mutating webhook reads the parsed values.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from statetier.backend.config import parse_size

__all__ = ["ANNOTATIONS", "PREFIX", "STATUS", "UPGRADE", "AppSettings", "parse", "problems"]

PREFIX = "statetier.io/"
STATUS = PREFIX + "status"
"""Written by the operator: what it configured (JSON). Users do not set it."""
UPGRADE = PREFIX + "upgrade"
"""Written by the operator: the last upgrade and its phase (JSON, :mod:`.upgrade`)."""
_WRITTEN = (STATUS, UPGRADE)
_URI = re.compile(r"^(s3|file|memory)://.+")
_SPARK_URI = re.compile(r"^(s3|s3a|file|memory)://.+")

_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclasses.dataclass(frozen=True)
class Annotation:
    """One annotation: its key suffix, what it accepts (as text for messages), and a check."""

    key: str
    allowed: str
    check: Callable[[str], bool]
    meaning: str

    @property
    def full(self) -> str:
        return PREFIX + self.key


def _one_of(*choices: str) -> Callable[[str], bool]:
    return lambda value: value in choices


def _fraction(value: str) -> bool:
    try:
        return 0.05 <= float(value) <= 1.0
    except ValueError:
        return False


def _size(value: str) -> bool:
    try:
        return parse_size(value) > 0
    except ValueError:
        return False


def _service_ref(value: str) -> bool:
    parts = value.split("/")
    return (
        1 <= len(parts) <= 2
        and all(_DNS_LABEL.match(p) for p in parts[:-1])
        and bool(_DNS_SUBDOMAIN.match(parts[-1]))
    )


ANNOTATIONS: tuple[Annotation, ...] = (
    Annotation(
        "enabled",
        "true, false",
        _one_of("true", "false"),
        "Opt in: the webhook configures the application only when this is true.",
    ),
    Annotation(
        "spill-volume",
        "ephemeral, hostPath, emptyDir",
        _one_of("ephemeral", "hostPath", "emptyDir"),
        "Kind of the executors' spill volume (default emptyDir). ephemeral is a PVC per "
        "executor pod (Spark's on-demand claim, e.g. on local SSD), deleted with the "
        "application's driver.",
    ),
    Annotation(
        "spill-size",
        "a Kubernetes quantity such as 100Gi",
        lambda v: bool(_QUANTITY.match(v)),
        "Size of the spill volume; required for ephemeral, a size limit for emptyDir.",
    ),
    Annotation(
        "spill-storage-class",
        "a StorageClass name (DNS subdomain)",
        lambda v: bool(_DNS_SUBDOMAIN.match(v)),
        "StorageClass of the ephemeral spill volume's claims (default: the cluster's default).",
    ),
    Annotation(
        "spill-host-path",
        "an absolute path",
        lambda v: v.startswith("/"),
        "Node directory of a hostPath spill volume (required for hostPath).",
    ),
    Annotation(
        "spill-mount-path",
        "an absolute path",
        lambda v: v.startswith("/"),
        "Where executors mount the spill volume (default /var/lib/statetier/spill).",
    ),
    Annotation(
        "checkpoint-uri",
        "an s3://, file:// or memory:// URI",
        lambda v: bool(_URI.match(v)),
        "Where checkpoints go (backend setting checkpoint.uri).",
    ),
    Annotation(
        "checkpoint-retention",
        "retain, delete",
        _one_of("retain", "delete"),
        "On deletion of the application: keep the checkpoints (default) or delete them.",
    ),
    Annotation(
        "restore-from",
        "a savepoint URI (s3://, file://, memory://) or the name of a Succeeded StateSnapshot",
        lambda v: bool(_URI.match(v) or _DNS_SUBDOMAIN.match(v)),
        "Start the application's state from this savepoint (backend setting "
        "checkpoint.restore-from) when its own checkpoint holds no committed epoch yet.",
    ),
    Annotation(
        "spark-checkpoint-uri",
        "an s3://, s3a://, file:// or memory:// URI",
        lambda v: bool(_SPARK_URI.match(v)),
        "The query's Spark checkpoint location (backend setting checkpoint.spark-uri, which "
        "the application passes to checkpointLocation); an upgrade moves it with the state.",
    ),
    Annotation(
        "upgrade-mode",
        "last-state, savepoint, stateless",
        _one_of("last-state", "savepoint", "stateless"),
        "What the next run starts from when the spec changes (docs/state-lifecycle.md, "
        "Upgrades): the running checkpoint, a savepoint taken of it, or nothing.",
    ),
    Annotation(
        "savepoint-destination",
        "an s3://, file:// or memory:// URI",
        lambda v: bool(_URI.match(v)),
        "Where upgrade-mode savepoint writes its StateSnapshots (their spec.destination).",
    ),
    Annotation(
        "compaction-service",
        "a CompactionService name, or namespace/name",
        _service_ref,
        "CompactionService whose endpoint goes to compaction.endpoints.",
    ),
    Annotation(
        "storage-secret",
        "a Secret name (DNS subdomain)",
        lambda v: bool(_DNS_SUBDOMAIN.match(v)),
        "Secret in the application's namespace whose keys (AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL_S3, ...) become environment variables of the "
        "driver and the executors: object-store credentials never go into Spark conf.",
    ),
    Annotation(
        "memory-budget",
        "a size such as 2g or 512m",
        _size,
        "State memory budget of each executor, split evenly across its state hosts; overrides "
        "the derived one (the executor's memoryOverhead grows by it either way).",
    ),
    Annotation(
        "memory-fraction",
        "a number between 0.05 and 1.0",
        _fraction,
        "Share of the executor memory (spec.executor.memory, default 1g) given to the state "
        "hosts' budget (default 0.5).",
    ),
)

_BY_KEY = {a.full: a for a in ANNOTATIONS}


def problems(annotations: Mapping[str, str]) -> list[str]:
    """Every bad ``statetier.io/*`` annotation, each message naming it and what is allowed."""
    found: list[str] = []
    for key, value in sorted(annotations.items()):
        if not key.startswith(PREFIX) or key in _WRITTEN:
            continue
        spec = _BY_KEY.get(key)
        if spec is None:
            known = ", ".join(a.full for a in ANNOTATIONS)
            found.append(f"annotation {key} is not known; known annotations: {known}")
        elif not spec.check(str(value)):
            found.append(f"annotation {key}={value!r} is not valid: allowed values: {spec.allowed}")
    if annotations.get(PREFIX + "enabled") == "true":
        volume = annotations.get(PREFIX + "spill-volume", "emptyDir")
        if volume == "ephemeral" and PREFIX + "spill-size" not in annotations:
            found.append(
                f"annotation {PREFIX}spill-size is required when "
                f"{PREFIX}spill-volume is ephemeral: allowed values: a Kubernetes "
                "quantity such as 100Gi"
            )
        if volume == "hostPath" and PREFIX + "spill-host-path" not in annotations:
            found.append(
                f"annotation {PREFIX}spill-host-path is required when "
                f"{PREFIX}spill-volume is hostPath: allowed values: an absolute path"
            )
        found += _upgrade_problems(annotations)
    return found


_UPGRADE_NEEDS = {
    "savepoint": ("checkpoint-uri", "spark-checkpoint-uri", "savepoint-destination"),
    "stateless": ("checkpoint-uri", "spark-checkpoint-uri"),
}


def _upgrade_problems(annotations: Mapping[str, str]) -> list[str]:
    """An upgrade mode that moves the state needs both locations it moves (and a place for
    the savepoint): without the Spark one, the new run would resume an old micro-batch."""
    mode = annotations.get(PREFIX + "upgrade-mode", "")
    return [
        f"annotation {PREFIX}{key} is required when {PREFIX}upgrade-mode is {mode}: allowed "
        f"values: {_BY_KEY[PREFIX + key].allowed}"
        for key in _UPGRADE_NEEDS.get(mode, ())
        if PREFIX + key not in annotations
    ]


@dataclasses.dataclass(frozen=True)
class AppSettings:
    """Parsed annotations of an opted-in application (after :func:`problems` found none)."""

    spill_volume: str = "emptyDir"
    spill_size: str | None = None
    storage_class: str | None = None
    host_path: str | None = None
    mount_path: str = "/var/lib/statetier/spill"
    checkpoint_uri: str | None = None
    retention: str = "retain"
    compaction_service: str | None = None
    memory_budget: int | None = None
    memory_fraction: float = 0.5
    storage_secret: str | None = None
    restore_from: str | None = None
    spark_checkpoint_uri: str | None = None
    upgrade_mode: str | None = None
    savepoint_destination: str | None = None


def enabled(annotations: Mapping[str, Any]) -> bool:
    """Whether the application opted in."""
    return annotations.get(PREFIX + "enabled") == "true"


def parse(annotations: Mapping[str, str]) -> AppSettings:
    """Read the settings; raises ValueError listing the problems if there are any."""
    bad = problems(annotations)
    if bad:
        raise ValueError("; ".join(bad))

    def get(key: str) -> str | None:
        return annotations.get(PREFIX + key)

    return AppSettings(
        spill_volume=get("spill-volume") or "emptyDir",
        spill_size=get("spill-size"),
        storage_class=get("spill-storage-class"),
        host_path=get("spill-host-path"),
        mount_path=get("spill-mount-path") or "/var/lib/statetier/spill",
        checkpoint_uri=get("checkpoint-uri"),
        retention=get("checkpoint-retention") or "retain",
        compaction_service=get("compaction-service"),
        memory_budget=parse_size(get("memory-budget")) if get("memory-budget") else None,
        memory_fraction=float(get("memory-fraction") or 0.5),
        storage_secret=get("storage-secret"),
        restore_from=get("restore-from"),
        spark_checkpoint_uri=get("spark-checkpoint-uri"),
        upgrade_mode=get("upgrade-mode"),
        savepoint_destination=get("savepoint-destination"),
    )
