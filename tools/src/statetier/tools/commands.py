"""``statetier demo`` and ``statetier bench``: the commands this distribution adds to ``statetier``.

The ``statetier`` command finds them through the ``statetier.commands`` entry points and calls
them with the rest of the command line, after it has checked the configuration; its own error
handling (a line or two, ``--debug`` for the traceback) covers them.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence

from statetier.tools.lifetime import terminate_as_interrupt

__all__ = ["BENCHMARKS", "BENCHMARK_HELP", "bench", "demo"]

BENCHMARKS = {
    "state": "statetier.tools.bench.state_ops",
    "typed-values": "statetier.tools.bench.typed_values",
    "wordcount": "statetier.tools.bench.wordcount",
    "state-scale": "statetier.tools.bench.state_scale",
    "checkpoint": "statetier.tools.bench.checkpoint",
    "savepoint": "statetier.tools.bench.savepoint",
    "compaction": "statetier.tools.bench.compaction",  # needs statetier-compaction installed
    "spark-wordcount": "statetier.tools.bench.spark_wordcount",  # needs the spark extra
    "timers": "statetier.tools.bench.spark_timers",  # needs the spark extra
    "state-bootstrap": "statetier.tools.bench.state_bootstrap",  # needs the spark extra
    "state-read": "statetier.tools.bench.state_read",  # needs the spark extra
    "spark-slots": "statetier.tools.bench.spark_slots",  # needs the spark extra
    # needs the spark extra and statetier-compaction installed
    "compaction-offload": "statetier.tools.bench.compaction_offload",
}
# spark-wordcount --connect: the same word count on a Spark Connect session and a classic one
CONNECT_BENCHMARK = "statetier.tools.bench.spark_connect"
BENCHMARK_HELP = {
    "state": "state API operations against a plain dict",
    "typed-values": "typed state values (by field name) against msgpack of a tuple",
    "wordcount": "word count on the heap, spilled to disk, and on RocksDB",
    "state-scale": "keyed state from 0.5x to 10x a memory budget: spilled, heap, RocksDB",
    "checkpoint": "checkpoint upload and restore against raw object-store transfers",
    "savepoint": "a savepoint against a raw copy; restore from it against from the checkpoint",
    "compaction": "the compaction service against compacting in the job",
    "spark-wordcount": "streaming word count on Spark against Spark's own state stores "
    "(--connect: on Spark Connect too)",
    "state-read": "a state read as a DataFrame against Spark's statestore data source",
    "spark-slots": "a state host per task slot against one per executor, on 2 cores",
    "compaction-offload": "Spark compaction in the executor, in the driver, on the service",
    "state-bootstrap": "write_state of 1M keys from a DataFrame, then the pipeline, exact",
}


def bench_parser() -> argparse.ArgumentParser:
    names = "\n".join(f"  {name:<16} {text}" for name, text in BENCHMARK_HELP.items())
    parser = argparse.ArgumentParser(
        prog="statetier bench",
        description="Run one benchmark; it exits 1 when it misses its target.",
        epilog=f"benchmarks:\n{names}\n\nstatetier bench NAME --help shows a benchmark's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", choices=sorted(BENCHMARKS), metavar="NAME")
    return parser


def bench(argv: Sequence[str]) -> int:
    """``statetier bench NAME [options]``: the benchmark's own ``main`` reads the options."""
    if not argv or argv[0] not in BENCHMARKS:
        bench_parser().parse_args(argv)  # --help, or an error naming the known benchmarks
    terminate_as_interrupt()  # a timeout's SIGTERM stops the servers the benchmark started
    rest = list(argv[1:])
    if argv[0] == "spark-wordcount" and "--connect" in rest:  # on a Spark Connect session too
        rest.remove("--connect")
        return _load_main(CONNECT_BENCHMARK)(rest)
    return _load_main(BENCHMARKS[argv[0]])(rest)


def demo(argv: Sequence[str]) -> int:
    """``statetier demo``: the Spark streaming demo (needs the spark extra), or with ``--local``
    the word count through the local runner, which imports nothing of Spark's."""
    terminate_as_interrupt()  # SIGTERM stops the demo as Ctrl-C does
    if "--local" not in argv:
        from statetier.tools.demo import spark

        return spark.main(argv)
    from statetier.tools.demo import local

    rest = list(argv)
    rest.remove("--local")
    return local.main(rest)


def _load_main(module: str) -> Callable[[Sequence[str]], int]:
    entry: Callable[[Sequence[str]], int] = importlib.import_module(module).main
    return entry
