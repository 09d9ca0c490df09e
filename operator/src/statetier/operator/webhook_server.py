"""kopf's webhook server, which also applies statetier's webhook configurations as it starts.

Why not kopf's managed mode (``settings.admission.managed``): kopf builds the configurations
itself and merge-patches their whole ``webhooks`` list, with no ``matchConditions``, when the
server starts and again on a normal stop. The conditions
(:mod:`statetier.operator.webhook_configuration`) are what let a deletion, a finalizer removal
or a label patch through while no operator runs, so they must be on the configurations at all
times. The operator therefore leaves kopf's managed mode off and applies the two ``statetier.io``
configurations itself (server-side apply, :meth:`Kube.apply`) each time the
server yields its client config (its URL and CA bundle: at start, and after the serving
certificate changes), before kopf sees that config. They are never removed on stop, so the
apiserver fails closed while no operator runs, for what the conditions do send. With
``--no-manage-webhooks`` (the Helm chart renders the same configurations) nothing is applied.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import kopf
from statetier.operator import kube, webhook_configuration

__all__ = ["ConfiguringWebhookServer"]


class ConfiguringWebhookServer(kopf.WebhookServer):
    """A :class:`kopf.WebhookServer` that applies the webhook configurations through ``client``
    (None: it applies nothing) for every client config it yields."""

    def __init__(self, *, client: kube.Kube | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._client = client

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        async for client_config in super().__call__(fn):
            if self._client is not None:
                for kind in ("Mutating", "Validating"):
                    obj = webhook_configuration.configuration(kind, dict(client_config))
                    await self._client.apply(obj)
            yield client_config
