"""How a state's values (and keys) become DataFrame columns: one seam per serializer.

msgpack and pickle values carry no schema, so by default a value is two columns: ``value``,
its JSON text where JSON can hold it (null where it cannot: bytes, sets, objects), and
``value_bytes``, the serializer's bytes, which the state's serializer reads back. A serializer
that knows its type (a typed state) registers :class:`ValueColumns` of its own with
:func:`register_value_columns` and its values come out as typed columns instead.

Keys are typed from a sample: a str, int, float, bool or bytes key is one column of that type,
a tuple key one column per field (``key_0``, ``key_1``, ...), anything else JSON text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from statetier.backend.spark.typed_columns import TypedValueColumns
from statetier.backend.typed.schema import ValueType
from statetier.backend.typed.serializer import TYPED_SERIALIZER_ID

__all__ = [
    "JsonValueColumns",
    "KeyColumns",
    "binary_column",
    "ValueColumns",
    "register_value_columns",
    "value_columns_for",
]


class ValueColumns(Protocol):
    """The columns of one state's values: their (name, Spark DDL type), and their arrays."""

    fields: list[tuple[str, str]]

    def arrays(
        self, values: Sequence[Any], value_bytes: Sequence[bytes] | pa.Array
    ) -> list[pa.Array]:
        """The columns of ``values``; ``value_bytes`` their stored bytes, a list or a column."""
        ...


def binary_column(value_bytes: Sequence[bytes] | pa.Array) -> pa.Array:
    """Stored bytes as a binary column: a stored column is cast (its buffers reused), a list
    copied into one."""
    if isinstance(value_bytes, pa.Array):
        return value_bytes.cast(pa.binary())
    return pa.array(value_bytes, pa.binary())


def to_json(value: Any) -> str | None:
    """``value`` as JSON text, None when JSON cannot hold it."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return None


def json_texts(values: Sequence[Any]) -> pa.Array:
    """The JSON text of each of ``values`` (null where JSON cannot hold one). Integers,
    booleans and strings without characters JSON escapes are cast by Arrow in one pass (a
    value state of counts or names, the common case); anything else goes through ``json``."""
    try:
        typed = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        typed = None
    if typed is not None and not typed.null_count:
        kind = typed.type
        if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
            return pc.cast(typed, pa.string())
        if (
            pa.types.is_string(kind)
            and not pc.any(pc.match_substring_regex(typed, _JSON_ESCAPED)).as_py()
        ):
            return pc.binary_join_element_wise('"', typed, '"', "")
    return pa.array(map(to_json, values), pa.string())


_JSON_ESCAPED = r'["\\\x00-\x1f]'  # what a JSON string escapes


class JsonValueColumns:
    """``value`` (JSON text or null) and ``value_bytes`` (the serializer's bytes)."""

    def __init__(self, prefix: str = "value") -> None:
        self.fields = [(prefix, "string"), (f"{prefix}_bytes", "binary")]

    def arrays(
        self, values: Sequence[Any], value_bytes: Sequence[bytes] | pa.Array
    ) -> list[pa.Array]:
        return [json_texts(values), binary_column(value_bytes)]


ColumnsFactory = Callable[[ValueType], ValueColumns]
_REGISTRY: dict[str, ColumnsFactory] = {TYPED_SERIALIZER_ID: TypedValueColumns}


def register_value_columns(serializer_id: str, factory: ColumnsFactory) -> None:
    """Give the values of serializer ``serializer_id`` columns of their own, made from the
    schema the manifest records for them (a state without one keeps the JSON columns)."""
    _REGISTRY[serializer_id] = factory


def value_columns_for(serializer_id: str, schema: ValueType | None = None) -> ValueColumns:
    """The columns of values of ``serializer_id`` stored with ``schema`` (None: schemaless)."""
    factory = _REGISTRY.get(serializer_id)
    return JsonValueColumns() if factory is None or schema is None else factory(schema)


_SCALARS: list[tuple[type, str, pa.DataType]] = [
    (bool, "boolean", pa.bool_()),  # before int: a bool is an int
    (int, "bigint", pa.int64()),
    (float, "double", pa.float64()),
    (str, "string", pa.string()),
    (bytes, "binary", pa.binary()),
]


def _scalar(sample: Any) -> tuple[str, pa.DataType] | None:
    for kind, ddl, arrow in _SCALARS:
        if isinstance(sample, kind):
            return ddl, arrow
    return None


class KeyColumns:
    """The key column(s) of a state, typed after ``sample`` (JSON text with ``as_json``)."""

    def __init__(self, sample: Any, *, as_json: bool = False, name: str = "key") -> None:
        self.name = name
        self.tuple_size = 0
        self.types: list[tuple[str, pa.DataType]] = []
        if not as_json and isinstance(sample, (tuple, list)) and sample:
            parts = [_scalar(part) for part in sample]
            if all(parts):
                self.tuple_size = len(sample)
                self.types = [p for p in parts if p is not None]
        elif not as_json and (found := _scalar(sample)) is not None:
            self.types = [found]
        if not self.types:
            self.types = [("string", pa.string())]
            self.as_json = True
        else:
            self.as_json = False

    @property
    def fields(self) -> list[tuple[str, str]]:
        if self.tuple_size:
            return [(f"{self.name}_{i}", ddl) for i, (ddl, _) in enumerate(self.types)]
        return [(self.name, self.types[0][0])]

    def to_key(self, columns: Sequence[Any]) -> Any:
        """The key a filter on the key column(s) names (for pushdown), from their values."""
        if self.as_json:
            return json.loads(columns[0])
        return tuple(columns) if self.tuple_size else columns[0]

    def arrays(self, keys: Sequence[Any]) -> list[pa.Array]:
        """The key column(s) of ``keys``; a TypeError naming the key that does not fit."""
        try:
            if self.as_json:
                return [pa.array([to_json(k) for k in keys], pa.string())]
            if self.tuple_size:
                return [
                    pa.array([k[i] for k in keys], arrow) for i, (_, arrow) in enumerate(self.types)
                ]
            return [pa.array(keys, self.types[0][1])]
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, IndexError, OverflowError):
            bad = next((k for k in keys if not self._fits(k)), keys[0] if keys else None)
            raise TypeError(
                f"{self.name} {bad!r} does not fit the {self.name} column(s) typed after the "
                f"first {self.name} ({', '.join(d for _, d in self.types)}); read with "
                '.option("key_format", "json")'
            ) from None

    def _fits(self, key: Any) -> bool:
        try:
            if self.tuple_size:
                return len(key) == self.tuple_size
            pa.array([key], self.types[0][1])
            return True
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            return False
