"""``statetier bench spark-wordcount`` end to end at a small size: the report's shape, exact
counts, and every pipeline measured in every round (the figures themselves are ``make bench``'s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.spark.conftest import REPO, spark_env


@pytest.mark.slow
def test_spark_wordcount_bench_reports_medians_of_rotated_rounds() -> None:
    args = ["--words", "20000", "--vocabulary", "2000", "--batches", "2", "--partitions", "2"]
    args += ["--rounds", "2", "--only", "ceiling,ceiling_keyed", "--s3"]
    done = subprocess.run(
        [sys.executable, "-m", "statetier.backend", "bench", "spark-wordcount", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO,
        env={**os.environ, **spark_env()},
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: a target missed at this size
    report = json.loads(done.stdout)
    assert report["warmup_words"] == 20_000  # a whole untimed round by default
    pipelines = report["pipelines"]
    assert set(pipelines) == {
        "statetier",
        "statetier_s3",
        "ceiling",
        "ceiling_keyed",
    }
    statetier, on_s3 = pipelines["statetier"], pipelines["statetier_s3"]
    for run in (statetier, on_s3):
        assert run["counts_exact"] is True and run["warm_hit_rate"] == 1.0
        # merges are counted with their CPU (the driver's merge process, read in clock ticks:
        # a small merge may take less than one); without a merge there is none
        assert run["merges"] >= 0 and run["merge_cpu_seconds"] >= 0
        assert run["merges"] > 0 or run["merge_cpu_seconds"] == 0
    # the SeaweedFS server served the checkpoints of the S3 run, on the same cores
    assert on_s3["s3_server_cpu_seconds"] > 0 and "s3_server_cpu_seconds" not in statetier
    # the hosts' heartbeats: the state by tier (no spill tier here)
    assert statetier["state_heap_bytes"] > 50 * statetier["state_keys"] > 0
    assert statetier["state_spilled_bytes"] == 0
    assert statetier["batches"] == 2 and statetier["warmup_epoch_seconds_with_host_start"] > 0
    # Spark's time of each micro-batch holds the pipeline's (the function is called inside it)
    spark_seconds, epoch_seconds = statetier["spark_batch_seconds"], statetier["epoch_seconds"]
    assert len(spark_seconds) == len(epoch_seconds) == 2
    assert all(s >= e - 0.01 for s, e in zip(spark_seconds, epoch_seconds, strict=True))
    for result in pipelines.values():
        rounds = result["rounds_records_per_s"]
        assert len(rounds) == 2 and min(rounds) <= result["records_per_s"] <= max(rounds)
    assert report["ratios"]["ceiling"] == round(
        statetier["records_per_s"] / pipelines["ceiling"]["records_per_s"], 3
    )
    # the RocksDB and pandas peers did not run: their targets are named, not judged
    assert report["unmeasured_targets"] == ["spark_rocksdb_count", "transform_with_state_in_pandas"]
    assert report["meets_target"] is (report["ratios"]["ceiling"] >= report["targets"]["ceiling"])


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statetier.backend", "bench", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO,
        env={**os.environ, **spark_env()},
    )


@pytest.mark.slow
def test_compaction_offload_bench_reports_every_mode_side_by_side() -> None:
    done = run_bench("compaction-offload", "--quick", "--json")
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: a target missed at this size
    report = json.loads(done.stdout)
    modes = report["modes"]
    assert list(modes) == ["executor", "local", "remote"]
    for mode in modes.values():
        assert mode["counts_exact"] is True
        assert mode["micro_batches"] == report["micro_batches"] == 7
        assert len(mode["latencies_s"]) == 7
        assert 0 < mode["p50_s"] <= mode["p99_s"] <= mode["max_s"]
        assert mode["compactions"] >= 2  # 2 ranges, 6 batches after the first, trigger 2
        assert len(mode["base_bytes"]) == 2 and min(mode["base_bytes"]) > 0
        assert mode["state_host_cpu_s"] > 0
    executor, local, remote = modes["executor"], modes["local"], modes["remote"]
    # where the compaction CPU went: the host's snapshots, the driver's thread, the worker
    assert executor["executor_compaction_cpu_gross_s"] > 0
    assert executor["off_executor_compaction_cpu_s"] == 0
    assert local["executor_compaction_cpu_s"] == remote["executor_compaction_cpu_s"] == 0
    assert local["driver_compaction_cpu_s"] > 0 and local["cpu_share_off_executor"] == 1.0
    assert remote["worker_cpu_s"] > 0 and remote["remote_fallbacks"] == 0
    figures = report["figures"]
    assert figures["cpu_share_off_executor"] == round(remote["cpu_share_off_executor"], 3)
    assert figures["throughput_ratio"] == round(
        remote["records_per_s"] / executor["records_per_s"], 3
    )
    meets = (
        figures["cpu_share_off_executor"] >= 0.9
        and remote["p99_over_p50"] <= 1.5
        and remote["records_per_s"] >= executor["records_per_s"]
    )
    assert report["meets_target"] is meets
    assert done.returncode == (0 if meets else 1)


@pytest.mark.parametrize("option", [["--rounds", "0"], ["--warmups", "-1"]])
def test_the_connect_bench_refuses_rounds_it_cannot_time(option: list[str]) -> None:
    done = run_bench("spark-wordcount", "--connect", *option)
    assert done.returncode == 2
    assert "--rounds must be 1 or more and --warmups 0 or more" in done.stderr
    assert "Traceback" not in done.stderr


def test_compaction_offload_bench_names_an_unknown_mode() -> None:
    done = run_bench("compaction-offload", "--only", "local,elsewhere")
    assert done.returncode == 2
    assert "unknown modes elsewhere" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_the_connect_bench_runs_every_pipeline_on_both_sessions_with_its_phases() -> None:
    """``spark-wordcount --connect`` at a small size: the six pipelines (statetier, RocksDB and
    the stateless ``foreachBatch`` peer on each session), statetier exact on both sessions, and
    each query's wall time split into its start, first micro-batch and the others (Spark's own
    times), which add up to it."""
    args = ["--words", "8000", "--vocabulary", "1000", "--batches", "2", "--partitions", "2"]
    done = run_bench(
        "spark-wordcount", "--connect", *args, "--rounds", "1", "--warmups", "0", "--json"
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: a target missed at this size
    report = json.loads(done.stdout)
    pipelines = report["pipelines"]
    assert set(pipelines) == {
        "classic_statetier",
        "classic_rocksdb",
        "classic_foreach_batch",
        "connect_statetier",
        "connect_rocksdb",
        "connect_foreach_batch",
    }
    assert pipelines["classic_statetier"]["exact"] is pipelines["connect_statetier"]["exact"]
    assert pipelines["connect_statetier"]["exact"] is True
    for name, result in pipelines.items():
        phases = result["phases_seconds"]
        assert result["batches"] == 2, name
        assert phases["first_batch"] > 0 and phases["later_batches"] > 0, (name, phases)
        # one round: its phases are its own, and add up to its wall time (rounded to 0.01 s)
        assert sum(phases.values()) == pytest.approx(result["seconds"], abs=0.03), (name, phases)
        assert result["later_batches_records_per_s"] == pytest.approx(
            8000 / 2 / phases["later_batches"], rel=0.02
        ), name
    st = pipelines["connect_statetier"]["records_per_s"]
    assert report["ratios"]["connect_rocksdb"] == round(
        st / pipelines["connect_rocksdb"]["records_per_s"], 3
    )
    fb = pipelines["connect_foreach_batch"]["records_per_s"]
    assert report["ratios"]["foreach_batch_classic"] == round(
        fb / pipelines["classic_foreach_batch"]["records_per_s"], 3
    )
    assert pipelines["connect_foreach_batch"]["exact"] is None  # it keeps no counts to check
    later = pipelines["connect_statetier"]["later_batches_records_per_s"]
    classic_later = pipelines["classic_statetier"]["later_batches_records_per_s"]
    assert report["later_batches_ratios"]["classic_statetier"] == pytest.approx(
        later / classic_later, rel=0.01
    )
