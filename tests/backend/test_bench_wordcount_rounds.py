"""``statetier bench wordcount``'s heap mode, small: its speed is the median of its rounds.

The figures are the benchmark's business (``make bench``); this checks that the heap child
counts exactly in each round and reports the median of the rounds it ran, and that a number of
rounds below one is refused in a line.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

SMALL = ["--records", "20000", "--vocabulary", "2000", "--seed", "3", "--gc-keys", "0"]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statetier.tools.bench.wordcount", *SMALL, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_heap_mode_reports_the_median_of_its_rounds() -> None:
    done = bench("--mode", "heap", "--rounds", "3")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["counts_ok"] is True
    rounds = report["cpu_us_per_record_rounds"]
    assert len(rounds) == 3 and all(r > 0 for r in rounds)
    assert report["cpu_us_per_record"] == statistics.median(rounds)


def test_one_round_is_one_count() -> None:
    report = json.loads(bench("--mode", "heap", "--rounds", "1").stdout)
    assert "cpu_us_per_record_rounds" not in report and report["cpu_us_per_record"] > 0


def test_no_rounds_is_refused_in_a_line() -> None:
    done = bench("--rounds", "0")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("at least 1 (got 0)")
