"""The tests' archive of Spark's classes (tests/jvm_archive.py), seen in a real ``spark-submit``:
Spark's launcher, which the archive does not fit, still prints a command the shell can run (the
JDK's notice of the misfit would go to its standard output), and the JVM it launches loads
Spark's classes from the archive."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pyspark
import pytest

SPARK_HOME = Path(pyspark.__file__).parent
OPTIONS = os.environ.get("JAVA_TOOL_OPTIONS", "")

pytestmark = pytest.mark.skipif(
    "-XX:SharedArchiveFile=" not in OPTIONS, reason="JAVA_TOOL_OPTIONS of one's own: no archive"
)


def test_spark_submit_runs_and_its_jvm_maps_the_archive(tmp_path: Path) -> None:
    log = tmp_path / "classes-%p.log"  # one file per JVM: the launcher's and SparkSubmit's
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "JAVA_TOOL_OPTIONS": f"{OPTIONS} -Xlog:class+load=info:file={log}",
    }
    done = subprocess.run(
        [str(SPARK_HOME / "bin" / "spark-submit"), "--version"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "version" in done.stdout + done.stderr  # SparkSubmit itself ran
    from_archive = {
        path.name: sum("shared objects file (top)" in line for line in path.open())
        for path in tmp_path.glob("classes-*.log")
    }
    assert len(from_archive) == 2, from_archive
    # the launcher's class path does not fit the archive; SparkSubmit's JVM loads from it
    assert sorted(from_archive.values())[0] == 0 and sorted(from_archive.values())[1] > 500
