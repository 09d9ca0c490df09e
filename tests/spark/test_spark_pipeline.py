"""The Spark pipeline on real Spark (local[2]): key groups, warm state, exactly-once epochs."""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client import REGISTRY
from pyspark.sql import DataFrame, SparkSession
from statetier.backend.keygroups import assign_to_key_group, spark_key_group_expr
from statetier.backend.snapshot import CorruptFileError, FencedError, SnapshotStore
from statetier.backend.spark import StatefulPipeline
from statetier.backend.spark.arrow_batches import MAX_BYTES_PER_BATCH, UNCAPPED

from tests.spark.conftest import REPO, spark_env
from tests.spark.spark_support import (
    CombinedWordCount,
    FailingCombinedWordCount,
    FailingWordCount,
    MapSideCombinedWordCount,
    SnapshotFailsOnce,
    VectorWordCount,
    WordCount,
    collecting,
    expected_counts,
    fail_once_per_marker,
    host_pids,
    latest,
    python_workers_heaps,
    run_available_now,
    words_df,
    zipf_words,
)

SCHEMA = "word string, count bigint"


def make(
    pipelines: list[StatefulPipeline], function: Any, uri: str, p: int, **config: Any
) -> StatefulPipeline:
    pipeline = StatefulPipeline(
        function,
        key="word",
        output_schema=SCHEMA,
        parallelism=p,
        config={"checkpoint.uri": uri, **config},
    )
    pipelines.append(pipeline)
    return pipeline


def test_spark_sql_key_group_equals_python(spark: SparkSession) -> None:
    rng = random.Random(5)
    rows = [
        (
            "".join(rng.choices("abcdé€😀xyz", k=rng.randint(0, 13))),
            rng.randint(-(2**63), 2**63 - 1),
        )
        for _ in range(300)
    ]
    df = spark.createDataFrame(rows, "s string, n bigint")
    for columns, key in ((["s"], lambda r: r[0]), (["n"], lambda r: r[1]), (["s", "n"], tuple)):
        got = df.selectExpr("s", "n", f"{spark_key_group_expr(columns, 128)} AS kg").collect()
        for row in got:
            assert row.kg == assign_to_key_group(key((row.s, row.n)), 128)


@pytest.mark.parametrize(
    "function", [WordCount, VectorWordCount, CombinedWordCount, MapSideCombinedWordCount]
)
def test_word_count_is_exact_and_stays_warm(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path, function: Any
) -> None:
    pipeline = make(pipelines, function, f"file://{tmp_path}/ckpt", 4)
    batches = [zipf_words(3000, 400, seed) for seed in range(3)]
    outputs: dict[str, int] = {}
    before = driver_metrics()
    for batch in batches:
        pipeline.run(words_df(spark, batch), collecting(outputs))
    assert outputs == expected_counts(batches)
    assert SnapshotStore(f"file://{tmp_path}/ckpt").epochs()[-1] == 3
    assert [r.fresh for r in pipeline.reports] == [4, 0, 0]
    assert pipeline.warm_hit_rate() == 1.0  # epochs 2 and 3 found every range warm
    # the driver exports what the state-tier dashboard shows
    after = driver_metrics()
    assert after["committed"] - before["committed"] == 3
    assert after["warm"] - before["warm"] == 8
    assert after["restored"] == before["restored"]
    if function in (CombinedWordCount, MapSideCombinedWordCount):  # one row per key moved
        rows = [r.rows for r in pipeline.reports]
        assert all(n < len(b) for n, b in zip(rows, batches, strict=True))
    assert [r.records for r in pipeline.reports] == [len(b) for b in batches]
    # the hosts told the driver their results, which it acknowledged: no result file written
    assert sum(r.results_told for r in pipeline.reports) == 12
    written = SnapshotStore(f"file://{tmp_path}/ckpt").list_files()
    assert not [name for name in written if "/results/" in name]


def arrow_byte_caps(df: DataFrame) -> set[str | None]:
    """The Arrow byte cap the tasks of a job over ``df`` ran with (their job property)."""

    def caps(batches: Any) -> Any:
        from pyspark import TaskContext

        for _ in batches:
            pass
        cap = TaskContext.get().getLocalProperty(MAX_BYTES_PER_BATCH)  # type: ignore[union-attr]
        yield pa.RecordBatch.from_pydict({"cap": [cap]}, schema=pa.schema([("cap", pa.string())]))

    return {r.cap for r in df.mapInArrow(caps, "cap string").collect()}


@pytest.mark.parametrize("session_cap", [None, "1048576"])
def test_statetier_jobs_batch_arrow_by_rows_unless_the_session_caps_bytes(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path, session_cap: Any
) -> None:
    pipeline = make(pipelines, WordCount, f"file://{tmp_path}/ckpt", 2)
    seen: list[set[str | None]] = []
    if session_cap is not None:
        spark.conf.set(MAX_BYTES_PER_BATCH, session_cap)
    try:
        pipeline.run(
            words_df(spark, ["a", "b", "a"]), lambda out, _: seen.append(arrow_byte_caps(out))
        )
        other_job = arrow_byte_caps(words_df(spark, ["c"]))
    finally:
        spark.conf.unset(MAX_BYTES_PER_BATCH)
    # the statetier job's tasks (and the sink's, in the same job) batch by rows only, unless
    # the session set a cap of its own; the session's other jobs keep Spark's setting
    assert seen == [{UNCAPPED if session_cap is None else session_cap}]
    assert other_job == {session_cap}
    assert spark.sparkContext.getLocalProperty(MAX_BYTES_PER_BATCH) is None
    assert pipeline.reports[0].records == 3


def test_the_sql_combiner_needs_no_second_exchange(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    pipeline = make(pipelines, CombinedWordCount, f"file://{tmp_path}/ckpt", 4)
    out = pipeline.transform(words_df(spark, zipf_words(100, 30, 0)), 1)
    plan = out._jdf.queryExecution().executedPlan().toString()
    assert plan.count("Exchange") == 1 and "shufflepartitionidpassthrough" in plan
    assert "Aggregate" in plan  # aggregated in the JVM after the range exchange


def test_a_failed_snapshot_leaves_the_epoch_uncommitted(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    """The host snapshots after the task returned; its failure must still stop the commit."""
    uri = f"file://{tmp_path}/ckpt"
    factory = functools.partial(SnapshotFailsOnce, str(tmp_path / "failed-once"))
    pipeline = make(pipelines, factory, uri, 4)
    batches = [zipf_words(2000, 300, seed) for seed in range(3)]
    pipeline.run(words_df(spark, batches[0]))
    with pytest.raises(CorruptFileError, match="failed to snapshot"):
        pipeline.run(words_df(spark, batches[1]))
    assert SnapshotStore(uri).epochs() == [1]
    outputs: dict[str, int] = {}
    for batch in batches[1:]:  # epoch 2 again, then 3
        pipeline.run(words_df(spark, batch), collecting(outputs))
    # the failed epoch's state was not trusted: a range starts warm only from an instance at
    # the committed base (epoch 1 and its token; a range the failed epoch ran is dirty), which
    # a host can still hold when the range went elsewhere for the failed epoch (its heartbeat
    # lapsed under load) and came back; the exact outputs below prove no range built on epoch
    # 2's state (it would count the second batch twice)
    retried = pipeline.reports[-2]
    assert retried.restored + retried.warm + retried.handed_off == 4, retried
    expected = expected_counts(batches)
    assert outputs == {w: expected[w] for w in {*batches[1], *batches[2]}}


def test_missing_results_fail_the_epoch_after_the_result_timeout(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    """A host that dies after its task returned writes no result: the driver gives up after
    ``host.result-timeout``, names it, and commits nothing (here the epoch's job never ran, so
    no range's result appears, as the driver sees a host gone before its snapshot)."""
    uri = f"file://{tmp_path}/ckpt"
    pipeline = make(pipelines, WordCount, uri, 2, **{"host.result-timeout": "1s"})
    pipeline.run(words_df(spark, zipf_words(500, 50, 1)))
    started = time.monotonic()
    with pytest.raises(CorruptFileError, match=r"no result within host.result-timeout=1s"):
        pipeline.commit(2)
    assert time.monotonic() - started < 5
    assert SnapshotStore(uri).epochs() == [1]


def driver_metrics() -> dict[str, float]:
    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    return {
        "committed": sample("statetier_checkpoints_total", outcome="committed"),
        "warm": sample("statetier_state_warm_hits_total"),
        "restored": sample("statetier_state_cold_restores_total"),
    }


@pytest.mark.parametrize("function", [FailingWordCount, FailingCombinedWordCount])
def test_failed_task_is_retried_and_counts_stay_exact(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path, function: Any
) -> None:
    pipeline = make(pipelines, function, f"file://{tmp_path}/ckpt", 4)
    batches = [zipf_words(2000, 300, seed) for seed in range(3)]
    outputs: dict[str, int] = {}
    for batch in batches:
        pipeline.run(words_df(spark, batch), collecting(outputs))
    assert outputs == expected_counts(batches)
    second = pipeline.reports[1]
    # range 1 updated its state, then failed: the retry must not build on that dirty state
    assert second.restored == 1 and second.warm == 3
    assert pipeline.reports[2].warm == 4


def test_restart_at_another_parallelism(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    uri = f"file://{tmp_path}/ckpt"
    batches = [zipf_words(2000, 300, seed) for seed in range(4)]
    outputs: dict[str, int] = {}
    for p, batch in zip((4, 4, 3, 6), batches, strict=True):
        pipeline = make(pipelines, VectorWordCount, uri, p)  # a new driver each time
        report = pipeline.run(words_df(spark, batch), collecting(outputs))
        assert report.restored == (p if report.epoch > 1 else 0)
    assert outputs == expected_counts(batches)
    manifest = SnapshotStore(uri).manifest()
    assert (manifest.epoch, manifest.parallelism) == (4, 6)


def test_spill_with_a_budget_below_the_state(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    pipeline = make(
        pipelines,
        VectorWordCount,
        f"file://{tmp_path}/ckpt",
        2,
        **{
            "spill.enabled": True,
            "memory.budget": "1m",
            "spill.check-interval": "10ms",
            "spill.dirs": str(tmp_path / "spill"),
        },
    )
    batches = [[f"{w}-{'x' * 40}" for w in zipf_words(20000, 20000, seed)] for seed in range(3)]
    outputs: dict[str, int] = {}
    for batch in batches:
        pipeline.run(words_df(spark, batch), collecting(outputs))
    assert outputs == expected_counts(batches)
    assert max(r.spilled_key_groups for r in pipeline.reports) > 0


def test_batch_rerun_after_the_driver_died_before_commit(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    uri = f"file://{tmp_path}/ckpt"
    env = {**os.environ, **spark_env()}
    crashed = subprocess.run(
        [sys.executable, "-m", "tests.spark.crash_driver", uri, str(tmp_path / "out.json")],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=240,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr.decode()[-3000:]
    store = SnapshotStore(uri)
    assert store.epochs() == [1, 2]  # epoch 3 ran but was never committed
    left = json.loads((tmp_path / "out.json").read_text())
    crashed_rows, crashed_hosts = left["rows"], set(left["hosts"])
    assert crashed_hosts, "the dead driver named no state host"
    # the new driver re-runs epoch 3 from the committed epoch 2
    pipeline = make(pipelines, VectorWordCount, uri, 4)
    outputs: dict[str, int] = {}
    batch = zipf_words(2000, 300, 3)
    report = pipeline.run_epoch(words_df(spark, batch), 3, collecting(outputs))
    assert not report.adopted and report.restored == 4
    assert store.epochs() == [1, 2, 3]
    expected = expected_counts([zipf_words(2000, 300, e) for e in (1, 2, 3)])
    assert outputs == {w: expected[w] for w in set(batch)}
    assert dict(map(tuple, crashed_rows)) == outputs  # the lost run had computed the same
    # the dead driver's state host noticed its executor was gone and exited (only its own hosts
    # are watched: a test in another pytest worker may start hosts of its own meanwhile)
    deadline = time.monotonic() + 20
    while crashed_hosts & host_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not crashed_hosts & host_pids()


def test_rerun_of_a_committed_epoch_adopts_it(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    uri = f"file://{tmp_path}/ckpt"
    batches = [zipf_words(2000, 300, seed) for seed in range(4)]
    first = make(pipelines, VectorWordCount, uri, 4)
    for batch in batches[:3]:
        first.run(words_df(spark, batch))
    store = SnapshotStore(uri)
    committed = store.fs.cat_file(store.full_path(store.manifest_name(3)))
    # a new driver re-runs epoch 3 (its sink had not finished): same outputs, manifest kept
    second = make(pipelines, VectorWordCount, uri, 4)
    outputs: dict[str, int] = {}
    report = second.run_epoch(words_df(spark, batches[2]), 3, collecting(outputs))
    assert report.adopted
    assert store.fs.cat_file(store.full_path(store.manifest_name(3))) == committed
    second.run_epoch(words_df(spark, batches[3]), 4, collecting(outputs))
    assert second.reports[-1].restored == 4  # its own epoch-3 files were not the committed ones
    expected = expected_counts(batches)
    assert outputs == {w: expected[w] for w in {*batches[2], *batches[3]}}


def test_a_write_stream_job_run_off_the_callback_thread_fails_clearly(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    """The epoch travels as a job property of the foreachBatch thread: a sink that runs the
    job elsewhere must fail, naming why, and commit nothing."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "part-0.csv").write_text("\n".join(zipf_words(500, 50, 0)) + "\n")
    pipeline = make(pipelines, VectorWordCount, f"file://{tmp_path}/ckpt", 2)

    def sink_on_another_thread(out: DataFrame, epoch: int) -> None:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(out.collect).result()

    words = spark.readStream.schema("word string").csv(str(source))
    query = (
        pipeline.write_stream(words, sink_on_another_thread)
        .option("checkpointLocation", str(tmp_path / "spark-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match="this job carries no epoch"):
        query.awaitTermination(120)
    query.stop()
    assert SnapshotStore(f"file://{tmp_path}/ckpt").epochs() == []


def test_a_driver_that_lost_the_lease_cannot_commit_its_next_epoch(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    """The driver plans the epoch after its own commit without listing the location; a
    newer driver that took the lease meanwhile still fences it at commit."""
    uri = f"file://{tmp_path}/ckpt"
    batches = [zipf_words(1000, 200, seed) for seed in range(3)]
    old = make(pipelines, VectorWordCount, uri, 2)
    for batch in batches[:2]:
        old.run(words_df(spark, batch))
    new = make(pipelines, VectorWordCount, uri, 2)
    new.run(words_df(spark, batches[2]))
    store = SnapshotStore(uri)
    committed = store.fs.cat_file(store.full_path(store.manifest_name(3)))
    with pytest.raises(FencedError, match="lost the lease"):
        old.run_epoch(words_df(spark, batches[2]), 3)
    assert store.epochs() == [1, 2, 3]
    assert store.fs.cat_file(store.full_path(store.manifest_name(3))) == committed


@pytest.mark.slow
@pytest.mark.parametrize(
    ("api", "function", "exchange"),
    [
        ("foreach_batch", VectorWordCount, "auto"),  # a plan per micro-batch
        ("write_stream", VectorWordCount, "auto"),  # planned once, the epoch sent with each job
        ("write_stream", FailingWordCount, "auto"),  # a task of epoch 2 fails once, is retried
        ("write_stream", VectorWordCount, "always"),  # the exchange, planned once
        ("write_stream", FailingWordCount, "always"),
        # a combiner aggregates per micro-batch (in the streaming plan, Spark would refuse a
        # streaming aggregation in append mode): in the task that cuts the micro-batch, or in
        # Spark SQL after the exchange
        ("write_stream", CombinedWordCount, "auto"),
        ("write_stream", CombinedWordCount, "always"),
    ],
)
def test_streaming_query_stopped_and_restarted_from_its_checkpoint(
    spark: SparkSession,
    pipelines: list[StatefulPipeline],
    tmp_path: Path,
    api: str,
    function: Any,
    exchange: str,
) -> None:
    """One file per micro-batch is one partition: with ``pipeline.exchange=auto`` its one task
    cuts it into the ranges (no exchange); ``always`` takes Spark's exchange every time."""
    source, uri = tmp_path / "in", f"file://{tmp_path}/ckpt"
    source.mkdir()
    batches = [zipf_words(1500, 300, seed) for seed in range(5)]
    outputs: dict[str, int] = {}

    def run_query(files: range) -> StatefulPipeline:
        for i in files:
            (source / f"part-{i:03d}.csv").write_text("\n".join(batches[i]) + "\n")
        pipeline = make(pipelines, function, uri, 4, **{"pipeline.exchange": exchange})
        stream = spark.readStream.schema("word string").option("maxFilesPerTrigger", 1)
        words = stream.csv(str(source))
        writer = (
            words.writeStream.foreachBatch(pipeline.foreach_batch(collecting(outputs)))
            if api == "foreach_batch"
            else pipeline.write_stream(words, collecting(outputs))
        )
        run_available_now(writer, tmp_path / "spark-ckpt")
        return pipeline

    first = run_query(range(3))
    assert [r.epoch for r in first.reports] == [1, 2, 3]
    routing = "direct" if exchange == "auto" else "exchange"
    # the first micro-batch of an application takes the exchange: its tasks, on every
    # executor, start the state hosts the ranges then stay with
    assert [r.routing for r in first.reports[1:]] == [routing] * 2
    # range 1 of epoch 2 failed after updating its state (FailingWordCount): restored on retry;
    # without the exchange the failed task held every range, and every range that got its
    # records before the task failed is restored too
    restored = first.reports[1].restored
    if function is not FailingWordCount:
        assert restored == 0
    elif exchange == "always":
        assert restored == 1
    else:
        assert 1 <= restored <= 4
    assert first.reports[2].warm == 4
    second = run_query(range(3, 5))  # a restarted query: new driver objects, same checkpoints
    assert [r.epoch for r in second.reports] == [4, 5]
    assert second.reports[0].restored == 4 and second.reports[1].warm == 4
    assert outputs == expected_counts(batches)


@pytest.mark.parametrize(
    ("exchange", "partitions", "routing", "function"),
    [
        # one task reads the micro-batch: it cuts it into the ranges
        ("auto", 1, "direct", VectorWordCount),
        # several: each task sends its piece of every range, the hosts gather them
        ("auto", 3, "gathered", VectorWordCount),
        ("never", 3, "gathered", VectorWordCount),
        ("always", 1, "exchange", VectorWordCount),
        ("always", 3, "exchange", VectorWordCount),
        # a combiner: one task aggregates all (CombinedWordCount fails on unmerged rows) ...
        ("auto", 1, "direct", CombinedWordCount),
        ("never", 3, "direct", CombinedWordCount),
        # ... or the map side did, and the host merges the partial rows of every piece
        ("never", 3, "gathered", MapSideCombinedWordCount),
        ("auto", 3, "exchange", CombinedWordCount),  # Spark SQL after the exchange
    ],
)
def test_the_exchange_is_taken_only_when_it_helps(
    spark: SparkSession,
    pipelines: list[StatefulPipeline],
    tmp_path: Path,
    exchange: str,
    partitions: int,
    routing: str,
    function: Any,
) -> None:
    pipeline = make(
        pipelines, function, f"file://{tmp_path}/ckpt", 4, **{"pipeline.exchange": exchange}
    )
    batches = [zipf_words(2000, 300, seed) for seed in range(3)]
    outputs: dict[str, int] = {}
    plans = []

    def sink(out: DataFrame, epoch: int) -> None:
        plans.append(out._jdf.queryExecution().executedPlan().toString())
        collecting(outputs)(out, epoch)

    for batch in batches:
        pipeline.run(words_df(spark, batch).repartition(partitions), sink)
    assert outputs == expected_counts(batches)
    assert [r.routing for r in pipeline.reports[1:]] == [routing] * 2  # (the first: see above)
    # the exchange into ranges is a shuffle by partition id; without it, no such step
    for report, plan in zip(pipeline.reports, plans, strict=True):
        assert ("shufflepartitionidpassthrough" in plan) == (report.routing == "exchange")
    assert [r.warm for r in pipeline.reports] == [0, 4, 4]
    assert [r.records for r in pipeline.reports] == [len(b) for b in batches]
    if function is not VectorWordCount:  # one row per key (and map task) reached the hosts
        assert all(r.rows < r.records for r in pipeline.reports)
    # Spark collects a reused worker's garbage after each task: a worker that ran the
    # pipeline's tasks left its imports out (a worker that only checked the function did not)
    heaps = python_workers_heaps(spark)
    assert any(heap.frozen > 20_000 for heap in heaps.values()), heaps


def test_gathered_pieces_kept_on_disk_count_the_same(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    """No runtime allowance: the hosts keep no piece in memory, every one waits in a file in
    the spill directory until its range runs, and goes then."""
    spill = tmp_path / "spill"
    pipeline = make(
        pipelines,
        VectorWordCount,
        f"file://{tmp_path}/ckpt",
        4,
        **{"memory.runtime-allowance": "0", "spill.dirs": str(spill)},
    )
    batches = [zipf_words(3000, 300, seed) for seed in range(3)]
    outputs: dict[str, int] = {}
    for batch in batches:
        pipeline.run(words_df(spark, batch).repartition(3), collecting(outputs))
    assert [r.routing for r in pipeline.reports[1:]] == ["gathered"] * 2
    assert outputs == expected_counts(batches)
    assert (spill / "pieces").is_dir() and list((spill / "pieces").iterdir()) == []


def test_a_gathered_range_that_fails_runs_again_on_its_completers_retry(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    """Range 1 of epoch 2 fails once after changing its state (FailingWordCount), in a
    micro-batch of three partitions that the hosts gather: the task whose piece completed the
    range fails, Spark retries it, its piece completes the range again, which is restored and
    runs again. Each range's outputs still leave Spark once, through the retried task."""
    pipeline = make(pipelines, FailingWordCount, f"file://{tmp_path}/ckpt", 4)
    batches = [zipf_words(2000, 300, seed) for seed in range(3)]
    outputs: dict[str, int] = {}
    rows: list[int] = []

    def sink(out: DataFrame, epoch: int) -> None:
        collected = out.collect()
        rows.append(len(collected))
        latest(outputs, ((r.word, r["count"]) for r in collected))

    for batch in batches:
        pipeline.run(words_df(spark, batch).repartition(3), sink)
    assert [r.routing for r in pipeline.reports[1:]] == ["gathered"] * 2
    assert rows == [len(set(b)) for b in batches]  # no range's outputs twice, none missing
    assert outputs == expected_counts(batches)
    assert pipeline.reports[1].restored == 1 and pipeline.reports[1].warm == 3
    assert pipeline.reports[2].warm == 4


def test_a_completing_task_that_fails_after_its_outputs_gets_them_again(
    spark: SparkSession, pipelines: list[StatefulPipeline], tmp_path: Path
) -> None:
    """Gathered ranges: a task fails after the hosts sent it the outputs of the ranges it
    completed. Its retry sends its pieces again and gets the same outputs back from the hosts,
    which ran each range once: no restore, no re-run of the epoch, each output row once."""
    from pyspark.sql import functions as sf

    pipeline = make(pipelines, VectorWordCount, f"file://{tmp_path}/ckpt", 4)
    batches = [zipf_words(2000, 300, seed) for seed in range(3)]
    outputs: dict[str, int] = {}
    rows: list[int] = []
    marker = str(tmp_path / "failed")
    fail_once = sf.udf(lambda word: fail_once_per_marker(marker, word), "string")

    def sink(out: DataFrame, epoch: int) -> None:
        if epoch == 2:
            out = out.select(fail_once("word").alias("word"), "count")
        collected = out.collect()
        rows.append(len(collected))
        latest(outputs, ((r.word, r["count"]) for r in collected))

    for batch in batches:
        pipeline.run(words_df(spark, batch).repartition(3), sink)
    assert (tmp_path / "failed").exists()
    assert [r.routing for r in pipeline.reports[1:]] == ["gathered"] * 2
    assert rows == [len(set(b)) for b in batches]
    assert outputs == expected_counts(batches)
    assert [(r.warm, r.restored, r.reruns) for r in pipeline.reports[1:]] == [(4, 0, 0)] * 2


def test_a_task_cuts_its_records_into_ranges_as_the_exchange_does() -> None:
    import numpy as np
    import pyarrow as pa
    from statetier.backend.spark.functions import KEY_GROUP_COLUMN
    from statetier.backend.spark.task import split_ranges

    rng = np.random.default_rng(3)
    kg = rng.integers(0, 128, 5000)
    kg[kg // 32 == 2] = 0  # range 2 of 4 gets nothing
    batches = [
        pa.record_batch(
            {"word": [f"w{i}" for i in range(n, n + 1000)], KEY_GROUP_COLUMN: kg[n : n + 1000]}
        )
        for n in range(0, 5000, 1000)
    ]
    slices = split_ranges(batches, 4, 128)
    assert len(slices) == 4 and sum(b.num_rows for s in slices for b in s) == 5000
    for index, records in enumerate(slices):
        table = pa.Table.from_batches(records, batches[0].schema)
        groups = table.column(KEY_GROUP_COLUMN).to_numpy()
        assert ((groups * 4) // 128 == index).all()  # repartitionById's owner of each row
        words = table.column("word").to_pylist()
        assert words == sorted(words, key=lambda w: int(w[1:]))  # the input's order kept
    assert slices[2] == []
    assert split_ranges([], 4, 128) == [[], [], [], []]
