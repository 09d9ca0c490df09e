"""Kills at random moments under a streaming count on a cluster of three executor JVMs.

Run as ``python -m tests.spark.chaos_job CONFIG.json``; prints one JSON report line. CONFIG has
``master``, ``work`` (a scratch directory), ``seed``, ``words`` (per micro-batch),
``vocabulary``, ``parallelism`` and ``phases``: a list of ``{"name", "files", "batches",
"kills"}``, each one streaming query (its own statetier checkpoint) over Parquet micro-batches
of ``files`` partitions (3: gathered by the state hosts; 1: sent ``direct``), ``kills`` of its
micro-batches (every other one from the third) losing an executor JVM or a state host
(SIGKILL, as many of one as of the other) a random moment after their sink started.

Each micro-batch is written by a ``foreachBatch`` Parquet sink into a folder of its own per
delivery (``sink/<phase>/batch=<b>/delivery=<n>``), so every delivery stays to be checked
against the oracle: the report lists, per micro-batch, each delivery that succeeded (has
``_SUCCESS``) as complete, partial (rows missing) or wrong, and the committed state of every
epoch against the counts of the words so far.

A separate process because one Python process holds one SparkContext, and the other Spark tests
share a ``local[2]`` one.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from statetier.backend.spark import StatefulPipeline

from tests.spark.cluster_job import session, wait_for_executors, watched_jvm
from tests.spark.spark_support import VectorWordCount, committed_counts, zipf_words

Rows = collections.Counter[tuple[str, int]]
SINK_SCHEMA = pa.schema([("word", pa.string()), ("count", pa.int64())])


def write_batches(source: Path, batches: list[list[str]], files: int) -> None:
    """Micro-batch ``i`` as ``files`` Parquet files (a partition each), oldest first."""
    source.mkdir(parents=True, exist_ok=True)
    for i, words in enumerate(batches):
        for f in range(files):
            path = source / f"part-{i:03d}-{f}.parquet"
            pq.write_table(pa.table({"word": words[f::files]}), path)
            stamp = time.time() - 3600 + 10 * i + f  # Spark takes the oldest files first
            os.utime(path, (stamp, stamp))


def expected_rows(batches: list[list[str]]) -> list[Rows]:
    """The oracle: per micro-batch, one row per distinct word with its count so far."""
    totals: collections.Counter[str] = collections.Counter()
    out = []
    for words in batches:
        totals.update(words)
        out.append(collections.Counter((w, totals[w]) for w in set(words)))
    return out


def cumulative_counts(batches: list[list[str]]) -> list[dict[str, int]]:
    """The oracle of the committed state: the counts after each micro-batch."""
    totals: collections.Counter[str] = collections.Counter()
    out = []
    for words in batches:
        totals.update(words)
        out.append(dict(totals))
    return out


class Chaos:
    """Kills a random executor JVM or state host of ``pipeline``'s application."""

    def __init__(self, rng: random.Random, pipeline: StatefulPipeline, kills: int) -> None:
        self.rng = rng
        self.pipeline = pipeline
        self.kinds = (["executor", "host"] * kills)[:kills]  # as many of each, in random order
        rng.shuffle(self.kinds)
        self.done: list[dict[str, Any]] = []

    def schedule(self, batch: int) -> None:
        kind = self.kinds.pop()
        delay = self.rng.uniform(0.05, 1.2)
        threading.Timer(delay, self.kill, (batch, kind, delay)).start()

    def kill(self, batch: int, kind: str, delay: float) -> None:
        hosts = self.pipeline.state_hosts()
        if not hosts:
            self.done.append({"batch": batch, "kind": kind, "delay": delay, "pid": None})
            return
        host = self.rng.choice(hosts)
        pid = watched_jvm(host.pid) if kind == "executor" else host.pid
        killed: int | None = pid
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # it died already
            killed = None
        self.done.append({"batch": batch, "kind": kind, "delay": round(delay, 3), "pid": killed})


def run_phase(
    spark: SparkSession, config: dict[str, Any], phase: dict[str, Any], rng: random.Random
) -> dict[str, Any]:
    work = Path(config["work"]) / phase["name"]
    seeds = [rng.randrange(1 << 30) for _ in range(phase["batches"])]
    batches = [zipf_words(config["words"], config["vocabulary"], s) for s in seeds]
    write_batches(work / "in", batches, phase["files"])
    pipeline = StatefulPipeline(
        VectorWordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=config["parallelism"],
        config={
            "checkpoint.uri": f"file://{work}/ckpt",
            "checkpoint.retained": 1000,  # every epoch's state stays to be checked
            "pipeline.exchange": "auto",
        },
    )
    chaos = Chaos(rng, pipeline, phase["kills"])
    # every other micro-batch from the third on: the one between starts the state host of an
    # executor that replaced a killed one (through the exchange), so the next kill meets a
    # micro-batch routed as the phase's are
    kill_at = set(range(2, phase["batches"], 2)[: phase["kills"]])
    started = time.monotonic()
    deliveries: dict[int, int] = collections.Counter()
    sink_dir = work / "sink"

    def sink(out: DataFrame, epoch: int) -> None:
        batch = epoch - 1
        if batch in kill_at and not deliveries[batch]:  # during its job's first run
            chaos.schedule(batch)
        deliveries[batch] += 1
        out.write.parquet(str(sink_dir / f"batch={batch:03d}" / f"delivery={deliveries[batch]}"))

    stream = spark.readStream.schema("word string").option("maxFilesPerTrigger", phase["files"])
    query = (
        pipeline.write_stream(stream.parquet(str(work / "in")), sink)
        .option("checkpointLocation", str(work / "spark-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    error = query.exception()
    query.stop()
    report = {
        "phase": phase["name"],
        "error": str(error)[:2000] if error else None,
        "kills": chaos.done,
        "routing": {r.epoch - 1: r.routing for r in pipeline.reports},
        "reruns": {r.epoch - 1: r.reruns for r in pipeline.reports if r.reruns},
        "seconds": round(time.monotonic() - started, 1),
        "batch_seconds": [round(r.seconds, 1) for r in pipeline.reports],
        "sink": check_sink(sink_dir, expected_rows(batches)),
        "state": check_state(pipeline, cumulative_counts(batches)),
    }
    pipeline.stop_hosts()
    return report


def check_sink(sink_dir: Path, expected: list[Rows]) -> list[dict[str, Any]]:
    """Every delivery of every micro-batch against the oracle."""
    out = []
    for batch, want in enumerate(expected):
        folders = sorted((sink_dir / f"batch={batch:03d}").glob("delivery=*"))
        seen = []
        for folder in folders:
            if not (folder / "_SUCCESS").exists():
                seen.append({"delivery": folder.name, "succeeded": False})
                continue
            table = pq.read_table(folder, schema=SINK_SCHEMA)
            got = collections.Counter(
                zip(table["word"].to_pylist(), table["count"].to_pylist(), strict=True)
            )
            verdict = "complete" if got == want else "partial" if got < want else "wrong"
            seen.append(
                {
                    "delivery": folder.name,
                    "succeeded": True,
                    "verdict": verdict,
                    "rows": sum(got.values()),
                    "expected": sum(want.values()),
                }
            )
        out.append({"batch": batch, "deliveries": seen})
    return out


def check_state(pipeline: StatefulPipeline, expected: list[dict[str, int]]) -> dict[str, Any]:
    """Each committed epoch's state against the counts of the words so far."""
    epochs = pipeline.store.epochs()
    wrong = []
    for epoch in epochs:
        counts = committed_counts(pipeline.store, epoch)
        want = expected[epoch - 1]
        lost = sum(max(0, n - counts.get(w, 0)) for w, n in want.items())
        doubled = sum(max(0, n - want.get(w, 0)) for w, n in counts.items())
        if lost or doubled:
            wrong.append({"epoch": epoch, "lost": lost, "doubled": doubled})
    return {"epochs": epochs, "wrong": wrong}


def main() -> None:
    config: dict[str, Any] = json.loads(Path(sys.argv[1]).read_text())
    rng = random.Random(config["seed"])
    spark = session(config["master"])
    wait_for_executors(spark, config["executors"])
    phases = [run_phase(spark, config, phase, rng) for phase in config["phases"]]
    spark.stop()
    print(json.dumps({"seed": config["seed"], "phases": phases}), flush=True)


if __name__ == "__main__":
    main()
