"""A word count on one executor of two cores (``local-cluster[1,2,1536]``), run twice in one
application: with ``host.per-executor`` 1, then with its default (a host per task slot).

Run as ``python -m tests.spark.slots_job CONFIG.json``; prints one JSON report line with, per
run, the hosts the driver's registry had, how many ranges each owned, each epoch's warm and
restored ranges, and whether the counts were exact. CONFIG has ``uri`` (checkpoints, one
folder per run under it), ``batches``, ``words``, ``vocabulary`` and ``parallelism``; with
``memory`` (``budget``, ``allowance``, ``keys``, ``batches``, ``dir``) a third run measures the
two hosts' memory under one executor budget (see :func:`memory_run`).

A separate process because one Python process holds one SparkContext, and the other Spark tests
share a ``local[2]`` one.
"""

from __future__ import annotations

import collections
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from statetier.backend.spark import StatefulPipeline

from tests.spark.cluster_job import session, wait_for_executors
from tests.spark.spark_support import (
    PaddedWordCount,
    VectorWordCount,
    expected_counts,
    latest,
    zipf_words,
)


def run(spark: SparkSession, config: dict[str, Any], name: str, settings: dict[str, Any]) -> Any:
    """The word count over ``config['batches']`` epochs with ``settings``; its report."""
    batches = [
        zipf_words(config["words"], config["vocabulary"], seed) for seed in range(config["batches"])
    ]
    pipeline = StatefulPipeline(
        VectorWordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=config["parallelism"],
        config={"checkpoint.uri": f"{config['uri']}/{name}", **settings},
    )
    outputs: dict[str, int] = {}
    for batch in batches:
        df = spark.createDataFrame([(w,) for w in batch], "word string").repartition(2)
        pipeline.run(df, lambda out, _: latest(outputs, out.collect()))
    registry = pipeline._registry
    assert registry is not None
    owned = collections.Counter(registry.owners.values())
    hosts = registry.live_hosts()
    report = {
        "hosts": sorted(owned.get(h.host_id, 0) for h in hosts),
        "executors": sorted({h.executor for h in hosts}),
        "expected_hosts": registry.expected_hosts(),
        "epochs": [
            {
                "warm": r.warm,
                "handed_off": r.handed_off,
                "restored": r.restored,
                "fresh": r.fresh,
                "routing": r.routing,
            }
            for r in pipeline.reports
        ],
        "warm_hit": pipeline.warm_hit_rate(),
        "exact": outputs == expected_counts(batches),
    }
    pipeline.stop_hosts()
    return report


def rss_anon(pid: int) -> int:
    """A process's anonymous resident bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            line = next(line for line in status if line.startswith("RssAnon:"))
    except (OSError, StopIteration):
        return 0
    return int(line.split()[1]) * 1024


def memory_run(spark: SparkSession, config: dict[str, Any]) -> Any:
    """The executor's two hosts under one budget, with state of ``config['memory_x']`` times
    it: the peak of their summed anonymous RSS (sampled every 50 ms), what the governors kept
    on heap and spilled (the hosts' heartbeats), and whether the counts were exact."""
    memory = config["memory"]
    keys = [f"k{i}" for i in range(memory["keys"])]
    batches = [keys[b :: memory["batches"]] for b in range(memory["batches"])]
    settings = {
        "memory.budget": memory["budget"],
        "memory.runtime-allowance": memory["allowance"],
        "spill.enabled": True,
        "spill.dirs": f"{memory['dir']}/spill",
        "spill.check-interval": "20ms",
    }
    pipeline = StatefulPipeline(
        PaddedWordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=config["parallelism"],
        config={"checkpoint.uri": f"{config['uri']}/memory", **settings},
    )
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            pids = [h.pid for h in pipeline.state_hosts()]
            peak[0] = max(peak[0], sum(rss_anon(pid) for pid in pids))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    outputs: dict[str, int] = {}
    for batch in batches:
        df = spark.createDataFrame([(w,) for w in batch], "word string").repartition(2)
        pipeline.run(df, lambda out, _: latest(outputs, out.collect()))
    time.sleep(2.5)  # the hosts' heartbeats after the last snapshot
    done.set()
    sampler.join()
    hosts = pipeline.state_hosts()
    report = {
        "hosts": len(hosts),
        "peak_rss": peak[0],
        "state_heap": [h.state_heap for h in hosts],
        "state_spilled": [h.state_spilled for h in hosts],
        "exact": outputs == expected_counts(batches),
    }
    pipeline.stop_hosts()
    return report


def main() -> None:
    config: dict[str, Any] = json.loads(Path(sys.argv[1]).read_text())
    spark = session("local-cluster[1,2,1536]")
    wait_for_executors(spark, 1)
    report = {
        "one": run(spark, config, "one", {"host.per-executor": 1}),
        "slots": run(spark, config, "slots", {}),
    }
    if "memory" in config:
        report["memory"] = memory_run(spark, config)
    spark.stop()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
