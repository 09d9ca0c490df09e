"""Integer columns between Arrow and NumPy through their buffers.

Not ``to_numpy`` or ``pa.array``: pyarrow converts through its pandas layer, whose first use in a
process imports pandas (0.3-0.9 s of CPU, 23-36 MiB of RSS). The processes that read key-group
columns have no other use for it: a Spark worker running a statetier task (on Spark Connect, a
new one per streaming query), and a state host running a :class:`~statetier.backend.spark.
functions.KeyGroupFunction` that answers in Arrow, which paid it at its first task.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["int64_array", "int64_values"]


def int64_values(column: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.int64]:
    """The values of an integer column as one int64 array, each chunk read from its buffer at
    its offset. A chunk with nulls, or of another type, is converted by ``to_numpy`` (nulls
    become NaN), as before."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [_from_buffer(chunk) for chunk in chunks]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def _from_buffer(chunk: pa.Array) -> npt.NDArray[np.int64]:
    if chunk.null_count or not pa.types.is_integer(chunk.type):
        converted: npt.NDArray[np.int64] = chunk.to_numpy(zero_copy_only=False)
        return converted
    width = chunk.type.bit_width // 8
    dtype = np.dtype(f"{'i' if pa.types.is_signed_integer(chunk.type) else 'u'}{width}")
    values = np.frombuffer(chunk.buffers()[1], dtype, len(chunk), chunk.offset * width)
    return values.astype(np.int64, copy=False)


def int64_array(values: npt.NDArray[np.int64]) -> pa.Array:
    """An int64 NumPy array as an Arrow array over the same memory (e.g. ``take`` indices)."""
    contiguous = np.ascontiguousarray(values, np.int64)
    return pa.Array.from_buffers(pa.int64(), len(contiguous), [None, pa.py_buffer(contiguous)])
