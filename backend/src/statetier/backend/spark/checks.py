"""Two user mistakes caught where they are made, with a message that says what to do.

- A key column of a type Spark hashes unlike Python (``int``: Spark hashes it as 4 bytes, a
  Python int as 8) would put a key into one key group on the driver's side and look for it in
  another on the host's: found at plan time, with the cast that fixes it.
- A function that returns rows of another width than the output schema failed deep in the
  conversion to Arrow (``zip() argument 2 is longer than argument 1``): named with the row and
  the schema's columns.

Plain Python on purpose: the state hosts import it without Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["KEY_TYPES", "OutputWidthError", "check_key_columns", "check_output_rows"]

# Spark SQL type names (DataType.simpleString) whose xxhash64 Python computes the same way.
KEY_TYPES = {"string": "str", "bigint": "int", "binary": "bytes"}
# Integer types that become keys after a cast to bigint.
_NARROW_INTEGERS = {"tinyint", "smallint", "int"}


class OutputWidthError(ValueError):
    """A function returned a row whose width is not the output schema's."""


def check_key_columns(fields: Sequence[tuple[str, str]], key_columns: Sequence[str]) -> None:
    """Refuse key columns that are missing or of a type statetier cannot key by.

    ``fields`` are the input's ``(name, simpleString type)`` pairs, e.g. from
    ``[(f.name, f.dataType.simpleString()) for f in df.schema.fields]``.
    """
    types = dict(fields)
    for column in key_columns:
        if column not in types:
            known = ", ".join(name for name, _ in fields)
            raise ValueError(f"key column {column!r} is not in the input; its columns: {known}")
        kind = types[column]
        if kind in KEY_TYPES:
            continue
        if kind in _NARROW_INTEGERS:
            raise ValueError(
                f"key column {column!r} is {kind}: cast it to BIGINT, e.g. "
                f"df.withColumn({column!r}, df[{column!r}].cast('bigint')) (Spark hashes {kind} "
                "as 4 bytes, statetier hashes integers as 8, so the key groups would disagree)"
            )
        allowed = ", ".join(KEY_TYPES)
        raise ValueError(
            f"key column {column!r} is {kind}: keys must be {allowed} (cast it, e.g. to string)"
        )


def check_output_rows(rows: Sequence[Any], names: Sequence[str]) -> None:
    """Refuse output rows (tuples in schema order) whose width is not ``len(names)``."""
    width = len(names)
    for row in rows:
        if isinstance(row, dict):
            continue
        try:
            size = len(row)
        except TypeError:
            size = -1
        if size != width:
            shown = repr(row)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            got = f"{size} values" if size >= 0 else f"a {type(row).__name__}, not a tuple"
            raise OutputWidthError(
                f"the function returned the row {shown} ({got}) for an output schema of "
                f"{width} columns ({', '.join(names)}): return tuples of {width} values in that "
                "order, or dicts keyed by column name"
            )
