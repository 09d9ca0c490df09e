"""``statetier-operator``: run the operator, or measure it.

``run`` parses the operator settings, installs them and starts kopf with the chosen namespaces,
peering and liveness endpoint. ``bench`` measures the time from ``kubectl apply`` of a
CompactionService to its Deployments existing, against the API emulator. ``sandbox`` shows the
operator at work on a laptop (``make sandbox``). ``render-app`` configures SparkApplication
manifests without the mutating webhook.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


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
    from importlib import metadata

    try:
        return metadata.version("statetier-operator")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
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

    args = parser.parse_args(argv)
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
