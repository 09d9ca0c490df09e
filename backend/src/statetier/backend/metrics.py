"""Process-wide Prometheus metrics of the backend outside the spill tier (prefix ``statetier_``).

The spill tier has its own series (:mod:`statetier.backend.spill.metrics`). This module holds the
rest, each behind a one-line call so the owning code stays small, and the process's endpoint
for all of them (:func:`serve_metrics`, on ``metrics.port``):

* checkpoints: :func:`checkpoint_committed` / :func:`checkpoint_failed` (duration, size,
  outcome, time of the last commit, for the "stale" alert);
* the maintenance after a commit: :func:`compaction_done` (one chain compacted or failed) and
  :func:`retention_done` (one retention run), separate because one never stops the other;
* state locality: :func:`warm_hit` / :func:`cold_restore` (a key-group range found warm in the
  process, or restored from tier 2), for the warm-hit rate;
* spill volumes: :func:`watch_spill_dirs` registers the spill directories; their capacity and
  free bytes are read with ``statvfs`` at each scrape, for the "spill volume nearly full" alert.

Dashboards and alerts use only the names in :data:`METRIC_NAMES` and the spill tier's.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = [
    "METRIC_NAMES",
    "checkpoint_committed",
    "checkpoint_failed",
    "cold_restore",
    "compaction_done",
    "gathered_piece",
    "retention_done",
    "serve_metrics",
    "warm_hit",
    "watch_spill_dirs",
]

log = logging.getLogger(__name__)

CHECKPOINT_SECONDS = Histogram(
    "statetier_checkpoint_duration_seconds",
    "Start of an epoch checkpoint to its manifest being committed.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
CHECKPOINT_SIZE = Histogram(
    "statetier_checkpoint_size_bytes",
    "Bytes written to object storage by one committed checkpoint (data files).",
    buckets=(1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 23, 1 << 26, 1 << 29, 1 << 32),
)
CHECKPOINTS = Counter(
    "statetier_checkpoints", "Epoch checkpoints, by outcome (committed, failed).", ["outcome"]
)
LAST_COMMIT = Gauge(
    "statetier_checkpoint_last_success_timestamp_seconds",
    "Unix time of the last committed checkpoint of this process (0: none yet).",
)
WARM_HITS = Counter(
    "statetier_state_warm_hits",
    "Key-group ranges whose state was already in this process when a task needed it.",
)
COLD_RESTORES = Counter(
    "statetier_state_cold_restores",
    "Key-group ranges whose state had to be restored from tier 2 (ownership moved, restart).",
)
COMPACTIONS = Counter(
    "statetier_compactions",
    "Chains compacted after a commit, by outcome (succeeded, failed).",
    ["outcome"],
)
RETENTION_RUNS = Counter(
    "statetier_retention_runs",
    "Retention runs after a commit, by outcome (succeeded, failed).",
    ["outcome"],
)
GATHERED_PIECE_BYTES = Counter(
    "statetier_gathered_piece_bytes",
    "Bytes of gathered ranges' pieces a state host received, by where it kept them until their "
    "range ran (memory, disk: beyond half of memory.runtime-allowance).",
    ["kept"],
)
for _outcome in ("committed", "failed"):
    CHECKPOINTS.labels(_outcome)
for _outcome in ("succeeded", "failed"):
    COMPACTIONS.labels(_outcome)
    RETENTION_RUNS.labels(_outcome)
for _kept in ("memory", "disk"):
    GATHERED_PIECE_BYTES.labels(_kept)

METRIC_NAMES = (
    "statetier_checkpoint_duration_seconds",
    "statetier_checkpoint_size_bytes",
    "statetier_checkpoints_total",
    "statetier_checkpoint_last_success_timestamp_seconds",
    "statetier_compactions_total",
    "statetier_retention_runs_total",
    "statetier_state_warm_hits_total",
    "statetier_state_cold_restores_total",
    "statetier_gathered_piece_bytes_total",
    "statetier_spill_volume_capacity_bytes",
    "statetier_spill_volume_free_bytes",
)

_served: list[int] = []  # the port, once started
_lock = threading.Lock()


def serve_metrics(port: int) -> None:
    """Start the process's metrics endpoint on ``port`` once (0: do nothing): every series of
    the backend and its spill tier, one endpoint per process, started by the runtime that
    drives the process (a Spark driver or state host, a LocalRunner), never by a backend made
    for one range."""
    if not port:
        return
    with _lock:
        if _served:
            return
        try:
            start_http_server(port)
        except OSError as exc:  # another runtime in the process, or another process, has it
            log.warning("metrics endpoint on port %d not started: %s", port, exc)
        _served.append(port)


def checkpoint_committed(seconds: float, size_bytes: int) -> None:
    """One checkpoint committed in ``seconds``, having written ``size_bytes``."""
    CHECKPOINT_SECONDS.observe(seconds)
    CHECKPOINT_SIZE.observe(size_bytes)
    CHECKPOINTS.labels("committed").inc()
    LAST_COMMIT.set(time.time())


def gathered_piece(nbytes: int, on_disk: bool) -> None:
    """A state host received a gathered range's piece of ``nbytes`` and kept it in memory or
    (``on_disk``) in a file until its range ran."""
    GATHERED_PIECE_BYTES.labels("disk" if on_disk else "memory").inc(nbytes)


def checkpoint_failed() -> None:
    """One checkpoint that did not commit."""
    CHECKPOINTS.labels("failed").inc()


def compaction_done(succeeded: bool) -> None:
    """One chain's compaction after a commit finished (or failed)."""
    COMPACTIONS.labels("succeeded" if succeeded else "failed").inc()


def retention_done(succeeded: bool) -> None:
    """One retention run after a commit finished (or failed)."""
    RETENTION_RUNS.labels("succeeded" if succeeded else "failed").inc()


def warm_hit(ranges: int = 1) -> None:
    """``ranges`` key-group ranges were served from state already in the process."""
    WARM_HITS.inc(ranges)


def cold_restore(ranges: int = 1) -> None:
    """``ranges`` key-group ranges had to be restored from tier 2."""
    COLD_RESTORES.inc(ranges)


class _SpillVolumes(Collector):
    """Capacity and free bytes of the file systems of the registered spill directories."""

    def __init__(self) -> None:
        self._dirs: set[str] = set()
        self._lock = threading.Lock()

    def add(self, dirs: Iterable[str]) -> None:
        with self._lock:
            self._dirs.update(os.path.abspath(d) for d in dirs)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        capacity = GaugeMetricFamily(
            "statetier_spill_volume_capacity_bytes",
            "Size of the file system holding a spill directory.",
            labels=["dir"],
        )
        free = GaugeMetricFamily(
            "statetier_spill_volume_free_bytes",
            "Bytes available to this process on the file system of a spill directory.",
            labels=["dir"],
        )
        with self._lock:
            dirs = sorted(self._dirs)
        for path in dirs:
            try:
                stat = os.statvfs(path)
            except OSError:
                continue  # gone or not yet created: no sample rather than a wrong one
            capacity.add_metric([path], stat.f_blocks * stat.f_frsize)
            free.add_metric([path], stat.f_bavail * stat.f_frsize)
        yield capacity
        yield free


_VOLUMES = _SpillVolumes()
REGISTRY.register(_VOLUMES)


def watch_spill_dirs(dirs: Iterable[str]) -> None:
    """Report the capacity and free space of these spill directories' file systems."""
    _VOLUMES.add(dirs)
