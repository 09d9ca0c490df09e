"""A state host per task slot on a real executor of two cores (``local-cluster[1,2,1536]``):
two hosts register, the ranges spread over both, counts are exact and every range is warm after
the first micro-batch; with ``host.per-executor`` 1 the executor runs one host, as before.
``tests/spark/slots_job.py`` runs both in its own process (one SparkContext per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyspark
import pytest

from tests.spark.conftest import REPO, spark_env

pytestmark = pytest.mark.timeout(600)


def test_an_executor_of_two_cores_runs_a_host_per_slot(tmp_path: Path) -> None:
    config = {"uri": f"file://{tmp_path}/ckpt", "batches": 3, "words": 2000, "vocabulary": 300}
    config["parallelism"] = 4
    (tmp_path / "job.json").write_text(json.dumps(config))
    env = {**os.environ, **spark_env(), "SPARK_HOME": os.path.dirname(pyspark.__file__)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.slots_job", str(tmp_path / "job.json")],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    shown = json.dumps(report)
    slots, one = report["slots"], report["one"]
    # one executor, two slots: two hosts, two of the four ranges each
    assert slots["hosts"] == [2, 2] and len(slots["executors"]) == 1, shown
    assert slots["expected_hosts"] == 2
    assert one["hosts"] == [4] and one["expected_hosts"] == 1, shown
    for run in (slots, one):
        assert run["exact"], shown
        assert run["epochs"][0]["fresh"] == 4
        assert all(e["warm"] == 4 for e in run["epochs"][1:]), shown
        assert run["warm_hit"] == 1.0
