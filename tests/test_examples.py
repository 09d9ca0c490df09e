"""Every example in examples/ runs as a program and succeeds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*/example.py"))


def test_examples_are_found() -> None:
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.parent.name for p in EXAMPLES])
def test_example_runs(example: Path) -> None:
    # A hang guard, not a speed check: the Spark examples take about a minute alone and twice
    # that beside another test worker's Spark jobs (06 took 120 s in a fresh clone's make test);
    # it stays under pytest's 300 s so that a hang is reported here, with the example's name.
    result = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, timeout=240, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip(), "an example should say what it did"
    if "pyspark" in example.read_text():  # the JVM logs its start on stderr
        assert "Traceback" not in result.stderr, result.stderr
        assert "Exception" not in result.stderr, result.stderr
    else:
        assert result.stderr == "", f"an example runs without warnings or errors:\n{result.stderr}"
