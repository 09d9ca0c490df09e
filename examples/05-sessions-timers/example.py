"""Event-time sessions with timers: each session is emitted once, when the watermark passes its
last event by the gap, across a restart at another parallelism; checked against an oracle.

Runs on the local runner; examples/06-spark-sessions runs the same function on Spark.
"""

from __future__ import annotations

import random
import sys
import tempfile
from typing import Any

from statetier.backend import (
    KeyedProcessFunction,
    LocalRunner,
    RuntimeContext,
    ValueStateDescriptor,
)

GAP = 30_000  # a session ends after 30 s of event time without a click
Session = tuple[str, int, int, int]  # user, first click, last click, clicks


class Sessions(KeyedProcessFunction[str, int, Session]):
    def open(self, context: RuntimeContext) -> None:
        self.session = context.get_state(ValueStateDescriptor[list[int]]("session"))

    def process(self, key: str, value: int, context: RuntimeContext) -> list[Session]:
        timers = context.timer_service
        session, out = self.session.value(), []
        if session is not None:
            timers.delete_event_time_timer(session[1] + GAP)
            if value - session[1] >= GAP:  # over, though the watermark has not reached it yet
                out.append((key, *session))
                session = None
        start, end, clicks = session or (value, value, 0)
        self.session.update([min(start, value), max(end, value), clicks + 1])
        timers.register_event_time_timer(max(end, value) + GAP)
        return out

    def on_timer(self, timestamp: int, key: str, context: RuntimeContext) -> list[Session]:
        start, end, clicks = self.session.value() or (0, 0, 0)
        self.session.clear()
        return [(key, start, end, clicks)]


def clicks(seed: int = 7) -> list[tuple[str, int]]:
    """Clicks in time order: users click every few seconds, with pauses longer than the gap."""
    rng = random.Random(seed)
    events = []
    for user in [f"user-{i}" for i in range(20)]:
        t = rng.randrange(60_000)
        for _ in range(rng.randrange(5, 40)):
            t += rng.choice([1_000, 4_000, 9_000, 45_000, 120_000])
            events.append((user, t))
    return sorted(events, key=lambda e: e[1])


def oracle(events: list[tuple[str, int]]) -> list[Session]:
    by_user: dict[str, list[int]] = {}
    for user, t in events:
        by_user.setdefault(user, []).append(t)
    sessions = []
    for user, times in by_user.items():
        start = end = times[0]
        count = 0
        for t in times:
            if t - end >= GAP:
                sessions.append((user, start, end, count))
                start, count = t, 0
            end = t
            count += 1
        sessions.append((user, start, end, count))
    return sorted(sessions)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="statetier-sessions-") as checkpoints:
        return run(f"file://{checkpoints}")


def run(uri: str) -> int:
    events = clicks()
    batches = [events[i : i + 8] for i in range(0, len(events), 8)]
    out: list[Any] = []
    runner = LocalRunner(Sessions, parallelism=2, checkpoint_uri=uri)
    seen = 0
    for n, batch in enumerate(batches):
        if n == len(batches) // 2:  # stop and restart from the last checkpoint, 3 instances
            runner.close()
            runner = LocalRunner(Sessions, parallelism=3, checkpoint_uri=uri)
        # the watermark: the latest click seen before this batch (clicks come in time order)
        watermark = events[seen - 1][1] if seen else None
        out.extend(runner.run_epoch(batch, watermark=watermark))
        seen += len(batch)
    out.extend(runner.end_of_input())
    runner.close()
    expected = oracle(events)
    assert sorted(out) == expected, "sessions differ from the oracle"
    print(f"{len(events)} clicks -> {len(out)} sessions, each emitted once at its gap timeout")
    print(f"restarted at batch {len(batches) // 2} of {len(batches)} with 3 instances instead of 2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
