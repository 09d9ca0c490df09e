"""The kopf entry module: importing it registers every handler of the operator.

``statetier-operator run`` imports it (and :mod:`statetier.operator.webhooks` unless webhooks
are off) and starts kopf; ``kopf run -m statetier.operator.handlers -m
statetier.operator.webhooks`` works as well, with default settings. The startup handler turns
:mod:`statetier.operator.settings` into kopf settings: the webhook server, the managed webhook
configuration, the metrics endpoint, and finalizer and event conventions.
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
    sparkapp_handlers,
)
from statetier.operator import settings as operator_settings

__all__ = ["autoscaling_handlers", "compaction_service_handlers", "sparkapp_handlers"]


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """Log in as kopf would: in-cluster service account, else the kubeconfig. The operator's
    own client (:mod:`statetier.operator.kube`) reads the same credentials itself."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
    """Apply the operator settings to kopf and start the metrics endpoint."""
    ours = operator_settings.current()
    settings.persistence.finalizer = "statetier.io/finalizer"
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 300
    if ours.webhooks:
        settings.admission.server = kopf.WebhookServer(
            addr=ours.webhook_addr,
            port=ours.webhook_port,
            host=ours.webhook_host,
            certfile=ours.certfile,
            pkeyfile=ours.keyfile,
        )
        if ours.manage_webhook_configuration:
            settings.admission.managed = "statetier.io"
    if ours.metrics_port:
        metrics.serve(ours.metrics_addr, ours.metrics_port)
        logger.info("metrics on http://%s:%d/metrics", ours.metrics_addr, ours.metrics_port)


@kopf.on.cleanup()
async def close(**_: Any) -> None:
    """Close the API client's connection pool."""
    await kube.close()
