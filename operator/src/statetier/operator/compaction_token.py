"""The API token of a CompactionService: which Secret holds it, and the one the operator makes.

The compaction gateway refuses its whole API without a token (unless started with
``--insecure-no-token``, for a sandbox), so every service needs one. A user may name a Secret
in ``spec.tokenSecretRef``; otherwise the operator creates ``<name>-compaction-token`` (key
``token``) once, owned by the service so that it goes with it. It is created if absent and never
rewritten: a new token on every reconcile would lock out the running gateway, workers and Spark
executors, which read it at start. The gateway, the workers and the opted-in Spark pods all get
it as ``STATETIER_COMPACTION_TOKEN`` through a ``secretKeyRef``, never as a literal value.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

__all__ = [
    "ENV",
    "SECRET_SUFFIX",
    "TOKEN_KEY",
    "copy_warning",
    "env",
    "generated_secret",
    "secret_ref",
]

Obj = dict[str, Any]
ENV = "STATETIER_COMPACTION_TOKEN"
SECRET_SUFFIX = "-compaction-token"
TOKEN_KEY = "token"


def secret_ref(name: str, spec: Obj) -> tuple[str, str]:
    """(Secret name, key) of the service's token: the user's ``tokenSecretRef``, else the
    Secret the operator generates."""
    ref = spec.get("tokenSecretRef")
    if ref:
        return str(ref["name"]), str(ref.get("key") or TOKEN_KEY)
    return name + SECRET_SUFFIX, TOKEN_KEY


def env(secret: str, key: str) -> Obj:
    """The ``STATETIER_COMPACTION_TOKEN`` variable, read from the Secret by the kubelet."""
    return {"name": ENV, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def generated_secret(body: Obj, owner: Obj, labels: dict[str, str]) -> Obj | None:
    """The token Secret to create for ``body`` (a CompactionService), or None when the user
    gave one. A fresh random token each call: create it only if absent, never apply it."""
    meta, spec = body["metadata"], body.get("spec") or {}
    if spec.get("tokenSecretRef"):
        return None
    name, key = secret_ref(meta["name"], spec)
    token = secrets.token_urlsafe(32)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": labels,
            "ownerReferences": [owner],
        },
        "data": {key: base64.b64encode(token.encode()).decode()},
    }


def copy_warning(service: str, secret: str, key: str, namespace: str) -> str:
    """What to do when the CompactionService ``service`` (``namespace/name``) is in another
    namespace than the application's ``namespace``: a Secret is readable only by pods of its
    own namespace, so the Spark pods need a copy of the token Secret under the same name."""
    return (
        f"CompactionService {service} is in another namespace: copy its token Secret {secret} "
        f"(key {key}) into namespace {namespace}, where the Spark pods read it"
    )
