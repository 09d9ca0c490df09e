"""Time in a Spark task: the timers a micro-batch fires around its records.

The driver puts the epoch's time in the task header (an ``EpochTime``, see ``epoch_time``); the
state host moves the range's instance to it before the records (the timers the watermark made
due fire first, as in Flink) and again after them (timers the records set for a time already
reached), then, in a batch run that asks for it, fires every event-time timer. The header is the
same for every attempt of the task, so a retried task fires the same timers from the same
restored state.
"""

from __future__ import annotations

from typing import Any

from statetier.backend.runtime import FunctionInstance
from statetier.backend.spark.messages import EpochTime
from statetier.backend.timers import MAX_WATERMARK
from statetier.backend.ttl import SystemClock

__all__ = ["EpochClock", "timers_after", "timers_before"]


class EpochClock:
    """A hosted range's clock: the processing time of the epoch it is serving.

    Timers and TTL of the range read it, so a retried task sees the same time as the attempt
    it replaces (never the host's wall clock, which differs per attempt and per executor).
    """

    def __init__(self, start: int | None) -> None:
        self._now: int = SystemClock().now_ms() if start is None else start

    def now_ms(self) -> int:
        return self._now

    def move_to(self, now_ms: int | None) -> None:
        if now_ms is not None and now_ms > self._now:  # time only moves forward
            self._now = now_ms


def timers_before(instance: FunctionInstance, time: EpochTime) -> list[Any]:
    """Move to the epoch's time and fire what is due: the outputs of ``on_timer``."""
    if isinstance(instance.clock, EpochClock):
        instance.clock.move_to(time.processing_time)
    return instance.advance_time(time.watermark, time.processing_time)


def timers_after(instance: FunctionInstance, time: EpochTime) -> list[Any]:
    """After the records: fire the timers they set at or before the epoch's time, then (at the
    end of a batch run's input) every event-time timer."""
    out = instance.advance_time(time.watermark, time.processing_time)
    if time.end_of_input:  # the batch's last watermark (processing time unchanged)
        out += instance.advance_time(MAX_WATERMARK, time.processing_time)
    return out
