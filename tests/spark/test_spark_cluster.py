"""State stays warm on a cluster of several executor JVMs (Spark's ``local-cluster`` master),
and survives losing one of them. Each case runs ``tests/spark/cluster_job.py`` in its own process
(one SparkContext per process); it needs ``SPARK_HOME`` (set to the installed pyspark)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import job_error, last_json_line, run_job_module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def run_job(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    config = {
        "master": "local-cluster[2,1,1024]",
        "executors": 2,
        "uri": f"file://{tmp_path}/ckpt",
        "work": str(tmp_path / "work"),
        "batches": 6,
        "words": 3000,
        "vocabulary": 500,
        "parallelism": 4,
        **overrides,
    }
    done = run_job_module("tests.spark.cluster_job", config, tmp_path / "job.json")
    assert done.returncode == 0, job_error(done.stderr)
    report = last_json_line(done.stdout)
    assert report["error"] is None, report["error"]
    return report


def test_ranges_stay_warm_on_two_executors(tmp_path: Path) -> None:
    """Micro-batches of two partitions: the state hosts gather each range from both tasks."""
    report = run_job(tmp_path, files=2)
    epochs = report["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3, 4, 5, 6]
    assert epochs[0]["fresh"] == 4
    # every range of every later micro-batch reached its warm owner, wherever its tasks ran (or
    # was handed over warm, should a host that joined late get ranges by rebalancing)
    assert all(e["warm"] + e["handed_off"] == 4 and e["restored_bytes"] == 0 for e in epochs[1:])
    assert report["hosts"] == 2  # both executors own ranges
    assert report["exact"]
    # the first micro-batch takes Spark's exchange (its tasks, on every executor, start the
    # state hosts); then no shuffle: each task sends its piece of every range to the owner
    assert not report["planned_once"]
    assert report["routing"] == ["exchange"] + ["gathered"] * 5
    # each output row left Spark through one task: no range's outputs came twice or not at all
    assert report["rows"] == [[n] for n in report["distinct"]]


def test_one_partition_goes_from_its_task_to_every_range(tmp_path: Path) -> None:
    report = run_job(tmp_path, batches=4)
    assert report["routing"] == ["exchange"] + ["direct"] * 3
    assert all(e["warm"] + e["handed_off"] == 4 for e in report["epochs"][1:])
    assert report["exact"] and report["rows"] == [[n] for n in report["distinct"]]


@pytest.mark.parametrize("exchange", ["auto", "always"])
def test_an_executor_killed_mid_stream_costs_one_restore_of_its_ranges(
    tmp_path: Path, exchange: str
) -> None:
    """``auto``: micro-batches of two partitions, gathered by the hosts; the pieces the dead
    host held are lost with it, so the epoch's job runs again. ``always``: Spark's exchange,
    which retries the lost tasks alone."""
    report = run_job(tmp_path, batches=7, kill_at=3, files=2, exchange=exchange)
    epochs = report["epochs"]
    assert report["killed"], "no executor was killed"
    assert [e["epoch"] for e in epochs] == [1, 2, 3, 4, 5, 6, 7]
    assert epochs[1]["warm"] + epochs[1]["handed_off"] == 4
    # the kill lands while epoch 3's job runs (or, on a slow machine, just after it). Each of the
    # dead host's ranges is restored once on another host: in epoch 3 if its task had not run
    # there yet, else in epoch 4, since epoch 3 committed the result it had written. A range of
    # the surviving host whose task ran on the dead executor was fed part of its records: its
    # retry restores it too. An epoch run again after a lost snapshot restores all its ranges
    shown = json.dumps(report)  # the whole report when an assertion fails
    restoring = [e for e in epochs[2:] if e["restored"]]
    assert restoring and {e["epoch"] for e in restoring} <= {3, 4}, shown
    restored = sum(e["restored"] for e in restoring)
    assert report["killed_ranges"] <= restored <= 4, shown
    assert all(e["restored_bytes"] > 0 for e in restoring)
    # ... and every later epoch is warm again on the new owners (a replacement executor's host
    # gets ranges by rebalancing: handed over warm by their owners)
    later = epochs[max(e["epoch"] for e in restoring) :]
    assert later and all(e["warm"] + e["handed_off"] == 4 for e in later), shown
    assert report["exact"]
    # the last run of every epoch's job returned each range's outputs (one row per distinct
    # word): none lost with the killed executor, none twice
    assert [runs[-1] for runs in report["rows"]] == report["distinct"], shown
