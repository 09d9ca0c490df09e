"""OpenAPI validation of custom resources against their CRD's structural schema.

A real apiserver refuses a custom resource whose (pruned, defaulted) content breaks the schema:
types, enums, bounds, patterns, lengths, required fields. The emulator checks the same with
``jsonschema`` after turning the CRD schema into JSON Schema (the ``x-kubernetes-*``
extensions dropped; an int-or-string takes either type, a pattern constraining strings only)
and reports each problem as the apiserver words it: ``spec.workers.max: Invalid value: 0: ...``.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

__all__ = ["problems"]

Obj = dict[str, Any]


def _json_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v) for k, v in node.items() if not k.startswith("x-")}
    if node.get("x-kubernetes-int-or-string"):  # a pattern constrains the string form only
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    out.pop("format", None)  # formats are advisory here, as most are for the apiserver
    return out


def _path(error: jsonschema.ValidationError) -> str:
    parts = ""
    for step in error.absolute_path:
        parts += f"[{step}]" if isinstance(step, int) else (f".{step}" if parts else str(step))
    return parts or "<root>"


def problems(schema: Obj | None, obj: Obj) -> list[str]:
    """Each way ``obj`` breaks ``schema``.

    ``metadata`` is the apiserver's and its content is not checked here, but it is there: a
    schema that requires it (the Spark Operator's CRD does) is satisfied, as by an apiserver.
    """
    if not schema:
        return []
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    if "metadata" in obj:
        body["metadata"] = {}
    validator = jsonschema.Draft4Validator(_json_schema(schema))
    found = []
    for error in sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path)):
        if error.validator == "required":
            field = f"{_path(error)}.{error.message.split(chr(39))[1]}".removeprefix("<root>.")
            found.append(f"{field}: Required value")
            continue
        where = _path(error)
        value = json.dumps(error.instance)
        if error.validator == "pattern":  # the apiserver's (kube-openapi's) own words
            found.append(
                f"{where}: Invalid value: {value}: {where} in body should match "
                f"'{error.validator_value}'"
            )
            continue
        found.append(f"{where}: Invalid value: {value}: {where} {error.message}")
    return found
