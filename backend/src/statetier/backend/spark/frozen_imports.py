"""Processes that serve task after task leave their imports out of garbage collections.

A full garbage collection walks every container object the process tracks, and most of them
are the modules it imported and never frees: pyspark's, pyarrow's, numpy's and statetier's,
45,000 to 50,000 objects in a Spark Python worker after a pipeline's first task (2026-12-02).
``gc.freeze()`` moves the objects alive at that moment to a generation no collection walks.
Its price: a frozen object that later dies in a reference cycle is never freed. So a process
freezes once, at a moment it holds little besides its modules:

- **Spark's Python workers.** A reused PySpark worker runs ``gc.collect()`` after every task
  (pyspark's ``daemon.py``), paid by every task of every micro-batch: in a plain interpreter a
  collection of 45,000 objects took 44 ms of CPU on a shared 2-core machine, of 79,000 (pandas
  imported too) 65 ms. A pipeline's task function is wrapped in
  :func:`leaves_imports_out_of_collections`, which freezes when the worker's first such task
  has ended: by then it imported what its tasks import, the modules Spark and pyarrow import
  lazily included, and it holds a few objects of Spark's besides. Measured on ``local[2]``,
  240 tasks (30 micro-batches of 8 ranges): the workers' CPU 18.2-18.9 s before, 8.9-11.3 s
  after.
- **The state host** freezes at its start (:func:`freeze_imports`), before it serves anything:
  later it holds ranges' state, whose cycles must stay collectable (a dropped range is freed by
  the collector). Python's own collections in the per-record path then walk the state and
  what tasks made, not the imports: the per-record sessions of ``bench timers`` in one process
  spent 1.5-2.0 us per click in the collector, 0.7-1.0 with the imports frozen.

Never the driver: freezing a user's driver or notebook would keep whatever cyclic garbage it
had at that moment.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


@functools.cache
def freeze_imports() -> None:
    """Freeze what this process tracks now, once: later collections skip it."""
    gc.freeze()


def leaves_imports_out_of_collections(
    run: Callable[[Iterator[T]], Iterator[T]],
) -> Callable[[Iterator[T]], Iterator[T]]:
    """``run`` (a ``mapInArrow`` function), freezing what its process tracks once its first
    task has ended, so that later collections skip it."""

    @functools.wraps(run)
    def frozen_after(batches: Iterator[T]) -> Iterator[T]:
        yield from run(batches)
        freeze_imports()

    return frozen_after
