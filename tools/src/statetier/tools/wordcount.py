"""The keyed word count that the local demo and the benchmarks run through the backend.

It lives below both, so that a benchmark does not import a demo: one function, a ValueState
count per word.
"""

from __future__ import annotations

from collections.abc import Iterable

from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.state import ValueState

__all__ = ["WordCount"]


class WordCount(KeyedProcessFunction[str, int, tuple[str, int]]):
    """Counts words; emits nothing per record (the counts live in state)."""

    count: ValueState[int]

    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(ValueStateDescriptor("count"))

    def process(self, key: str, value: int, context: RuntimeContext) -> Iterable[tuple[str, int]]:
        self.count.update((self.count.value() or 0) + value)
        return ()
