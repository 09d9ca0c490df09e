"""Ranges follow the cluster: a word count starts on two executors, a third joins, and the
driver moves ranges to it between epochs, their state handed over by the old hosts.

One application on ``local-cluster[3,1,1024]`` with dynamic allocation (two executors at first,
at most three, none requested on its own: the backlog timeout is an hour), two pipelines run
epoch by epoch side by side: ``warm`` and ``killed``. After two epochs the job asks Spark for a
third executor (``SparkContext.requestExecutors``), whose first tasks start its state host. At
the next epoch boundary the registry moves ranges to it. ``killed`` rebalances only after
``warm`` has, and then the executor of the old owner of the first range it moves is killed (its
JVM and state host, SIGKILL) after the move was decided and before the range's hand-off: that
range is restored from tier 2 instead.

Run as ``python -m tests.spark.rebalance_job CONFIG.json``; prints one JSON report line. CONFIG
has ``uri`` (checkpoints), ``batches``, ``words``, ``vocabulary``, ``parallelism``.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pyspark
from pyspark.sql import DataFrame, SparkSession
from statetier.backend.spark import StatefulPipeline

from tests.spark.cluster_job import wait_for_executors, watched_jvm
from tests.spark.spark_support import VectorWordCount, expected_counts, latest, zipf_words

JOIN_AFTER = 2  # epochs run on two executors before the third is asked for


def session() -> SparkSession:
    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    builder = SparkSession.builder.master("local-cluster[3,1,1024]").appName("statetier-rebal")
    settings = {
        "spark.ui.enabled": "false",
        "spark.executor.memory": "512m",
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.adaptive.enabled": "false",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.task.maxFailures": "8",
        "spark.locality.wait": "0",  # the new executor gets tasks as soon as it is free
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.initialExecutors": "2",
        "spark.dynamicAllocation.minExecutors": "2",
        "spark.dynamicAllocation.maxExecutors": "3",
        "spark.dynamicAllocation.schedulerBacklogTimeout": "3600s",
        "spark.dynamicAllocation.executorIdleTimeout": "3600s",
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def pipeline(config: dict[str, Any], name: str) -> StatefulPipeline:
    return StatefulPipeline(
        VectorWordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=config["parallelism"],
        name=name,
        config={"checkpoint.uri": f"{config['uri']}/{name}", "pipeline.exchange": "always"},
    )


def kill_an_old_owner(run: StatefulPipeline, after: StatefulPipeline, killed: list[int]) -> None:
    """Make ``run``'s first rebalancing kill the executor (JVM and state host) that owned the
    first range it moves, once the move is decided and before the range is handed over. ``run``
    rebalances only once ``after`` has (the kill takes ranges of both pipelines' hosts)."""
    decide = run._rebalance

    def rebalance_then_kill(spark: SparkSession) -> list[int]:
        if not any(report.moved for report in after.reports):
            return []
        moved = decide(spark)
        registry = run._registry
        if moved and not killed and registry is not None:
            first = (run.name, run.parallelism, moved[0])
            old = registry.hosts[registry.previous[first]]
            jvm = watched_jvm(old.pid)
            killed.extend([first[2], old.pid, jvm])
            os.kill(jvm, signal.SIGKILL)
            os.kill(old.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while registry.owner(first) is not None and old.alive and time.monotonic() < deadline:
                time.sleep(0.05)  # the registry sees its link close
        return moved

    run._rebalance = rebalance_then_kill  # type: ignore[method-assign]


def collect_into(outputs: dict[str, int], out: DataFrame, _: int) -> None:
    latest(outputs, out.collect())


def describe(run: StatefulPipeline, outputs: dict[str, int], batches: list[list[str]]) -> Any:
    return {
        "exact": outputs == expected_counts(batches),
        "epochs": [
            {
                "epoch": r.epoch,
                "moved": r.moved,
                "warm": r.warm,
                "handed_off": r.handed_off,
                "restored": r.restored,
                "restored_bytes": r.restored_bytes_by_range,
                "hosts": r.hosts_by_range,
                "reruns": r.reruns,
            }
            for r in run.reports
        ],
    }


def main() -> None:
    config: dict[str, Any] = json.loads(Path(sys.argv[1]).read_text())
    spark = session()
    wait_for_executors(spark, 2)
    batches = [
        zipf_words(config["words"], config["vocabulary"], seed) for seed in range(config["batches"])
    ]
    runs = {name: pipeline(config, name) for name in ("warm", "killed")}
    killed: list[int] = []
    kill_an_old_owner(runs["killed"], runs["warm"], killed)
    outputs: dict[str, dict[str, int]] = {name: {} for name in runs}
    joined_at = 0
    first_hosts: list[str] = []
    for epoch, batch in enumerate(batches, start=1):
        if epoch == JOIN_AFTER + 1:
            first_hosts = [h.host_id for h in runs["warm"].state_hosts()]
            spark.sparkContext._jsc.sc().requestExecutors(1)
            wait_for_executors(spark, 3)
            joined_at = epoch
        for name, run in runs.items():
            df = spark.createDataFrame([(w,) for w in batch], "word string").repartition(2)
            run.run(df, functools.partial(collect_into, outputs[name]))
    report = {
        "joined_at": joined_at,
        "kill": killed,  # [the range, its old host's pid, its executor's]
        "first_hosts": first_hosts,
        **{name: describe(run, outputs[name], batches) for name, run in runs.items()},
    }
    runs["warm"].stop_hosts()
    spark.stop()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
