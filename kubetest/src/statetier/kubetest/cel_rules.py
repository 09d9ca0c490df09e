"""CRD validation rules (``x-kubernetes-validations``, CEL), evaluated as the apiserver does.

A real apiserver checks these rules twice: when a CRD is written, against every schema
``default`` of a node that carries rules (so a rule that reads a field the default lacks makes
the CRD itself invalid: ``no such key: min evaluating rule: ...``), and on every create or
update of a custom resource, against the defaulted object, between mutating and validating
admission. The expressions are evaluated with ``common-expression-language`` (the maintained
CEL implementation on PyPI); ``self`` is the node, ``oldSelf`` the node before an update
(transition rules are skipped on create, as the apiserver does).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import cel

__all__ = ["RuleViolation", "check_defaults", "check_object", "rules_of"]

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class RuleViolation:
    """One failed or broken rule: where (field path as the apiserver prints it) and why."""

    field: str
    detail: str

    def __str__(self) -> str:
        return f'{self.field}: Invalid value: "object": {self.detail}'


def rules_of(schema: Obj | None, path: str = "") -> Iterator[tuple[str, Obj, Obj]]:
    """Every (field path, schema node, rule) in a structural schema, depth first."""
    if not isinstance(schema, dict):
        return
    for rule in schema.get("x-kubernetes-validations") or []:
        yield path, schema, rule
    for name, sub in (schema.get("properties") or {}).items():
        yield from rules_of(sub, f"{path}.{name}" if path else name)
    if isinstance(schema.get("items"), dict):
        yield from rules_of(schema["items"], f"{path}[*]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from rules_of(schema["additionalProperties"], f"{path}[*]")


def _error_text(exc: Exception) -> str:
    """The library's error in the apiserver's words where they differ (a missing key)."""
    text = str(exc).strip("'\"")
    if isinstance(exc, KeyError) or re.search(r"(?i)no such (key|field)|undefined field", text):
        key = re.sub(r"(?i).*(no such (key|field)|undefined field)[: ]*", "", text).strip("'\" ")
        return f"no such key: {key}"
    return text


def _evaluate(rule: Obj, value: Any, old: Any = None) -> str | None:
    """None when the rule holds, else the message the apiserver would give."""
    expression = rule["rule"]
    if "oldSelf" in expression and old is None:
        return None  # a transition rule: only checked on update
    context: Obj = {"self": value}
    if old is not None:
        context["oldSelf"] = old
    try:
        result = cel.evaluate(expression, context)
    except Exception as exc:
        return f"{_error_text(exc)} evaluating rule: {rule.get('message') or expression}"
    if result is True:
        return None
    return str(rule.get("message") or f"failed rule: {expression}")


def _schema_path(path: str) -> str:
    """``spec.workers`` as the CRD validation error names it."""
    parts = [p for p in path.split(".") if p]
    return "spec.validation.openAPIV3Schema" + "".join(f".properties[{p}]" for p in parts)


def check_defaults(schema: Obj | None) -> list[RuleViolation]:
    """Rules that do not compile or fail against their node's ``default`` (CRD write time)."""
    problems = []
    for path, node, rule in rules_of(schema):
        try:
            cel.compile(rule["rule"])
        except Exception as exc:
            field = f"{_schema_path(path)}.x-kubernetes-validations[rule]"
            problems.append(RuleViolation(field, f"compilation failed: {exc}"))
            continue
        if "[*]" in path or "default" not in node:
            continue
        detail = _evaluate(rule, node["default"])
        if detail is not None:
            problems.append(RuleViolation(f"{_schema_path(path)}.default", detail))
    return problems


def _values(obj: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(printed path, value) of every node at a rules_of path; ``[*]`` fans out."""
    nodes: list[tuple[str, Any]] = [("", obj)]
    for part in [p for p in path.split(".") if p]:
        name, star = (part[:-3], True) if part.endswith("[*]") else (part, False)
        step = []
        for printed, node in nodes:
            if not isinstance(node, dict) or name not in node:
                continue
            child, where = node[name], f"{printed}.{name}" if printed else name
            if not star:
                step.append((where, child))
            elif isinstance(child, list):
                step += [(f"{where}[{i}]", item) for i, item in enumerate(child)]
            elif isinstance(child, dict):
                step += [(f"{where}[{key}]", item) for key, item in child.items()]
        nodes = step
    return iter(nodes)


def check_object(schema: Obj | None, obj: Obj, old: Obj | None = None) -> list[RuleViolation]:
    """Rules that fail against a (defaulted) custom resource; ``old`` for transition rules."""
    problems = []
    for path, _, rule in rules_of(schema):
        old_values = dict(_values(old, path)) if old is not None else {}
        for where, value in _values(obj, path):
            detail = _evaluate(rule, value, old_values.get(where))
            if detail is not None:
                problems.append(RuleViolation(where or "<root>", detail))
    return problems
