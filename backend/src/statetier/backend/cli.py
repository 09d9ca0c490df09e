"""statetier: keyed state for PySpark. Run the demo, inspect checkpoints, benchmark, configure.

Every failure is reported in a line or two and exits with status 2; add --debug (anywhere on the
command line) for the full traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata

from statetier.backend import config
from statetier.backend.snapshot.location import CREDENTIALS_HINT

# Commands that the developer tools add (the statetier-tools distribution): the ``statetier``
# command lists them, and runs the one registered under its name in this entry-point group.
COMMANDS_GROUP = "statetier.commands"
TOOLS = "statetier-tools"
TOOL_COMMANDS = {
    "demo": "streaming word count on Spark with tiered state (--local: without Spark)",
    "bench": "run a benchmark (statetier bench --help)",
}
# Commands whose own parser reads the rest of the command line.
DELEGATED = (*TOOL_COMMANDS, "checkpoint", "pyspark-bytecode")
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def version() -> str:
    """The installed version of the statetier-backend distribution."""
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
    for name, text in TOOL_COMMANDS.items():
        sub.add_parser(name, add_help=False, help=text)
    sub.add_parser(
        "checkpoint", add_help=False, help="list, inspect, verify or garbage-collect checkpoints"
    )
    sub.add_parser(
        "pyspark-bytecode",
        add_help=False,
        help="add bytecode to Spark's pyspark.zip: Spark's Python processes start faster",
    )
    cfg = sub.add_parser("config", help="the configuration settings")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    cfg_sub.add_parser("docs", help="print the configuration reference (Markdown)")
    cfg_sub.add_parser("show", help="print the resolved configuration of this environment")
    return top


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
PLAIN_ERRORS = {
    "BytecodeError",
    "CheckpointLocationError",
    "ConfigError",
    "DemoDirError",
    "NoSnapshotError",
    "StorageError",
}
# What to do about errors whose own message does not say it.
HINTS = {
    "NoCredentialsError": CREDENTIALS_HINT,
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
    if command == "checkpoint":
        from statetier.backend.snapshot import admin

        return admin.main(rest)
    if command == "pyspark-bytecode":
        from statetier.backend import pyspark_bytecode

        return pyspark_bytecode.main(rest)
    return run_tool(command, rest, tool_commands())


def tool_commands() -> dict[str, metadata.EntryPoint]:
    """The commands installed distributions register in ``COMMANDS_GROUP``, by name."""
    return {entry.name: entry for entry in metadata.entry_points(group=COMMANDS_GROUP)}


def run_tool(command: str, argv: Sequence[str], commands: Mapping[str, metadata.EntryPoint]) -> int:
    """Run the tool command ``command`` from ``commands``; when no installed distribution
    registers it, say which one to install (one line, exit 2)."""
    entry = commands.get(command)
    if entry is None:
        print(
            f"statetier {command} comes with the {TOOLS} package: pip install {TOOLS}, or from "
            "a statetier checkout: pip install ./tools (make install sets up everything)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    run: Callable[[Sequence[str]], int] = entry.load()
    return run(list(argv))


def _config(command: str) -> int:
    if command == "docs":
        sys.stdout.write(config.render_markdown())
        return 0
    resolved = config.load_config()
    for name, value in resolved.items():
        print(f"{name} = {value!r}  ({resolved.source(name)})")
    return 0
