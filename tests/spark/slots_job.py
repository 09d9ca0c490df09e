"""A word count on one executor of two cores (``local-cluster[1,2,1536]``), run twice in one
application: with ``host.per-executor`` 1, then with its default (a host per task slot).

Run as ``python -m tests.spark.slots_job CONFIG.json``; prints one JSON report line with, per
run, the hosts the driver's registry had, how many ranges each owned, each epoch's warm and
restored ranges, and whether the counts were exact. CONFIG has ``uri`` (checkpoints, one
folder per run under it), ``batches``, ``words``, ``vocabulary`` and ``parallelism``.

A separate process because one Python process holds one SparkContext, and the other Spark tests
share a ``local[2]`` one.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from statetier.backend.spark import StatefulPipeline

from tests.spark.cluster_job import session, wait_for_executors
from tests.spark.spark_support import VectorWordCount, expected_counts, latest, zipf_words


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
            {"warm": r.warm, "restored": r.restored, "fresh": r.fresh, "routing": r.routing}
            for r in pipeline.reports
        ],
        "warm_hit": pipeline.warm_hit_rate(),
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
    spark.stop()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
