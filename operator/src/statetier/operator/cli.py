"""statetier-operator: run the statetier operator, or configure SparkApplication manifests.

run starts the operator: it reconciles CompactionServices and, with its webhooks, configures
the SparkApplications that opt in with statetier.io/* annotations. render-app writes that
configuration into application manifests instead, for clusters without the mutating webhook
or for a GitOps pipeline. bench and sandbox come with the statetier-kubetest package: bench
measures the operator against a Kubernetes API emulator, sandbox shows it at work there.
"""

# How it is built: ``run``'s flags are made from :class:`OperatorSettings` and reach the
# handlers in kopf's memo; ``bench`` and ``sandbox`` are entry points that statetier-kubetest
# registers in ``COMMANDS_GROUP``, since the Kubernetes test environment is not part of the
# operator. The docstring above is the command's help, so it names nothing of that.

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata

from statetier.backend.options import add_options, from_options
from statetier.operator.settings import OperatorSettings

__all__ = ["build_parser", "main"]

COMMANDS_GROUP = "statetier_operator.commands"
KUBETEST = "statetier-kubetest"
KUBETEST_COMMANDS = {
    "bench": "apply->Deployment latency against the emulator",
    "sandbox": "emulator + operator + examples, narrated",
}


def _run(args: argparse.Namespace) -> int:
    import kopf
    from statetier.operator import handlers

    try:
        ours = from_options(OperatorSettings, args)
    except ValueError as exc:
        print(f"statetier-operator run: {exc}", file=sys.stderr)
        return 2
    kopf.configure(verbose=ours.verbose, log_format=kopf.LogFormat[ours.log_format.upper()])
    assert handlers  # imported for its registrations
    if ours.webhooks:
        from statetier.operator import webhooks

        assert webhooks  # imported for its registrations
    kopf.run(
        clusterwide=not ours.namespaces,
        namespaces=list(ours.namespaces),
        standalone=ours.standalone,
        peering_name=ours.peering,
        priority=ours.priority,
        liveness_endpoint=ours.liveness,
        memo=kopf.Memo(settings=ours),  # what every handler reads (settings.of)
    )
    return 0


def _version() -> str:
    try:
        return metadata.version("statetier-operator")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def installed_commands() -> dict[str, metadata.EntryPoint]:
    """The commands installed distributions register in ``COMMANDS_GROUP``, by name."""
    return {entry.name: entry for entry in metadata.entry_points(group=COMMANDS_GROUP)}


def run_kubetest_command(
    name: str, argv: Sequence[str], commands: Mapping[str, metadata.EntryPoint]
) -> int:
    """``statetier-operator NAME ...`` from the entry point ``commands`` hold under ``name``;
    without one, a line that says what to install and exit status 2."""
    if name not in commands:
        print(
            f"statetier-operator {name} comes with the {KUBETEST} package: pip install "
            f"{KUBETEST}, or from a statetier checkout: pip install ./kubetest",
            file=sys.stderr,
        )
        return 2
    command: Callable[[Sequence[str]], int] = commands[name].load()
    return command(list(argv))


def build_parser() -> argparse.ArgumentParser:
    """The command line; ``run``'s flags are made from :class:`OperatorSettings`."""
    parser = argparse.ArgumentParser(prog="statetier-operator", description=__doc__)
    parser.add_argument("--version", action="version", version=f"statetier-operator {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator (kopf)")
    add_options(run, OperatorSettings)  # every flag, default and help is declared there
    run.set_defaults(func=_run)

    render = sub.add_parser(
        "render-app",
        help="configure SparkApplication manifests without the mutating webhook",
        description=render_app_description(),
    )
    render.add_argument("files", nargs="*", help="YAML files (default: stdin); - for stdin")
    render.add_argument(
        "--compaction-endpoint", help="the CompactionService's status.endpoint, if it uses one"
    )
    render.add_argument(
        "--compaction-token-secret",
        metavar="NAME[:KEY]",
        help="Secret (and key, default token) of the CompactionService's API token; default "
        "the one the operator generates, <service>-compaction-token",
    )
    render.add_argument(
        "--pod-template",
        action="store_true",
        help="put the spill volume, mount and pod label into the Spark Operator's pod templates",
    )
    render.set_defaults(func=_render_app)

    for name, text in KUBETEST_COMMANDS.items():
        sub.add_parser(name, add_help=False, help=f"{text} ({KUBETEST})")

    return parser


def render_app_description() -> str:
    """``render-app --help``: its module's docstring, written for users (no reST markup)."""
    from statetier.operator import render_app

    return render_app.__doc__ or ""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in KUBETEST_COMMANDS:
        return run_kubetest_command(argv[0], argv[1:], installed_commands())
    args = build_parser().parse_args(argv)
    return int(args.func(args))


def _render_app(args: argparse.Namespace) -> int:
    from statetier.operator.render_app import main as render_main

    return render_main(
        args.files, args.compaction_endpoint, args.pod_template, args.compaction_token_secret
    )


if __name__ == "__main__":
    sys.exit(main())
