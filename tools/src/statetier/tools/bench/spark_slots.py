"""``statetier bench spark-slots``: a state host per task slot against one host per executor.

One executor of two cores (``local-cluster[1,2,2048]``), the same Zipf words in the same
micro-batches, a per-record function doing about 30 us of Python work per record
(``spark_functions.BusyWordCount``), so that state work dominates. Each round runs the word
count twice, alternated: with ``host.per-executor`` at its default (a host per task slot: two)
and at 1 (today's one host per executor). A round's first micro-batch starts the hosts and is
not timed; the others are.

Per configuration: throughput (input records / wall time of the timed micro-batches, median of
rounds), and the CPU seconds of each process of the executor read from /proc over that wall
time: the state hosts (cores used by all of them together: one process cannot pass 1.0), the
executor JVM and the PySpark Python workers (its other descendants), also as CPU per record.
The machine's load average is printed with every round: the machine may be shared. Targets:
the hosts per slot use more than 1.2 cores together and reach at least 1.3x the one-host
throughput. From the CPU per record per process, the report projects the throughput of
executors of 4, 8 and 16 cores with one host and with hosts per slot (docs/spark.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from statetier.backend.helptext import plain
from statetier.tools.bench import cpu_seconds, print_table
from statetier.tools.bench.spark_wordcount import spark_session, write_input
from statetier.tools.workloads import batches, zipf_words

MASTER = "local-cluster[1,2,2048]"
MIN_HOST_CORES = 1.2
MIN_SPEEDUP = 1.3
PROJECTED_CORES = (4, 8, 16)
CONFIGS = {"slots": {}, "one": {"host.per-executor": 1}}  # the default: a host per slot


@dataclasses.dataclass
class Round:
    """One timed run of one configuration."""

    records: int
    seconds: float
    cpu: dict[str, float]  # CPU seconds by process kind: hosts, jvm, workers
    hosts: int
    load: float  # the 1-minute load average at its end
    routing: list[str]
    exact: bool

    @property
    def rate(self) -> float:
        return self.records / self.seconds


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(root: int) -> set[int]:
    """Every live process under ``root`` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def watched_jvm(host_pid: int) -> int:
    """The executor JVM a state host watches (its ``--watch-pid``)."""
    args = Path(f"/proc/{host_pid}/cmdline").read_bytes().decode().split("\0")
    return int(args[args.index("--watch-pid") + 1])


def process_cpu(host_pids: set[int]) -> dict[str, dict[int, float]]:
    """CPU seconds so far of each process of the executor, by kind: the state hosts, the
    executor JVM and its other descendants (PySpark's daemon and Python workers)."""
    jvm = watched_jvm(next(iter(host_pids)))
    workers = descendants(jvm) - host_pids
    kinds = {"hosts": host_pids, "jvm": {jvm}, "workers": workers}
    out: dict[str, dict[int, float]] = {}
    for kind, pids in kinds.items():
        out[kind] = {}
        for pid in pids:
            with contextlib.suppress(OSError, IndexError, ValueError):  # it ended meanwhile
                out[kind][pid] = cpu_seconds(pid)
    return out


def spent(
    before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]
) -> dict[str, float]:
    """CPU seconds each kind spent between two readings (a process that started between them
    counts from 0; one that ended is lost, so the workers' figure is a lower bound)."""
    return {
        kind: sum(cpu - before.get(kind, {}).get(pid, 0.0) for pid, cpu in pids.items())
        for kind, pids in after.items()
    }


def run_config(spark: Any, source: Path, uri: str, settings: dict[str, Any], files: int) -> Round:
    """The word count over every micro-batch with ``settings``; the first is not timed."""
    from statetier.backend.spark import StatefulPipeline
    from statetier.tools.bench.spark_functions import BusyWordCount

    pipeline = StatefulPipeline(
        BusyWordCount,
        key="word",
        output_schema="word string, count bigint",
        parallelism=8,
        config={"checkpoint.uri": uri, **settings},
    )
    counts: dict[str, int] = {}

    def sink(out: Any, _: int) -> None:
        for row in out.toArrow().to_pylist():
            counts[row["word"]] = max(counts.get(row["word"], 0), row["count"])

    def epoch(i: int) -> int:
        df = spark.read.parquet(str(source / f"part-{i:03d}.parquet"))
        return pipeline.run(df, sink).records

    try:
        epoch(0)  # starts the hosts (untimed)
        pids = {h.pid for h in pipeline.state_hosts()}
        before = process_cpu(pids)
        started = time.perf_counter()
        records = sum(epoch(i) for i in range(1, files))
        seconds = time.perf_counter() - started
        after = process_cpu(pids)
        expected = _expected(spark, source)
        return Round(
            records=records,
            seconds=seconds,
            cpu=spent(before, after),
            hosts=len(pids),
            load=os.getloadavg()[0],
            routing=[r.routing for r in pipeline.reports[1:]],
            exact=counts == expected,
        )
    finally:
        pipeline.stop_hosts()


def _expected(spark: Any, source: Path) -> dict[str, int]:
    """Every word's count over the whole input (Spark's own count)."""
    rows = spark.read.parquet(str(source)).groupBy("word").count().collect()
    return {r["word"]: r["count"] for r in rows}


def per_record(rounds: list[Round]) -> dict[str, float]:
    """Median CPU microseconds per record of each process kind."""
    kinds = rounds[0].cpu
    return {k: statistics.median(r.cpu[k] / r.records * 1e6 for r in rounds) for k in kinds}


def projection(us: dict[str, float], cores: int) -> dict[str, float]:
    """Records/s of an executor of ``cores`` from CPU per record per process: with hosts per
    slot every core works (cores / all the CPU a record takes); with one host, also at most
    one core's worth of host work (1 / the host's CPU per record)."""
    total = sum(us.values()) / 1e6
    slots = cores / total
    return {"one_host": min(slots, 1e6 / us["hosts"]), "hosts_per_slot": slots}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="statetier bench spark-slots", description=plain(__doc__))
    parser.add_argument("--words", type=int, default=600_000)
    parser.add_argument("--vocabulary", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=6, help="micro-batches (the first untimed)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", default=MASTER)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="statetier-bench-slots-"))
    spark = spark_session(8, args.master)
    source = work / "in"
    write_input(spark, batches(zipf_words(args.words, args.vocabulary), args.batches), source)
    rounds: dict[str, list[Round]] = {name: [] for name in CONFIGS}
    try:
        for i in range(args.rounds):
            for name, settings in CONFIGS.items():
                uri = f"file://{work}/ckpt-{name}-{i}"
                done = run_config(spark, source, uri, settings, args.batches)
                rounds[name].append(done)
                print(
                    f"round {i + 1} {name}: {done.rate:,.0f} records/s, hosts "
                    f"{done.cpu['hosts'] / done.seconds:.2f} cores, load {done.load:.1f}",
                    flush=True,
                )
    finally:
        spark.stop()
    return report(rounds, args.json)


def report(rounds: dict[str, list[Round]], as_json: bool) -> int:
    """The table, the projection and the targets; 1 when a target is missed."""
    summary: dict[str, Any] = {}
    for name, done in rounds.items():
        summary[name] = {
            "records_per_s": statistics.median(r.rate for r in done),
            "host_cores": statistics.median(r.cpu["hosts"] / r.seconds for r in done),
            "hosts": done[0].hosts,
            "cpu_us_per_record": per_record(done),
            "load": [round(r.load, 1) for r in done],
            "routing": done[0].routing,
            "exact": all(r.exact for r in done),
        }
    slots, one = summary["slots"], summary["one"]
    speedup = slots["records_per_s"] / one["records_per_s"]
    us = slots["cpu_us_per_record"]
    projected = {cores: projection(us, cores) for cores in PROJECTED_CORES}
    ok = (
        slots["host_cores"] > MIN_HOST_CORES
        and speedup >= MIN_SPEEDUP
        and slots["exact"]
        and one["exact"]
    )
    if as_json:
        print(json.dumps({**summary, "speedup": speedup, "projection": projected, "ok": ok}))
        return 0 if ok else 1
    rows = [
        [
            name,
            f"{s['hosts']}",
            f"{s['records_per_s']:,.0f}",
            f"{s['host_cores']:.2f}",
            *(f"{s['cpu_us_per_record'][k]:.1f}" for k in ("hosts", "jvm", "workers")),
            "yes" if s["exact"] else "NO",
            ",".join(map(str, s["load"])),
        ]
        for name, s in summary.items()
    ]
    header = ["hosts", "per exec", "records/s", "host cores", "host us", "jvm us", "worker us"]
    print_table(MASTER, [*header, "exact", "load 1m"], rows)
    print(f"throughput hosts per slot / one host: {speedup:.2f}x (target >= {MIN_SPEEDUP}x)")
    print(f"host cores with hosts per slot: {slots['host_cores']:.2f} (target > {MIN_HOST_CORES})")
    table = [
        [str(c), f"{p['one_host']:,.0f}", f"{p['hosts_per_slot']:,.0f}"]
        for c, p in projected.items()
    ]
    print_table("projection (records/s)", ["cores", "one host", "hosts per slot"], table)
    print("targets met" if ok else "TARGET MISSED")
    return 0 if ok else 1
