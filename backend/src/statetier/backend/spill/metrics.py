"""Prometheus metrics of the spill tier (``statetier_`` prefix), process-wide.

Why process-wide and updated by deltas: one executor process runs several backends (one per
task or key-group range), and Prometheus scrapes the process. Each spill manager adds its own
change to the gauges and takes its share back when it closes, so the gauges are the sum over
the process's backends. Dashboards and alerts must use only the names in :data:`METRIC_NAMES`.
The process's endpoint, for these and the rest, is :func:`statetier.backend.metrics.serve_metrics`.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "GC_PAUSE",
    "HEAP_BYTES",
    "KEY_GROUPS",
    "LOADS",
    "LOAD_SECONDS",
    "METRIC_NAMES",
    "RUNTIME_MEMORY",
    "SPILLED_BYTES",
    "SPILLS",
    "SPILL_ERRORS",
    "SPILL_SECONDS",
]

HEAP_BYTES = Gauge(
    "statetier_state_heap_bytes", "Estimated heap bytes of keyed state on the heap tier."
)
SPILLED_BYTES = Gauge(
    "statetier_state_spilled_bytes", "Serialized bytes of keyed state on the spill tier."
)
SPILL_DISK_BYTES = Gauge(
    "statetier_spill_disk_bytes", "Bytes reserved by this process's spill chunk files."
)
KEY_GROUPS = Gauge("statetier_key_groups", "Key groups per tier.", ["tier"])
SPILLS = Counter(
    "statetier_key_group_spills", "Key groups moved from heap to disk, by reason.", ["reason"]
)
LOADS = Counter(
    "statetier_key_group_loads", "Key groups moved from disk to heap, by reason.", ["reason"]
)
SPILL_SECONDS = Histogram(
    "statetier_key_group_spill_seconds",
    "Time to spill one key group (all its states).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
LOAD_SECONDS = Histogram(
    "statetier_key_group_load_seconds",
    "Time to load one key group back to heap.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
SPILL_ERRORS = Counter(
    "statetier_spill_errors",
    "Spill attempts that failed on I/O (key group kept on heap), by errno name.",
    ["reason"],
)
GC_PAUSE = Histogram(
    "statetier_gc_gen2_pause_seconds",
    "Pauses of Python's generation-2 (full) garbage collections.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0),
)
MEMORY_BUDGET = Gauge("statetier_memory_budget_bytes", "Memory budget of the spill monitor.")
PROCESS_RSS = Gauge("statetier_process_rss_bytes", "Resident set size at the last check.")
RUNTIME_MEMORY = Gauge(
    "statetier_runtime_memory_bytes",
    "The process's non-state memory when it first held state (compare memory.runtime-allowance).",
)

# Names as scraped (counters get _total, histograms _bucket/_sum/_count).
METRIC_NAMES = (
    "statetier_state_heap_bytes",
    "statetier_state_spilled_bytes",
    "statetier_spill_disk_bytes",
    "statetier_key_groups",
    "statetier_key_group_spills_total",
    "statetier_key_group_loads_total",
    "statetier_key_group_spill_seconds",
    "statetier_key_group_load_seconds",
    "statetier_spill_errors_total",
    "statetier_gc_gen2_pause_seconds",
    "statetier_memory_budget_bytes",
    "statetier_process_rss_bytes",
    "statetier_runtime_memory_bytes",
)
