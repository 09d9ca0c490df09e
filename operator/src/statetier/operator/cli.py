"""``statetier-operator``: run the operator, or measure it.

``run`` parses the operator settings (flags made from :class:`OperatorSettings`) and starts kopf
with them in its memo: the chosen namespaces, peering and liveness endpoint, and what the
handlers read. ``bench`` measures the time from ``kubectl apply`` of a
CompactionService to its Deployments existing, against the API emulator. ``sandbox`` shows the
operator at work on a laptop (``make sandbox``). ``render-app`` configures SparkApplication
manifests without the mutating webhook.
"""

from __future__ import annotations

import argparse
import sys

from statetier.backend.options import add_options, from_options
from statetier.operator.settings import OperatorSettings

__all__ = ["build_parser", "main"]


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
    from importlib import metadata

    try:
        return metadata.version("statetier-operator")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The command line; ``run``'s flags are made from :class:`OperatorSettings`."""
    parser = argparse.ArgumentParser(prog="statetier-operator", description=__doc__)
    parser.add_argument("--version", action="version", version=f"statetier-operator {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator (kopf)")
    add_options(run, OperatorSettings)  # every flag, default and help is declared there
    run.set_defaults(func=_run)

    bench = sub.add_parser("bench", help="apply->Deployment latency against the emulator")
    bench.add_argument("--runs", type=int, default=20)
    bench.set_defaults(func=_bench)

    render = sub.add_parser(
        "render-app", help="configure SparkApplication manifests without the mutating webhook"
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

    sandbox = sub.add_parser("sandbox", help="emulator + operator + examples, narrated")
    sandbox.add_argument("--repo", default=".", help="repository root (crds/, examples/)")
    sandbox.set_defaults(func=_sandbox)

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


def _bench(args: argparse.Namespace) -> int:
    from statetier.operator.testing.bench import main as bench_main

    return bench_main(args.runs)


def _render_app(args: argparse.Namespace) -> int:
    from statetier.operator.render_app import main as render_main

    return render_main(
        args.files, args.compaction_endpoint, args.pod_template, args.compaction_token_secret
    )


def _sandbox(args: argparse.Namespace) -> int:
    from statetier.operator.testing.sandbox import main as sandbox_main

    return sandbox_main(args.repo)


if __name__ == "__main__":
    sys.exit(main())
