"""The ``statetier`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from statetier.backend import config


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="statetier", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    cfg = sub.add_parser("config", help="configuration schema")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    cfg_sub.add_parser("docs", help="print the configuration reference (Markdown)")
    cfg_sub.add_parser("show", help="print the resolved configuration of this environment")
    args = parser.parse_args(argv)
    if args.command == "config":
        if args.config_command == "docs":
            sys.stdout.write(config.render_markdown())
        else:
            try:
                resolved = config.load_config()
            except config.ConfigError as exc:
                print(f"statetier: {exc}", file=sys.stderr)
                return 2
            for name, value in resolved.items():
                print(f"{name} = {value!r}  ({resolved.source(name)})")
    return 0
