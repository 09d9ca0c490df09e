"""The Spark pipeline on a Spark Connect session: a real ``SparkConnectServer`` (local[2,4]) on
127.0.0.1, started once for the module and stopped by it; the test process talks to it over gRPC
only (its classic session, if another module made one, is not used).

Batch runs keep their coordinator in the client; a streaming query's runs in the Python process
the Connect server runs ``foreachBatch`` in, so what it did is read from the checkpoint and the
sink's files, not from the client's pipeline object.
"""

from __future__ import annotations

import functools
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from pyspark.sql import DataFrame, SparkSession
from statetier.backend.compaction_client import RemoteCompactor
from statetier.backend.snapshot import SnapshotStore
from statetier.backend.spark import StatefulPipeline
from statetier.backend.spark.host_roster import read_roster
from statetier.backend.spark.protocol import process_alive
from statetier.backend.spark.registry import HostInfo
from statetier.backend.timers import MAX_WATERMARK
from statetier.backend.ttl import ManualClock

from tests.spark.conftest import spark_env
from tests.spark.spark_support import (
    HostDiesInSnapshot,
    VectorWordCount,
    collecting,
    committed_counts,
    expected_counts,
    host_pids,
    hosted_ranges,
    latest,
    run_with_a_host_killed,
    words_df,
    zipf_words,
)
from tests.spark.test_spark_remote_compaction import FAST
from tests.spark.timer_support import SCHEMA as TIMER_SCHEMA
from tests.spark.timer_support import ListenerProbe, TimerProbe

pytest.importorskip("grpc")
from statetier.tools.compaction_launch import Processes
from statetier.tools.connect_server import ConnectServer

SCHEMA = "word string, count bigint"
MARKER = f"CONNECT_TEST_MARKER={uuid.uuid4().hex}"  # in the environment of our hosts only


@pytest.fixture(scope="module")
def server_local_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Connect server's ``spark.local.dir``: its block manager's folder is made in it."""
    return tmp_path_factory.mktemp("connect-local")


@pytest.fixture(scope="module")
def connect(
    tmp_path_factory: pytest.TempPathFactory, server_local_dir: Path
) -> Iterator[SparkSession]:
    """A Connect session to a server of this module's own; the server's state hosts, and the
    files its queries' coordinators share, are gone after it stops."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    name, value = MARKER.split("=")
    conf = {
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.adaptive.enabled": "false",
        "spark.local.dir": str(server_local_dir),
    }
    log = tmp_path_factory.mktemp("connect") / "server.log"
    server = ConnectServer.start(log, "local[2,4]", conf, env={**spark_env(), name: value})
    # pyspark's functions build Connect columns only in Connect mode (for this module only)
    had_mode = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    try:
        session = ConnectSession.builder.remote(server.url).getOrCreate()
        yield cast(SparkSession, session)  # the same API, served over gRPC
        session.stop()
    finally:
        if had_mode is None:
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        server.stop()
    deadline = time.monotonic() + 30
    while host_pids(MARKER) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not host_pids(MARKER), "a state host outlived the Connect server"
    left = sorted(str(p) for p in server_local_dir.rglob("statetier-*"))
    assert left == [], f"the coordinators' shared files outlived the Connect server: {left}"


@pytest.fixture
def made() -> Iterator[list[StatefulPipeline]]:
    """Pipelines a test made in this process; their state hosts are stopped afterwards."""
    pipelines: list[StatefulPipeline] = []
    yield pipelines
    for pipeline in pipelines:
        pipeline.stop_hosts()


def make(
    made: list[StatefulPipeline], function: Any, uri: str, p: int, **kwargs: Any
) -> StatefulPipeline:
    schema = kwargs.pop("schema", SCHEMA)
    key = kwargs.pop("key", "word")
    config = {"checkpoint.uri": uri, **kwargs.pop("config", {})}
    pipeline = StatefulPipeline(
        function, key=key, output_schema=schema, parallelism=p, config=config, **kwargs
    )
    made.append(pipeline)
    return pipeline


def test_the_classic_driver_is_not_there(connect: SparkSession) -> None:
    """What the pipeline must do without: the client has no SparkContext."""
    with pytest.raises(Exception, match="JVM_ATTRIBUTE_NOT_SUPPORTED"):
        _ = connect.sparkContext


@pytest.mark.parametrize("function", [VectorWordCount])
def test_batch_runs_are_exact_and_stay_warm(
    connect: SparkSession, made: list[StatefulPipeline], tmp_path: Path, function: Any
) -> None:
    pipeline = make(made, function, f"file://{tmp_path}/ckpt", 4)
    batches = [zipf_words(2000, 300, seed) for seed in range(2)]
    outputs: dict[str, int] = {}
    for batch in batches:
        pipeline.run(words_df(connect, batch), collecting(outputs))
    assert outputs == expected_counts(batches)
    assert [r.epoch for r in pipeline.reports] == [1, 2]
    assert [r.fresh for r in pipeline.reports] == [4, 0]
    assert pipeline.warm_hit_rate() == 1.0
    assert [r.records for r in pipeline.reports] == [len(b) for b in batches]
    if function is VectorWordCount:
        assert committed_counts(pipeline.store, 2) == expected_counts(batches)


def test_an_input_spark_proves_empty_still_runs_every_range(
    connect: SparkSession, made: list[StatefulPipeline], tmp_path: Path
) -> None:
    pipeline = make(made, VectorWordCount, f"file://{tmp_path}/ckpt", 3)
    pipeline.run(words_df(connect, ["a", "b"]))
    report = pipeline.run(words_df(connect, ["a"]).limit(0))
    assert (report.epoch, report.ranges, report.warm, report.records) == (2, 3, 3, 0)
    assert committed_counts(pipeline.store, 2) == {"a": 1, "b": 1}


def test_the_routing_estimate_reads_the_records_as_given(
    connect: SparkSession,
    made: list[StatefulPipeline],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``pipeline.exchange`` ``auto`` on Connect routes an epoch by the optimizer's estimate of
    its records as given (a Parquet read's: its files' bytes), not of the plan with the
    key-group column, which is estimated bigger: with the limit at that estimate the epoch goes
    ``direct``, one byte below it through the exchange; both exact."""
    from pyspark.sql import functions as sf
    from statetier.backend.spark import pipeline as pipeline_module
    from statetier.backend.spark.plans import estimated_bytes

    words = zipf_words(4000, 300, 7)
    words_df(connect, words).coalesce(1).write.parquet(str(tmp_path / "words"))
    records = connect.read.parquet(str(tmp_path / "words"))
    size = estimated_bytes(records)
    keyed = estimated_bytes(records.withColumn("kg", sf.lit(1).cast("long")))
    assert size is not None and keyed is not None and 0 < size < keyed
    pipeline = make(made, VectorWordCount, f"file://{tmp_path}/ckpt", 4)
    pipeline.run(words_df(connect, ["a"]))  # the hosts start (auto waits for them)
    monkeypatch.setattr(pipeline_module, "DIRECT_BYTES", size)
    assert pipeline.run(records).routing == "direct"
    monkeypatch.setattr(pipeline_module, "DIRECT_BYTES", size - 1)
    assert pipeline.run(records).routing == "exchange"
    assert committed_counts(pipeline.store, 3) == expected_counts([["a"], words, words])


def test_timers_and_listeners_in_batch_runs(
    connect: SparkSession, made: list[StatefulPipeline], tmp_path: Path
) -> None:
    clock = ManualClock(1_000)
    pipeline = make(
        made, TimerProbe, f"file://{tmp_path}/ckpt", 2, schema=TIMER_SCHEMA, key="key", clock=clock
    )
    out: list[tuple[Any, ...]] = []

    def sink(df: DataFrame, epoch: int) -> None:
        out.extend(tuple(r) for r in df.collect())

    def ops(rows: list[tuple[str, str, int]]) -> DataFrame:
        return connect.createDataFrame(rows, "key string, op string, ts bigint").coalesce(1)

    first = [("a", "event", 100), ("a", "event", 200), ("a", "del-event", 200)]
    first += [("b", "proc", 1_500), ("d", "event", 500)]
    pipeline.run(ops(first), sink)
    assert out == []
    clock.set(2_000)
    pipeline.run(ops([]), sink, watermark=150)
    assert out == [("b", "proc", 1_500, 2, 150), ("a", "event", 100, 2, 150)]
    out.clear()
    pipeline.run(ops([]), sink, end_of_input=True)
    assert out == [("d", "event", 500, 3, MAX_WATERMARK)]

    logs = tmp_path / "logs"
    logs.mkdir()
    heard = make(
        made,
        functools.partial(ListenerProbe, str(logs)),
        f"file://{tmp_path}/ckpt-listeners",
        2,
        schema=TIMER_SCHEMA,
        key="key",
    )
    rows = ops([(f"k{i}", "event", i) for i in range(20)])
    heard.run(rows)
    heard.transform(rows, 2).write.format("noop").mode("overwrite").save()  # never committed
    heard.run_epoch(rows, 2)  # restored from epoch 1: the instances of the noop run are aborted
    last = heard.run(rows)  # an epoch's completion reaches the function with the next epoch
    # only a warm instance hears of its epoch: one restored or handed off hears nothing of it,
    # as in Flink (listeners), so a range that was not warm names itself here first
    assert (last.epoch, last.warm, last.ranges) == (3, 2, 2)
    lines = [line.split() for f in sorted(logs.iterdir()) for line in f.read_text().splitlines()]
    for index in ("0", "1"):
        assert [(w, int(e)) for w, e, i in lines if i == index] == [
            ("complete", 1),
            ("aborted", 2),
            ("complete", 2),
        ]


def json_sink(directory: Path) -> Callable[[DataFrame, int], None]:
    """A sink that runs on the Connect server: each epoch's rows to a directory of its own
    (overwritten by a re-run of the epoch)."""
    path = str(directory)

    def sink(out: DataFrame, epoch: int) -> None:
        out.write.mode("overwrite").json(f"{path}/epoch={epoch}")

    return sink


def sunk_counts(directory: Path) -> dict[str, int]:
    outputs: dict[str, int] = {}
    for part in sorted(directory.glob("epoch=*/*.json")):
        rows = [json.loads(line) for line in part.read_text().splitlines()]
        latest(outputs, ((r["word"], r["count"]) for r in rows))
    return outputs


def run_query(writer: Any, checkpoint: Path) -> None:
    """Run a query over the files there are (availableNow); its failure, if any, told."""
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination(300)
    query.stop()
    assert query.exception() is None, query.exception()


def words_stream(connect: SparkSession, source: Path) -> DataFrame:
    return connect.readStream.schema("word string").option("maxFilesPerTrigger", 1).csv(str(source))


def add_files(source: Path, batches: list[list[str]], files: range) -> None:
    source.mkdir(exist_ok=True)
    for i in files:
        (source / f"part-{i:03d}.csv").write_text("\n".join(batches[i]) + "\n")


def test_a_streaming_query_restarted_from_its_checkpoint_is_exact(
    connect: SparkSession, made: list[StatefulPipeline], tmp_path: Path
) -> None:
    """write_stream: two micro-batches, then a new query object and pipeline over the same
    checkpoints (a new foreachBatch process, whose hosts restore the ranges) runs one more."""
    source, uri, out = tmp_path / "in", f"file://{tmp_path}/ckpt", tmp_path / "out"
    batches = [zipf_words(1500, 300, seed) for seed in range(3)]
    spark_checkpoint = tmp_path / "spark-ckpt"
    for files in (range(2), range(2, 3)):
        add_files(source, batches, files)
        pipeline = make(made, VectorWordCount, uri, 3)
        writer = pipeline.write_stream(words_stream(connect, source), json_sink(out))
        run_query(writer, spark_checkpoint)
        store = SnapshotStore(uri)
        assert store.epochs()[-1] == files.stop
        assert committed_counts(store, files.stop) == expected_counts(batches[: files.stop])
    assert sunk_counts(out) == expected_counts(batches)


def test_foreach_batch_on_the_connect_server_is_exact(
    connect: SparkSession, made: list[StatefulPipeline], tmp_path: Path
) -> None:
    """foreach_batch: the function the client hands to foreachBatch runs on the server."""
    source, uri, out = tmp_path / "in", f"file://{tmp_path}/ckpt", tmp_path / "out"
    batches = [zipf_words(1500, 300, seed) for seed in range(2)]
    add_files(source, batches, range(2))
    spark_checkpoint = tmp_path / "spark-ckpt"
    pipeline = make(made, VectorWordCount, uri, 3)
    function = pipeline.foreach_batch(json_sink(out), checkpoint_location=str(spark_checkpoint))
    run_query(words_stream(connect, source).writeStream.foreachBatch(function), spark_checkpoint)
    store = SnapshotStore(uri)
    assert store.epochs()[-1] == 2
    assert committed_counts(store, 2) == expected_counts(batches)
    assert sunk_counts(out) == expected_counts(batches)


def test_write_stream_needs_the_query_checkpoint_location(
    connect: SparkSession, made: list[StatefulPipeline], tmp_path: Path
) -> None:
    pipeline = make(made, VectorWordCount, f"file://{tmp_path}/ckpt", 2)
    words = connect.readStream.schema("word string").csv(str(tmp_path))
    with pytest.raises(ValueError, match=r"checkpointLocation"):
        pipeline.write_stream(words).start()
    with pytest.raises(ValueError, match=r"checkpoint_location=\.\.\."):
        pipeline.foreach_batch()


def test_the_queries_of_a_connect_server_share_its_state_hosts(
    connect: SparkSession, made: list[StatefulPipeline], tmp_path: Path, server_local_dir: Path
) -> None:
    """Each query's foreachBatch process coordinates its own pipeline with a registry of its
    own, and all of them use the application's state hosts: a second query, then two at once,
    start no host, and each is exact (a range's result goes to the registry that routed its
    task). The secret and the host roster they share are in the server's block manager folder,
    which Spark deletes when it stops (the fixture checks that nothing is left)."""
    batches = [zipf_words(1500, 300, seed) for seed in range(2)]

    def start(name: str) -> tuple[Any, str, Path]:
        root = tmp_path / name
        root.mkdir()
        add_files(root / "in", batches, range(2))
        uri = f"file://{root}/ckpt"
        writer = make(made, VectorWordCount, uri, 3).write_stream(
            words_stream(connect, root / "in"), json_sink(root / "out")
        )
        query = writer.option("checkpointLocation", str(root / "spark-ckpt"))
        return query.trigger(availableNow=True).start(), uri, root / "out"

    def finish(query: Any, uri: str, out: Path) -> None:
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        assert SnapshotStore(uri).epochs()[-1] == 2
        assert committed_counts(SnapshotStore(uri), 2) == expected_counts(batches)
        assert sunk_counts(out) == expected_counts(batches)

    finish(*start("first"))
    hosts = host_pids(MARKER)
    together = [start("second"), start("third")]
    for started in together:
        finish(*started)
    assert host_pids(MARKER) - hosts == set(), "a query started state hosts of its own"
    shared = [p.suffix for p in server_local_dir.glob("blockmgr-*/statetier-*")]
    assert shared.count(".secret") == shared.count(".hosts") == 1, shared


def test_a_stopped_query_leaves_the_hosts_at_once(
    connect: SparkSession, made: list[StatefulPipeline], tmp_path: Path, server_local_dir: Path
) -> None:
    """On Connect a query's coordinator is its foreachBatch process, which Spark stops with the
    query: the hosts lose its registry and drop the ranges it routed (spark.stopped_queries
    follows nothing here)."""
    source, uri = tmp_path / "in", f"file://{tmp_path}/ckpt"
    add_files(source, [zipf_words(900, 200, 0)], range(1))
    pipeline = make(made, VectorWordCount, uri, 3, name=f"stops-{uuid.uuid4().hex[:8]}")
    writer = pipeline.write_stream(words_stream(connect, source))
    query = writer.option("checkpointLocation", str(tmp_path / "spark-ckpt")).start()
    deadline = time.monotonic() + 120
    while not SnapshotStore(uri).epochs():  # its first micro-batch is committed
        assert time.monotonic() < deadline and query.exception() is None, query.exception()
        time.sleep(0.1)
    (secret,) = server_local_dir.glob("blockmgr-*/statetier-*.secret")
    (roster,) = server_local_dir.glob("blockmgr-*/statetier-*.hosts")
    key = bytes.fromhex(secret.read_text().strip())
    # The roster is a hint, whole from the view of the coordinator that wrote it last
    # (host_roster): read once after the commit, it once named one host of two (1 range of 3),
    # and another run saw it name the hosts of 2 ranges for two minutes. So the hosts are those
    # of every read, until they hold all 3 ranges or, after 30 s, at least one.
    seen: dict[str, HostInfo] = {}
    enough = time.monotonic() + 30
    while True:
        seen.update((host.host_id, host) for host in read_roster(str(roster)))
        held = hosted_ranges(key, hosts := list(seen.values()))
        mine = held.get(pipeline.name, 0)
        if mine == 3 or (mine and time.monotonic() > enough):
            break
        assert time.monotonic() < deadline, f"the running query's ranges: {held}"
        time.sleep(0.1)
    query.stop()
    deadline = time.monotonic() + 60
    while (held := hosted_ranges(key, hosts)).get(pipeline.name):
        assert time.monotonic() < deadline, f"the stopped query's ranges stayed: {held}"
        time.sleep(0.1)
    assert hosts and all(process_alive(host.pid) for host in hosts), "the hosts stay"


# the tests below kill a host or start a compaction service: last, so that nothing they leave
# behind in the module's Connect server can reach the tests above
def test_a_host_killed_after_its_task_costs_a_rerun_not_the_epoch(
    connect: SparkSession, made: list[StatefulPipeline], tmp_path: Path
) -> None:
    """The loss of a state host (an executor's, in effect) on Connect: the client's coordinator
    notices it and runs the epoch again, restoring the lost range; nothing lost or doubled."""
    marker = tmp_path / "killed-once"
    factory = functools.partial(HostDiesInSnapshot, str(marker))
    pipeline = make(made, factory, f"file://{tmp_path}/ckpt", 2)
    batches, _ = run_with_a_host_killed(connect, pipeline, marker)
    assert committed_counts(pipeline.store, 3) == expected_counts(batches)


def test_the_compaction_service_compacts_what_a_connect_client_commits(
    connect: SparkSession, made: list[StatefulPipeline], tmp_path: Path
) -> None:
    """Remote compaction with the coordinator in the Connect client: the service's worker
    merges the chains, and the hosts on the server name the compacted bases."""
    root = tmp_path / "store"
    root.mkdir()
    prefix = f"file://{root}"
    with Processes(tmp_path) as procs:
        gateway, _ = procs.gateway([prefix], *FAST)
        procs.worker(gateway, [prefix])
        config = {
            "compaction.endpoints": gateway,
            "compaction.delta-trigger": 3,
            "compaction.size-ratio": 100.0,
            "compaction.poll-interval": "100ms",
        }
        pipeline = make(made, VectorWordCount, f"{prefix}/ckpt", 2, config=config)
        batches = [zipf_words(600, 300, seed) for seed in range(10)]
        outputs: dict[str, int] = {}
        for words in batches:
            pipeline.run(words_df(connect, words), collecting(outputs))
        pipeline.drain()
        remote = pipeline.upkeep.compactor
        assert isinstance(remote, RemoteCompactor), remote
        assert remote.remote_jobs >= 2 and remote.fallbacks == 0
    assert outputs == expected_counts(batches)
    latest_epoch = pipeline.store.epochs()[-1]
    assert committed_counts(pipeline.store, latest_epoch) == expected_counts(batches)
    bases = [c.base.path for c in pipeline.store.manifest(latest_epoch).chains()]
    assert any("/compacted/" in path for path in bases), bases
