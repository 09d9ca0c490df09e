"""Fixtures of the Spark tests: one real local[2] Spark session, whose state hosts serve one test
after another (as an application's serve its queries) and stop with it.

The Python workers and the state hosts they start must import statetier and these test modules:
the workers run this interpreter (PYSPARK_PYTHON) with the repository on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).parents[2]
sys.path.insert(0, str(REPO))

pyspark = pytest.importorskip("pyspark")
# its checks (run_with_a_host_killed, ...) fail with the values compared, as a test's do
pytest.register_assert_rewrite("tests.spark.spark_support")

from pyspark.sql import SparkSession  # noqa: E402
from statetier.backend.spark import StatefulPipeline  # noqa: E402

from tests.spark.spark_support import host_pids  # noqa: E402


def spark_env() -> dict[str, str]:
    env = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    paths = [str(REPO), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run_job_module(
    module: str, config: dict[str, Any], config_file: Path
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module config_file`` (a Spark job in its own process: its own
    local-cluster master) with ``config`` written there as JSON; its output captured."""
    config_file.write_text(json.dumps(config))
    env = {**os.environ, **spark_env(), "SPARK_HOME": os.path.dirname(pyspark.__file__)}
    return subprocess.run(
        [sys.executable, "-m", module, str(config_file)],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )


def job_error(stderr: str, limit: int = 3000) -> str:
    """What a failed job said: its last Python traceback (to its end, at most ``limit``
    characters), else the end of its standard error. Spark's JVM logs its shutdown after the
    traceback, which would push it out of a plain tail."""
    start = stderr.rfind("Traceback (most recent call last)")
    if start < 0:
        return stderr[-limit:]
    lines = stderr[start:].splitlines()
    kept = [lines[0]]
    for line in lines[1:]:
        kept.append(line)
        if line and not line[0].isspace():  # the exception's own line ends the traceback
            break
    return "\n".join(kept)[-limit:]


def last_json_line(stdout: str) -> dict[str, Any]:
    """A job's report: the last line it printed, as JSON."""
    report: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return report


class SharedHosts:
    """The state hosts of the session's Spark application, kept from one test to the next as
    an application's hosts outlive its queries: each test releases its pipelines' ranges
    (``StatefulPipeline.release``) instead of stopping the hosts, so the next test's first
    epoch does not start two interpreters and import Arrow, pandas and the test's modules in
    them again (about 2 s of CPU each), nor the driver's merge process. A test marked
    ``own_hosts`` stops them before it starts and stops its own after it."""

    def __init__(self) -> None:
        self.released: list[StatefulPipeline] = []
        self.pids: set[int] = set()

    def keep(self, made: list[StatefulPipeline]) -> None:
        """Release ``made`` (a test's pipelines, their tasks over); their hosts stay."""
        for pipeline in made:
            self.pids |= set(pipeline.hosts.values())
            pipeline.release()
        self.released += made

    def stop(self) -> None:
        """Stop the kept hosts: the first call stops every host of the application's
        registry; on a registry stopped before, a call finds no live host and returns."""
        for pipeline in reversed(self.released):
            pipeline.stop_hosts()
        survivors, self.pids, self.released = self.pids & host_pids(), set(), []
        assert not survivors, f"state hosts {sorted(survivors)} survived their stop"


SHARED_HOSTS = SharedHosts()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ.update(spark_env())
    session = (
        SparkSession.builder.master("local[2,4]")  # 4: a failed task is retried
        .appName("statetier-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    SHARED_HOSTS.stop()
    session.stop()


def running_tasks(session: SparkSession) -> int:
    """Task attempts Spark's scheduler counts as running, cancelled ones included: an attempt
    is counted until its executor reports it ended (killed, failed or done). The stages of an
    aborted job are no longer active while such attempts still run."""
    infos = session.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return sum(info.numRunningTasks() for info in infos)


def wait_until_spark_is_idle(session: SparkSession, timeout: float = 60.0) -> None:
    """Return once ``session``'s Spark runs no task. A job that failed returns to the test at
    its first task that failed for good; the attempts of its other tasks are killed but go on
    for a while (one starting a state host waits for it), and they must not run beside the
    next test's tasks on the same executor and host slots."""
    deadline = time.monotonic() + timeout
    while running := running_tasks(session):
        if time.monotonic() > deadline:
            pytest.fail(f"Spark still runs {running} task(s) {timeout:.0f} s after the test")
        time.sleep(0.05)


@pytest.fixture
def pipelines(request: pytest.FixtureRequest) -> Iterator[list[StatefulPipeline]]:
    """Pipelines a test made. Once the test's Spark jobs are over (every cancelled task
    attempt too), on the session's Spark their ranges are released and the hosts kept for the
    next test (:class:`SharedHosts`); a test marked ``own_hosts``, or on another session, has
    its state hosts stopped and checked gone."""
    marked = request.node.get_closest_marker("own_hosts") is not None
    if marked:  # the session's application must start hosts again, with the test's settings
        SHARED_HOSTS.stop()
    own = marked or "spark" not in request.fixturenames  # another session: another application
    made: list[StatefulPipeline] = []
    yield made
    if "spark" in request.fixturenames:
        wait_until_spark_is_idle(request.getfixturevalue("spark"))
    if not own:
        SHARED_HOSTS.keep(made)
        return
    pids = {pid for p in made for pid in p.hosts.values()}
    for p in made:
        p.stop_hosts()
    assert not (pids & host_pids()), "a state host survived its test"
