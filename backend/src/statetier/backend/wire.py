"""Typed reads of the JSON messages that cross a process boundary.

A Spark pipeline's driver, tasks and state hosts, and the compaction service and its clients,
are separate processes (often separate machines); each message between them is a frozen
dataclass with one ``encode`` to JSON-ready data and one ``decode`` from it. A decode reads its
fields through :class:`Fields`, so that a malformed message (a missing field, a wrong type)
fails with a :class:`MessageError` naming the message and the field, not a ``KeyError`` deep
inside whatever first used it.

Most messages are a flat list of plain fields (numbers, strings, flags, string lists and maps);
:func:`encode_fields` and :func:`decode_fields` write and read those by the dataclass's own
field names and annotated types, so that each message lists its fields once, in its class. A
field the class marks :data:`FLAT` is a nested message whose fields travel inline; one marked
:data:`LOCAL` stays in its process; a field of another kind (a list of nested messages) has its
writer and reader passed in by the message.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import typing
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeVar

__all__ = ["FLAT", "LOCAL", "REQUIRED", "Fields", "MessageError", "decode_fields", "encode_fields"]

M = TypeVar("M")
E = TypeVar("E", bound=enum.Enum)

FLAT: Mapping[str, str] = {"wire": "flat"}  # a nested message, its fields inline
LOCAL: Mapping[str, str] = {"wire": "local"}  # not sent: the receiver gets its default


class MessageError(ValueError):
    """A message from another process is malformed: says which message and which field."""


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # the default of a field that must be present


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Fields:
    """The fields of one decoded JSON object, read with their types checked."""

    def __init__(self, message: str, data: Any) -> None:
        if not isinstance(data, dict):
            raise MessageError(f"{message}: expected a JSON object, got {_shown(data)}")
        self.message = message
        self.data: dict[str, Any] = data

    @classmethod
    def parse(cls, message: str, raw: bytes | str) -> Fields:
        """The fields of the JSON object in ``raw``; text that is no JSON says so."""
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise MessageError(f"{message}: not JSON: {e}") from None
        return cls(message, data)

    def fail(self, name: str, expected: str, value: Any) -> NoReturn:
        raise MessageError(
            f"{self.message}: field {name!r} must be {expected}, got {_shown(value)}"
        )

    def _get(self, name: str, default: Any) -> Any:
        if name in self.data:
            return self.data[name]
        if default is REQUIRED:
            raise MessageError(f"{self.message}: field {name!r} is missing")
        return default

    def integer(self, name: str, default: Any = REQUIRED) -> int:
        value = self._get(name, default)
        if type(value) is not int:  # a bool is no count
            self.fail(name, "an integer", value)
        return value

    def maybe_integer(self, name: str) -> int | None:
        """An integer or null; absent is null."""
        value = self._get(name, None)
        return None if value is None else self.integer(name)

    def choice(self, name: str, kind: type[E], default: Any = REQUIRED) -> E:
        """A member of the string enum ``kind``, by its value."""
        value = self.text(name, default)
        try:
            return kind(value)
        except ValueError:
            *most, last = (str(member.value) for member in kind)
            self.fail(name, f"{', '.join(most)} or {last}" if most else last, value)

    def number(self, name: str, default: Any = REQUIRED) -> float:
        value = self._get(name, default)
        if type(value) not in (int, float):
            self.fail(name, "a number", value)
        return float(value)

    def flag(self, name: str, default: Any = REQUIRED) -> bool:
        value = self._get(name, default)
        if type(value) is not bool:
            self.fail(name, "true or false", value)
        return bool(value)

    def text(self, name: str, default: Any = REQUIRED) -> str:
        value = self._get(name, default)
        if not isinstance(value, str):
            self.fail(name, "a string", value)
        return value

    def maybe_text(self, name: str) -> str | None:
        """A string or null; absent is null."""
        value = self._get(name, None)
        return None if value is None else self.text(name)

    def texts(self, name: str, default: Any = REQUIRED) -> tuple[str, ...]:
        value = self._get(name, default)
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            self.fail(name, "a list of strings", value)
        return tuple(value)

    def text_map(self, name: str, default: Any = REQUIRED) -> dict[str, str]:
        value = self.mapping(name, default)
        if not all(isinstance(v, str) for v in value.values()):
            self.fail(name, "an object of strings", value)
        return dict(value)

    def mapping(self, name: str, default: Any = REQUIRED) -> dict[str, Any]:
        value = self._get(name, default)
        if not isinstance(value, dict):
            self.fail(name, "an object", value)
        return value

    def items(self, name: str, default: Any = REQUIRED) -> list[Any]:
        value = self._get(name, default)
        if not isinstance(value, (list, tuple)):
            self.fail(name, "a list", value)
        return list(value)


_Reader = Callable[[Fields, str, Any], Any]
_READERS: dict[Any, _Reader] = {
    int: Fields.integer,
    int | None: lambda fields, name, _: fields.maybe_integer(name),  # absent is null
    float: Fields.number,
    bool: Fields.flag,
    str: Fields.text,
    str | None: lambda fields, name, _: fields.maybe_text(name),
    tuple[str, ...]: Fields.texts,
    dict[str, str]: Fields.text_map,
    dict[str, Any]: Fields.mapping,
}


_WireFields = tuple[tuple[dataclasses.Field[Any], Any], ...]
_wire_fields_of: dict[type, _WireFields] = {}


def _wire_fields(cls: type) -> _WireFields:
    """The fields of dataclass ``cls`` that travel, with their resolved types (resolved once per
    class: ``get_type_hints`` evaluates every annotation, and messages cross per task)."""
    known = _wire_fields_of.get(cls)
    if known is None:
        hints = typing.get_type_hints(cls)
        known = _wire_fields_of[cls] = tuple(
            (field, hints[field.name])
            for field in dataclasses.fields(cls)
            if _marked(field) != "local"
        )
    return known


def _marked(field: dataclasses.Field[Any]) -> str | None:
    """How ``field`` travels: marked :data:`FLAT`, :data:`LOCAL`, or neither (None)."""
    return field.metadata.get("wire")


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return REQUIRED


def decode_fields(cls: type[M], fields: Fields, **readers: Callable[[Fields], Any]) -> M:
    """A ``cls`` read from ``fields``, field by field in the class's order: each by its name and
    annotated type (a field with a default may be absent), or by its reader in ``readers``."""
    values = {}
    for field, kind in _wire_fields(cls):
        if field.name in readers:
            values[field.name] = readers[field.name](fields)
        elif _marked(field) == "flat":
            values[field.name] = decode_fields(kind, fields)
        elif isinstance(kind, type) and issubclass(kind, enum.Enum):
            values[field.name] = fields.choice(field.name, kind, _default(field))
        elif kind in _READERS:
            values[field.name] = _READERS[kind](fields, field.name, _default(field))
        else:
            raise TypeError(f"{cls.__name__}.{field.name}: no reader for {kind}; pass one")
    return cls(**values)


def encode_fields(message: Any, **writers: Callable[[Any], Any]) -> dict[str, Any]:
    """The JSON-ready fields of dataclass ``message`` (what :func:`decode_fields` reads): each
    field by its name, a tuple as a list, an enum as its value, or by its writer in ``writers``."""
    data: dict[str, Any] = {}
    for field, _ in _wire_fields(type(message)):
        value = getattr(message, field.name)
        if field.name in writers:
            data[field.name] = writers[field.name](value)
        elif _marked(field) == "flat":
            data.update(encode_fields(value))
        elif isinstance(value, enum.Enum):
            data[field.name] = value.value
        else:
            data[field.name] = list(value) if isinstance(value, tuple) else value
    return data
