"""The state budget of an executor's state hosts, and the executor memory that covers them.

State lives in the executor's state host processes, one per task slot by default (executor
cores / ``spark.task.cpus``; ``host.per-executor`` sets another number), each with its own
memory governor; the backend's ``memory.budget`` is the state budget of the whole executor, and
each host keeps its RSS within its equal share of it plus a runtime allowance of its own
(``memory.runtime-allowance``: interpreter, pyarrow, a batch's working memory; the backend
measures what it takes as ``statetier_runtime_memory_bytes``). The hosts are children of the
executor's pod outside the JVM heap, so the pod must have room for them beyond what Spark asked
for. The one formula, here and in docs/operator.md and docs/spill.md:

- budget = the ``statetier.io/memory-budget`` annotation if set, else ``memory-fraction``
  (annotation, default 0.5) x the executor memory (``spec.executor.memory``, else
  ``spark.executor.memory``, else Spark's default 1g);
- memoryOverhead = the overhead the application would have had (its own
  ``spec.executor.memoryOverhead`` or ``spark.executor.memoryOverhead``, else Spark's default
  max(384Mi, factor x executor memory), factor = ``spark.executor.memoryOverheadFactor``, else
  ``spec.memoryOverheadFactor``, else 0.4 for ``spec.type: Python`` and 0.1 otherwise)
  + budget + hosts x :data:`HOST_ALLOWANCE`, hosts being the executor's state hosts.

Spark sizes the executor pod's memory request and limit as memory + memoryOverhead (+ pyspark
memory if set), so raising memoryOverhead is what makes the pod cover the host.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from statetier.backend.config import SETTINGS, parse_size
from statetier.operator.annotations import AppSettings

SETTINGS_BY_NAME = {setting.name: setting for setting in SETTINGS}

__all__ = [
    "DEFAULT_EXECUTOR_MEMORY",
    "HOST_ALLOWANCE",
    "MIN_OVERHEAD",
    "MemoryPlan",
    "plan",
    "spark_memory",
    "state_hosts",
]

Obj = dict[str, Any]
MIB = 1 << 20
HOST_ALLOWANCE: int = SETTINGS_BY_NAME["memory.runtime-allowance"].default
"""Reserve for the state host's runtime beyond its budget: the interpreter, pyarrow and a
batch's working memory. The backend's own ``memory.runtime-allowance`` default, so that the pod
reserves what the host keeps itself within (it measures the real figure as
``statetier_runtime_memory_bytes``)."""
MIN_OVERHEAD = 384 * MIB  # Spark's MEMORY_OVERHEAD_MIN
DEFAULT_EXECUTOR_MEMORY = "1g"  # Spark's spark.executor.memory default


def spark_memory(text: Any) -> int | None:
    """Spark memory strings (``4g``, ``512m``; bare numbers are MiB) in bytes, or None."""
    if text is None or str(text).strip() == "":
        return None
    raw = str(text).strip().lower()
    return parse_size(raw if raw[-1:].isalpha() else raw + "m")


def _size(text: Any, field: str) -> int:
    """A Spark memory setting in bytes; ValueError naming the field and value."""
    try:
        size = spark_memory(text)
    except ValueError as exc:
        raise ValueError(f"{field}={text!r} is not a memory size: {exc}") from None
    if size is None or size <= 0:
        raise ValueError(f"{field}={text!r} is not a memory size")
    return size


def _mib(size: int) -> int:
    return math.ceil(size / MIB)


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """The budget and the executor's memoryOverhead, with where each number came from."""

    budget: int
    budget_from: str
    base_overhead: int
    base_from: str
    overhead_mib: int
    hosts: int = 1  # state hosts per executor, each with its own runtime allowance

    @property
    def spark_overhead(self) -> str:
        """``spec.executor.memoryOverhead`` as the Spark Operator takes it (``3738m``)."""
        return f"{self.overhead_mib}m"

    @property
    def explanation(self) -> str:
        """The arithmetic in words and numbers, for the status annotation."""
        allowance = f"{_mib(HOST_ALLOWANCE)}Mi host allowance"
        if self.hosts > 1:
            allowance = f"{self.hosts} x {allowance} ({self.hosts} state hosts)"
        return (
            f"{self.overhead_mib}Mi = {_mib(self.base_overhead)}Mi ({self.base_from}) + "
            f"{_mib(self.budget)}Mi budget + {allowance}"
        )


def _executor_memory(spec: Obj) -> tuple[int, str]:
    executor, conf = spec.get("executor") or {}, spec.get("sparkConf") or {}
    field = "spec.executor.memory" if executor.get("memory") else "spark.executor.memory"
    text = executor.get("memory") or conf.get("spark.executor.memory")
    if text is None:
        return parse_size(DEFAULT_EXECUTOR_MEMORY), f"{DEFAULT_EXECUTOR_MEMORY} (Spark default)"
    return _size(text, field), str(text)


def _factor(spec: Obj) -> tuple[float, str]:
    conf = spec.get("sparkConf") or {}
    for where, value in (
        ("spark.executor.memoryOverheadFactor", conf.get("spark.executor.memoryOverheadFactor")),
        ("spec.memoryOverheadFactor", spec.get("memoryOverheadFactor")),
    ):
        if value is not None:
            try:
                factor = float(value)
            except ValueError:
                raise ValueError(f"{where}={value!r} is not a number") from None
            if not 0 < factor < 100:
                raise ValueError(f"{where}={value!r} is not a positive factor")
            return factor, where
    if spec.get("type") == "Python":
        return 0.4, "Spark default for Python"
    return 0.1, "Spark default"


def _base_overhead(spec: Obj, original: str | None, memory: int, shown: str) -> tuple[int, str]:
    """The overhead the application would have had without statetier."""
    conf = spec.get("sparkConf") or {}
    own = original if original is not None else conf.get("spark.executor.memoryOverhead")
    if own is not None:
        where = "spec.executor" if original is not None else "spark.executor"
        where += ".memoryOverhead"
        return _size(own, where), f"{where} {own}"
    factor, where = _factor(spec)
    # Spark: max(MEMORY_OVERHEAD_MIN, (factor * executor memory in MiB).toLong) MiB.
    size = max(MIN_OVERHEAD, int(factor * (memory // MIB)) * MIB)
    return size, f"{where}: max(384Mi, {factor:g} x {shown})"


def plan(spec: Obj, settings: AppSettings, original_overhead: str | None) -> MemoryPlan:
    """The budget and memoryOverhead of ``spec`` (a SparkApplication's), by the one formula.

    ``original_overhead`` is the application's own ``spec.executor.memoryOverhead`` before any
    mutation (None: it had none), so that mutating a mutated object adds nothing again.
    Raises ValueError for a memory setting Spark would refuse too (the message names it).
    """
    memory, shown = _executor_memory(spec)
    if settings.memory_budget is not None:
        budget, budget_from = settings.memory_budget, "annotation statetier.io/memory-budget"
    else:
        budget = int(settings.memory_fraction * memory)
        budget_from = f"{settings.memory_fraction:g} x executor memory {shown}"
    base, base_from = _base_overhead(spec, original_overhead, memory, shown)
    hosts = state_hosts(spec)
    total = _mib(base) + _mib(budget) + hosts * _mib(HOST_ALLOWANCE)
    return MemoryPlan(budget, budget_from, base, base_from, total, hosts)


def _whole(value: Any, field: str) -> int | None:
    """A positive whole number of a spec or conf field, None when unset."""
    if value is None or str(value).strip() == "":
        return None
    text = str(value).strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{field}={value!r} is not a positive whole number")
    return int(text)


def state_hosts(spec: Obj) -> int:
    """The state hosts each executor runs, as the backend decides it (statetier.backend.spark
    .slots): ``spark.statetier.host.per-executor`` when set above 0, else one per task slot,
    executor cores (``spec.executor.cores``, else ``spark.executor.cores``, else 1) over
    ``spark.task.cpus``. The backend also caps it at the pipeline's ranges, which the operator
    does not know: it reserves for the cores."""
    executor, conf = spec.get("executor") or {}, spec.get("sparkConf") or {}
    configured = conf.get("spark.statetier.host.per-executor")
    if configured is not None and str(configured).strip() not in ("", "0"):
        return _whole(configured, "spark.statetier.host.per-executor") or 1
    cores = _whole(executor.get("cores"), "spec.executor.cores") or _whole(
        conf.get("spark.executor.cores"), "spark.executor.cores"
    )
    per_task = _whole(conf.get("spark.task.cpus"), "spark.task.cpus") or 1
    return max(1, (cores or 1) // per_task)
