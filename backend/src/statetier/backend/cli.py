"""statetier: keyed state for PySpark. Run the demo, inspect checkpoints, benchmark, configure.

Every failure is reported in a line or two and exits with status 2; add --debug (anywhere on the
command line) for the full traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from statetier.backend import config

BENCHMARKS = {
    "state": "statetier.backend.bench.state_ops",
    "wordcount": "statetier.backend.bench.wordcount",
    "state-scale": "statetier.backend.bench.state_scale",
    "checkpoint": "statetier.backend.bench.checkpoint",
    "compaction": "statetier.compaction.bench",  # needs statetier-compaction installed
    "spark-wordcount": "statetier.backend.bench.spark_wordcount",  # needs the spark extra
    "timers": "statetier.backend.bench.spark_timers",  # needs the spark extra
    # needs the spark extra and statetier-compaction installed
    "compaction-offload": "statetier.backend.bench.compaction_offload",
}
BENCHMARK_HELP = {
    "state": "state API operations against a plain dict",
    "wordcount": "word count on the heap, spilled to disk, and on RocksDB",
    "state-scale": "keyed state from 0.5x to 10x a memory budget: spilled, heap, RocksDB",
    "checkpoint": "checkpoint upload and restore against raw object-store transfers",
    "compaction": "the compaction service against compacting in the job",
    "spark-wordcount": "streaming word count on Spark against Spark's own state stores",
    "compaction-offload": "Spark compaction in the executor, in the driver, on the service",
}
# Commands whose own parser reads the rest of the command line.
DELEGATED = ("demo", "bench", "checkpoint")
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def version() -> str:
    """The installed version of the statetier-backend distribution."""
    from importlib import metadata

    try:
        return metadata.version("statetier-backend")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def parser() -> argparse.ArgumentParser:
    """The top-level parser: options, the command list and ``config``'s own subcommands."""
    top = argparse.ArgumentParser(prog="statetier", description=__doc__)
    top.add_argument("--version", action="version", version=f"statetier {version()}")
    top.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser(
        "demo",
        add_help=False,
        help="streaming word count on Spark with tiered state (--local: without Spark)",
    )
    sub.add_parser("bench", add_help=False, help="run a benchmark (statetier bench --help)")
    sub.add_parser(
        "checkpoint", add_help=False, help="list, inspect, verify or garbage-collect checkpoints"
    )
    cfg = sub.add_parser("config", help="the configuration settings")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    cfg_sub.add_parser("docs", help="print the configuration reference (Markdown)")
    cfg_sub.add_parser("show", help="print the resolved configuration of this environment")
    return top


def bench_parser() -> argparse.ArgumentParser:
    names = "\n".join(f"  {name:<16} {text}" for name, text in BENCHMARK_HELP.items())
    bench = argparse.ArgumentParser(
        prog="statetier bench",
        description="Run one benchmark; it exits 1 when it misses its target.",
        epilog=f"benchmarks:\n{names}\n\nstatetier bench NAME --help shows a benchmark's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument("name", choices=sorted(BENCHMARKS), metavar="NAME")
    return bench


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    # retries and other warnings only with --debug; the failure itself is reported below
    logging.getLogger("statetier").setLevel(logging.DEBUG if debug else logging.ERROR)
    command = next((a for a in argv if not a.startswith("-")), None)
    try:
        return _dispatch(argv, command)
    except KeyboardInterrupt:
        print(f"{_name(command)}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if debug:
            raise
        print(failure_message(command, exc), file=sys.stderr)
        return EXIT_USAGE


# Errors whose message already says what is wrong: shown without their class name.
PLAIN_ERRORS = {"ConfigError", "DemoDirError", "NoSnapshotError", "StorageError"}
# What to do about errors whose own message does not say it.
HINTS = {
    "NoCredentialsError": "object-store credentials: set AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY in the environment",
}


def failure_message(command: str | None, exc: BaseException) -> str:
    """Two lines: what failed and why (the first line of the error), then how to see more."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if len(text) > 300:
        text = text[:297] + "..."
    kind = type(exc).__name__
    problem = text if kind in PLAIN_ERRORS else f"{kind}: {text}"
    if kind in HINTS:
        problem = f"{problem}; {HINTS[kind]}"
    return f"{_name(command)}: {problem}\n(add --debug for the traceback)"


def _name(command: str | None) -> str:
    return f"statetier {command}" if command else "statetier"


def _dispatch(argv: list[str], command: str | None) -> int:
    if command not in DELEGATED:
        args = parser().parse_args(argv)
        return _config(args.config_command)
    head = argv[: argv.index(command)]
    rest = argv[argv.index(command) + 1 :]
    parser().parse_args([*head, command])  # --help / --version before the command
    config.load_config()  # a bad STATETIER_* variable is refused before anything runs
    if command == "demo":
        return _demo(rest)
    if command == "checkpoint":
        from statetier.backend.snapshot import admin

        return admin.main(rest)
    if not rest or rest[0] not in BENCHMARKS:
        bench_parser().parse_args(rest)  # --help, or an error naming the known benchmarks
    return _load_main(BENCHMARKS[rest[0]])(rest[1:])


def _demo(argv: list[str]) -> int:
    """``statetier demo``: the Spark streaming demo (needs the spark extra), or with ``--local``
    the word count through the local runner. Chosen here, so that neither demo imports the
    other."""
    if "--local" not in argv:
        from statetier.backend.spark import demo as spark_demo

        return spark_demo.main(argv)
    from statetier.backend import demo

    local = list(argv)
    local.remove("--local")
    return demo.main(local)


def _load_main(module: str) -> Callable[[Sequence[str]], int]:
    import importlib

    entry: Callable[[Sequence[str]], int] = importlib.import_module(module).main
    return entry


def _config(command: str) -> int:
    if command == "docs":
        sys.stdout.write(config.render_markdown())
        return 0
    resolved = config.load_config()
    for name, value in resolved.items():
        print(f"{name} = {value!r}  ({resolved.source(name)})")
    return 0
