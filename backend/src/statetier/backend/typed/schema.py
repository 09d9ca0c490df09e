"""The schema of a typed state value: field names and types, as data.

A :class:`ValueType` is what a checkpoint manifest records about a typed state's values and what
a reader of the state maps to columns (int, float, str, bool and bytes map to Spark's long,
double, string, boolean and binary; ``optional`` to a nullable column; ``list``, ``map`` and
``record`` to array, map and struct). It is derived from a Python annotation (a dataclass, or
``int``, ``list[str]``, ``dict[str, float]``, ``X | None``, ...) or declared field by field with
:func:`record_type`, whose values are then dicts. It knows nothing of bytes or of evolution rules.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAP_KEYS",
    "SCALARS",
    "SchemaField",
    "ValueType",
    "record_type",
    "stored_value_schema",
    "value_type_of",
]

SCALARS: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool, "bytes": bytes}
MAP_KEYS = frozenset({"int", "str", "bytes", "bool"})  # scalars msgpack keeps as map keys
_NO_DEFAULT: Any = object()  # a declared field without a default


@dataclasses.dataclass(frozen=True)
class SchemaField:
    """One field of a record: its name, type and whether it has a default (what lets a
    restore add it to values stored without it). ``default`` is the value itself for a
    declared record (dict values); a dataclass fills in its own defaults."""

    name: str
    type: ValueType
    has_default: bool = False
    default: Any = dataclasses.field(default=_NO_DEFAULT, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type.to_json(), "default": self.has_default}


@dataclasses.dataclass(frozen=True)
class ValueType:
    """A value's type: a scalar (``int``, ``float``, ``str``, ``bool``, ``bytes``),
    ``optional`` (``args``: the type), ``list`` (``args``: the element), ``map`` (``args``:
    key, value) or ``record`` (``fields``, in declaration order; ``name``: its class's).
    ``python_type`` is the dataclass a record's values are (None: dicts); it is not part of
    the schema, so a class that moved or was renamed keeps its schema."""

    kind: str
    args: tuple[ValueType, ...] = ()
    fields: tuple[SchemaField, ...] = ()
    name: str = ""
    python_type: type | None = dataclasses.field(default=None, compare=False, repr=False)

    def field(self, name: str) -> SchemaField | None:
        """The record's field called ``name``, None if it has none."""
        return next((f for f in self.fields if f.name == name), None)

    def describe(self) -> str:
        """The type as people read it: ``int``, ``list<str>``, ``map<str, float>``,
        ``optional<int>``, ``record Session``."""
        if self.kind in SCALARS:
            return self.kind
        if self.kind == "record":
            return f"record {self.name}" if self.name else "record"
        return f"{self.kind}<{', '.join(arg.describe() for arg in self.args)}>"

    def to_json(self) -> dict[str, Any]:
        """The schema as the manifest records it (plain JSON)."""
        body: dict[str, Any] = {"kind": self.kind}
        if self.args:
            body["args"] = [arg.to_json() for arg in self.args]
        if self.kind == "record":
            body["name"] = self.name
            body["fields"] = [f.to_json() for f in self.fields]
        return body

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ValueType:
        """The schema :meth:`to_json` wrote; ValueError naming what is malformed."""
        try:
            kind = body["kind"]
            args = tuple(cls.from_json(arg) for arg in body.get("args", ()))
            fields = tuple(
                SchemaField(f["name"], cls.from_json(f["type"]), bool(f["default"]))
                for f in body.get("fields", ())
            )
            name = body.get("name", "")
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed value schema {body!r}: missing {exc}") from None
        if kind not in SCALARS and kind not in _ARITY:
            raise ValueError(f"malformed value schema: unknown kind {kind!r}")
        return cls(kind, args, fields, name)


_ARITY = {"optional": 1, "list": 1, "map": 2, "record": 0}


def stored_value_schema(meta: Mapping[str, Any], slot: str = "value") -> ValueType | None:
    """The schema a manifest's state entry (``Manifest.states[name]``) records for its values
    (``slot`` "user_key": a map's keys); None for a schemaless state, whose values a reader
    shows as bytes or JSON instead of typed columns."""
    body = meta.get("schemas", {}).get(slot)
    return None if body is None else ValueType.from_json(body)


def record_type(
    name: str, fields: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> ValueType:
    """A record declared field by field (values are dicts): ``fields`` maps each name to a type
    (an annotation or a ValueType), ``defaults`` gives the fields that have one."""
    defaults = defaults or {}
    unknown = set(defaults) - set(fields)
    if unknown:
        raise ValueError(f"record {name}: defaults for fields it does not declare: {unknown}")
    return ValueType(
        "record",
        fields=tuple(
            SchemaField(
                field_name,
                value_type_of(annotation),
                field_name in defaults,
                defaults.get(field_name, _NO_DEFAULT),
            )
            for field_name, annotation in fields.items()
        ),
        name=name,
    )


def value_type_of(annotation: Any) -> ValueType:
    """The ValueType of a Python annotation (or a ValueType as it is); TypeError naming the
    part that has none."""
    return _of(annotation, ())


def _of(annotation: Any, seen: tuple[type, ...]) -> ValueType:
    if isinstance(annotation, ValueType):
        return annotation
    for kind, python in SCALARS.items():
        if annotation is python:
            return ValueType(kind)
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return _dataclass(annotation, seen)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        inner = next(arg for arg in args if arg is not type(None))
        return ValueType("optional", (_of(inner, seen),))
    if origin is list and len(args) == 1:
        return ValueType("list", (_of(args[0], seen),))
    if origin is dict and len(args) == 2:
        key = _of(args[0], seen)
        if key.kind not in MAP_KEYS:
            raise TypeError(f"a typed map's keys must be int, str, bytes or bool, not {args[0]}")
        return ValueType("map", (key, _of(args[1], seen)))
    raise TypeError(
        f"a typed state value cannot be {annotation!r}: use int, float, str, bool, bytes, "
        "X | None, list[X], dict[K, X] or a dataclass of those"
    )


def _dataclass(cls: type, seen: tuple[type, ...]) -> ValueType:
    """A dataclass's record: its fields' names, types (string annotations resolved) and
    whether each has a default; a class that contains itself is refused (no finite schema)."""
    if cls in seen:
        raise TypeError(f"dataclass {cls.__qualname__} contains itself: a typed value is finite")
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        has_default = (
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        )
        try:
            field_type = _of(hints[f.name], (*seen, cls))
        except TypeError as exc:
            raise TypeError(f"field {cls.__qualname__}.{f.name}: {exc}") from None
        fields.append(SchemaField(f.name, field_type, has_default))
    return ValueType("record", fields=tuple(fields), name=cls.__qualname__, python_type=cls)
