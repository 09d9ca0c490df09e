"""Operator settings: what the process serves and how, given on the command line.

They are command-line options rather than environment variables on purpose: the backend
rejects unknown ``STATETIER_*`` variables (a typo must never fall back to a default), so the
operator keeps out of that namespace. ``statetier-operator run`` fills one
:class:`OperatorSettings` before kopf starts, and the handlers read it through :func:`current`.
"""

from __future__ import annotations

import dataclasses

__all__ = ["OperatorSettings", "configure", "current"]


@dataclasses.dataclass(frozen=True)
class OperatorSettings:
    """Everything the handlers need to know about how this operator process runs."""

    namespaces: tuple[str, ...] = ("default",)
    """Namespaces to watch (globs allowed, as kopf takes them); empty means all namespaces."""

    metrics_addr: str = "0.0.0.0"
    metrics_port: int = 9090
    """Prometheus endpoint; 0 disables it."""

    webhook_addr: str = "0.0.0.0"
    webhook_port: int = 9443
    webhook_host: str | None = None
    """Host name the apiserver uses to reach the webhooks (the Service name in a cluster)."""

    certfile: str | None = None
    keyfile: str | None = None
    """Serving certificate and key of the webhook server; without them kopf makes a
    self-signed pair, which only works where kopf also manages the webhook configuration."""

    webhooks: bool = True
    manage_webhook_configuration: bool = True
    """Let kopf create and patch the Mutating/ValidatingWebhookConfiguration named statetier.io
    (URL and caBundle included). Off when a Helm chart owns those objects."""

    checkpoint_delete_timeout: float = 60.0
    """Longest a finalizer spends deleting a checkpoint before it gives up and lets go."""


_current = OperatorSettings()


def configure(settings: OperatorSettings) -> None:
    """Install the settings for this process (called once, before kopf starts)."""
    global _current  # noqa: PLW0603 - one settings object per operator process, by design
    _current = settings


def current() -> OperatorSettings:
    """The settings of this process."""
    return _current
