"""How many state hosts an executor runs, which one a task uses, and each one's memory budget.

One host process runs its ranges in one Python interpreter: one core at most, whatever the
executor has. So an executor runs a host per task slot (``host.per-executor``, default one per
slot: executor cores / ``spark.task.cpus``), each owning its own ranges, so that its cores all
work on state. The driver decides the number from its Spark conf and the tasks carry it
(:class:`~statetier.backend.spark.messages.PipelineSpec`); a task uses the host of slot
``partition id mod hosts`` of its executor (a stable rule: no coordination between tasks), and
starts it if none runs. Every host registers with the driver's registry, which spreads ranges
over all of them.

The hosts share the executor's memory: ``memory.budget`` is the executor's, and each host's
governor (one per process, as FLIP-50's monitor) keeps its own process within an equal share.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping

from statetier.backend.config import StatetierConfig
from statetier.backend.process_memory import resolve_budget

__all__ = ["host_budget", "host_config", "hosts_per_executor", "slot_of", "task_slots"]

_LOCAL = re.compile(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*\d+\s*,\s*(\d+)\s*,\s*\d+\s*\]")


def _executor_cores(master: str, conf: Mapping[str, str]) -> int | None:
    """An executor's cores: K of ``local[K]`` (``*``: this machine's), C of
    ``local-cluster[N,C,M]``, else ``spark.executor.cores``; None when unknown."""
    master = master.strip()
    cluster = _LOCAL_CLUSTER.fullmatch(master)
    if cluster:
        return int(cluster.group(1))
    local = _LOCAL.fullmatch(master)
    if local:
        threads = local.group(1)
        if threads is None:
            return 1
        return (os.cpu_count() or 1) if threads == "*" else int(threads)
    cores = conf.get("spark.executor.cores", "").strip()
    return int(cores) if cores.isdigit() else None


def task_slots(master: str, conf: Mapping[str, str]) -> int:
    """An executor's task slots: its cores / ``spark.task.cpus`` (at least 1; 1 when the
    cores are unknown, as on a standalone or YARN cluster without ``spark.executor.cores``)."""
    cores = _executor_cores(master, conf)
    cpus = conf.get("spark.task.cpus", "1").strip()
    per_task = int(cpus) if cpus.isdigit() and int(cpus) > 0 else 1
    return max(1, (cores or 1) // per_task)


def hosts_per_executor(
    configured: int, master: str, conf: Mapping[str, str], parallelism: int
) -> int:
    """The state hosts each executor runs: ``host.per-executor`` when set (> 0), else one per
    task slot; never more than the pipeline's ranges (a host without a range is idle)."""
    hosts = configured if configured > 0 else task_slots(master, conf)
    return max(1, min(hosts, parallelism))


def slot_of(partition: int, hosts: int) -> int:
    """The host slot a task of ``partition`` uses on its executor: partition mod hosts, so that
    the tasks Spark runs side by side (consecutive partitions) use different hosts."""
    return partition % max(1, hosts)


def host_budget(executor_budget: int, hosts: int) -> int:
    """One host's state budget: the executor's (``memory.budget``; 0: the container's limit,
    else physical memory) split evenly across its ``hosts``. One host keeps the setting as it
    is (0 stays 0: the governor resolves it, and says where it came from)."""
    if hosts <= 1:
        return executor_budget
    budget = executor_budget if executor_budget > 0 else resolve_budget(0)[0]
    return budget // max(1, hosts)


def host_config(config: StatetierConfig, hosts: int) -> StatetierConfig:
    """A host's settings: ``memory.budget`` as its share of the executor's (see
    :func:`host_budget`); ``memory.runtime-allowance`` stays per process (each host has its own
    interpreter and libraries)."""
    share = host_budget(config.memory_budget, hosts)
    if share == config.memory_budget:
        return config
    return dataclasses.replace(config, memory_budget=share)
