"""Prometheus metrics of the compaction gateway (prefix ``statetier_compaction_``).

One registry per gateway (not the process-global one), so tests can run several gateways in
one process. :data:`DOCUMENTED` lists the scraped names (the contract dashboards and alerts rely
on, written out rather than derived); a test checks that docs/compaction.md and the endpoint
both have every one.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["DOCUMENTED", "GatewayMetrics"]

PREFIX = "statetier_compaction_"
DOCUMENTED: tuple[str, ...] = tuple(
    PREFIX + name
    for name in (
        "queue_depth",
        "jobs_running",
        "workers_alive",
        "jobs_submitted_total",
        "jobs_total",
        "tenant_jobs_total",
        "job_duration_seconds",
        "input_bytes_total",
        "output_bytes_total",
        "leases_lost_total",
        "requests_refused_total",
    )
)
OUTCOMES = ("succeeded", "failed", "aborted")
REFUSALS = ("path", "token", "invalid", "queue_full")
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class GatewayMetrics:
    """The gateway's series; gauges are set from the scheduler at each scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.queue_depth = self._gauge("queue_depth", "Jobs waiting for a worker.")
        self.running = self._gauge("jobs_running", "Jobs a worker holds a lease on.")
        self.workers_alive = self._gauge(
            "workers_alive", "Workers that heartbeated within the lease time."
        )
        self.submitted = self._counter("jobs_submitted", "Jobs accepted by the gateway.")
        self.finished = self._counter(
            "jobs", "Jobs finished, by outcome (succeeded, failed, aborted).", "outcome"
        )
        self.tenant_finished = self._counter(
            "tenant_jobs",
            "Jobs finished, by tenant (the checkpoint location a job writes under) and outcome.",
            "tenant",
            "outcome",
        )
        self.duration = Histogram(
            PREFIX + "job_duration_seconds",
            "Submission to finish of a job, by outcome.",
            ["outcome"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.input_bytes = self._counter("input_bytes", "Input bytes of succeeded jobs.")
        self.output_bytes = self._counter("output_bytes", "Output bytes of succeeded jobs.")
        self.leases_lost = self._counter(
            "leases_lost",
            "Running attempts that lost their lease (dead, stalled or leaving worker, error).",
        )
        self.refused = self._counter(
            "requests_refused",
            "Requests refused, by reason (path, token, invalid, queue_full).",
            "reason",
        )
        for outcome in OUTCOMES:  # every labelled series exported from the start, at zero
            self.finished.labels(outcome)
            self.duration.labels(outcome)
        for reason in REFUSALS:
            self.refused.labels(reason)

    def _gauge(self, name: str, documentation: str) -> Gauge:
        return Gauge(PREFIX + name, documentation, registry=self.registry)

    def _counter(self, name: str, documentation: str, *labels: str) -> Counter:
        return Counter(PREFIX + name, documentation, labels, registry=self.registry)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
