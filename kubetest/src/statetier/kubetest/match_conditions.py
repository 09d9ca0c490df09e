"""Admission webhooks' ``matchConditions`` (CEL), checked and evaluated as kube-apiserver does.

On write of a Mutating- or ValidatingWebhookConfiguration the apiserver compiles every
condition and refuses the object naming the webhook and the condition whose expression does not
compile. On admission, after a webhook's rules and selectors matched, it evaluates the
conditions with ``object`` (null for DELETE), ``oldObject`` (null for CREATE) and ``request``
(the AdmissionRequest's attributes): any condition false skips the webhook; else any error
applies the webhook's ``failurePolicy`` (Fail: the request is refused; Ignore: the webhook is
skipped); else (all true) the webhook is called. A result that is not a bool is an error, as
the apiserver's type check makes it one. Evaluation uses ``common-expression-language``, as
:mod:`.cel_rules` does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import cel

__all__ = ["Decision", "decide", "problems"]

Obj = dict[str, Any]


def problems(config: Obj) -> list[str]:
    """What the apiserver's validation says of each condition that does not compile, as
    ``webhooks[i].matchConditions[j].expression: Invalid value: ...`` lines."""
    found = []
    for i, hook in enumerate(config.get("webhooks") or []):
        names: set[str] = set()
        for j, condition in enumerate(hook.get("matchConditions") or []):
            where = f"webhooks[{i}].matchConditions[{j}]"
            name = str(condition.get("name") or "")
            if not name:
                found.append(f"{where}.name: Required value")
            elif name in names:
                found.append(f'{where}.name: Duplicate value: "{name}"')
            names.add(name)
            expression = str(condition.get("expression") or "")
            try:
                cel.compile(expression)
            except Exception as exc:
                found.append(
                    f'{where}.expression: Invalid value: "{expression}": compilation failed '
                    f'(webhook "{hook.get("name")}", condition "{name}"): {exc}'
                )
    return found


@dataclasses.dataclass(frozen=True)
class Decision:
    """Whether to call the webhook: ``call``, ``skip``, or ``error`` (``detail`` says which
    condition and why; the failure policy decides)."""

    outcome: Literal["call", "skip", "error"]
    detail: str = ""


def _evaluate(expression: str, variables: Obj) -> bool:
    result = cel.evaluate(expression, variables)
    if not isinstance(result, bool):
        raise TypeError(f"expected a bool, got {type(result).__name__}")
    return result


def decide(hook: Obj, request: Obj) -> Decision:
    """Evaluate every condition of ``hook`` on the AdmissionRequest ``request`` (its
    ``object`` and ``oldObject`` are the variables of those names); a false one wins over an
    error."""
    variables = {"object": request["object"], "oldObject": request["oldObject"], "request": request}
    errors = []
    for condition in hook.get("matchConditions") or []:
        try:
            if not _evaluate(str(condition.get("expression")), variables):
                return Decision("skip")
        except Exception as exc:
            errors.append(f"matchCondition {condition.get('name')!r}: {exc}")
    if errors:
        return Decision("error", "; ".join(errors))
    return Decision("call")
