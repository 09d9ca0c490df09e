"""A job whose function lives in a module only the driver can import (run by
test_spark_unshipped_module in its own process, on ``local-cluster``): prints one JSON line with
the error of the first run, the task attempts Spark made until then, and the outputs of a run
after the module was shipped with ``addPyFile``."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession
from statetier.backend.spark import StatefulPipeline


def task_attempts(spark: SparkSession) -> dict[str, int]:
    """Finished and failed task attempts of every job the application ran."""
    tracker = spark.sparkContext.statusTracker()
    done = failed = 0
    for job in tracker.getJobIdsForGroup(None):
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info else []:
            s = tracker.getStageInfo(stage)
            if s is not None:
                done, failed = done + s.numCompletedTasks, failed + s.numFailedTasks
    return {"completed": done, "failed": failed}


def main(folder: Path, checkpoint: str) -> None:
    sys.path.insert(0, str(folder))  # the driver's path only: the executors do not have it
    function = importlib.import_module("driver_only_module").CountPerWord
    spark = (
        SparkSession.builder.master("local-cluster[1,1,1024]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    words = spark.createDataFrame([("a",), ("b",), ("a",)], "word string")
    report: dict[str, object] = {}
    pipeline = StatefulPipeline(
        function, key="word", output_schema="word string, count bigint", parallelism=2,
        config={"checkpoint.uri": checkpoint},
    )  # fmt: skip
    try:
        pipeline.run(words)
    except Exception as e:  # reported to the test
        report["error"] = f"{type(e).__name__}: {e}"
    report["attempts"] = task_attempts(spark)
    spark.sparkContext.addPyFile(str(folder / "driver_only_module.py"))
    pipeline.run(words, sink=lambda out, _: report.update(rows=sorted(map(tuple, out.collect()))))
    pipeline.stop_hosts()
    spark.stop()
    print(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
