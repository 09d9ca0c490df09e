"""The guide's keyed function: a user's session ends after 30 s of event time without a click.

It has a module of its own because the state host, a Python process beside each executor,
unpickles it by name: ship this file with the job (``addPyFile``, ``--py-files`` or the image).
"""

from __future__ import annotations

from statetier.backend import KeyedProcessFunction, RuntimeContext, ValueStateDescriptor

GAP_MS = 30_000
Session = tuple[str, int, int, int]  # user, first click, last click, clicks


class Sessions(KeyedProcessFunction[str, int, Session]):
    """Key: the ``user`` column. Value: the one other column, the click's ``ts`` in ms."""

    def open(self, context: RuntimeContext) -> None:
        self.session = context.get_state(ValueStateDescriptor[list[int]]("session"))

    def process(self, user: str, ts: int, context: RuntimeContext) -> list[Session]:
        timers, out = context.timer_service, []
        session = self.session.value()  # [first, last, clicks] or None
        if session is not None:
            timers.delete_event_time_timer(session[1] + GAP_MS)
            if ts - session[1] >= GAP_MS:  # over, though the watermark has not reached it yet
                out.append((user, *session))
                session = None
        first, last, clicks = session or (ts, ts, 0)
        self.session.update([min(first, ts), max(last, ts), clicks + 1])
        timers.register_event_time_timer(max(last, ts) + GAP_MS)
        return out

    def on_timer(self, timestamp: int, user: str, context: RuntimeContext) -> list[Session]:
        first, last, clicks = self.session.value() or (0, 0, 0)
        self.session.clear()
        return [(user, first, last, clicks)]
