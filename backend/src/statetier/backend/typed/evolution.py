"""Which changes of a typed state's value type its stored values survive.

Values are stored by field name (see serializer), so a value written as the old type can be
read as the new one when every field the new type reads is either there with a type that
converts without loss, or new with a default. Accepted, as Spark's and Flink's Avro schema
evolution accept them: adding a field with a default, dropping a field, reordering fields,
widening ``int`` to ``float`` and a type ``T`` to ``T | None``, each also inside lists, map
values and nested records. Refused, because old values would be lost or misread: a new field
without a default (a rename is a drop and an add), any other type change (``str`` to ``int``,
``float`` to ``int``, ``T | None`` to ``T``, a record to a scalar), and any change of a map's
key type (entries would collide or change keys).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from statetier.backend.typed.schema import ValueType

__all__ = ["incompatibility", "schema_change_refusal"]

_WIDENINGS = frozenset({("int", "float")})
# what a path names when it is not a record's field: the value itself, its elements, its keys
_TOP = {
    "": "the value",
    "[]": "the list's elements",
    "{key}": "the map's keys",
    "{}": "the map's values",
}


def incompatibility(stored: ValueType, declared: ValueType, where: str = "") -> str | None:
    """None when values stored as ``stored`` read as ``declared``; else one sentence naming the
    field (dotted, ``where`` being the path so far) and both types."""
    if stored == declared:
        return None
    if declared.kind == "optional":
        inner = stored.args[0] if stored.kind == "optional" else stored
        return incompatibility(inner, declared.args[0], where)
    if stored.kind == declared.kind == "list":
        return incompatibility(stored.args[0], declared.args[0], f"{where}[]")
    if stored.kind == declared.kind == "map":
        if stored.args[0] != declared.args[0]:
            return _refused(f"{where}{{key}}", stored.args[0], declared.args[0])
        return incompatibility(stored.args[1], declared.args[1], f"{where}{{}}")
    if stored.kind == declared.kind == "record":
        return _record(stored, declared, where)
    if (stored.kind, declared.kind) in _WIDENINGS:
        return None
    return _refused(where, stored, declared)


def _record(stored: ValueType, declared: ValueType, where: str) -> str | None:
    """Each declared field: read from the stored one, or new with a default."""
    for field in declared.fields:
        path = f"{where}.{field.name}" if where else field.name
        old = stored.field(field.name)
        if old is None:
            if field.has_default:
                continue
            return (
                f"field {path!r} ({field.type.describe()}) is new and has no default, so values "
                "stored without it cannot be read (a rename is a drop and an add: give the new "
                "field a default, or migrate the state)"
            )
        reason = incompatibility(old.type, field.type, path)
        if reason is not None:
            return reason
    return None


def _refused(where: str, stored: ValueType, declared: ValueType) -> str:
    what = _TOP.get(where) or f"field {where!r}"
    return (
        f"{what} is stored as {stored.describe()} and declared as {declared.describe()}, a "
        "change stored values do not survive"
    )


def schema_change_refusal(
    stored: Mapping[str, Any], declared: Mapping[str, ValueType]
) -> str | None:
    """Why a state whose manifest recorded ``stored`` (schema JSON per serializer slot) cannot
    be read as ``declared``, None when it can. A slot stored without a schema (a schemaless
    serializer, or a manifest older than typed state) is not checked here: its serializer id
    is. A map's keys must keep their type exactly (a changed key would move entries)."""
    for slot, schema in declared.items():
        body = stored.get(slot)
        if body is None:
            continue
        old = ValueType.from_json(body)
        if slot == "value":
            reason = incompatibility(old, schema)
        elif old != schema:
            reason = _refused("{key}", old, schema)
        else:
            reason = None
        if reason is not None:
            return reason
    return None
