"""The kopf entry module: importing it registers every handler of the operator.

``statetier-operator run`` imports it (and :mod:`statetier.operator.webhooks` unless webhooks
are off) and starts kopf; ``kopf run -m statetier.operator.handlers -m
statetier.operator.webhooks`` works as well, with default settings. The startup handler turns
the :class:`~statetier.operator.settings.OperatorSettings` in kopf's memo into kopf settings
(the webhook server, which applies the webhook configurations unless a chart owns them, the
finalizer and event conventions),
starts the metrics endpoint, and puts what the handlers share into the memo: the API client
and the per-service status locks.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from statetier.operator import (
    autoscaling_handlers,
    compaction_service_handlers,
    kube,
    metrics,
    refusals,
    snapshot_handlers,
    sparkapp_handlers,
    upgrade_handlers,
    webhook_server,
)
from statetier.operator import settings as operator_settings

__all__ = [
    "autoscaling_handlers",
    "compaction_service_handlers",
    "snapshot_handlers",
    "sparkapp_handlers",
    "upgrade_handlers",
]


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """Log in as kopf would: in-cluster service account, else the kubeconfig. The operator's
    own client (:mod:`statetier.operator.kube`) reads the same credentials itself."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
async def configure(
    settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Apply the operator settings to kopf, put the operator's API client and shared state in
    kopf's memo (every resource's memo is a copy of it, made after this handler ran), and
    start the metrics endpoint."""
    ours = operator_settings.of(memo)
    settings.persistence.finalizer = "statetier.io/finalizer"
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 300
    memo.kube = await kube.connect()
    refusals.install()
    if ours.webhooks:
        # kopf's managed mode stays off: it would strip the matchConditions (webhook_server).
        settings.admission.server = webhook_server.ConfiguringWebhookServer(
            client=memo.kube if ours.manage_webhook_configuration else None,
            addr=ours.webhook_addr,
            port=ours.webhook_port,
            host=ours.webhook_host,
            certfile=ours.certfile,
            pkeyfile=ours.keyfile,
        )
    memo.status_locks = compaction_service_handlers.StatusLocks()
    if ours.metrics_port:
        metrics.serve(ours.metrics_addr, ours.metrics_port)
        logger.info("metrics on http://%s:%d/metrics", ours.metrics_addr, ours.metrics_port)


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    """Close the API client's connection pool."""
    if "kube" in memo:
        await kube.of(memo).close()
