"""The statetier function of the Spark word-count benchmark and demo (imported by state hosts).

It is the word count a user would write for speed: one vectorized pass over the whole range
(``process_range``: one Arrow ``group_by``, one state update per distinct word, the output built
as Arrow columns). It declares no :class:`~statetier.backend.spark.functions.Combiner`: measured
on this benchmark (one input partition per micro-batch, 2 cores), pre-aggregating before the
exchange (``map_side=True``) or in Spark SQL after it cost more than it saved (docs/spark.md).
"""

from __future__ import annotations

from operator import add
from typing import Any

import pyarrow as pa
from statetier.backend.descriptors import ReducingStateDescriptor, ValueStateDescriptor
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.spark.functions import KEY_GROUP_COLUMN, KeyGroupFunction

__all__ = [
    "BUSY_LOOPS",
    "SESSION_GAP_MS",
    "ArrowSessions",
    "ArrowWordCount",
    "BusyWordCount",
    "Sessions",
]

SESSION_GAP_MS = 30_000  # sessions benchmark: a session ends after 30 s without a click
BUSY_LOOPS = 800  # spark-slots benchmark: about 30 us of Python per record on a 2020s core


class ArrowWordCount(KeyGroupFunction):
    """Adds each word's count of the epoch to its state, one add per distinct word; emits the
    updated counts (as Spark's update mode does). The words' counts and key groups come from one
    Arrow ``group_by``; the counts are a reducing state (a sum), added to for all the words at
    once (``add_each`` over a ``KeyBatch`` built from the pipeline's key-group column: no word
    is hashed again, and each word's entry is read and written in one step)."""

    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(ReducingStateDescriptor[int]("count", reduce_function=add))

    def process_range(self, records: Any, context: RuntimeContext) -> pa.Table:
        counts = (
            records.group_by([KEY_GROUP_COLUMN, "word"], use_threads=False)
            .aggregate([("word", "count")])
            .sort_by(KEY_GROUP_COLUMN)  # key group by key group: each one's map stays in cache
        )
        words = counts["word"]
        batch = context.key_batch(words, counts[KEY_GROUP_COLUMN])
        totals = self.count.add_each(batch, counts["word_count"])
        return pa.table({"word": words, "count": pa.array(totals, pa.int64())})


class Sessions(KeyedProcessFunction[str, int, tuple[str, int, int, int]]):
    """Sessionization with an event-time timer per user (``statetier bench timers``): a click
    extends the user's session and moves its timer to the last click plus the gap; the timer
    emits the session (user, first click, last click, clicks) and clears it."""

    def open(self, context: RuntimeContext) -> None:
        self.session = context.get_state(ValueStateDescriptor[list[int]]("session"))

    def process(self, key: str, value: int, context: RuntimeContext) -> list[Any]:
        timers = context.timer_service
        session, out = self.session.value(), []
        if session is not None:
            timers.delete_event_time_timer(session[1] + SESSION_GAP_MS)
            if value - session[1] >= SESSION_GAP_MS:  # over before the watermark said so
                out.append((key, *session))
                session = None
        start, end, clicks = session or (value, value, 0)
        self.session.update([min(start, value), max(end, value), clicks + 1])
        timers.register_event_time_timer(max(end, value) + SESSION_GAP_MS)
        return out

    def on_timer(self, timestamp: int, key: str, context: RuntimeContext) -> list[Any]:
        start, end, clicks = self.session.value() or (0, 0, 0)
        self.session.clear()
        return [(key, start, end, clicks)]


class ArrowSessions(KeyGroupFunction):
    """The sessions of :class:`Sessions` as a user writes them for speed: the range's clicks
    sorted by user and time with Arrow, then per user one state read, one timer move and one
    state write for all its clicks of the epoch (the same sessions: a user's clicks in time
    order, as ``Sessions`` sees them when the input is in time order)."""

    def open(self, context: RuntimeContext) -> None:
        self.session = context.get_state(ValueStateDescriptor[list[int]]("session"))

    def process_range(self, records: Any, context: RuntimeContext) -> list[Any]:
        ordered = records.sort_by([("user", "ascending"), ("ts", "ascending")])
        users, times = ordered["user"].to_pylist(), ordered["ts"].to_pylist()
        set_key, timers = context.keyed_state.set_current_key, context.timer_service
        state, gap = self.session, SESSION_GAP_MS
        out: list[Any] = []
        i, n = 0, len(users)
        while i < n:
            user = users[i]
            set_key(user)
            session = state.value()
            if session is not None:
                timers.delete_event_time_timer(session[1] + gap)
            while i < n and users[i] == user:
                t = times[i]
                if session is not None and t - session[1] >= gap:
                    out.append((user, *session))
                    session = None
                session = [t, t, 1] if session is None else [session[0], t, session[2] + 1]
                i += 1
            state.update(session)
            timers.register_event_time_timer(session[1] + gap)
        return out

    def on_timer(self, timestamp: int, key: str, context: RuntimeContext) -> list[Any]:
        start, end, clicks = self.session.value() or (0, 0, 0)
        self.session.clear()
        return [(key, start, end, clicks)]


class BusyWordCount(KeyedProcessFunction[str, None, tuple[str, int]]):
    """A per-record word count that also does :data:`BUSY_LOOPS` steps of pure Python
    arithmetic per record (``statetier bench spark-slots``): a function heavy enough that the
    state host's interpreter, one core at most, is what bounds an executor."""

    def open(self, context: RuntimeContext) -> None:
        self.count = context.get_state(ValueStateDescriptor[int]("count"))

    def process(self, key: str, value: None, context: RuntimeContext) -> list[tuple[str, int]]:
        x = len(key)
        for _ in range(BUSY_LOOPS):
            x = x * 31 % 1000003
        count = (self.count.value() or 0) + 1 + x * 0
        self.count.update(count)
        return [(key, count)]
