"""A word count that runs with the Spark conf the Spark Operator would submit, and nothing else.

Run as ``python -m tests.spark.submitted_job CONFIG.json``; prints one JSON report line. CONFIG
has ``conf`` (every ``--conf`` pair of the submission, the volumes' mount paths already mapped
into a temporary folder), ``local`` (what a ``local-cluster`` master needs instead of a
Kubernetes one: the master, the driver's address), ``spill`` (the mapped mount path of the spill
volume), ``port`` (the metrics port to read), ``work``, ``batches``, ``words``, ``vocabulary``.

The pipeline is given no settings of its own: what it knows of spill, budget, checkpoints and
metrics comes from the ``spark.statetier.*`` keys the operator's webhook wrote. While the state
hosts still run, the job lists the spill files under the volume's mount path and reads the
metrics endpoint; then it stops everything it started.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pyspark
from pyspark.sql import DataFrame, SparkSession
from statetier.backend.spark import StatefulPipeline

from tests.spark.cluster_job import wait_for_executors
from tests.spark.spark_support import VectorWordCount, expected_counts, latest, zipf_words


def session(conf: dict[str, str], local: dict[str, str]) -> SparkSession:
    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    builder = SparkSession.builder
    for key, value in {**conf, **local}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def spill_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*.chunk"))


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def main() -> None:
    config: dict[str, Any] = json.loads(Path(sys.argv[1]).read_text())
    spark = session(config["conf"], config["local"])
    wait_for_executors(spark, int(config["conf"].get("spark.executor.instances", "2")))
    work = Path(config["work"])
    work.mkdir(parents=True, exist_ok=True)
    batches = [
        zipf_words(config["words"], config["vocabulary"], seed) for seed in range(config["batches"])
    ]
    pipeline = StatefulPipeline(
        VectorWordCount, key="word", output_schema="word string, count bigint", parallelism=4
    )
    outputs: dict[str, int] = {}

    def sink(out: DataFrame, _: int) -> None:
        latest(outputs, ((r.word, r["count"]) for r in out.collect()))

    spilled: list[int] = []
    for epoch, words in enumerate(batches, start=1):
        path = work / f"words-{epoch}.parquet"
        pq.write_table(pa.table({"word": words}), path)
        report = pipeline.run_epoch(spark.read.parquet(str(path)), epoch, sink)
        spilled.append(sum(report.spilled_by_range))
        time.sleep(float(config.get("pause", 1.5)))  # the memory monitor checks once a second
    result = {
        "exact": outputs == expected_counts(batches),
        "spilled": spilled,
        "spill_files": spill_files(Path(config["spill"])),
        "metrics": metrics(config["port"]),
        "hosts": len(pipeline.hosts),
    }
    pipeline.stop_hosts()
    spark.stop()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
