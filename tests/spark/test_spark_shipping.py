"""The executors' Python lacks statetier itself (PYSPARK_PYTHON names another interpreter than
the driver's, or the image was built without it): the first epoch says so in one line, naming
that Python and how to install, instead of a "ship module 'statetier' with addPyFile" that no
addPyFile could fix. Real Spark (the suite's session), its Python workers started from the
venv's base interpreter, which has pyspark's files on its path but not statetier."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from statetier.backend import KeyedProcessFunction
from statetier.backend.spark.protocol import process_alive
from statetier.backend.spark.shipping import FunctionNotShippedError, check_function_ships

from tests.spark.spark_support import PidNote

BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)


@pytest.fixture
def workers_on_base_python(spark: SparkSession) -> Iterator[SparkSession]:
    """The session's Python workers run BASE_PYTHON until the test ends."""
    probe = [BASE_PYTHON, "-c", "import statetier"]
    if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        pytest.skip(f"{BASE_PYTHON} has statetier installed: no Python without it to run")
    context = spark.sparkContext
    before, context.pythonExec = context.pythonExec, BASE_PYTHON
    try:
        yield spark
    finally:
        context.pythonExec = before


def test_executors_without_statetier_are_told_to_install_it(
    workers_on_base_python: SparkSession,
) -> None:
    with pytest.raises(FunctionNotShippedError) as raised:
        check_function_ships(workers_on_base_python, pickle.dumps(KeyedProcessFunction))
    message = str(raised.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"the executors' Python ({BASE_PYTHON}) cannot import statetier")
    assert "pip install './backend[spark]'" in message and "PYSPARK_PYTHON" in message
    assert "addPyFile" not in message  # shipping a file cannot install a package


def test_the_check_leaves_its_python_worker_to_the_next_task(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark kills a Python worker whose task left input unread, so a check that ignored its
    one row cost every query's start a new worker on an executor (about a second of CPU)."""
    notes = tmp_path / "pids"
    function_bytes = pickle.dumps(PidNote(str(notes)))
    check_function_ships(spark, function_bytes)
    (worker,) = map(int, notes.read_text().split())
    check_function_ships(spark, function_bytes)  # a Spark job later: a kill has landed
    for _ in range(10):
        assert process_alive(worker), f"the check's Python worker {worker} was killed"
        time.sleep(0.05)
