"""``statetier demo``: the Spark streaming word count on SeaweedFS, then ``--restart``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark.conftest import REPO, spark_env
from tests.spark.spark_support import host_pids


@pytest.mark.slow
def test_demo_spills_checkpoints_to_seaweedfs_and_resumes_exactly(tmp_path: Path) -> None:
    before = host_pids()
    args = [
        sys.executable, "-m", "statetier.backend", "demo", "--words", "60000",
        "--vocabulary", "20000", "--batches", "4", "--budget", "1m", "--dir", str(tmp_path / "d"),
    ]  # fmt: skip
    env = {**os.environ, **spark_env()}
    first = subprocess.run(
        args, capture_output=True, text=True, timeout=300, check=False, cwd=REPO, env=env
    )
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    assert "none (fresh start)" in first.stdout
    assert "on SeaweedFS http://127.0.0.1:" in first.stdout
    second = subprocess.run(
        [*args, "--restart"], capture_output=True, text=True, timeout=300, check=False,
        cwd=REPO, env=env,
    )  # fmt: skip
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    assert "resumed from epoch  2" in second.stdout
    assert "epochs 3-4" in second.stdout
    for out in (first.stdout, second.stdout):
        line = next(x for x in out.splitlines() if "counts exact" in x)
        assert line.split()[-1] == "True"
        spill = next(x for x in out.splitlines() if "spill ratio" in x)
        assert "(max 0;" not in spill  # key groups spilled under the 1m budget
    assert not host_pids() - before  # the demo stopped its state hosts
