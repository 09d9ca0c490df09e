"""The statetier function of the Spark word-count benchmark and demo (imported by state hosts)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.functions import RuntimeContext
from statetier.backend.spark.functions import KeyGroupFunction

__all__ = ["ArrowWordCount"]


class ArrowWordCount(KeyGroupFunction):
    """Counts each key group's words with Arrow, then one state update per distinct word;
    emits the updated counts (as Spark's update mode does)."""

    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(ValueStateDescriptor[int]("count"))

    def process_key_group(
        self, key_group: int, records: Any, context: RuntimeContext
    ) -> Iterable[tuple[str, int]]:
        counts = records.group_by("word").aggregate([("word", "count")])
        set_key = context.keyed_state.set_current_key
        value, update = self.count.value, self.count.update
        out = []
        for word, n in zip(
            counts["word"].to_pylist(), counts["word_count"].to_pylist(), strict=True
        ):
            set_key(word)
            total = (value() or 0) + n
            update(total)
            out.append((word, total))
        return out
