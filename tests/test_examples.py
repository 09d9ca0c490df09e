"""Every example in examples/ runs as a program and succeeds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*/example.py"))


def test_examples_are_found() -> None:
    assert len(EXAMPLES) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[p.parent.name for p in EXAMPLES])
def test_example_runs(example: Path, tmp_path: Path) -> None:
    spark = "pyspark" in example.read_text()
    # The examples without Spark leave their checkpoint for the reader to look at, in the temp
    # dir: here the test's own. (Spark's keep the temp dir: a state host's Unix socket path is
    # derived from it, and pytest's folders are long enough to pass the socket's limit.)
    env = os.environ if spark else {**os.environ, "TMPDIR": str(tmp_path)}
    # A hang guard, not a speed check: the Spark examples take about a minute alone and twice
    # that beside another test worker's Spark jobs (06 took 120 s in a fresh clone's make test);
    # it stays under pytest's 300 s so that a hang is reported here, with the example's name.
    result = subprocess.run(
        [sys.executable, str(example)],
        capture_output=True, text=True, timeout=240, check=False, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip(), "an example should say what it did"
    if spark:  # the JVM logs its start on stderr
        assert "Traceback" not in result.stderr, result.stderr
        assert "Exception" not in result.stderr, result.stderr
    else:
        assert result.stderr == "", f"an example runs without warnings or errors:\n{result.stderr}"


QUOTE = re.compile(r"<!-- example: (?P<path>\S+) -->\n```python\n(?P<code>.*?)```\n", re.DOTALL)
PAGES = sorted((REPO / "docs").glob("*.md"))


def quotes(page: Path) -> list[tuple[str, str]]:
    """Each code block ``page`` marks as quoted from an example: (the example's path, the code)."""
    return [(m["path"], m["code"]) for m in QUOTE.finditer(page.read_text())]


def test_the_spark_guide_opens_with_a_quoted_streaming_example() -> None:
    quoted = quotes(REPO / "docs" / "spark.md")
    paths = {path for path, _ in quoted}
    assert paths == {
        "examples/07-spark-guide/sessions.py",
        "examples/07-spark-guide/example.py",
    }
    job = "".join(code for path, code in quoted if path.endswith("example.py"))
    needed = ["withWatermark", "checkpointLocation", "checkpoint.uri", "addPyFile", "end_of_input"]
    assert [part for part in needed if part not in job] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_quoted_code_is_the_examples_own(page: Path) -> None:
    """A page's quote of an example is a verbatim part of it, so the page shows code that runs."""
    for path, code in quotes(page):
        assert code in (REPO / path).read_text(), f"{page.name} quotes {path} differently"
