"""The apiserver's typed round trip of built-in objects, as far as it shows in what is stored.

A real apiserver decodes a Deployment or Service into Go structs and encodes it again, so what
it stores is not what the client sent: empty lists (``env: []``) and empty maps of
``omitempty`` fields vanish, and resource quantities come back in canonical form (``"0.5"`` ->
``"500m"``, ``1024Mi`` -> ``1Gi``, ``1`` -> ``"1"``). A controller that compares what it sent
with what it reads back therefore never sees a match on a real cluster. The emulator applies
:func:`round_trip` to built-in kinds so tests see the same.
"""

from __future__ import annotations

import fractions
import math
import re
from typing import Any

__all__ = ["QuantityError", "canonical_quantity", "round_trip"]

_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {exp: suffix for suffix, exp in _DECIMAL.items()}
# Maps whose empty value the Go structs omit (``omitempty`` on a map field).
_OMIT_EMPTY_MAPS = frozenset({"labels", "annotations", "nodeSelector", "matchLabels"})


class QuantityError(ValueError):
    """Not a Kubernetes quantity."""


def _parse(text: str) -> tuple[fractions.Fraction, str]:
    match = _QUANTITY.match(text.strip())
    if not match:
        raise QuantityError(
            f"quantities must match the regular expression of resource.Quantity: {text!r}"
        )
    value = fractions.Fraction(match["num"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return value * 1024 ** _BINARY[suffix], "binary"
    if suffix[:1] in ("e", "E"):
        return value * fractions.Fraction(10) ** int(suffix[1:]), "exponent"
    return value * fractions.Fraction(10) ** _DECIMAL[suffix], "decimal"


def canonical_quantity(value: str | int | float) -> str:
    """The string a real apiserver stores for a quantity (Go's ``Quantity.String()``).

    Values are rounded up to nano units; binary quantities stay binary when they are whole and
    at least 1Ki, else they become decimal; decimal ones take the largest SI suffix that keeps
    the number whole.
    """
    amount, form = _parse(str(value))
    nanos = math.ceil(amount * 10**9)
    amount = fractions.Fraction(nanos, 10**9)
    if amount == 0:
        return "0"
    sign, amount = ("-" if amount < 0 else ""), abs(amount)
    if form == "binary" and amount.denominator == 1 and amount >= 1024:
        power = max(p for p in range(7) if amount.numerator % 1024**p == 0)
        suffix = {v: k for k, v in _BINARY.items()}.get(power, "")
        return f"{sign}{amount.numerator // 1024**power}{suffix}"
    exponent = max(
        e for e in range(-9, 19, 3) if (amount / fractions.Fraction(10) ** e).denominator == 1
    )
    mantissa = int(amount / fractions.Fraction(10) ** exponent)
    suffix = (
        (f"e{exponent}" if exponent else "") if form == "exponent" else _DECIMAL_SUFFIX[exponent]
    )
    return f"{sign}{mantissa}{suffix}"


def _canonical_resources(resources: Any) -> None:
    if not isinstance(resources, dict):
        return
    for part in ("requests", "limits"):
        amounts = resources.get(part)
        if isinstance(amounts, dict):
            for name, amount in amounts.items():
                amounts[name] = canonical_quantity(amount)


def _drop_empty(node: Any) -> Any:
    """Empty lists everywhere and empty ``omitempty`` maps go, as Go's encoder drops them."""
    if isinstance(node, dict):
        out = {}
        for key, raw in node.items():
            value = _drop_empty(raw)
            if value == [] or (value == {} and key in _OMIT_EMPTY_MAPS):
                continue
            out[key] = value
        return out
    if isinstance(node, list):
        return [_drop_empty(item) for item in node]
    return node


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec") or {}
    template = (spec.get("template") or {}).get("spec")
    return [
        s for s in (spec if obj.get("kind") == "Pod" else None, template) if isinstance(s, dict)
    ]


def round_trip(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as a real apiserver would store it (quantities canonical, empty lists gone).

    Raises :class:`QuantityError` for a resource amount that is not a quantity, which the
    apiserver refuses with 422 too.
    """
    for pod in _pod_specs(obj):
        for group in ("containers", "initContainers"):
            for container in pod.get(group) or []:
                if isinstance(container, dict):
                    _canonical_resources(container.get("resources"))
    result: dict[str, Any] = _drop_empty(obj)
    return result
