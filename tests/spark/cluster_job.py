"""A streaming word count on a Spark cluster of several executor JVMs (``local-cluster``).

Run as ``python -m tests.spark.cluster_job CONFIG.json``; prints one JSON report line. CONFIG has
``master``, ``uri`` (checkpoints), ``work`` (a scratch directory), ``batches``, ``words``,
``vocabulary``, ``parallelism`` and optionally ``files`` (per micro-batch, each read as a
partition of it; 1 by default), ``exchange`` (``pipeline.exchange``), ``kill_at``: the
micro-batch whose job loses an executor (its JVM is killed with SIGKILL while the job
runs, taking its state host with it) and ``kill_delay``: how long after the micro-batch's
sink starts (0.3 s by default).

A separate process because one Python process holds one SparkContext, and the other Spark tests
share a ``local[2]`` one.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyspark
from pyspark.sql import DataFrame, SparkSession
from statetier.backend.spark import StatefulPipeline

from tests.spark.spark_support import VectorWordCount, expected_counts, latest, zipf_words


def session(master: str) -> SparkSession:
    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    spark = (
        SparkSession.builder.master(master)
        .appName("statetier-cluster-test")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.task.maxFailures", "8")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def wait_for_executors(spark: SparkSession, count: int, timeout: float = 120.0) -> None:
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
    deadline = time.monotonic() + timeout
    while status.size() < count + 1 and time.monotonic() < deadline:  # + the driver
        time.sleep(0.2)
        status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()


def watched_jvm(host_pid: int) -> int:
    """The executor JVM a state host watches (its ``--watch-pid``)."""
    with open(f"/proc/{host_pid}/cmdline", "rb") as f:
        args = f.read().decode().split("\0")
    return int(args[args.index("--watch-pid") + 1])


def main() -> None:
    config: dict[str, Any] = json.loads(Path(sys.argv[1]).read_text())
    spark = session(config["master"])
    wait_for_executors(spark, config.get("executors", 2))
    work = Path(config["work"])
    source = work / "in"
    source.mkdir(parents=True, exist_ok=True)
    batches = [
        zipf_words(config["words"], config["vocabulary"], seed) for seed in range(config["batches"])
    ]
    files = config.get("files", 1)
    for i, batch in enumerate(batches):
        for f in range(files):  # a micro-batch of `files` partitions
            path = source / f"part-{i:03d}-{f}.csv"
            path.write_text("\n".join(batch[f::files]) + "\n")
            # Spark takes the oldest files first: micro-batch i is then exactly batch i
            stamp = time.time() - 3600 + 10 * i + f
            os.utime(path, (stamp, stamp))
    pipeline = StatefulPipeline(
        VectorWordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=config["parallelism"],
        config={
            "checkpoint.uri": config["uri"],
            "pipeline.exchange": config.get("exchange", "auto"),
        },
    )
    outputs: dict[str, int] = {}
    rows: dict[int, list[int]] = {}  # epoch -> output rows of each run of its job
    killed: list[int] = []
    killed_ranges: list[int] = []

    kills_timed: set[int] = set()

    def sink(out: DataFrame, epoch: int) -> None:
        # its job's first run only (a first run that fails, as a gathered job that lost a range
        # does, appends no rows: the run again must not kill a second executor)
        if epoch == config.get("kill_at") and epoch not in kills_timed:
            kills_timed.add(epoch)
            threading.Timer(config.get("kill_delay", 0.3), kill_an_owner).start()
        collected = out.collect()
        rows.setdefault(epoch, []).append(len(collected))
        latest(outputs, ((r.word, r["count"]) for r in collected))

    def kill_an_owner() -> None:
        registry = pipeline._registry
        assert registry is not None
        owners = list(registry.owners.values())
        host = max(registry.live_hosts(), key=lambda h: owners.count(h.host_id))
        killed_ranges.append(owners.count(host.host_id))
        jvm = watched_jvm(host.pid)
        os.kill(jvm, signal.SIGKILL)
        killed.append(jvm)

    stream = spark.readStream.schema("word string").option("maxFilesPerTrigger", files)
    query = (
        pipeline.write_stream(stream.csv(str(source)), sink)
        .option("checkpointLocation", str(work / "spark-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    error = query.exception()
    # a query planned once carries its route (the exchange and mapInArrow) in its own plan
    planned_once = "MapInArrow" in query._jsq.streamingQuery().logicalPlan().toString()
    query.stop()
    report = {
        "error": str(error) if error else None,
        "exact": outputs == expected_counts(batches),
        "killed": killed,
        "killed_ranges": sum(killed_ranges),
        "epochs": [
            {
                "epoch": r.epoch,
                "warm": r.warm,
                "handed_off": r.handed_off,  # moved to a host that joined (see rebalancing)
                "restored": r.restored,
                "fresh": r.fresh,
                "restored_bytes": r.restored_bytes,
                "reruns": r.reruns,
            }
            for r in pipeline.reports
        ],
        "hosts": len(pipeline.hosts),
        # one output row per distinct word of a micro-batch in each run of its job
        "rows": [rows.get(e, []) for e in range(1, len(batches) + 1)],
        "distinct": [len(set(b)) for b in batches],
        "routing": [r.routing for r in pipeline.reports],
        "planned_once": planned_once,
    }
    pipeline.stop_hosts()
    spark.stop()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
