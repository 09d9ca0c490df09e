"""The functions the Spark word-count benchmark runs (importable by workers and state hosts)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pandas as pd
from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.functions import RuntimeContext
from statetier.backend.spark.functions import KeyGroupFunction

__all__ = ["ArrowWordCount", "TwsCount", "apply_count", "count_rows"]


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


def count_rows(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """The ceiling: touch every batch, count its rows."""
    n = 0
    for frame in frames:
        n += len(frame)
    yield pd.DataFrame({"n": [n]})


def apply_count(
    key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any
) -> Iterator[pd.DataFrame]:
    """applyInPandasWithState: a running count per word."""
    count = state.get[0] if state.exists else 0
    for frame in frames:
        count += len(frame)
    state.update((count,))
    yield pd.DataFrame({"word": [key[0]], "count": [count]})


def _tws_base() -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    return StatefulProcessor


class TwsCount(_tws_base()):  # type: ignore[misc]
    """transformWithStateInPandas: a running count per word in a ValueState."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "count long")

    def handleInputRows(  # noqa: N802 (Spark's name)
        self,
        key: Any,
        rows: Iterator[pd.DataFrame],
        timerValues: Any,  # noqa: N803
    ) -> Iterator[pd.DataFrame]:
        count = self.count.get()[0] if self.count.exists() else 0
        for frame in rows:
            count += len(frame)
        self.count.update((count,))
        yield pd.DataFrame({"word": [key[0]], "count": [count]})

    def close(self) -> None:
        pass
