"""A typed state's values as typed columns: its stored schema mapped to Spark and Arrow types.

A state declared with a TypedSerializer records its values' schema in the manifest
(:func:`~statetier.backend.typed.schema.stored_value_schema`), so a reader needs neither the
job's classes nor JSON to show them: ``value`` is a column of the schema's own type (a record is
a struct of its fields, a list an array, a dict a map, ``X | None`` a nullable ``X``), and
``value_bytes`` the stored bytes, as for schemaless values. The stored values are read as the
registry's TypedSerializer reads them without the job's code (records as dicts), and Arrow
builds the column from those dicts in one call: a field an older value lacks (one added with a
default since) is null, a field it still holds but the schema dropped is left out, and an
``int`` stored before a field was widened becomes a ``float``.

The Arrow types are the ones PySpark gives the Spark types (a list's item is ``element``, a
map's key not null), because a Python data source's batches must match its schema exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from statetier.backend.typed.schema import ValueType

__all__ = ["TypedValueColumns", "arrow_type", "spark_ddl"]

_SCALARS: dict[str, tuple[str, pa.DataType]] = {
    "int": ("bigint", pa.int64()),
    "float": ("double", pa.float64()),
    "str": ("string", pa.string()),
    "bool": ("boolean", pa.bool_()),
    "bytes": ("binary", pa.binary()),
}


def _inner(value_type: ValueType) -> ValueType:
    """The type a column holds: ``optional`` is a nullable column of its argument (every
    column and field of the reader is nullable)."""
    while value_type.kind == "optional":
        value_type = value_type.args[0]
    return value_type


def spark_ddl(value_type: ValueType) -> str:
    """The Spark DDL type of a value of ``value_type`` (struct field names quoted)."""
    value_type = _inner(value_type)
    if value_type.kind in _SCALARS:
        return _SCALARS[value_type.kind][0]
    if value_type.kind == "list":
        return f"array<{spark_ddl(value_type.args[0])}>"
    if value_type.kind == "map":
        return f"map<{spark_ddl(value_type.args[0])}, {spark_ddl(value_type.args[1])}>"
    fields = ", ".join(f"`{_quoted(f.name)}`: {spark_ddl(f.type)}" for f in value_type.fields)
    return f"struct<{fields}>"


def _quoted(name: str) -> str:
    return name.replace("`", "``")


def arrow_type(value_type: ValueType) -> pa.DataType:
    """The Arrow type PySpark gives :func:`spark_ddl`'s Spark type."""
    value_type = _inner(value_type)
    if value_type.kind in _SCALARS:
        return _SCALARS[value_type.kind][1]
    if value_type.kind == "list":
        return pa.list_(pa.field("element", arrow_type(value_type.args[0])))
    if value_type.kind == "map":
        return pa.map_(arrow_type(value_type.args[0]), arrow_type(value_type.args[1]))
    return pa.struct([pa.field(f.name, arrow_type(f.type)) for f in value_type.fields])


class TypedValueColumns:
    """``value`` of the stored schema's type and ``value_bytes`` (the stored bytes)."""

    def __init__(self, schema: ValueType, prefix: str = "value") -> None:
        self.schema = schema
        self.type = arrow_type(schema)
        self.fields = [(prefix, spark_ddl(schema)), (f"{prefix}_bytes", "binary")]

    def arrays(
        self, values: Sequence[Any], value_bytes: Sequence[bytes] | pa.Array
    ) -> list[pa.Array]:
        stored = value_bytes if isinstance(value_bytes, pa.Array) else pa.array(value_bytes)
        return [pa.array(values, self.type), stored.cast(pa.binary())]
