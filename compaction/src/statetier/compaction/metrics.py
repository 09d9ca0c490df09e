"""Prometheus metrics of the compaction gateway (prefix ``statetier_compaction_``).

One registry per gateway (not the process-global one), so tests can run several gateways in
one process. :data:`DOCUMENTED` lists the scraped names; a test checks that docs/compaction.md
and the endpoint both have every one.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["DOCUMENTED", "GatewayMetrics"]

DOCUMENTED: tuple[str, ...] = (
    "statetier_compaction_queue_depth",
    "statetier_compaction_jobs_running",
    "statetier_compaction_workers_alive",
    "statetier_compaction_jobs_submitted_total",
    "statetier_compaction_jobs_total",
    "statetier_compaction_job_duration_seconds",
    "statetier_compaction_input_bytes_total",
    "statetier_compaction_output_bytes_total",
    "statetier_compaction_leases_lost_total",
    "statetier_compaction_requests_refused_total",
)


class GatewayMetrics:
    """The gateway's series; gauges are set from the scheduler at each scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.queue_depth = Gauge(
            "statetier_compaction_queue_depth", "Jobs waiting for a worker.", registry=r
        )
        self.running = Gauge(
            "statetier_compaction_jobs_running", "Jobs a worker holds a lease on.", registry=r
        )
        self.workers_alive = Gauge(
            "statetier_compaction_workers_alive",
            "Workers that heartbeated within the lease time.",
            registry=r,
        )
        self.submitted = Counter(
            "statetier_compaction_jobs_submitted", "Jobs accepted by the gateway.", registry=r
        )
        self.finished = Counter(
            "statetier_compaction_jobs",
            "Jobs finished, by outcome (succeeded, failed, aborted).",
            ["outcome"],
            registry=r,
        )
        self.duration = Histogram(
            "statetier_compaction_job_duration_seconds",
            "Submission to finish of a job, by outcome.",
            ["outcome"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.input_bytes = Counter(
            "statetier_compaction_input_bytes", "Input bytes of succeeded jobs.", registry=r
        )
        self.output_bytes = Counter(
            "statetier_compaction_output_bytes", "Output bytes of succeeded jobs.", registry=r
        )
        self.leases_lost = Counter(
            "statetier_compaction_leases_lost",
            "Running attempts that lost their lease (dead, stalled or leaving worker, error).",
            registry=r,
        )
        self.refused = Counter(
            "statetier_compaction_requests_refused",
            "Requests refused, by reason (path, token, invalid).",
            ["reason"],
            registry=r,
        )
        for outcome in ("succeeded", "failed", "aborted"):
            self.finished.labels(outcome)
            self.duration.labels(outcome)
        for reason in ("path", "token", "invalid"):
            self.refused.labels(reason)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
