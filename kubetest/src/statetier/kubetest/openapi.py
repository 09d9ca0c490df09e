"""The ``/openapi/v3`` documents kubectl reads before it writes.

``kubectl apply`` (validation on, the default) asks ``/openapi/v3`` whether the server checks
fields itself: when a group-version document lists a PATCH operation for the kind with a
``fieldValidation`` query parameter, kubectl sends ``?fieldValidation=Strict`` and leaves the
checking to the server, as it does against every apiserver since 1.27. These documents say
exactly that, and carry each custom resource's schema, so tests need no ``--validate=false``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, Protocol

__all__ = ["group_version_doc", "root_doc"]

Obj = dict[str, Any]


class Served(Protocol):
    """What the emulator knows of one served resource (its ResourceDef)."""

    @property
    def group(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def plural(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def namespaced(self) -> bool: ...
    @property
    def schema(self) -> Obj | None: ...


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def group_version_doc(defs: Iterable[Served], group: str, version: str) -> Obj | None:
    """The OpenAPI v3 document of one group-version, or None when nothing is served there."""
    paths: Obj = {}
    schemas: Obj = {}
    for rdef in defs:
        if (rdef.group, rdef.version) != (group, version):
            continue
        gvk = {"group": rdef.group, "version": rdef.version, "kind": rdef.kind}
        scope = "namespaces/{namespace}/" if rdef.namespaced else ""
        item = f"/{_gv_path(group, version)}/{scope}{rdef.plural}/{{name}}"
        ref = f"{group or 'core'}.{version}.{rdef.kind}"
        params = [
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
            {"name": "force", "in": "query", "schema": {"type": "boolean"}},
        ]
        operation = {
            "operationId": f"patch{rdef.kind}",
            "x-kubernetes-group-version-kind": gvk,
            "x-kubernetes-action": "patch",
            "parameters": params,
            "responses": {"200": {"description": "OK"}},
        }
        paths[item] = {
            "patch": operation,
            "put": {**operation, "operationId": f"replace{rdef.kind}"},
        }
        schemas[ref] = {
            **(rdef.schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
            "x-kubernetes-group-version-kind": [gvk],
        }
    if not paths:
        return None
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (statetier emulator)", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def root_doc(defs: Iterable[Served]) -> Obj:
    """``/openapi/v3``: one entry per group-version, its hash changing with its content."""
    defs = list(defs)
    entries: Obj = {}
    for group, version in sorted({(d.group, d.version) for d in defs}):
        doc = group_version_doc(defs, group, version)
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()
        path = _gv_path(group, version)
        entries[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": entries}
