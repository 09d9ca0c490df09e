"""``statetier bench state-scale`` end to end, at a tiny budget: the report's fields and shape.

Timing is the benchmark's business (``make bench``); this checks what the report says about
state and memory, which does not depend on the machine's speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from statetier.tools.bench.state_scale import draw_slices

BUDGET = 4 << 20


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statetier.backend", "bench", "state-scale", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    done = run_bench(
        "--budget", "4m", "--multiples", "4,0.25", "--records", "20000", "--rounds", "1", "--json"
    )
    assert done.returncode in (0, 1), done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    assert done.returncode == (0 if result["meets_targets"] else 1)
    return result


def test_every_point_has_every_peer_in_ascending_size(report: dict[str, Any]) -> None:
    points = report["points"]
    assert [p["multiple"] for p in points] == [0.25, 4.0]
    assert report["budget_bytes"] == BUDGET
    assert len(report["load_average"]["start"]) == len(report["load_average"]["end"]) == 3
    for point in points:
        assert set(point["peers"]) == {"spilled", "heap", "rocksdict"}
        # the keys make the state the multiple of the budget, by the heap estimate per key
        assert point["state_bytes"] == pytest.approx(point["multiple"] * BUDGET, rel=0.01)
        for peer in point["peers"].values():
            assert peer["records_per_s"] > 0
            assert peer["counts_ok"] is True
            assert 0 < peer["peak_anon_rss_bytes"] <= peer["peak_rss_bytes"]
    small, large = points
    assert large["keys"] == pytest.approx(16 * small["keys"], rel=0.01)


def test_spilled_share_grows_with_the_state(report: dict[str, Any]) -> None:
    small, large = report["points"]
    assert small["peers"]["spilled"]["spilled_share"] == 0  # under spill.threshold: all on heap
    assert large["peers"]["spilled"]["spilled_share"] > 0.5  # 4x: most of it on disk
    assert large["peers"]["spilled"]["spilled_bytes"] > 0
    assert (
        large["peers"]["spilled"]["spill_disk_bytes"] >= large["peers"]["spilled"]["spilled_bytes"]
    )
    assert large["peers"]["heap"]["spilled_share"] == 0
    # spilled keeps its heap state near half the budget; the heap peer holds all of it
    assert large["peers"]["spilled"]["heap_bytes"] < BUDGET
    assert large["peers"]["heap"]["heap_bytes"] > 3 * BUDGET


def test_the_targets_are_judged_at_the_largest_size(report: dict[str, Any]) -> None:
    checks = report["checks"]
    assert set(checks) == {
        "spilled_vs_heap",
        "spilled_vs_rocksdict",
        "spilled_peak_anon_rss_within_budget_plus_allowance",
        "counts_ok",
    }
    assert report["unmeasured_targets"] == []
    assert report["missed_targets"] == [name for name, ok in checks.items() if not ok]
    large = report["points"][-1]
    ratio = large["peers"]["spilled"]["records_per_s"] / large["peers"]["heap"]["records_per_s"]
    assert large["ratios"]["spilled_vs_heap"] == pytest.approx(ratio, abs=0.001)


def test_only_leaves_peers_out_and_names_the_targets_not_judged() -> None:
    done = run_bench(
        "--budget", "2m", "--multiples", "2", "--records", "5000", "--rounds", "1",
        "--only", "spilled",
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    assert "not measured (left out): spilled_vs_heap, spilled_vs_rocksdict" in done.stdout
    assert "rocksdict rec/s" in done.stdout


def test_bad_arguments_are_refused_in_a_line() -> None:
    done = run_bench("--only", "spilled,leveldb")
    assert done.returncode == 2
    assert "unknown peers leveldb" in done.stderr
    assert "Traceback" not in done.stderr


def test_draws_follow_a_zipf_law_over_every_key() -> None:
    keys = 1000
    ranks = [r for _, part in draw_slices(keys, 200_000, seed=3) for r in part.tolist()]
    assert min(ranks) == 0 and max(ranks) <= keys - 1
    hottest = ranks.count(0)
    # rank 1 against rank 10 of a Zipf law of exponent 1.1: about 10 ** 1.1 = 12.6 times
    assert 8 < hottest / ranks.count(9) < 18
    assert len(set(ranks)) > 0.9 * keys
