"""``statetier-operator``: run the operator, or measure it.

``run`` parses the operator settings, installs them and starts kopf with the chosen namespaces,
peering and liveness endpoint. ``render-app`` configures SparkApplication manifests without the
mutating webhook. ``bench`` (the time from ``kubectl apply`` of a CompactionService to its
Deployments existing, against the API emulator) and ``sandbox`` (the operator at work on a
laptop, ``make sandbox``) run the Kubernetes test environment, which is not part of the
operator: the statetier-kubetest distribution registers them in the entry-point group
``COMMANDS_GROUP``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata

__all__ = ["main"]

COMMANDS_GROUP = "statetier_operator.commands"
KUBETEST = "statetier-kubetest"
KUBETEST_COMMANDS = {
    "bench": "apply->Deployment latency against the emulator",
    "sandbox": "emulator + operator + examples, narrated",
}


def _run(args: argparse.Namespace) -> int:
    import kopf
    from statetier.operator import handlers, settings

    settings.configure(
        settings.OperatorSettings(
            namespaces=tuple(args.namespace),
            metrics_addr=args.metrics_addr,
            metrics_port=args.metrics_port,
            webhook_addr=args.webhook_addr,
            webhook_port=args.webhook_port,
            webhook_host=args.webhook_host,
            certfile=args.certfile,
            keyfile=args.keyfile,
            webhooks=not args.no_webhooks,
            manage_webhook_configuration=not args.no_manage_webhooks,
            checkpoint_delete_timeout=args.checkpoint_delete_timeout,
        )
    )
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()])
    assert handlers  # imported for its registrations
    if not args.no_webhooks:
        from statetier.operator import webhooks

        assert webhooks  # imported for its registrations
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=args.standalone,
        peering_name=args.peering,
        priority=args.priority,
        liveness_endpoint=args.liveness,
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
            f"statetier-operator {name} comes with the {KUBETEST} package: pip install {KUBETEST}",
            file=sys.stderr,
        )
        return 2
    command: Callable[[Sequence[str]], int] = commands[name].load()
    return command(list(argv))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in KUBETEST_COMMANDS:
        return run_kubetest_command(argv[0], argv[1:], installed_commands())
    parser = argparse.ArgumentParser(prog="statetier-operator", description=__doc__)
    parser.add_argument("--version", action="version", version=f"statetier-operator {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator (kopf)")
    run.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="namespace to watch (repeatable, globs allowed); none: all namespaces",
    )
    run.add_argument(
        "--standalone",
        action="store_true",
        help="no peering: run even if another replica is active",
    )
    run.add_argument(
        "--peering",
        default=None,
        help="KopfPeering name; one replica (highest priority) is active at a time",
    )
    run.add_argument("--priority", type=int, default=0, help="peering priority of this replica")
    run.add_argument(
        "--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    run.add_argument("--metrics-addr", default="0.0.0.0")
    run.add_argument("--metrics-port", type=int, default=9090, help="0 disables metrics")
    run.add_argument("--webhook-addr", default="0.0.0.0")
    run.add_argument("--webhook-port", type=int, default=9443)
    run.add_argument(
        "--webhook-host",
        default=None,
        help="host name in the webhook URLs (e.g. the Service DNS name)",
    )
    run.add_argument("--certfile", default=None, help="webhook serving certificate (PEM)")
    run.add_argument("--keyfile", default=None, help="webhook serving key (PEM)")
    run.add_argument("--no-webhooks", action="store_true", help="serve no admission webhooks")
    run.add_argument(
        "--no-manage-webhooks",
        action="store_true",
        help="do not create/patch the WebhookConfiguration objects",
    )
    run.add_argument(
        "--checkpoint-delete-timeout",
        type=float,
        default=60.0,
        help="seconds a finalizer may spend deleting checkpoints",
    )
    run.add_argument(
        "--log-format",
        default="json",
        choices=["json", "plain", "full"],
        help="json: structured logs, one object per line",
    )
    run.add_argument("--verbose", action="store_true")
    run.set_defaults(func=_run)

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

    for name, text in KUBETEST_COMMANDS.items():
        sub.add_parser(name, add_help=False, help=f"{text} ({KUBETEST})")

    args = parser.parse_args(argv)
    return int(args.func(args))


def _render_app(args: argparse.Namespace) -> int:
    from statetier.operator.render_app import main as render_main

    return render_main(
        args.files, args.compaction_endpoint, args.pod_template, args.compaction_token_secret
    )


if __name__ == "__main__":
    sys.exit(main())
