"""TypedSerializer: values of a declared type, stored by field name.

A record is written as a msgpack map from field name to value, not as a positional array, so
that bytes written as one version of a type read as another: a reader takes the fields it
declares by name, fills in the defaults of fields the bytes lack, ignores fields it no longer
declares and widens an int to a float (see evolution for which changes are accepted). Nothing
about the order of fields is stored, so bytes of different versions may share a file.

Writes check each value against the type (a str in an int field is refused when it is written,
naming the field), because stored values whose type is only a promise would make the evolution
checks at restore meaningless. The reader is compiled once per type: a part that needs no
conversion (scalars other than float, and lists and maps of them) is taken as msgpack returns
it, and a record of such fields is built with one call when the bytes hold exactly its fields.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable
from typing import Any

import msgpack
from statetier.backend.serializers import SerializationError, register_serializer, short_repr
from statetier.backend.typed.schema import SCALARS, SchemaField, ValueType, value_type_of

__all__ = ["TYPED_SERIALIZER_ID", "TypedSerializer"]

TYPED_SERIALIZER_ID = "typed"

Convert = Callable[[Any], Any]
Reader = Convert | None  # None: the part is read as msgpack returns it


class TypedSerializer:
    """Values of ``value_type``: a dataclass, an annotation (``int``, ``list[str]``,
    ``dict[str, float]``, ``X | None`` and nestings of these) or a ValueType (a declared
    :func:`~statetier.backend.typed.schema.record_type`, whose values are dicts).

    Without a type (as the registry makes it from a manifest's serializer id) it only reads:
    records as dicts, for tools that read a state without the job's classes."""

    id = TYPED_SERIALIZER_ID

    def __init__(self, value_type: Any = None) -> None:
        self.schema: ValueType | None = None if value_type is None else value_type_of(value_type)
        self._write: Convert = _writer(self.schema) if self.schema else _unwritable
        self._read: Reader = _reader(self.schema) if self.schema else None

    def dumps(self, value: Any) -> bytes:
        try:
            plain = self._write(value)
        except _MismatchError as exc:
            raise SerializationError(str(exc)) from None
        try:
            return msgpack.packb(plain, use_bin_type=True)  # type: ignore[no-any-return]
        except (TypeError, OverflowError, ValueError) as exc:  # an int past 64 bits
            raise SerializationError(f"cannot write {short_repr(value)}: {exc}") from None

    def check(self, value: Any) -> None:
        """SerializationError naming the field when ``value`` is not of the declared type."""
        try:
            self._write(value)
        except _MismatchError as exc:
            raise SerializationError(str(exc)) from None

    def loads(self, data: bytes) -> Any:
        try:
            plain = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except (ValueError, msgpack.UnpackException) as exc:
            raise SerializationError(f"malformed typed value: {exc}") from None
        return plain if self._read is None else self._read(plain)

    def bulk_dumps(self) -> Callable[[Any], bytes]:
        """A ``dumps`` for many values on one thread: one packer kept, errors come out raw
        (:meth:`dumps` of the value gives the message)."""
        pack, write = msgpack.Packer(use_bin_type=True).pack, self._write
        return lambda value: pack(write(value))


class _MismatchError(TypeError):
    """A written value does not match the declared type (the message names the field)."""


def _unwritable(value: Any) -> Any:
    raise _MismatchError(
        "a TypedSerializer without a value type only reads; declare the state's type, "
        "e.g. TypedSerializer(MyDataclass)"
    )


# ------------------------------------------------------------------ writing


def _writer(value_type: ValueType, where: str = "") -> Convert:
    """value -> the plain value msgpack writes (records as dicts), checked against the type."""
    kind = value_type.kind
    if kind in SCALARS:
        return _scalar_writer(kind, where)
    if kind == "optional":
        inner = _writer(value_type.args[0], where)
        return lambda value: None if value is None else inner(value)
    if kind == "list":
        element = _writer(value_type.args[0], f"{where}[]")
        # a list of scalars all of exactly the element's type is written as it is
        item_kind = value_type.args[0].kind
        same = {SCALARS[item_kind]} if item_kind in SCALARS else None

        def write_list(value: Any) -> Any:
            if type(value) is not list:
                raise _mismatch(where, "list", value)
            if same is not None and set(map(type, value)) <= same:
                return value
            return [element(item) for item in value]

        return write_list
    if kind == "map":
        key = _writer(value_type.args[0], f"{where}{{key}}")
        item = _writer(value_type.args[1], f"{where}{{}}")

        def write_map(value: Any) -> Any:
            if type(value) is not dict:
                raise _mismatch(where, "dict", value)
            return {key(k): item(v) for k, v in value.items()}

        return write_map
    return _record_writer(value_type, where)


def _scalar_writer(kind: str, where: str) -> Convert:
    expected = SCALARS[kind]

    def write(value: Any) -> Any:
        if type(value) is expected:
            return value
        if kind == "float" and type(value) is int:
            return float(value)
        if kind == "bytes" and type(value) in (bytearray, memoryview):
            return bytes(value)
        raise _mismatch(where, kind, value)

    return write


def _record_writer(value_type: ValueType, where: str) -> Convert:
    """A record's writer: the class is checked, then its fields. The common case, every field
    of exactly its declared type at the top (a str in a str field, a list in a list field),
    is told by one comparison of type tuples; then only lists, maps and nested records are
    looked into. Anything else (an int in a float field, None in an optional one) takes the
    field-by-field path, which converts or names the field."""
    cls = value_type.python_type or dict
    names = tuple(f.name for f in value_type.fields)
    writers = [(f.name, _writer(f.type, _path(where, f.name))) for f in value_type.fields]
    get = _getter(names, cls is dict)
    top_types = tuple(_top_type(f.type) for f in value_type.fields)
    deep = [
        (i, name, w)
        for i, (name, w) in enumerate(writers)
        if value_type.fields[i].type.kind in ("list", "map", "record")
    ]
    label = value_type.describe()

    def write(value: Any) -> Any:
        if type(value) is not cls:
            raise _mismatch(where, label, value)
        try:
            values = get(value)
        except KeyError as exc:
            raise _MismatchError(f"{_what(where)}: the {label} dict has no field {exc}") from None
        if isinstance(value, dict) and len(value) != len(names):  # keys it would drop
            extra = sorted(map(str, set(value) - set(names)))
            raise _MismatchError(f"{_what(where)}: the {label} dict has undeclared fields {extra}")
        if tuple(map(type, values)) == top_types:
            plain = dict(zip(names, values, strict=True))
            for i, name, w in deep:
                plain[name] = w(values[i])
            return plain
        return {name: w(v) for (name, w), v in zip(writers, values, strict=True)}

    return write


def _top_type(value_type: ValueType) -> type | None:
    """The one Python type a value of ``value_type`` has at the top, None if several may."""
    if value_type.kind in SCALARS:
        return SCALARS[value_type.kind]
    if value_type.kind == "record":
        return value_type.python_type or dict
    return {"list": list, "map": dict}.get(value_type.kind)


def _getter(names: tuple[str, ...], from_dict: bool) -> Callable[[Any], tuple[Any, ...]]:
    """The field values of a record, in declaration order, as a tuple (one C call)."""
    if not names:
        return lambda value: ()
    get = (operator.itemgetter if from_dict else operator.attrgetter)(*names)
    if len(names) == 1:
        return lambda value: (get(value),)
    return get


def _path(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _what(where: str) -> str:
    return f"field {where!r}" if where else "the value"


def _mismatch(where: str, expected: str, value: Any) -> _MismatchError:
    return _MismatchError(
        f"{_what(where)} is declared {expected} but got {type(value).__name__} {short_repr(value)}"
    )


# ------------------------------------------------------------------ reading


def _reader(value_type: ValueType) -> Reader:
    """plain value -> the declared type's value; None where msgpack's value is it already."""
    kind = value_type.kind
    if kind == "float":
        return _to_float
    if kind in SCALARS:
        return None
    if kind == "optional":
        inner = _reader(value_type.args[0])
        return None if inner is None else (lambda value: None if value is None else inner(value))
    if kind == "list":
        element = _reader(value_type.args[0])
        return None if element is None else (lambda value: [element(v) for v in value])
    if kind == "map":
        item = _reader(value_type.args[1])
        return None if item is None else (lambda value: {k: item(v) for k, v in value.items()})
    return _record_reader(value_type)


def _to_float(value: Any) -> Any:
    """A float field's value; an int stored before the field was widened becomes a float."""
    return float(value) if type(value) is int else value


def _record_reader(value_type: ValueType) -> Convert:
    """A record from its stored map: fields by name, defaults for missing ones, stored fields
    no longer declared ignored. When the map holds exactly the declared fields (bytes of this
    version) it is converted in place, only where a field needs it, and passed on whole."""
    cls = value_type.python_type
    readers = [(f.name, _reader(f.type)) for f in value_type.fields]
    converting = [(name, reader) for name, reader in readers if reader is not None]
    names = frozenset(name for name, _ in readers)
    defaults = [] if cls is not None else [f for f in value_type.fields if f.has_default]

    def read(stored: dict[str, Any]) -> Any:
        if stored.keys() == names:  # the bytes hold exactly the declared fields
            for name, reader in converting:
                stored[name] = reader(stored[name])
            return stored if cls is None else cls(**stored)
        fields = {
            name: stored[name] if reader is None else reader(stored[name])
            for name, reader in readers
            if name in stored
        }
        if cls is None:
            _fill_defaults(fields, defaults)
            return fields
        return cls(**fields)  # the dataclass fills in its defaults

    return read


def _fill_defaults(fields: dict[str, Any], defaults: list[SchemaField]) -> None:
    """A declared record's defaults for the fields its stored map lacks (a copy each, so no
    two values share a mutable default)."""
    for field in defaults:
        if field.name not in fields:
            fields[field.name] = copy.copy(field.default)


register_serializer(TYPED_SERIALIZER_ID, TypedSerializer)
