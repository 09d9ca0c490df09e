"""The admission webhooks statetier registers, and the CEL ``matchConditions`` that keep them
out of the way of what they do not judge.

One place for both ways the configurations reach a cluster: the operator applies them
(:mod:`statetier.operator.webhook_server`) and the Helm chart renders the same names, rules and
conditions (a test compares the two). Every webhook has ``failurePolicy: Fail``, so a request
the apiserver sends to a webhook while no operator runs is refused; the conditions decide which
requests are sent at all (all must be true; admissionregistration v1, GA in Kubernetes 1.30):

* an object being deleted is never sent: removing a finalizer by hand, or any other write to
  a terminating object, must not wait for the operator;
* an UPDATE that changes neither the spec nor the annotations (labels, finalizers, owner
  references) is not sent: nothing the webhooks read changed;
* a SparkApplication with no ``statetier.io/`` annotation is not sent: statetier has nothing
  to say about it, so a Spark job that never opted in never waits for statetier's operator.

A CREATE of an opted-in application is always sent, so while no operator runs it is refused
rather than admitted without its spill volume and settings.

``object`` is dynamically typed in admission CEL, so a field that may be absent is read behind
``has()``; ``request.operation`` tells CREATE from UPDATE, where ``oldObject`` is null.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from statetier.operator import annotations as ann
from statetier.operator import compaction_service, sparkapp

__all__ = [
    "CONFIGURATION_NAME",
    "WEBHOOKS",
    "Webhook",
    "configuration",
    "match_conditions",
]

CONFIGURATION_NAME = "statetier.io"
"""The name of both configuration objects, and the suffix of every webhook's name (kopf's
convention, kept so a cluster where kopf managed them keeps the same names)."""

NOT_BEING_DELETED = {
    "name": "not-being-deleted",
    "expression": "!has(object.metadata.deletionTimestamp)",
}


def _changes(name: str, *fields: str) -> dict[str, str]:
    """A condition true for every operation but an UPDATE that leaves all ``fields`` (paths
    under the object, possibly absent) as they were."""
    changed = [
        f"(has(object.{f}) ? object.{f} : {{}}) != (has(oldObject.{f}) ? oldObject.{f} : {{}})"
        for f in fields
    ]
    return {"name": name, "expression": " || ".join(["request.operation != 'UPDATE'", *changed])}


CHANGES_SPEC_OR_ANNOTATIONS = _changes(
    "changes-spec-or-annotations", "spec", "metadata.annotations"
)
CHANGES_SPEC = _changes("changes-spec", "spec")
HAS_STATETIER_ANNOTATIONS = {
    "name": "has-statetier-annotations",
    "expression": (
        "has(object.metadata.annotations)"
        f" && object.metadata.annotations.exists(k, k.startsWith('{ann.PREFIX}'))"
    ),
}


@dataclasses.dataclass(frozen=True)
class Webhook:
    """One webhook: the kopf handler id (also its URL path), what it admits, and when."""

    id: str
    kind: str  # "Mutating" or "Validating"
    group: str
    version: str
    plural: str
    conditions: tuple[dict[str, str], ...]
    operations: tuple[str, ...] = ("CREATE", "UPDATE")

    @property
    def name(self) -> str:
        return f"{self.id}.{CONFIGURATION_NAME}"


_SPARK = (sparkapp.GROUP, sparkapp.VERSION, sparkapp.PLURAL)
_SPARK_CONDITIONS = (NOT_BEING_DELETED, CHANGES_SPEC_OR_ANNOTATIONS, HAS_STATETIER_ANNOTATIONS)

WEBHOOKS: tuple[Webhook, ...] = (
    Webhook("mutate-sparkapplication", "Mutating", *_SPARK, _SPARK_CONDITIONS),
    Webhook("validate-sparkapplication", "Validating", *_SPARK, _SPARK_CONDITIONS),
    # It judges the spec only: metadata writes (kopf's own annotations, labels) skip it.
    Webhook(
        "validate-compactionservice",
        "Validating",
        compaction_service.GROUP,
        compaction_service.VERSION,
        compaction_service.PLURAL,
        (NOT_BEING_DELETED, CHANGES_SPEC),
    ),
)


def match_conditions(webhook_id: str) -> list[dict[str, str]]:
    """The matchConditions of the webhook with this handler id, as the API spells them."""
    found = next(w for w in WEBHOOKS if w.id == webhook_id)
    return [dict(condition) for condition in found.conditions]


def _client_config(base: dict[str, Any], webhook_id: str) -> dict[str, Any]:
    """kopf's client config with the handler id appended to the URL path, as kopf's webhook
    server routes requests (``/<id>``)."""
    config = dict(base)
    if config.get("url"):
        config["url"] = f"{str(config['url']).rstrip('/')}/{webhook_id}"
    return config


def _webhook(hook: Webhook, client_config: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": hook.name,
        "admissionReviewVersions": ["v1", "v1beta1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "timeoutSeconds": 30,
        "rules": [
            {
                "apiGroups": [hook.group],
                "apiVersions": [hook.version],
                "resources": [hook.plural],
                "operations": list(hook.operations),
                "scope": "*",
            }
        ],
        "clientConfig": _client_config(client_config, hook.id),
        "matchConditions": match_conditions(hook.id),
    }


def configuration(kind: str, client_config: dict[str, Any]) -> dict[str, Any]:
    """The ``<kind>WebhookConfiguration`` object (Mutating or Validating) for a webhook server
    reachable as ``client_config`` (kopf's: ``url`` and ``caBundle``)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": f"{kind}WebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME},
        "webhooks": [_webhook(hook, client_config) for hook in WEBHOOKS if hook.kind == kind],
    }
