"""Whether the executors can load the pipeline's function, asked once before its first epoch.

A function defined in a module that only the driver can import (a file beside the driver's
script, a notebook's folder) fails where the state host unpickles it: every task attempt of
every epoch, each failure a Python traceback inside Spark's Java stack, until Spark gives up.
One task that *returns* the import error instead of raising it is never retried, and tells
the driver which module to ship and how.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
from pyspark.sql import SparkSession
from statetier.backend.spark.session_kind import is_connect

__all__ = ["FunctionNotShippedError", "check_function_ships"]


class FunctionNotShippedError(ImportError):
    """The executors cannot import a module the pipeline's function needs."""


def check_function_ships(spark: SparkSession, function_bytes: bytes) -> None:
    """Unpickle the function in one task on an executor: :class:`FunctionNotShippedError`,
    in one line naming the module and how to ship it, if a module is missing there."""

    def load(rows: Iterable[object]) -> Iterator[tuple[str | None, str]]:
        # Read to the end first: a Python worker whose input was left unread cannot be
        # reused, so Spark kills it after the task and the next job starts another (a second
        # of CPU on every executor where a query starts)
        for _ in rows:
            pass
        try:
            pickle.loads(function_bytes)
        except ImportError as e:  # ModuleNotFoundError, or a name the module lacks there
            yield e.name or str(e), sys.executable
        else:
            yield None, sys.executable

    if is_connect(spark):  # no RDDs: one task of a one-row range, answering in Arrow
        missing, python = _connect_load(spark, load)
    else:
        ((missing, python),) = spark.sparkContext.parallelize([0], 1).mapPartitions(load).collect()
    if missing is None:
        return
    if missing.split(".")[0] == "statetier":
        raise FunctionNotShippedError(_not_installed(python), name=missing)
    raise FunctionNotShippedError(_message(missing), name=missing)


def _not_installed(python: str) -> str:
    """statetier itself is missing where the tasks run: no addPyFile ships an installed package
    with its native dependencies, so the fix is the executors' Python."""
    return (
        f"the executors' Python ({python}) cannot import statetier: install it there "
        "(pip install 'statetier-backend[spark]', or from a checkout "
        "pip install './backend[spark]') or set PYSPARK_PYTHON to a Python that has it"
    )


def _connect_load(
    spark: SparkSession, load: Callable[[Iterable[object]], Iterator[tuple[str | None, str]]]
) -> tuple[str | None, str]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ((missing, python),) = list(load(batches))
        row = {"missing": [missing], "python": [python]}
        yield pa.RecordBatch.from_pydict(row, schema=_MISSING)

    schema = "missing string, python string"
    (row,) = spark.range(1, numPartitions=1).mapInArrow(run, schema).collect()
    return (None if row.missing is None else str(row.missing)), str(row.python)


_MISSING = pa.schema([("missing", pa.string()), ("python", pa.string())])


def _message(module: str) -> str:
    here = getattr(sys.modules.get(module), "__file__", None)
    if here is None:
        what = "its file or a .zip of its package"
    elif here.endswith("__init__.py"):
        what = f"a .zip of its package {here.rsplit('/', 2)[0]}"
    else:
        what = repr(here)
    return (
        f"the executors cannot import module {module!r}, which the pipeline's function needs: "
        f"ship it with spark.sparkContext.addPyFile({what}) before the first epoch, "
        "spark-submit --py-files, or install it in the executors' image"
    )
