"""Ranges follow the cluster on real executors (``local-cluster[3,1,1024]``, dynamic allocation):
a word count starts on two executors, a third joins, and within three epochs its state host owns
ranges; the ranges that moved were handed over by their old hosts (nothing restored from tier 2
for them) and the counts are exact. A second pipeline of the same application has the old owner
of a range it moves killed (executor JVM and state host) before the hand-off: that range is
restored from tier 2 instead, and its counts are exact too. ``tests/spark/rebalance_job.py``
runs both in its own process (one SparkContext per process)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from tests.spark.conftest import job_error, last_json_line, run_job_module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PARALLELISM = 6


def test_ranges_move_to_an_executor_that_joins_and_are_handed_over_warm(tmp_path: Path) -> None:
    config = {"uri": f"file://{tmp_path}/ckpt", "batches": 5, "words": 2000, "vocabulary": 300}
    config["parallelism"] = PARALLELISM
    done = run_job_module("tests.spark.rebalance_job", config, tmp_path / "job.json")
    assert done.returncode == 0, job_error(done.stderr)
    report = last_json_line(done.stdout)
    shown = json.dumps(report)
    joined = report["joined_at"] - 1  # position of the first epoch with the third executor
    first_hosts = set(report["first_hosts"])
    assert len(first_hosts) == 2, shown

    warm = report["warm"]["epochs"]
    assert report["warm"]["exact"], shown
    # within three epochs of the join, a host of the new executor owns ranges
    owning = [i for i, e in enumerate(warm) if i >= joined and set(e["hosts"]) - first_hosts]
    assert owning and owning[0] <= joined + 2, shown
    # the ranges rebalancing moved were handed over warm: nothing restored from tier 2
    epoch = next(e for e in warm if e["moved"])
    moved = epoch["moved"]
    assert len(moved) == epoch["handed_off"] == 2, shown
    assert epoch["restored"] == 0 and epoch["warm"] == PARALLELISM - 2, shown
    assert [epoch["restored_bytes"][index] for index in moved] == [0, 0], shown
    new_hosts = {epoch["hosts"][index] for index in moved}
    assert len(new_hosts) == 1 and not new_hosts & first_hosts, shown
    # the spread after it: two ranges per host
    assert sorted(collections.Counter(epoch["hosts"]).values()) == [2, 2, 2], shown

    killed = report["killed"]["epochs"]
    assert report["killed"]["exact"], shown
    killed_range = report["kill"][0]
    epoch = next(e for e in killed if e["moved"])
    assert len(epoch["moved"]) == 2 and killed_range in epoch["moved"], shown
    # the range whose old host was killed before its hand-off: restored from tier 2
    assert epoch["restored_bytes"][killed_range] > 0, shown
    # the other one's old host was alive: handed over, nothing from tier 2
    (other,) = set(epoch["moved"]) - {killed_range}
    assert epoch["handed_off"] == 1 and epoch["restored_bytes"][other] == 0, shown
