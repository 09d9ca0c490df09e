"""The Spark baselines of the word-count benchmark (importable by Spark's Python workers).

Kept apart from spark_functions so that the state hosts, which import that module, do not load
pandas and pyspark.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd

__all__ = ["TwsCount", "TwsSessions", "apply_count", "count_rows"]


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


class TwsSessions(_tws_base()):  # type: ignore[misc]
    """transformWithStateInPandas (event time): the sessions of ``spark_functions.Sessions``, a
    ValueState per user and a timer at the last click plus the gap."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.session = handle.getValueState("session", "start long, end long, clicks long")

    def handleInputRows(  # noqa: N802 (Spark's name)
        self,
        key: Any,
        rows: Iterator[pd.DataFrame],
        timerValues: Any,  # noqa: N803
    ) -> Iterator[pd.DataFrame]:
        from statetier.tools.bench.spark_functions import SESSION_GAP_MS

        gap = SESSION_GAP_MS
        clicks = sorted(t for frame in rows for t in frame["ts"].tolist())
        session = self.session.get() if self.session.exists() else None
        out = []
        if session is not None:
            self.handle.deleteTimer(session[1] + gap)
        for t in clicks:
            if session is not None and t - session[1] >= gap:
                out.append((key[0], *session))
                session = None
            start, end, n = session or (t, t, 0)
            session = (min(start, t), max(end, t), n + 1)
        assert session is not None
        self.session.update(session)
        self.handle.registerTimer(session[1] + gap)
        if out:
            yield pd.DataFrame(out, columns=["user", "start", "end", "clicks"])

    def handleExpiredTimer(  # noqa: N802 (Spark's name)
        self,
        key: Any,
        timerValues: Any,  # noqa: N803
        expiredTimerInfo: Any,  # noqa: N803
    ) -> Iterator[pd.DataFrame]:
        if self.session.exists():
            start, end, n = self.session.get()
            self.session.clear()
            yield pd.DataFrame(
                [(key[0], start, end, n)], columns=["user", "start", "end", "clicks"]
            )

    def close(self) -> None:
        pass
