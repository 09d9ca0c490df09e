"""Timers: Flink's ``TimerService`` for keyed functions, kept as keyed state.

A function registers a timer for the *current key* at a timestamp, in event time (fires once the
watermark reaches it) or processing time (fires once the processing time reaches it). When it
fires, the runtime makes the timer's key current and calls ``on_timer(timestamp, key, context)``,
so the key's state is in scope and the function may emit output and register more timers.

As in Flink, timers are state: each domain is one keyed state (``EVENT_TIMER_STATE``,
``PROCESSING_TIMER_STATE``) holding, per key, the sorted list of its timestamps. They therefore
spill, checkpoint (incrementally: registering a timer touches its key), restore and rescale with
their key groups, and a timer registered twice for one key and timestamp is one timer. The
firing order comes from a heap over all timers of the instance (timestamp, key group, key bytes:
deterministic at any parallelism), rebuilt from the state on restore. The heap is an index only:
an entry whose timer was deleted (or already fired) is skipped when it comes up, and the heap is
rebuilt when such entries outnumber the live timers.

Time is given to the service by the runtime (:meth:`TimerService.advance`), never read by it:
the watermark starts at ``MIN_WATERMARK`` and both clocks only move forward.
"""

from __future__ import annotations

import bisect
import enum
import heapq
import itertools
from collections.abc import Iterator, MutableMapping
from typing import Any

from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.keyed_backend import (
    EVENT_TIMER_STATE,
    PROCESSING_TIMER_STATE,
    KeyedStateBackend,
)
from statetier.backend.serializers import MsgpackSerializer

__all__ = ["MAX_WATERMARK", "MIN_WATERMARK", "TimeDomain", "TimerService"]

MIN_WATERMARK = -(1 << 63)  # Flink's Long.MIN_VALUE: no event time has passed yet
MAX_WATERMARK = (1 << 63) - 1  # end of input: every event-time timer is due
_COMPACT_SLACK = 1024  # stale heap entries tolerated beyond the live timers


class TimeDomain(enum.Enum):
    """Which clock a timer follows (Flink's ``TimeDomain``)."""

    EVENT_TIME = "event-time"
    PROCESSING_TIME = "processing-time"


_STATE_NAMES = {
    TimeDomain.EVENT_TIME: EVENT_TIMER_STATE,
    TimeDomain.PROCESSING_TIME: PROCESSING_TIMER_STATE,
}
_HeapEntry = tuple[int, int, bytes, int, Any]  # timestamp, key group, key bytes, seq, key


def _check_timestamp(timestamp: object) -> int:
    if type(timestamp) is not int or not MIN_WATERMARK <= timestamp <= MAX_WATERMARK:
        raise TypeError(
            f"a timer timestamp is an int of milliseconds (64-bit), got "
            f"{type(timestamp).__name__} {timestamp!r}"
        )
    return timestamp


class _TimerQueue:
    """The timers of one domain: their keyed state (created on first use) and the heap index."""

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        self._backend = backend
        self._name = name
        self._maps: list[MutableMapping[Any, Any]] | None = None
        self._heap: list[_HeapEntry] = []
        self._seq = itertools.count()
        self.live = 0
        if name in backend.restored or name in backend.tables:
            self._state_maps()  # restored timers: register the state and index them now

    def _state_maps(self) -> list[MutableMapping[Any, Any]]:
        if self._maps is None:
            descriptor = ValueStateDescriptor[list[int]](self._name, serializer=MsgpackSerializer())
            self._backend.register_internal_state(descriptor)
            self._maps = self._backend.tables[self._name].maps
            self._rebuild()
        return self._maps

    def _entry(self, timestamp: int, key_group: int, key: Any) -> _HeapEntry:
        key_bytes = self._backend.key_serializer.dumps(key)
        return (timestamp, key_group, key_bytes, next(self._seq), key)

    def _rebuild(self) -> None:
        """The heap from the state: every timer once (after a restore, or to drop stale ones)."""
        assert self._maps is not None
        first = self._backend.key_groups.start
        heap: list[_HeapEntry] = []
        for slot in range(len(self._backend.key_groups)):
            for key, stamps in self._maps[slot].items():
                heap.extend(self._entry(ts, first + slot, key) for ts in stamps)
        heapq.heapify(heap)
        self._heap = heap
        self.live = len(heap)

    def register(self, timestamp: int) -> None:
        maps = self._state_maps()
        ctx = self._backend.context
        ctx.require_key()
        kg_map = maps[ctx.index]
        stamps: list[int] | None = kg_map.get(ctx.key)
        if stamps is None:
            kg_map[ctx.key] = [timestamp]
        elif timestamp in stamps:
            return  # one timer per key and timestamp
        else:
            bisect.insort(stamps, timestamp)
            kg_map[ctx.key] = stamps  # a spilled map must see the write
        self.live += 1
        key_group = self._backend.key_groups.start + ctx.index
        heapq.heappush(self._heap, self._entry(timestamp, key_group, ctx.key))

    def delete(self, timestamp: int) -> None:
        ctx = self._backend.context
        ctx.require_key()
        if self._maps is None:
            return
        removed = self._remove(self._maps[ctx.index], ctx.key, timestamp)
        if removed and len(self._heap) > 2 * self.live + _COMPACT_SLACK:
            self._rebuild()  # mostly stale entries: index the live timers only

    def _remove(self, kg_map: MutableMapping[Any, Any], key: Any, timestamp: int) -> bool:
        stamps: list[int] | None = kg_map.get(key)
        if not stamps or timestamp not in stamps:
            return False
        stamps.remove(timestamp)
        if stamps:
            kg_map[key] = stamps
        else:
            del kg_map[key]
        self.live -= 1
        return True

    def due(self, time: int) -> Iterator[tuple[int, Any]]:
        """Pop the timers at or before ``time`` in order, each with its key made current.

        A generator: timers registered while one fires (by ``on_timer``) are seen by the same
        loop when due, as in Flink's ``advanceWatermark``.
        """
        backend = self._backend
        while self._heap and self._heap[0][0] <= time:  # on_timer may rebuild the heap
            timestamp, _, _, _, key = heapq.heappop(self._heap)
            backend.set_current_key(key)  # the key's state in scope; logs the change
            assert self._maps is not None
            if self._remove(self._maps[backend.context.index], key, timestamp):
                yield timestamp, key

    def earliest(self) -> int | None:
        """The earliest live timer's timestamp (None: no timer). Stale heap entries on top (of
        deleted or fired timers) are dropped on the way: the heap is only an index."""
        while self._heap:
            timestamp, key_group, _, _, key = self._heap[0]
            assert self._maps is not None
            stamps = self._maps[key_group - self._backend.key_groups.start].get(key)
            if stamps and timestamp in stamps:
                return timestamp
            heapq.heappop(self._heap)
        return None

    def timers_of_current_key(self) -> list[int]:
        ctx = self._backend.context
        ctx.require_key()
        if self._maps is None:
            return []
        return list(self._maps[ctx.index].get(ctx.key) or ())


class TimerService:
    """Timers and time of one function instance (Flink's ``TimerService``).

    Functions reach it as ``context.timer_service``; registering and deleting act on the current
    key. The runtime moves time with :meth:`advance` and fires with :meth:`due`.
    """

    def __init__(self, backend: KeyedStateBackend, processing_time: int) -> None:
        self._queues = {domain: _TimerQueue(backend, name) for domain, name in _STATE_NAMES.items()}
        self._watermark = MIN_WATERMARK
        self._processing_time = processing_time

    # ------------------------------------------------------------------ what functions call

    def current_watermark(self) -> int:
        """The event time reached: event-time timers at or before it have fired or are firing."""
        return self._watermark

    def current_processing_time(self) -> int:
        """The processing time (ms) the runtime last set: the epoch's clock."""
        return self._processing_time

    def register_event_time_timer(self, timestamp: int) -> None:
        """Fire ``on_timer`` for the current key once the watermark reaches ``timestamp``."""
        self._queues[TimeDomain.EVENT_TIME].register(_check_timestamp(timestamp))

    def register_processing_time_timer(self, timestamp: int) -> None:
        """Fire ``on_timer`` for the current key once processing time reaches ``timestamp``."""
        self._queues[TimeDomain.PROCESSING_TIME].register(_check_timestamp(timestamp))

    def delete_event_time_timer(self, timestamp: int) -> None:
        """Remove the current key's event-time timer at ``timestamp`` (none: no error)."""
        self._queues[TimeDomain.EVENT_TIME].delete(_check_timestamp(timestamp))

    def delete_processing_time_timer(self, timestamp: int) -> None:
        """Remove the current key's processing-time timer at ``timestamp`` (none: no error)."""
        self._queues[TimeDomain.PROCESSING_TIME].delete(_check_timestamp(timestamp))

    def timers(self, domain: TimeDomain) -> list[int]:
        """The current key's timers in ``domain``, ascending (for tests and tools)."""
        return self._queues[domain].timers_of_current_key()

    # ------------------------------------------------------------------ what the runtime calls

    def advance(self, watermark: int | None, processing_time: int | None) -> None:
        """Move time forward; a smaller value than the current one is ignored (time never goes
        back, as Flink forwards only increasing watermarks); None leaves a clock unchanged."""
        if watermark is not None and _check_timestamp(watermark) > self._watermark:
            self._watermark = watermark
        if processing_time is not None and _check_timestamp(processing_time) > (
            self._processing_time
        ):
            self._processing_time = processing_time

    def due(self, domain: TimeDomain) -> Iterator[tuple[int, Any]]:
        """The timers of ``domain`` due at the current time, in timestamp order, removed as
        they are yielded, each with its key made current in the keyed backend."""
        time = self._watermark if domain is TimeDomain.EVENT_TIME else self._processing_time
        return self._queues[domain].due(time)

    def earliest(self, domain: TimeDomain) -> int | None:
        """When the next timer of ``domain`` is due (None: none is set): what a runtime that
        moves time only when asked needs to know to ask in time (see spark.wakeups)."""
        return self._queues[domain].earliest()

    def count(self, domain: TimeDomain) -> int:
        """Live timers of ``domain`` in this instance."""
        return self._queues[domain].live
