"""``statetier bench timers --local-only``: the per-record sessions on the LocalRunner, small.

The CPU figure is the benchmark's business (``make bench``); this checks that the run it
measures is the workload it claims: every session closed by the last click, exactly as the
Spark pipelines' oracle has them, over several epochs and both instances.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from statetier.tools.bench.local_timers import epochs_of, floor_sessions, run_sessions
from statetier.tools.bench.spark_timers import clicks, closed_sessions

ARGS = ["--clicks", "4000", "--users", "300", "--epochs", "7", "--local-rounds", "2", "--json"]


def test_the_local_run_emits_the_oracles_sessions_and_a_cpu_figure() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "statetier.backend", "bench", "timers", "--local-only", *ARGS],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["sessions_exact"] is True and report["floor_exact"] is True
    assert (report["records"], report["epochs"], report["rounds"]) == (4000, 7, 2)
    assert report["cpu_us_per_record"] > 0 and len(report["cpu_us_per_record_rounds"]) == 2
    floor = report["floor_cpu_us_per_record"]
    ratio = report["cpu_us_per_record"] / floor  # of the rounded figures: close, not equal
    assert report["ratio_to_floor"] == pytest.approx(ratio, rel=0.01)


def test_sessions_cross_epochs_and_close_at_the_last_watermark() -> None:
    data = clicks(3000, 200, seed=5)
    parts = epochs_of(data, 9)
    run = run_sessions(parts)
    expected = closed_sessions(parts, data[-1][1])
    assert sorted(run.sessions) == expected
    # a session is open at the end (the last clicks' gaps have not passed): the oracle and
    # the run both leave it out, so the check sees the last watermark
    assert len(expected) < len(closed_sessions(parts, data[-1][1] + 10**9))
    assert run.records == len(data) and run.cpu_seconds > 0


def test_the_floor_emits_the_same_sessions_with_no_timer_left_behind() -> None:
    """The floor is a peer only if it does the same work: every session the oracle closes, each
    once (a stale timer of a moved session must not close it early or twice)."""
    data = clicks(3000, 200, seed=5)
    parts = epochs_of(data, 9)
    floor = floor_sessions(parts)
    assert sorted(floor.sessions) == closed_sessions(parts, data[-1][1])
    assert len(floor.sessions) == len(set(floor.sessions))
