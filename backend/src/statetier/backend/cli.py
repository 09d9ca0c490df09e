"""The ``statetier`` command line: demo, benchmarks, configuration."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from statetier.backend import config

BENCHMARKS = {
    "state": "statetier.backend.bench.state_ops",
    "wordcount": "statetier.backend.bench.wordcount",
    "checkpoint": "statetier.backend.bench.checkpoint",
    "compaction": "statetier.compaction.bench",  # needs statetier-compaction installed
    "spark-wordcount": "statetier.backend.bench.spark_wordcount",  # needs the spark extra
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="statetier", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the keyed word-count demo", add_help=False)
    bench = sub.add_parser("bench", help="run a benchmark", add_help=False)
    bench.add_argument("name", choices=sorted(BENCHMARKS))
    sub.add_parser(
        "checkpoint", help="list, inspect, verify or gc checkpoints (URI)", add_help=False
    )
    cfg = sub.add_parser("config", help="configuration schema")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    cfg_sub.add_parser("docs", help="print the configuration reference (Markdown)")
    cfg_sub.add_parser("show", help="print the resolved configuration of this environment")
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from statetier.backend import demo

        return demo.main(rest)
    if args.command == "checkpoint":
        from statetier.backend.snapshot import admin

        return admin.main(rest)
    if args.command == "bench":
        return _load_main(BENCHMARKS[args.name])(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return _config(args.config_command)


def _load_main(module: str) -> Callable[[Sequence[str]], int]:
    import importlib

    entry: Callable[[Sequence[str]], int] = importlib.import_module(module).main
    return entry


def _config(command: str) -> int:
    if command == "docs":
        sys.stdout.write(config.render_markdown())
        return 0
    try:
        resolved = config.load_config()
    except config.ConfigError as exc:
        print(f"statetier: {exc}", file=sys.stderr)
        return 2
    for name, value in resolved.items():
        print(f"{name} = {value!r}  ({resolved.source(name)})")
    return 0
