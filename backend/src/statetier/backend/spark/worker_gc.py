"""Spark's Python worker collects its garbage after every task: what it imported is left out.

A reused PySpark worker runs ``gc.collect()`` after each task (pyspark's ``daemon.py``), a full
collection that walks every container object the process tracks. Most of them are the modules
the worker imported and never frees: pyspark's, pyarrow's, numpy's and statetier's, 45,000 to
50,000 objects after a pipeline's first task (2026-12-02). In a plain interpreter a collection
of 45,000 took 44 ms of CPU on a shared 2-core machine, of 79,000 (pandas imported too) 65 ms:
paid again by every task of every micro-batch.

``gc.freeze()`` moves the objects alive at that moment to a generation no collection walks, so
the collection after a task walks only what was made since. A pipeline's task function is
wrapped in :func:`leaves_imports_out_of_collections`, which freezes once per process, when the
worker's first such task has ended: by then it imported what its tasks import, the modules Spark
and pyarrow import lazily on a task's way included.

The price: a frozen object that later dies in a reference cycle is never freed. What is alive
when a worker's first task has ended is its modules and a few objects of Spark's, so this holds
back at most that task's cycles, once per worker. Measured on ``local[2]``, 240 tasks (30
micro-batches of 8 ranges): the workers' CPU 18.2-18.9 s before, 8.9-11.3 s after.

Only tasks freeze, never the driver: freezing a user's driver or notebook would keep whatever
cyclic garbage it had at that moment.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


@functools.cache
def _freeze_once() -> None:
    gc.freeze()


def leaves_imports_out_of_collections(
    run: Callable[[Iterator[T]], Iterator[T]],
) -> Callable[[Iterator[T]], Iterator[T]]:
    """``run`` (a ``mapInArrow`` function), freezing what its process tracks once its first
    task has ended, so that later collections skip it."""

    @functools.wraps(run)
    def frozen_after(batches: Iterator[T]) -> Iterator[T]:
        yield from run(batches)
        _freeze_once()

    return frozen_after
