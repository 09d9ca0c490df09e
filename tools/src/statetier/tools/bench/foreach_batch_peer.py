"""The ``foreach_batch`` peer of ``spark-wordcount --connect``: a ``foreachBatch`` query of
statetier's shape without state, so a run shows what Spark's ``foreachBatch`` itself costs a
query on each kind of session.

Its own module, importable by Spark's Python workers and by the Connect server's
``foreachBatch`` process, and without pandas: statetier's tasks import none, and a new worker
that imported it for the peer alone would make the peer slower than what it stands for.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["count_arrow_rows", "count_batch"]


def count_arrow_rows(batches: Iterator[Any]) -> Iterator[Any]:
    """Count the rows of a task's Arrow batches (as statetier's tasks read them)."""
    import pyarrow as pa

    n = 0
    for batch in batches:
        n += batch.num_rows
    yield pa.RecordBatch.from_pydict({"n": [n]})


def count_batch(batch: Any, batch_id: int) -> None:
    """The ``foreachBatch`` function: the micro-batch read by one task (as statetier's
    ``direct`` route reads a one-file micro-batch), its rows counted in Arrow, the count
    written to the ``noop`` sink."""
    counted = batch.coalesce(1).mapInArrow(count_arrow_rows, "n long")
    counted.write.format("noop").mode("overwrite").save()
