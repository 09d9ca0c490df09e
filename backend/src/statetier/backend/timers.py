"""Timers: Flink's ``TimerService`` for keyed functions, kept as keyed state.

A function registers a timer for the *current key* at a timestamp, in event time (fires once the
watermark reaches it) or processing time (fires once the processing time reaches it). When it
fires, the runtime makes the timer's key current and calls ``on_timer(timestamp, key, context)``,
so the key's state is in scope and the function may emit output and register more timers.

As in Flink, timers are state: each domain is one keyed state (``EVENT_TIMER_STATE``,
``PROCESSING_TIMER_STATE``) holding, per key, its timestamps (checkpointed as a sorted list;
on the heap one timestamp is a bare int, see :class:`_Stamps`). They therefore
spill, checkpoint (incrementally: registering a timer touches its key), restore and rescale with
their key groups, and a timer registered twice for one key and timestamp is one timer. The
firing order (timestamp, key group, key bytes: deterministic at any parallelism) comes from a
heap over the keys with timers (``_TimerQueue``), rebuilt from the state on restore; it is an
index only, which is lazy: moving a key's timer later writes the state, not the heap.

Time is given to the service by the runtime (:meth:`TimerService.advance`), never read by it:
the watermark starts at ``MIN_WATERMARK`` and both clocks only move forward.
"""

from __future__ import annotations

import bisect
import enum
import heapq
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.keyed_backend import (
    EVENT_TIMER_STATE,
    PROCESSING_TIMER_STATE,
    KeyedStateBackend,
)
from statetier.backend.keygroups import UPPER_BOUND_MAX_PARALLELISM
from statetier.backend.serializers import MsgpackSerializer, Serializer

__all__ = ["MAX_WATERMARK", "MIN_WATERMARK", "TimeDomain", "TimerService"]

MIN_WATERMARK = -(1 << 63)  # Flink's Long.MIN_VALUE: no event time has passed yet
MAX_WATERMARK = (1 << 63) - 1  # end of input: every event-time timer is due
_COMPACT_SLACK = 1024  # stale heap entries tolerated beyond two per key with timers
# a heap entry is ``timestamp << _KG_BITS | key group``: every key group below the largest max
# parallelism fits in the low bits, so the ints order as (timestamp, key group) pairs do
_KG_BITS = (UPPER_BOUND_MAX_PARALLELISM - 1).bit_length()
_KG_MASK = (1 << _KG_BITS) - 1


class TimeDomain(enum.Enum):
    """Which clock a timer follows (Flink's ``TimeDomain``)."""

    EVENT_TIME = "event-time"
    PROCESSING_TIME = "processing-time"


# what fires a timer: the function's ``on_timer(timestamp, key, context)``, returning its output
OnTimer = Callable[[int, Any, Any], Iterable[Any] | None]


def _check_timestamp(timestamp: object) -> int:
    """``timestamp``, if it is a timer timestamp; else a TypeError naming it."""
    if type(timestamp) is not int or not MIN_WATERMARK <= timestamp <= MAX_WATERMARK:
        raise TypeError(
            f"a timer timestamp is an int of milliseconds (64-bit), got "
            f"{type(timestamp).__name__} {timestamp!r}"
        )
    return timestamp


def _key_encoder(serializer: Serializer) -> Callable[[Any], bytes]:
    """What makes a key's bytes for the heap: the default serializer's packer called directly
    (a fifth of ``dumps``, which finds its thread's packer on every call). A queue is used by
    one thread at a time (its instance's), as that packer must be; the keys were hashed when
    they became current, so they are ones it can write."""
    if isinstance(serializer, MsgpackSerializer):
        return serializer.direct_codec()[0]
    return serializer.dumps


def _listed(stamps: int | list[int]) -> list[int]:
    """A key's stored timestamps (:class:`_Stamps`) as their sorted list (not a copy)."""
    return [stamps] if isinstance(stamps, int) else stamps


def _stored(stamps: list[int]) -> int | list[int]:
    """The stored form of a key's sorted, non-empty timestamps: one is a bare int."""
    return stamps[0] if len(stamps) == 1 else stamps


class _Stamps:
    """The serializer of the timer states: a key's timestamps, written as the sorted list of
    them that checkpoints have always held (id ``msgpack``: readers, compaction and older
    checkpoints see no change), kept on the heap as a bare int when there is one.

    Most keys with timers have one (a session's, a dedup's expiry), and a function that moves
    it on every record then writes an int to the key's dict entry: no list to allocate, fill
    and follow through two pointers to the timestamp, per register, delete and firing."""

    id = MsgpackSerializer.id

    def __init__(self) -> None:
        self._msgpack = MsgpackSerializer()

    def dumps(self, stamps: int | list[int]) -> bytes:
        return self._msgpack.dumps(_listed(stamps))

    def loads(self, data: bytes) -> int | list[int]:
        return _stored(self._msgpack.loads(data))

    def bulk_dumps(self) -> Callable[[Any], bytes]:
        """The default serializer's bulk ``dumps`` of the stored lists (see serializers)."""
        pack = self._msgpack.bulk_dumps()
        return lambda stamps: pack(_listed(stamps))


class _TimerQueue:
    """The timers of one domain: their keyed state (created on first use) and a heap over keys.
    The event-time queue is the :class:`TimerService` itself (see there why).

    The state is the truth: per key, its timestamp, or the sorted list of its timestamps when it
    has several (:class:`_Stamps`). The heap orders the keys, not the timers: it holds, for
    every key with timers, an entry at or before the key's earliest timer, its *bound*
    (``_bound[key]``, the timestamp of that entry). A timer at or after the bound is only
    written to the state; a function that moves its key's timer later on every record (a
    session) writes a dict entry per record and leaves the heap alone. When the bound's entry
    comes up, the key's earliest timer fires if it is the entry's timestamp; else (the timer was
    moved or deleted) the entry is pushed again at the earliest timer, or dropped with the bound
    when the key has none left. Entries that are not their key's bound (an earlier timer was
    registered since) are dropped when they come up, and the heap is rebuilt from the state when
    it grows past two entries per key with timers (below).

    The order is (timestamp, key group, key bytes), and every key's entry is at or before its
    earliest timer, so a timer fires exactly when it is the smallest of all by that order: the
    same order as a heap holding every timer. The heap holds ints, ``timestamp << 15 | key
    group`` (a *when*), each once, and ``_keys[when]`` the key of the entry there, or the list
    of keys in key-bytes order when several keys of a key group share the timestamp (a key is
    never a list: lists are not hashable). Ints compare in one step where a tuple of timestamp,
    key group and key bytes took several, and an entry allocates no container the garbage
    collector has to follow; key bytes are made only to order keys that share a *when*.

    Registering and deleting keep no count: the heap is checked against the state only when it
    grows (:meth:`_push`), and rebuilt once it holds more than two entries per key with timers
    (plus ``_COMPACT_SLACK``), which bounds the stale entries a key leaves by moving its timer
    earlier again and again. Entries of keys whose timers were deleted stay until they come up
    or the next rebuild; :attr:`live` counts the timers from the state when asked.
    """

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        self._backend = backend
        self._ctx = backend.context
        self._first = backend.key_groups.start
        self._name = name
        self._maps: list[MutableMapping[Any, Any]] | None = None
        self._heap: list[int] = []
        self._keys: dict[int, Any] = {}
        self._bound: dict[Any, int] = {}
        self._key_bytes = _key_encoder(backend.key_serializer)
        self._limit = _COMPACT_SLACK  # the heap's size that makes _push look at the state
        if name in backend.restored or name in backend.tables:
            self._state_maps()  # restored timers: register the state and index them now

    def _state_maps(self) -> list[MutableMapping[Any, Any]]:
        if self._maps is None:
            descriptor = ValueStateDescriptor[Any](self._name, serializer=_Stamps())
            self._backend.register_internal_state(descriptor)
            self._maps = self._backend.tables[self._name].maps
            self._rebuild()
        return self._maps

    def _rebuild(self) -> None:
        """The heap from the state: one entry per key with timers, at its earliest (after a
        restore, or to drop stale entries). In place: a firing loop in progress (``on_timer``
        deleted the timer that made the heap mostly stale) goes on with the new entries."""
        assert self._maps is not None
        keys: dict[int, Any] = {}
        bound: dict[Any, int] = {}
        for slot in range(len(self._backend.key_groups)):
            key_group = self._first + slot
            for key, stamps in self._maps[slot].items():
                listed = _listed(stamps)
                earliest = listed[0]
                when = earliest << _KG_BITS | key_group
                there = keys.get(when)
                if there is None:
                    keys[when] = key
                elif type(there) is list:
                    there.append(key)
                else:
                    keys[when] = [there, key]
                bound[key] = earliest
        for there in keys.values():
            if type(there) is list:
                there.sort(key=self._key_bytes)
        self._heap[:] = keys
        heapq.heapify(self._heap)
        self._keys.clear()
        self._keys.update(keys)
        self._bound.clear()
        self._bound.update(bound)
        self._limit = 2 * len(bound) + _COMPACT_SLACK

    def _register(self, timestamp: int) -> None:
        """Fire ``on_timer`` for the current key once this queue's time reaches ``timestamp``
        (a key's timer at a timestamp is one timer, however often it is registered)."""
        if type(timestamp) is not int or timestamp > MAX_WATERMARK:
            _check_timestamp(timestamp)
        maps = self._maps or self._state_maps()
        ctx = self._ctx
        key = ctx.key
        kg_map = maps[ctx.index]  # the last slot raises NoCurrentKeyError: no key is current
        bound = self._bound.get(key)
        if bound is not None and bound <= timestamp:
            # at or after the key's bound, so not below MIN_WATERMARK: a write to the state only
            # (a session's moved timer: deleted, then registered later, is stored here)
            stamps = kg_map.setdefault(key, timestamp)
            if stamps is not timestamp:
                self._add(kg_map, key, stamps, timestamp)
            return
        # the key's new bound: checked, stored, pushed
        if timestamp < MIN_WATERMARK:
            _check_timestamp(timestamp)
        stamps = kg_map.setdefault(key, timestamp)
        if stamps is not timestamp and not self._add(kg_map, key, stamps, timestamp):
            return
        key_group = self._first + ctx.index
        when = timestamp << _KG_BITS | key_group
        keys = self._keys
        if when in keys:  # another key of the key group has a timer then: ordered with it
            self._push(timestamp, key_group, key)
            return
        keys[when] = key  # _push's usual case, without its call
        heap = self._heap
        heapq.heappush(heap, when)
        if len(heap) > self._limit:
            self._compact()
        self._bound[key] = timestamp

    @staticmethod
    def _add(
        kg_map: MutableMapping[Any, Any], key: Any, stamps: int | list[int], timestamp: int
    ) -> bool:
        """Add ``timestamp`` to ``key``'s stored timers ``stamps``; False if it is one of them
        (one timer per key and timestamp)."""
        if isinstance(stamps, int):
            if stamps == timestamp:
                return False
            kg_map[key] = [stamps, timestamp] if stamps < timestamp else [timestamp, stamps]
            return True
        if timestamp in stamps:
            return False
        bisect.insort(stamps, timestamp)
        kg_map[key] = stamps  # a spilled map must see the write
        return True

    def _push(self, timestamp: int, key_group: int, key: Any) -> None:
        """Make ``timestamp`` ``key``'s bound: an entry for it in the heap. Its usual case (no
        other key's entry at that *when*) is written out in :meth:`_register` and :meth:`_fire`
        too: a session pushes about once per click, and the call cost more than the push."""
        when = timestamp << _KG_BITS | key_group
        keys = self._keys
        there = keys.get(when)
        if there is None:
            keys[when] = key
            heap = self._heap
            heapq.heappush(heap, when)
            if len(heap) > self._limit:
                self._compact()
        elif type(there) is list:
            bisect.insort(there, key, key=self._key_bytes)
        else:
            keys[when] = sorted((there, key), key=self._key_bytes)
        self._bound[key] = timestamp

    def _compact(self) -> None:
        """Rebuild the heap if it holds more than two entries per key with timers (plus the
        slack); else look again once it does by the count of now. Counting costs a ``len`` per
        key group, a rebuild a pass over the keys: after one, the heap has to grow by more than
        the slack again before the next."""
        with_timers = self._backend.tables[self._name].entry_count()
        self._limit = 2 * with_timers + _COMPACT_SLACK
        if len(self._heap) > self._limit:
            self._rebuild()  # mostly stale entries: index the live timers only

    def _pop_first(self, when: int) -> Any:
        """Remove and return the first key of the entry ``when``, the heap's top."""
        there = self._keys.pop(when)
        if type(there) is list:
            return self._first_of(when, there)
        heapq.heappop(self._heap)
        return there

    def _first_of(self, when: int, keys: list[Any]) -> Any:
        """The first of the ``keys`` that share the entry ``when`` (taken out of ``_keys``),
        whose others stay in it."""
        key = keys.pop(0)
        self._keys[when] = keys if len(keys) > 1 else keys[0]
        return key

    def _delete(self, timestamp: int) -> None:
        """Remove the current key's timer at ``timestamp`` from this queue (none: no error)."""
        maps = self._maps
        if maps is not None:
            ctx = self._ctx
            kg_map = maps[ctx.index]  # the last slot raises NoCurrentKeyError: no key is current
            key = ctx.key
            stamps = kg_map.get(key)
            # the key's one timer (a session's): no other check needed, since a stored timestamp
            # was checked when it was registered and an int equal to it is one too
            if stamps == timestamp and type(timestamp) is int:
                del kg_map[key]
                return
        self._delete_other(timestamp)

    def _delete_other(self, timestamp: int) -> None:
        """What :meth:`_delete` does in every case but the key's one timer: the timestamp is
        checked, then one of the key's several timers removed, or nothing."""
        _check_timestamp(timestamp)
        ctx = self._ctx
        maps = self._maps
        if maps is None:  # no timer yet (the key is still checked)
            ctx.require_key()
            return
        kg_map = maps[ctx.index]
        stamps = kg_map.get(ctx.key)
        if type(stamps) is list and timestamp in stamps:
            stamps.remove(timestamp)
            kg_map[ctx.key] = _stored(stamps)

    def _fire(self, time: int, on_timer: OnTimer, context: Any, out: list[Any]) -> None:
        """Pop the timers at or before ``time`` in order and call ``on_timer(timestamp, key,
        context)`` for each with its key made current, adding what it returns to ``out``.

        Timers that ``on_timer`` registers are seen by the same loop when due, as in Flink's
        ``advanceWatermark``. Entries passed on the way are pushed again at their key's earliest
        timer, or dropped (not their key's bound, or the key has no timers left). The loop calls
        the function itself: a generator's resume and a tuple per timer cost a tenth of a
        firing, and a session fires a timer for about every other click.
        """
        if self._maps is None:
            return
        maps, bound, first, backend = self._maps, self._bound, self._first, self._backend
        heap, keys, ctx = self._heap, self._keys, self._ctx
        heappop, heappush = heapq.heappop, heapq.heappush
        log = backend.plain_change_log()  # not None: a key is made current here, in three stores
        last = time << _KG_BITS | _KG_MASK  # the last when at or before time
        while heap:
            when = heap[0]
            if when > last:
                break
            key = keys.pop(when)  # _pop_first, without a call per entry
            if type(key) is list:  # several keys share the entry
                key = self._first_of(when, key)
            else:
                heappop(heap)
            timestamp = when >> _KG_BITS
            if bound.get(key) != timestamp:
                continue  # an earlier entry of the key is its bound
            key_group = when & _KG_MASK
            slot = key_group - first
            kg_map = maps[slot]
            stamps = kg_map.get(key)
            if stamps is None:
                del bound[key]
                continue
            earliest = stamps if type(stamps) is int else stamps[0]
            if earliest != timestamp:  # moved later: the entry goes to its earliest timer
                when = earliest << _KG_BITS | key_group
                if when in keys:  # another key's entry is there: ordered with it
                    self._push(earliest, key_group, key)
                    continue
                keys[when] = key  # _push's usual case, without its call (or the size check:
                heappush(heap, when)  # the heap lost the entry this one replaces)
                bound[key] = earliest
                continue
            if log is not None and not ctx.per_record_work:  # set_current_key's plain path
                ctx.index = slot
                ctx.key = key
                log[key] = slot  # the change is logged
            else:
                kg_map, stamps = self._make_current(key, slot)
            if type(stamps) is int:
                del kg_map[key]
                del bound[key]
            else:
                self._drop_earliest(kg_map, key, stamps, key_group)
            result = on_timer(timestamp, key, context)
            if result:  # None or empty: nothing; a generator (true) runs only now
                out.extend(result)

    def _make_current(self, key: Any, slot: int) -> tuple[MutableMapping[Any, Any], Any]:
        """Make ``key`` current through the backend (per-record hooks or spill counting run;
        the change is logged), for :meth:`_fire`: its key group's timer map and its stored
        timestamps, read again (making it current may have moved the key group)."""
        self._backend.set_current_key(key)
        assert self._maps is not None
        kg_map = self._maps[slot]
        return kg_map, kg_map[key]

    def _drop_earliest(
        self, kg_map: MutableMapping[Any, Any], key: Any, stamps: list[int], key_group: int
    ) -> None:
        """Remove the earliest of ``key``'s several timers (firing), and push its next."""
        del stamps[0]
        kg_map[key] = _stored(stamps)
        self._push(stamps[0], key_group, key)

    def _earliest(self) -> int | None:
        """The earliest live timer's timestamp (None: no timer). Entries on top that are not
        at their key's earliest timer are moved or dropped on the way."""
        if self._maps is None:
            return None
        heap, keys, maps = self._heap, self._keys, self._maps
        bound, first = self._bound, self._first
        while heap:
            when = heap[0]
            there = keys[when]
            key = there[0] if type(there) is list else there
            timestamp, key_group = when >> _KG_BITS, when & _KG_MASK
            if bound.get(key) == timestamp:
                stamps = maps[key_group - first].get(key)
                earliest = stamps if stamps is None or type(stamps) is int else stamps[0]
                if earliest == timestamp:
                    return timestamp
                self._pop_first(when)
                if earliest is not None:
                    self._push(earliest, key_group, key)
                else:
                    del bound[key]
            else:
                self._pop_first(when)
        return None

    @property
    def _live(self) -> int:
        """The live timers, counted from the state (for tests and tools: it reads every key)."""
        if self._maps is None:
            return 0
        return sum(
            1 if type(stamps) is int else len(stamps)
            for slot in range(len(self._backend.key_groups))
            for stamps in self._maps[slot].values()
        )

    def _timers_of_current_key(self) -> list[int]:
        ctx = self._ctx
        ctx.require_key()
        if self._maps is None:
            return []
        stamps = self._maps[ctx.index].get(ctx.key)
        return [] if stamps is None else list(_listed(stamps))


class TimerService(_TimerQueue):
    """Timers and time of one function instance (Flink's ``TimerService``).

    Functions reach it as ``context.timer_service``; registering and deleting act on the current
    key. The runtime moves time with :meth:`advance` and fires with :meth:`fire`.

    The service is its event-time queue, and holds the processing-time one. A session or a
    dedup with expiry registers and deletes an event-time timer on every record: as functions
    of this class, ``register_event_time_timer`` and ``delete_event_time_timer`` are looked up
    once per call site (CPython caches a class's function and calls it directly), where a
    queue's bound method kept in an attribute was looked up by name on every call (1.1% of a
    session's instructions per click). The processing-time methods are the other queue's,
    bound in ``__init__``: one call each too.
    """

    def __init__(self, backend: KeyedStateBackend, processing_time: int) -> None:
        super().__init__(backend, EVENT_TIMER_STATE)
        self._processing = _TimerQueue(backend, PROCESSING_TIMER_STATE)
        self.register_processing_time_timer = self._processing._register  # type: ignore[method-assign]
        self.delete_processing_time_timer = self._processing._delete  # type: ignore[method-assign]
        self._watermark = MIN_WATERMARK
        self._processing_time = processing_time

    # ------------------------------------------------------------------ what functions call

    def current_watermark(self) -> int:
        """The event time reached: event-time timers at or before it have fired or are firing."""
        return self._watermark

    def current_processing_time(self) -> int:
        """The processing time (ms) the runtime last set: the epoch's clock."""
        return self._processing_time

    # What functions call on every record: each checks the timestamp itself, one call per timer
    # operation. The event-time ones are this queue's own; __init__ replaces the others by the
    # processing-time queue's.

    register_event_time_timer = _TimerQueue._register
    delete_event_time_timer = _TimerQueue._delete

    def register_processing_time_timer(self, timestamp: int) -> None:
        """Fire ``on_timer`` for the current key once processing time reaches ``timestamp``."""
        self._processing._register(timestamp)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        """Remove the current key's processing-time timer at ``timestamp`` (none: no error)."""
        self._processing._delete(timestamp)

    def timers(self, domain: TimeDomain) -> list[int]:
        """The current key's timers in ``domain``, ascending (for tests and tools)."""
        return self._queue(domain)._timers_of_current_key()

    # ------------------------------------------------------------------ what the runtime calls

    def _queue(self, domain: TimeDomain) -> _TimerQueue:
        return self if domain is TimeDomain.EVENT_TIME else self._processing

    def advance(self, watermark: int | None, processing_time: int | None) -> None:
        """Move time forward; a smaller value than the current one is ignored (time never goes
        back, as Flink forwards only increasing watermarks); None leaves a clock unchanged."""
        if watermark is not None and _check_timestamp(watermark) > self._watermark:
            self._watermark = watermark
        if processing_time is not None and _check_timestamp(processing_time) > (
            self._processing_time
        ):
            self._processing_time = processing_time

    def fire(self, domain: TimeDomain, on_timer: OnTimer, context: Any) -> list[Any]:
        """Fire the timers of ``domain`` due at the current time, in timestamp order: each is
        removed, its key made current in the keyed backend, and ``on_timer(timestamp, key,
        context)`` called; what the calls return, in order."""
        time = self._watermark if domain is TimeDomain.EVENT_TIME else self._processing_time
        out: list[Any] = []
        self._queue(domain)._fire(time, on_timer, context, out)
        return out

    def earliest(self, domain: TimeDomain) -> int | None:
        """When the next timer of ``domain`` is due (None: none is set): what a runtime that
        moves time only when asked needs to know to ask in time (see spark.wakeups)."""
        return self._queue(domain)._earliest()

    def count(self, domain: TimeDomain) -> int:
        """Live timers of ``domain`` in this instance."""
        return self._queue(domain)._live
