"""statetier demo: a streaming word count on Spark (local[2]) with tiered state.

Generated Zipf-distributed words arrive as Parquet files, one micro-batch each, read by a
Structured Streaming query that StatefulPipeline.write_stream runs. The state lives in the
executor's state host (warm across micro-batches), spills key groups to local disk under a small
memory budget, and is checkpointed every batch to SeaweedFS, started on 127.0.0.1 as the object
store. The first run processes the first half of the files; --restart adds the second half and
resumes both the Spark query and the state from their checkpoints. Both runs check the
checkpointed counts against a plain Counter. --local runs a demo without Spark instead
(statetier demo --local --help). The demo only ever deletes a directory it made itself.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from statetier.tools.demo.local import print_summary
from statetier.tools.demo.shell import statetier_program
from statetier.tools.demo.workdir import prepare
from statetier.tools.workloads import batches, zipf_words

PREFIX = "demo-wordcount"
T = TypeVar("T")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="statetier demo", description=__doc__)
    parser.add_argument("--words", type=int, default=1_000_000, help="records over both runs")
    parser.add_argument("--vocabulary", type=int, default=100_000, help="distinct words")
    parser.add_argument("--batches", type=int, default=10, help="micro-batches over both runs")
    parser.add_argument("--parallelism", type=int, default=4, help="key-group ranges (tasks)")
    parser.add_argument(
        "--budget",
        default="6m",
        help="memory.budget of the state host: the memory its state may take (the runtime "
        "comes on top); the demo's state grows to about 6 MB, so part of it spills",
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the generated words")
    parser.add_argument(
        "--dir",
        default="statetier-demo",
        help="where everything goes: a new or empty directory, or one this demo made",
    )
    parser.add_argument(
        "--restart", action="store_true", help="process the second half, resuming from --dir"
    )
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="keep the object store running after the run, until Ctrl-C, to try "
        "`statetier checkpoint` on the demo's checkpoint",
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help="only start the object store on the data of an earlier run in --dir, until Ctrl-C",
    )
    parser.add_argument("--local", action="store_true", help="run the demo without Spark")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.serve:
        return serve(args)
    return run(args)


def serve(args: argparse.Namespace) -> int:
    """The object store of an earlier run, up until Ctrl-C, with the commands that read it."""
    from statetier.tools.seaweed import SeaweedFS

    directory = prepare(Path(args.dir), "spark", restart=True)
    with CtrlC() as ctrl_c, SeaweedFS.start(directory / "seaweedfs") as weed:
        wait_for_ctrl_c(weed, ctrl_c)
    return 0


def wait_for_ctrl_c(weed: Any, ctrl_c: CtrlC) -> None:
    """Say how to read the checkpoint, then keep the object store up until Ctrl-C."""
    print(f"SeaweedFS is running at {weed.endpoint}; read the demo's checkpoint with")
    print(f"  {checkpoint_command(weed, 'list')}")
    print(f"  {checkpoint_command(weed, 'verify')}")
    print("Ctrl-C stops it.", flush=True)
    while weed.process.poll() is None and not ctrl_c.pressed:
        time.sleep(0.5)  # a signal cuts the sleep short only to run its handler
    print("stopped the object store", flush=True)


def checkpoint_command(weed: Any, action: str) -> str:
    """The exact ``statetier checkpoint`` command line that reads the demo's checkpoint."""
    key, secret = weed.options["key"], weed.options["secret"]
    return (
        f"AWS_ACCESS_KEY_ID={key} AWS_SECRET_ACCESS_KEY={secret} "
        f"{statetier_program()} checkpoint {action} {shlex.quote(weed.uri(PREFIX))} "
        f"-o endpoint_url={weed.endpoint}"
    )


def write_input(args: argparse.Namespace, directory: Path) -> list[str]:
    """This run's share of the input files; returns every word the checkpoint must count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = batches(zipf_words(args.words, args.vocabulary, seed=args.seed), args.batches)
    half = args.batches // 2
    todo = range(half, args.batches) if args.restart else range(half)
    source = directory / "input"
    source.mkdir(exist_ok=True)
    for i in todo:
        pq.write_table(pa.table({"word": parts[i]}), source / f"part-{i:04d}.parquet")
    return [w for i in range(todo.stop) for w in parts[i]]


def run(args: argparse.Namespace) -> int:
    from statetier.tools.seaweed import SeaweedFS

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    directory = prepare(Path(args.dir), "spark", restart=args.restart)
    done = write_input(args, directory)
    logging.getLogger("py4j").setLevel(logging.CRITICAL)  # its errors on Ctrl-C say nothing new
    with CtrlC() as ctrl_c:
        weed = SeaweedFS.start(directory / "seaweedfs")
        try:
            exact = stream(args, directory, weed, done, ctrl_c)
        except KeyboardInterrupt:
            print(
                "interrupted: nothing committed is lost; continue with\n"
                f"  {statetier_program()} demo --restart --dir {shlex.quote(str(directory))}",
                file=sys.__stderr__,
                flush=True,
            )
            return 130
        finally:
            weed.stop()
    if not args.keep_running:
        print(
            "The object store has stopped; to read the checkpoint, start it again with\n"
            f"  {statetier_program()} demo --serve --dir {shlex.quote(str(directory))}"
        )
    return 0 if exact else 1


def stream(
    args: argparse.Namespace, directory: Path, weed: Any, done: list[str], ctrl_c: CtrlC
) -> bool:
    """The streaming query over the input, then the summary; whether the counts are exact."""
    from statetier.backend.spark import StatefulPipeline
    from statetier.tools.bench.spark_functions import ArrowWordCount
    from statetier.tools.bench.spark_wordcount import read_counts, spark_session

    spark = pipeline = None
    jvm_temp, killed = directory / "spark-tmp", False  # see stop_quietly
    try:
        jvm_temp.mkdir(exist_ok=True)
        spark = ctrl_c.deferred(spark_session, args.parallelism, "local[2]", jvm_temp)
        uri = weed.uri(PREFIX)
        pipeline = StatefulPipeline(
            ArrowWordCount,
            key="word",
            output_schema="word string, count bigint",
            parallelism=args.parallelism,
            config={
                "checkpoint.uri": uri,
                "spill.enabled": True,
                "memory.budget": args.budget,
                "spill.check-interval": "50ms",
                "spill.dirs": str(directory / "spill"),
            },
            storage_options=weed.options,
            name=PREFIX,
        )
        stored = pipeline_epochs(uri, weed.options)
        started = time.perf_counter()
        words = spark.readStream.schema("word string").option("maxFilesPerTrigger", 1)
        query = (
            pipeline.write_stream(words.parquet(str(directory / "input")))
            .option("checkpointLocation", str(directory / "spark-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        ctrl_c.wait(query)
        elapsed = time.perf_counter() - started
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        counts = read_counts(pipeline)
        exact = counts == dict(collections.Counter(done))
        summary(args, pipeline, weed, uri, stored, elapsed, counts, exact)
        if args.keep_running:
            wait_for_ctrl_c(weed, ctrl_c)
        return exact
    except KeyboardInterrupt:
        if stop_quietly(spark):
            spark, killed = None, True
        raise
    finally:
        if pipeline is not None:
            pipeline.stop_hosts()
        if spark is not None:
            spark.stop()
        if killed:  # a JVM that exits removes its temp dirs; a killed one leaves them
            shutil.rmtree(jvm_temp, ignore_errors=True)


class CtrlC:
    """Ctrl-C (and SIGTERM, a timeout's or a CI limit's) as a flag, checked between steps.
    PySpark's own SIGINT handler raises in the middle of a Py4J call, which then prints pages
    of tracebacks from both sides of the bridge; Python's default SIGTERM ends the process
    without stopping the object store and the state hosts.

    The flag is a plain attribute, not a ``threading.Event``: a handler runs in the main thread
    between two of its steps, possibly while that thread holds the Event's lock in ``wait``, and
    ``Event.set`` would then wait for that lock forever."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.pressed = False
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        for signum in self.SIGNALS:
            signal.signal(signum, self._press)

    def _press(self, signum: int, frame: FrameType | None) -> None:
        self.pressed = True

    def __enter__(self) -> CtrlC:
        self.previous = {signum: signal.getsignal(signum) for signum in self.SIGNALS}
        self.install()
        return self

    def __exit__(self, *_: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def deferred(self, start: Callable[..., T], *args: Any) -> T:
        """``start(*args)`` with Ctrl-C held back until it returned: starting a SparkContext
        installs PySpark's handler, which is replaced by this one again afterwards."""
        signal.pthread_sigmask(signal.SIG_BLOCK, set(self.SIGNALS))
        try:
            return start(*args)
        finally:
            self.install()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, set(self.SIGNALS))
            self.check()

    def check(self) -> None:
        if self.pressed:
            raise KeyboardInterrupt

    def wait(self, query: Any) -> None:
        """Wait for ``query`` to end, in short steps; KeyboardInterrupt on Ctrl-C."""
        while not query.awaitTermination(0.5):
            self.check()
        self.check()


def stop_quietly(spark: Any) -> bool:
    """Stop Spark at once after Ctrl-C; whether it was running. Stopping the query or the
    SparkContext under a running micro-batch makes the JVM's threads print hundreds of lines of
    errors that mean nothing here. Nothing committed is lost: Spark's checkpoint and statetier's
    manifests are both written whole or not at all, and the next run resumes from them.

    A killed JVM cannot remove its temp dirs (``spark-*``, ``blockmgr-*``, ``artifacts-*`` and
    the native libraries it unpacked, a few each Ctrl-C): the demo gives it one of its own in
    its directory (``spark-tmp``), and removes that after the kill."""
    gateway = getattr(getattr(spark, "sparkContext", None), "_gateway", None)
    process = getattr(gateway, "proc", None)
    if process is None:
        return False
    with contextlib.suppress(Exception):
        spark.sparkContext.setLogLevel("OFF")
    # PySpark's servers and the pipeline's callbacks in this process report each request the
    # JVM leaves unanswered, on stderr or in the log
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - until the process ends
    logging.disable(logging.CRITICAL)
    process.kill()
    process.wait()
    return True


def pipeline_epochs(uri: str, options: dict[str, Any]) -> list[int]:
    from statetier.backend.snapshot import SnapshotStore

    return SnapshotStore(uri, **options).epochs()


def resumed_from(*, restart: bool, stored: list[int]) -> str:
    """The summary's ``resumed from epoch`` row. A restart after a Ctrl-C that came before the
    first commit has nothing to resume from: it says so, and not that it resumed."""
    if stored:
        return str(stored[-1])
    if restart:
        return "none (fresh start: no epoch was committed before the interruption)"
    return "none (fresh start)"


def rates(
    reports: list[Any], records: int, elapsed: float, warm_hit_rate: float
) -> list[tuple[str, str]]:
    """The records/s and warm-hit rows; with no new input there is no rate to give, and a
    ``records/s 0`` or ``warm-hit rate 0%`` would read as a fault."""
    if not records:
        nothing = "nothing new was processed: every input file was already in the checkpoint"
        return [("records/s", nothing)]
    return [
        ("records/s", f"{records / elapsed:,.0f} (query wall time, incl. a checkpoint per batch)"),
        (
            "warm-hit rate",
            f"{warm_hit_rate:.0%} of ranges served from the state host "
            f"({sum(r.restored for r in reports)} restored from tier 2)",
        ),
    ]


def summary(
    args: argparse.Namespace,
    pipeline: Any,
    weed: Any,
    uri: str,
    stored: list[int],
    elapsed: float,
    counts: dict[str, int],
    exact: bool,
) -> None:
    reports = pipeline.reports
    records = sum(r.records for r in reports)
    store = pipeline.store
    manifest = store.manifest()
    latest_bytes = sum(f.size for f in manifest.files())
    all_bytes = sum(store.list_files().values())
    spilled = max((r.spilled_key_groups for r in reports), default=0)
    last_spilled = reports[-1].spilled_key_groups if reports else 0
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:5]
    rows = [
        ("run", "restart" if args.restart else "first run"),
        ("resumed from epoch", resumed_from(restart=args.restart, stored=stored)),
        (
            "batches",
            f"{len(reports)} (epochs {reports[0].epoch}-{reports[-1].epoch})" if reports else "0",
        ),
        ("records", f"{records:,} on local[2], parallelism {args.parallelism}"),
        *rates(reports, records, elapsed, pipeline.warm_hit_rate()),
        (
            "spill ratio",
            f"{last_spilled}/{manifest.max_parallelism} key groups on disk at the "
            f"end (max {spilled}; memory.budget {args.budget})",
        ),
        ("checkpoint", f"{uri} on SeaweedFS {weed.endpoint}"),
        (
            "checkpoint sizes",
            f"latest epoch {latest_bytes / 1e6:.2f} MB, all retained files "
            f"{all_bytes / 1e6:.2f} MB, uploaded per batch "
            f"{sum(r.upload_bytes for r in reports) / max(len(reports), 1) / 1e6:.2f} MB",
        ),
        ("distinct words", f"{len(counts):,}"),
        ("counts exact", str(exact)),
        ("top words", ", ".join(f"{w}={n}" for w, n in top)),
    ]
    print_summary("statetier demo: streaming word count on Spark with tiered state", rows)
    if not exact:
        print("  ERROR: checkpointed counts differ from the input")


if __name__ == "__main__":
    sys.exit(main())
