"""Typed reads of the JSON messages that cross a process boundary.

A Spark pipeline's driver, tasks and state hosts, and the compaction service and its clients,
are separate processes (often separate machines); each message between them is a frozen
dataclass with one ``encode`` to JSON-ready data and one ``decode`` from it. A decode reads its
fields through :class:`Fields`, so that a malformed message (a missing field, a wrong type)
fails with a :class:`MessageError` naming the message and the field, not a ``KeyError`` deep
inside whatever first used it.
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["REQUIRED", "Fields", "MessageError"]


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
        value = self._get(name, None)
        return None if value is None else self.integer(name)

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
