"""The Spark baselines of the word-count benchmark (importable by Spark's Python workers).

Kept apart from spark_functions so that the state hosts, which import that module, do not load
pandas and pyspark.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd

__all__ = ["TwsCount", "apply_count", "count_rows"]


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
