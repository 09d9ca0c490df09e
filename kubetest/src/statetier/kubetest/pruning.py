"""Unknown fields of custom resources: pruned, or refused under strict field validation.

A real apiserver drops every field a CRD's structural schema does not declare (unless the
node says ``x-kubernetes-preserve-unknown-fields``), and with ``?fieldValidation=Strict`` (what
kubectl sends by default) refuses the write instead, naming each field.
"""

from __future__ import annotations

from typing import Any

__all__ = ["prune"]

Obj = dict[str, Any]
_ROOT = ("apiVersion", "kind", "metadata")


def prune(value: Any, schema: Obj | None, path: str = "", root: bool = True) -> list[str]:
    """Remove undeclared fields from ``value`` in place; return their paths (``.spec.foo``)."""
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    dropped: list[str] = []
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for name in list(value):
            where = f"{path}.{name}"
            if root and name in _ROOT:
                continue
            if name in properties:
                dropped += prune(value[name], properties[name], where, False)
            elif isinstance(extra, dict):
                dropped += prune(value[name], extra, where, False)
            elif extra is not True:
                del value[name]
                dropped.append(where)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            dropped += prune(item, schema["items"], f"{path}[{index}]", False)
    return dropped
