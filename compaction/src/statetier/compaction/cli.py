"""``statetier-compaction gateway|worker``: the two processes of the compaction service.

The operator starts them with exactly these flags (see statetier.operator.compaction_service). The
shared token comes from ``STATETIER_COMPACTION_TOKEN`` (the backend's ``compaction.token``
setting, so client, gateway and workers read one variable) or ``--token-file``; a gateway
without one refuses its API unless started with ``--insecure-no-token`` (a sandbox).
Object-storage credentials come from the usual AWS_* variables, as s3fs reads them. Every bound
of the gateway is a flag with a default (docs/compaction.md lists them), declared once with the
settings class it fills (``GatewaySettings``, ``SchedulerSettings``, ``Limits``,
``WorkerSettings``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Sequence

from statetier.backend.options import add_options, from_options
from statetier.compaction.gateway import GatewaySettings
from statetier.compaction.scheduler import SchedulerSettings
from statetier.compaction.validation import Limits
from statetier.compaction.worker import WorkerSettings

__all__ = ["build_parser", "main"]

TOKEN_ENV = "STATETIER_COMPACTION_TOKEN"


def _token(args: argparse.Namespace) -> str:
    if args.token_file:
        with open(args.token_file) as f:
            return f.read().strip()
    return os.environ.get(TOKEN_ENV, "")


def _gateway_settings(args: argparse.Namespace) -> GatewaySettings:
    return from_options(
        GatewaySettings,
        args,
        allowed_prefixes=tuple(args.allowed_prefix),
        token=_token(args),
        scheduler=from_options(SchedulerSettings, args),
        limits=from_options(Limits, args),
    )


def _gateway(args: argparse.Namespace) -> int:
    from statetier.compaction.gateway import Gateway, serve
    from statetier.compaction.paths import RefusedPathError

    try:
        settings = _gateway_settings(args)
        gateway = Gateway(settings)
    except (ValueError, RefusedPathError, OSError) as exc:
        print(f"statetier-compaction gateway: {exc}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(gateway, settings.host, settings.port))
    return 0


def _worker(args: argparse.Namespace) -> int:
    from statetier.compaction.paths import RefusedPathError
    from statetier.compaction.worker import (
        RegistrationError,
        Worker,
        leave_and_exit,
        stop_on_signals,
    )

    try:
        settings = from_options(
            WorkerSettings, args, allowed_prefixes=tuple(args.allowed_prefix), token=_token(args)
        )
        worker = Worker(settings)
    except (ValueError, RefusedPathError, OSError) as exc:
        print(f"statetier-compaction worker: {exc}", file=sys.stderr)
        return 2
    try:
        stop_on_signals()
        worker.run()
    except RegistrationError as exc:
        print(f"statetier-compaction worker: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:  # SIGTERM or SIGINT
        leave_and_exit(worker)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line (the operator's Deployments are tested against it). Every flag but the
    shared ones comes from a settings class: its default and help are declared there."""
    parser = argparse.ArgumentParser(prog="statetier-compaction", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--allowed-prefix",
        action="append",
        default=[],
        help="s3://bucket/prefix or file:///dir jobs may read and write (repeatable)",
    )
    common.add_argument("--token-file", default=None, help=f"shared token (else ${TOKEN_ENV})")
    common.add_argument("--log-level", default="INFO")

    gw = sub.add_parser("gateway", parents=[common], help="run the HTTP gateway and scheduler")
    add_options(gw, GatewaySettings)
    add_options(gw.add_argument_group("scheduling"), SchedulerSettings)
    add_options(gw.add_argument_group("limits of one job"), Limits)
    # accepted and ignored: operators up to 0.1.0 passed it; the autoscaler reads the target
    # from the CompactionService, not from the gateway
    gw.add_argument("--target-queue-per-worker", type=int, help=argparse.SUPPRESS)
    gw.set_defaults(func=_gateway)

    wk = sub.add_parser("worker", parents=[common], help="run a compaction worker")
    add_options(wk, WorkerSettings)
    wk.set_defaults(func=_worker)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    if not args.allowed_prefix:
        parser.error("at least one --allowed-prefix is required")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
