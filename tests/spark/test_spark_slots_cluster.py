"""A state host per task slot on a real executor of two cores (``local-cluster[1,2,1536]``):
two hosts register, the ranges spread over both, counts are exact and every range is warm after
the first micro-batch; with ``host.per-executor`` 1 the executor runs one host, as before. A
third run holds state of ten times the executor's memory budget in its two hosts, which stay
within the budget plus an allowance each (anonymous RSS, sampled while it runs).
``tests/spark/slots_job.py`` runs both in its own process (one SparkContext per process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.spark.conftest import job_error, last_json_line, run_job_module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MiB = 1 << 20
BUDGET = 4 * MiB  # the executor's, split across its two hosts
ALLOWANCE = 128 * MiB  # per host: a host's runtime here is about 80 MiB of anonymous RSS


def test_an_executor_of_two_cores_runs_a_host_per_slot(tmp_path: Path) -> None:
    config = {"uri": f"file://{tmp_path}/ckpt", "batches": 3, "words": 2000, "vocabulary": 300}
    config["parallelism"] = 4
    config["memory"] = {
        "budget": BUDGET,
        "allowance": ALLOWANCE,
        "keys": 40_000,  # about 1 KiB of state each: 10x the budget
        "batches": 2,
        "dir": str(tmp_path),
    }
    done = run_job_module("tests.spark.slots_job", config, tmp_path / "job.json")
    assert done.returncode == 0, job_error(done.stderr)
    report = last_json_line(done.stdout)
    shown = json.dumps(report)
    slots, one = report["slots"], report["one"]
    # one executor, two slots: two hosts, two of the four ranges each
    assert slots["hosts"] == [2, 2] and len(slots["executors"]) == 1, shown
    assert slots["expected_hosts"] == 2
    assert one["hosts"] == [4] and one["expected_hosts"] == 1, shown
    for run in (slots, one):
        assert run["exact"], shown
        assert run["epochs"][0]["fresh"] == 4
        assert all(e["warm"] + e["handed_off"] == 4 for e in run["epochs"][1:]), shown
        assert run["warm_hit"] == 1.0

    # one executor budget across its two hosts, at a state of 10x the budget: the hosts'
    # anonymous RSS together stays within the budget plus an allowance per host, the governors
    # keep the heap within the budget and the rest of the state on disk
    memory = report["memory"]
    assert memory["hosts"] == 2 and memory["exact"], shown
    assert memory["peak_rss"] <= BUDGET + 2 * ALLOWANCE, shown
    assert sum(memory["state_heap"]) <= BUDGET, shown
    assert sum(memory["state_spilled"]) >= 8 * BUDGET, shown
