"""A driver that dies before it commits: run as ``python -m tests.spark.crash_driver URI OUT``.

Epochs 1 and 2 are committed; epoch 3 runs its job and its sink (the outputs are written to OUT),
then the process kills itself before the commit. OUT also names the state hosts' pids, so that
the test can watch those hosts, and not the hosts of a test running beside it, exit.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from pyspark.sql import SparkSession
from statetier.backend.spark import StatefulPipeline

from tests.spark.spark_support import VectorWordCount, zipf_words


def main() -> None:
    uri, out_path = sys.argv[1], sys.argv[2]
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    pipeline = StatefulPipeline(
        VectorWordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=4,
        config={"checkpoint.uri": uri},
    )
    for epoch in (1, 2, 3):
        df = spark.createDataFrame([(w,) for w in zipf_words(2000, 300, epoch)], "word string")
        if epoch < 3:
            pipeline.run(df)
            continue
        rows = pipeline.transform(df, epoch).collect()  # the job and the sink ran...
        with open(out_path, "w") as f:
            rows_out = [[r.word, r["count"]] for r in rows]
            json.dump({"rows": rows_out, "hosts": sorted(pipeline.hosts.values())}, f)
        os.kill(os.getpid(), signal.SIGKILL)  # ...and the driver dies before the commit


if __name__ == "__main__":
    main()
