"""The statetier function of the Spark word-count benchmark and demo (imported by state hosts).

It uses the API a user would for a count: a :class:`Combiner` (the pipeline pre-aggregates each
input partition per word before the key-group exchange, as Spark's ``groupBy().count()`` does)
and one vectorized pass over the whole range (``process_range``), building its output in Arrow.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.functions import RuntimeContext
from statetier.backend.spark.functions import Combiner, KeyGroupFunction

__all__ = ["ArrowWordCount"]


class ArrowWordCount(KeyGroupFunction):
    """Adds each word's count of the epoch to its state, one update per distinct word; emits the
    updated counts (as Spark's update mode does)."""

    combiner = Combiner({"n": ("word", "count")})

    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(ValueStateDescriptor[int]("count"))

    def process_range(self, records: Any, context: RuntimeContext) -> pa.Table:
        words = records["word"]
        set_key = context.keyed_state.set_current_key
        value, update = self.count.value, self.count.update
        totals = []
        for word, n in zip(words.to_pylist(), records["n"].to_pylist(), strict=True):
            set_key(word)
            total = (value() or 0) + n
            update(total)
            totals.append(total)
        return pa.table({"word": words, "count": pa.array(totals, pa.int64())})

    def process_key_group(self, key_group: int, records: Any, context: RuntimeContext) -> Any:
        return self.process_range(records, context)
