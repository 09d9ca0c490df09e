"""``statetier-compaction gateway|worker``: the two processes of the compaction service.

The operator starts them with exactly these flags (see statetier.operator.compaction). The
shared token comes from ``STATETIER_COMPACTION_TOKEN`` (the backend's ``compaction.token``
setting, so client, gateway and workers read one variable) or ``--token-file``; a gateway
without one refuses its API unless started with ``--insecure-no-token`` (a sandbox).
Object-storage credentials come from the usual AWS_* variables, as s3fs reads them. Every bound
of the gateway is a flag with a default (docs/compaction.md lists them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["build_parser", "main"]

TOKEN_ENV = "STATETIER_COMPACTION_TOKEN"


def _token(args: argparse.Namespace) -> str:
    if args.token_file:
        with open(args.token_file) as f:
            return f.read().strip()
    return os.environ.get(TOKEN_ENV, "")


def _size(text: str) -> int:
    from statetier.backend.config import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def _gateway_settings(args: argparse.Namespace) -> Any:
    from statetier.compaction.gateway import GatewaySettings
    from statetier.compaction.scheduler import SchedulerSettings
    from statetier.compaction.validation import Limits

    return GatewaySettings(
        allowed_prefixes=tuple(args.allowed_prefix),
        token=_token(args),
        insecure=args.insecure_no_token,
        scheduler=SchedulerSettings(
            worker_policy=args.worker_policy,
            job_policy=args.scheduling_policy,
            lease_ttl=args.lease_ttl,
            stall_timeout=args.stall_timeout,
            max_attempts=args.max_attempts,
            max_queued=args.max_queued,
            max_queued_per_tenant=args.max_queued_per_tenant,
            max_tenant_bytes=args.max_tenant_bytes,
        ),
        limits=Limits(
            max_inputs=args.max_inputs,
            max_job_bytes=args.max_job_bytes,
            max_worker_slots=args.max_worker_slots,
        ),
        heartbeat_interval=args.heartbeat_interval,
        max_poll_wait=args.max_poll_wait,
        max_body_bytes=args.max_body_bytes,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
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
        asyncio.run(serve(gateway, args.host, args.port))
    return 0


def _worker(args: argparse.Namespace) -> int:
    from statetier.compaction.paths import RefusedPathError
    from statetier.compaction.worker import RegistrationError, Worker, install_signal_handlers

    try:
        worker = Worker(
            args.gateway,
            allowed_prefixes=tuple(args.allowed_prefix),
            slots=args.concurrency,
            token=_token(args),
            max_read_rate=args.max_read_rate,
            worker_id=args.worker_id,
        )
    except (ValueError, RefusedPathError, OSError) as exc:
        print(f"statetier-compaction worker: {exc}", file=sys.stderr)
        return 2
    install_signal_handlers(worker)
    try:
        worker.run()
    except RegistrationError as exc:
        print(f"statetier-compaction worker: {exc}", file=sys.stderr)
        return 3
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line (the operator's Deployments are tested against it)."""
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
    gw.add_argument("--host", default="0.0.0.0")
    gw.add_argument("--port", type=int, default=8080, help="0 picks a free port (printed)")
    gw.add_argument("--scheduling-policy", choices=["fifo", "fair"], default="fair")
    gw.add_argument(
        "--worker-policy", choices=["round-robin", "least-loaded"], default="least-loaded"
    )
    # accepted and ignored: operators up to 0.1.0 passed it; the autoscaler reads the target
    # from the CompactionService, not from the gateway
    gw.add_argument("--target-queue-per-worker", type=int, help=argparse.SUPPRESS)
    gw.add_argument("--lease-ttl", type=float, default=10.0, help="seconds without heartbeat")
    gw.add_argument("--heartbeat-interval", type=float, default=2.0)
    gw.add_argument("--stall-timeout", type=float, default=300.0, help="seconds without progress")
    gw.add_argument("--max-attempts", type=int, default=3)
    gw.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="serve the API without a token (a sandbox only: anyone reaching the port can "
        "register as a worker and receive jobs)",
    )
    limits = gw.add_argument_group("limits")
    limits.add_argument("--max-body-bytes", type=_size, default=1 << 20)
    limits.add_argument("--header-timeout", type=float, default=10.0, help="seconds")
    limits.add_argument("--body-timeout", type=float, default=10.0, help="seconds")
    limits.add_argument("--max-poll-wait", type=float, default=20.0, help="seconds")
    limits.add_argument("--max-inputs", type=int, default=256, help="input files per job")
    limits.add_argument("--max-job-bytes", type=_size, default=4 << 30, help="input bytes/job")
    limits.add_argument("--max-worker-slots", type=int, default=64)
    limits.add_argument("--max-queued", type=int, default=1000, help="queued jobs in all")
    limits.add_argument("--max-queued-per-tenant", type=int, default=100)
    limits.add_argument(
        "--max-tenant-bytes", type=_size, default=64 << 30, help="queued+running input bytes"
    )
    gw.set_defaults(func=_gateway)

    wk = sub.add_parser("worker", parents=[common], help="run a compaction worker")
    wk.add_argument("--gateway", required=True, help="URL of the gateway")
    wk.add_argument("--concurrency", type=int, default=1, help="jobs run at a time")
    wk.add_argument("--max-read-rate", type=float, default=0.0, help="input bytes/s, 0: no cap")
    wk.add_argument("--worker-id", default=None)
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
