"""A function whose module the executors cannot import (issue 45): the driver says so in one line
at the first epoch, naming the module and how to ship it, after one task attempt instead of
every attempt of every task failing inside Spark's Java stack; shipped as the line says, the
same pipeline runs. Real Spark on ``local-cluster[1,1,1024]`` (its own process, SPARK_HOME set
to the installed pyspark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from tests.spark.conftest import REPO, job_error, spark_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MODULE = """
from statetier.backend import KeyedProcessFunction, ValueStateDescriptor


class CountPerWord(KeyedProcessFunction):
    def open(self, context):
        self.count = context.get_state(ValueStateDescriptor("count"))

    def process(self, key, value, context):
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        return [(key, n)]
"""


def test_a_module_only_the_driver_has_is_named_with_how_to_ship_it(tmp_path: Path) -> None:
    folder = tmp_path / "driver-only"
    folder.mkdir()
    (folder / "driver_only_module.py").write_text(MODULE)
    env = {**os.environ, **spark_env(), "SPARK_HOME": os.path.dirname(pyspark.__file__)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.unshipped_job", str(folder), f"file://{tmp_path}/c"],
        check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert done.returncode == 0, job_error(done.stderr)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    error = report["error"]
    assert len(error.splitlines()) == 1, error
    assert error.startswith("FunctionNotShippedError: the executors cannot import module "
                            "'driver_only_module'")  # fmt: skip
    assert f"addPyFile('{folder / 'driver_only_module.py'}')" in error
    assert "--py-files" in error and "image" in error
    # one task found it and returned it: nothing failed, nothing was retried
    assert report["attempts"] == {"completed": 1, "failed": 0}
    assert report["rows"] == [["a", 1], ["a", 2], ["b", 1]]  # shipped as said, it runs
