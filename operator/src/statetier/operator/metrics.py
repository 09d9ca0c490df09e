"""Prometheus metrics of the operator (prefix ``statetier_``).

Every metric the operator exports is declared here, and :data:`DOCUMENTED` lists their names so
that tests can check that the scraped endpoint, docs/operator.md and any dashboard agree.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from prometheus_client import (
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

__all__ = [
    "ADMISSIONS",
    "AUTOSCALER_DECISIONS",
    "AUTOSCALER_DOCUMENTED",
    "AUTOSCALER_LOAD",
    "AUTOSCALER_RECOMMENDED",
    "DOCUMENTED",
    "ERRORS",
    "MANAGED_APPLICATIONS",
    "RECONCILE_SECONDS",
    "SNAPSHOT_DOCUMENTED",
    "RECONCILIATIONS",
    "SNAPSHOTS",
    "SNAPSHOT_LAST_SUCCESS",
    "WORKERS_CURRENT",
    "WORKERS_DESIRED",
    "advance_last_success",
    "reconciling",
    "serve",
]

# The *_created series double what a scrape shows and no panel or alert uses them.
disable_created_metrics()  # type: ignore[no-untyped-call]

RECONCILIATIONS = Counter(
    "statetier_operator_reconciliations",
    "Reconciliations run, by resource kind and outcome (success or error).",
    ["resource", "outcome"],
)
RECONCILE_SECONDS = Histogram(
    "statetier_operator_reconcile_duration_seconds",
    "Wall time of one reconciliation, by resource kind.",
    ["resource"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
ERRORS = Counter(
    "statetier_operator_errors",
    "Errors while handling a resource, by resource kind and the handler that failed.",
    ["resource", "handler"],
)
ADMISSIONS = Counter(
    "statetier_operator_admissions",
    "Admission reviews answered, by webhook (mutate, validate) and outcome "
    "(mutated, unchanged, skipped, allowed, rejected).",
    ["webhook", "outcome"],
)
MANAGED_APPLICATIONS = Gauge(
    "statetier_operator_managed_applications",
    "SparkApplications that opted in to statetier and exist now.",
)
WORKERS_DESIRED = Gauge(
    "statetier_compaction_workers_desired",
    "Worker replicas the operator asks for, per CompactionService.",
    ["namespace", "name"],
)
WORKERS_CURRENT = Gauge(
    "statetier_compaction_workers_current",
    "Worker replicas that exist, per CompactionService (from the worker Deployment's status).",
    ["namespace", "name"],
)

SNAPSHOTS = Counter(
    "statetier_snapshots",
    "StateSnapshots that ended, by namespace, application (or source checkpoint URI) and "
    "outcome (succeeded, failed).",
    ["namespace", "application", "outcome"],
)
SNAPSHOT_LAST_SUCCESS = Gauge(
    "statetier_snapshot_last_success_timestamp_seconds",
    "Finish time (Unix seconds) of the newest StateSnapshot that succeeded, per namespace and "
    "application (or source checkpoint URI); its age is time() minus it.",
    ["namespace", "application"],
)

AUTOSCALER_DECISIONS = Counter(
    "statetier_operator_autoscaler_decisions",
    "Autoscaling periods of CompactionServices, by what was decided (up, down, unchanged, "
    "unreachable: the gateway could not be read).",
    ["decision"],
)
AUTOSCALER_RECOMMENDED = Gauge(
    "statetier_compaction_autoscaler_recommended_workers",
    "Workers the autoscaler recommends from the gateway's load this period, per "
    "CompactionService (before the scale-down stabilization window).",
    ["namespace", "name"],
)
AUTOSCALER_LOAD = Gauge(
    "statetier_compaction_autoscaler_load",
    "Queued plus running jobs the autoscaler read from the gateway, per CompactionService.",
    ["namespace", "name"],
)

# Per-service series of the autoscaler: they exist once a service with autoscaling ran a period.
AUTOSCALER_DOCUMENTED: tuple[str, ...] = (
    "statetier_compaction_autoscaler_recommended_workers",
    "statetier_compaction_autoscaler_load",
)

# Names as they appear on the scraped endpoint (counters get _total, histograms _bucket etc.).
DOCUMENTED: tuple[str, ...] = (
    "statetier_operator_reconciliations_total",
    "statetier_operator_reconcile_duration_seconds",
    "statetier_operator_errors_total",
    "statetier_operator_admissions_total",
    "statetier_operator_managed_applications",
    "statetier_compaction_workers_desired",
    "statetier_compaction_workers_current",
    "statetier_operator_autoscaler_decisions_total",
)

# Per-application series of StateSnapshots: they exist once a snapshot of that application ended.
SNAPSHOT_DOCUMENTED: tuple[str, ...] = (
    "statetier_snapshots_total",
    "statetier_snapshot_last_success_timestamp_seconds",
)


def advance_last_success(namespace: str, application: str, timestamp: float) -> None:
    """Move an application's last successful snapshot time forward, never back: a snapshot
    older than the newest one, seen again when the operator resumes, changes nothing."""
    labels = {"namespace": namespace, "application": application}
    name = "statetier_snapshot_last_success_timestamp_seconds"
    current = REGISTRY.get_sample_value(name, labels) or 0.0
    SNAPSHOT_LAST_SUCCESS.labels(namespace, application).set(max(current, timestamp))


@contextlib.contextmanager
def reconciling(resource: str) -> Iterator[None]:
    """Count and time one reconciliation of ``resource``; an exception counts as an error."""
    started = time.perf_counter()
    try:
        yield
    except BaseException:
        RECONCILIATIONS.labels(resource, "error").inc()
        raise
    else:
        RECONCILIATIONS.labels(resource, "success").inc()
    finally:
        RECONCILE_SECONDS.labels(resource).observe(time.perf_counter() - started)


def serve(addr: str, port: int) -> None:
    """Start the metrics endpoint in a background thread (prometheus-client's own server)."""
    # Touch the label-less series and the outcome labels so a scrape lists every metric at once,
    # before the first event happens.
    for resource in ("compactionservice", "sparkapplication", "statesnapshot"):
        RECONCILIATIONS.labels(resource, "success")
        RECONCILIATIONS.labels(resource, "error")
        RECONCILE_SECONDS.labels(resource)
        ERRORS.labels(resource, "reconcile")
    for webhook, outcome in (
        ("mutate", "mutated"),
        ("mutate", "unchanged"),
        ("mutate", "skipped"),
        ("validate", "allowed"),
        ("validate", "rejected"),
    ):
        ADMISSIONS.labels(webhook, outcome)
    for decision in ("up", "down", "unchanged", "unreachable"):
        AUTOSCALER_DECISIONS.labels(decision)
    start_http_server(port, addr=addr)
