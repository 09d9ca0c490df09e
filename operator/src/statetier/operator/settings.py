"""Operator settings: what the process watches and serves, and how, given on the command line.

They are command-line options rather than environment variables on purpose: the backend
rejects unknown ``STATETIER_*`` variables (a typo must never fall back to a default), so the
operator keeps out of that namespace. Each is declared once here, with its type, default, help
and validation; ``statetier-operator run`` makes its flags from these fields
(:mod:`statetier.backend.options`, the compaction service's style too), builds one
:class:`OperatorSettings` and hands it to kopf in the operator's memo, where every handler
finds it (:func:`of`). No module-level state: two operators in one process (tests, embedding)
each have their own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from statetier.backend.options import option
from statetier.operator.sparkapp import DEFAULT_EXECUTOR_METRICS_PORT

__all__ = ["LOG_FORMATS", "OperatorSettings", "of"]

LOG_FORMATS = ("json", "plain", "full")
_ANY_ADDRESS = "0.0.0.0"  # a pod's listening address: its network policy is what narrows it


@dataclasses.dataclass(frozen=True)
class OperatorSettings:
    """Everything the operator process runs with: kopf's run options and what the handlers
    need to know."""

    namespaces: tuple[str, ...] = option(
        (),
        "namespace to watch (repeatable, globs allowed); none: all namespaces",
        flag=("--namespace", "-n"),
    )
    standalone: bool = option(False, "no peering: run even if another replica is active")
    peering: str | None = option(
        None, "KopfPeering name; one replica (highest priority) is active at a time"
    )
    priority: int = option(0, "peering priority of this replica")
    liveness: str | None = option(None, "liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    metrics_addr: str = option(_ANY_ADDRESS, "address of the Prometheus endpoint")
    metrics_port: int = option(9090, "port of the Prometheus endpoint; 0 disables metrics")
    webhook_addr: str = option(_ANY_ADDRESS, "address of the admission webhook server")
    webhook_port: int = option(9443, "port of the admission webhook server")
    webhook_host: str | None = option(
        None, "host name in the webhook URLs (e.g. the Service DNS name)"
    )
    certfile: str | None = option(
        None,
        "webhook serving certificate (PEM); without it and --keyfile kopf makes a self-signed "
        "pair, which only works where kopf also manages the webhook configuration",
    )
    keyfile: str | None = option(None, "webhook serving key (PEM)")
    webhooks: bool = option(True, "serve no admission webhooks", flag="--no-webhooks")
    manage_webhook_configuration: bool = option(
        True,
        "do not create/patch the WebhookConfiguration objects (a Helm chart owns them)",
        flag="--no-manage-webhooks",
    )
    executor_metrics_port: int = option(
        DEFAULT_EXECUTOR_METRICS_PORT,
        "backend metrics port written into opted-in applications (spark.statetier.metrics.port); "
        "the port the executor PodMonitor scrapes",
    )
    checkpoint_delete_timeout: float = option(
        60.0, "seconds a finalizer may spend deleting checkpoints before it lets go"
    )
    snapshot_image: str = option(
        "statetier/operator:0.1.0",
        "image of the Jobs that take and delete StateSnapshots (it needs the statetier CLI with "
        "the s3 extra: the operator image has it)",
    )
    log_format: str = option(
        "json", "json: structured logs, one object per line", choices=LOG_FORMATS
    )
    verbose: bool = option(False, "log at debug level")

    def __post_init__(self) -> None:
        for name in ("metrics_port", "webhook_port", "executor_metrics_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ValueError(f"--{name.replace('_', '-')} {port} is not between 0 and 65535")
        if not 0 < self.checkpoint_delete_timeout <= 86400:
            raise ValueError("--checkpoint-delete-timeout must be in (0, 86400] seconds")
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"--log-format must be one of {', '.join(LOG_FORMATS)}")


def of(memo: Any) -> OperatorSettings:
    """The settings in kopf's memo (``memo.settings``); the defaults when kopf was started
    without them (``kopf run -m statetier.operator.handlers``)."""
    found = memo.get("settings")
    if found is None:
        return OperatorSettings()
    if not isinstance(found, OperatorSettings):
        raise TypeError(f"memo.settings is a {type(found).__name__}, not OperatorSettings")
    return found
