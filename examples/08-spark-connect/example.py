"""A word count on Spark Connect: the client is a thin gRPC process with no SparkContext; statetier
runs a batch epoch from the client and a streaming query whose epochs the Connect server's
``foreachBatch`` process coordinates and commits, with exact counts. (A query restarted from its
checkpoints continues where it stopped, as on a classic session: tests/spark/test_spark_connect.py.)

The example starts a local Connect server on 127.0.0.1 (a ``SparkConnectServer`` process from the
installed pyspark, ``local[2]``) and stops it at the end; against a real one, only the
``remote(...)`` URL changes (``sc://HOST:15002``).
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyspark
from pyspark.sql import DataFrame, SparkSession
from statetier.backend import RuntimeContext, ValueStateDescriptor
from statetier.backend.spark import KeyGroupFunction, StatefulPipeline


class WordCount(KeyGroupFunction):
    """One Arrow pass per range: a count per distinct word, one state update each."""

    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(ValueStateDescriptor[int]("count"))

    def process_range(self, records: Any, context: RuntimeContext) -> pa.Table:
        counts = records.group_by("word", use_threads=False).aggregate([("word", "count")])
        totals = []
        pairs = zip(counts["word"].to_pylist(), counts["word_count"].to_pylist(), strict=True)
        for word, n in pairs:
            context.set_current_key(word)
            total = (self.count.value() or 0) + n
            self.count.update(total)
            totals.append(total)
        return pa.table({"word": counts["word"], "count": pa.array(totals, pa.int64())})


def ends_with_this_process() -> None:
    """In the server's process before it runs: SIGTERM when this one dies, however (Linux)."""
    ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG


def start_connect_server(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A local Spark Connect server on 127.0.0.1 and a free port; its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = os.path.dirname(pyspark.__file__)
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
    }
    command = [f"{home}/bin/spark-submit", "--master", "local[2]"]
    command += ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    env = {**os.environ, "SPARK_HOME": home, "PYSPARK_PYTHON": sys.executable}
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [*command, "spark-internal"], env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=ends_with_this_process,  # noqa: PLW1509
        )  # fmt: skip
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and server.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return server, f"sc://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    os.killpg(server.pid, signal.SIGKILL)
    raise RuntimeError(f"the Connect server did not start: {log.read_text()[-2000:]}")


def pipeline_at(work: Path) -> StatefulPipeline:
    return StatefulPipeline(
        WordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=4,
        config={"checkpoint.uri": f"file://{work}/statetier"},
    )


def run_query(spark: SparkSession, source: Path, work: Path) -> None:
    """Process the files not yet seen. The sink runs on the Connect server: each epoch's rows go
    to a folder of their own, which a re-run of the epoch overwrites."""
    out = str(work / "out")

    def sink(rows: DataFrame, epoch: int) -> None:
        rows.write.mode("overwrite").json(f"{out}/epoch={epoch}")

    words = spark.readStream.schema("word string").option("maxFilesPerTrigger", 1)
    query = (
        pipeline_at(work)
        .write_stream(words.csv(str(source)), sink)
        .option("checkpointLocation", str(work / "spark"))  # the query's offset log is read
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def latest_counts(folder: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for part in sorted(folder.glob("epoch=*/*.json"), key=lambda p: int(p.parent.name[6:])):
        for line in part.read_text().splitlines():
            row = json.loads(line)
            counts[row["word"]] = row["count"]
    return counts


def main() -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="statetier-example-"))
    server, url = start_connect_server(work / "connect-server.log")
    spark = SparkSession.builder.remote(url).getOrCreate()
    text = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "the", "end"]
    try:
        # A batch epoch from the client: its coordinator runs here.
        batch = pipeline_at(work / "batch")
        report = batch.run(spark.createDataFrame([(w,) for w in text], "word string"))
        print(f"batch epoch {report.epoch}: {report.records} words, {report.ranges} ranges")
        batch.stop_hosts()

        source = work / "in"
        source.mkdir()
        for i in range(2):  # one file per micro-batch
            (source / f"part-{i}.csv").write_text("\n".join(text[i:] + text) + "\n")
        run_query(spark, source, work)
        counts = latest_counts(work / "out")
        expected = collections.Counter(w for i in range(2) for w in text[i:] + text)
        assert counts == dict(expected), (counts, expected)
        print(f"streaming counts match ({len(counts)} words, the={counts['the']})")
    finally:
        spark.stop()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
