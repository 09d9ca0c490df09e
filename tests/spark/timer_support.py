"""Timer functions of the Spark tests (importable: the state hosts unpickle them).

Records are ``(key, op, ts)``: ``op`` registers (``event``, ``proc``) or deletes (``del-event``,
``del-proc``) a timer of the key at ``ts``. Each fired timer is one output row
``(key, domain, ts, epoch, watermark)``: the epoch and the watermark it fired at.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from statetier.backend.descriptors import ValueStateDescriptor
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.spark import KeyGroupFunction, current_task
from statetier.backend.timers import TimeDomain

SCHEMA = "key string, domain string, ts bigint, epoch bigint, watermark bigint"
FIRED = ValueStateDescriptor[int]("fired")


def _apply(op: str, ts: int, context: RuntimeContext) -> None:
    timers = context.timer_service
    {
        "event": timers.register_event_time_timer,
        "proc": timers.register_processing_time_timer,
        "del-event": timers.delete_event_time_timer,
        "del-proc": timers.delete_processing_time_timer,
    }[op](ts)


def _fired(key: str, ts: int, context: RuntimeContext) -> tuple[Any, ...]:
    domain = "event" if context.time_domain is TimeDomain.EVENT_TIME else "proc"
    watermark = context.timer_service.current_watermark()
    return (key, domain, ts, current_task().epoch, watermark)


class TimerProbe(KeyedProcessFunction[str, tuple[str, int], tuple[Any, ...]]):
    """Applies each record's timer operation; emits each timer when it fires."""

    def open(self, context: RuntimeContext) -> None:
        self.fired = context.get_state(FIRED)

    def process(self, key: str, value: tuple[str, int], context: RuntimeContext) -> list[Any]:
        _apply(value[0], value[1], context)
        return []

    def on_timer(self, timestamp: int, key: str, context: RuntimeContext) -> list[Any]:
        self.fired.update((self.fired.value() or 0) + 1)  # state is in scope
        return [_fired(key, timestamp, context)]


class EventTimer(KeyedProcessFunction[str, int, tuple[Any, ...]]):
    """Records ``(key, ts)``: an event-time timer at ``ts + GAP`` (a session's end)."""

    GAP = 1_000
    fail_at: tuple[int, int] | None = None  # (epoch, partition): fails after its timers fired

    def process(self, key: str, value: int, context: RuntimeContext) -> list[Any]:
        task = current_task()
        if self.fail_at == (task.epoch, task.partition_id) and task.attempt_number == 0:
            raise RuntimeError("injected failure after the epoch's timers fired")
        context.timer_service.register_event_time_timer(value + self.GAP)
        return []

    def on_timer(self, timestamp: int, key: str, context: RuntimeContext) -> list[Any]:
        return [_fired(key, timestamp, context)]


class FailingEventTimer(EventTimer):
    fail_at = (3, 1)


class KeyGroupTimerProbe(KeyGroupFunction):
    """The per-key-group form: sets the key current, then the record's timer operation."""

    def process_key_group(self, key_group: int, records: Any, context: RuntimeContext) -> None:
        set_key = context.keyed_state.set_current_key
        for key, op, ts in zip(
            records["key"].to_pylist(),
            records["op"].to_pylist(),
            records["ts"].to_pylist(),
            strict=True,
        ):
            set_key(key)
            _apply(op, ts, context)

    def on_timer(self, timestamp: int, key: str, context: RuntimeContext) -> Iterable[Any]:
        return [_fired(key, timestamp, context)]


class ListenerProbe(KeyedProcessFunction[str, tuple[str, int], tuple[Any, ...]]):
    """Appends ``complete E`` / ``aborted E`` with its range to a file per host process."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir

    def open(self, context: RuntimeContext) -> None:
        self.range = context.index

    def process(self, key: str, value: tuple[str, int], context: RuntimeContext) -> list[Any]:
        return []

    def _log(self, what: str, epoch: int) -> None:
        with open(os.path.join(self.log_dir, f"{os.getpid()}.log"), "a") as f:
            f.write(f"{what} {epoch} {self.range}\n")

    def notify_checkpoint_complete(self, epoch: int) -> None:
        self._log("complete", epoch)

    def notify_checkpoint_aborted(self, epoch: int) -> None:
        self._log("aborted", epoch)


class DelayedTimer(KeyedProcessFunction[str, tuple[str, int], tuple[Any, ...]]):
    """Records ``(key, op, delay)``: a processing-time timer ``delay`` ms after the epoch's
    processing time (whenever the micro-batch runs); emits each timer when it fires."""

    def process(self, key: str, value: tuple[str, int], context: RuntimeContext) -> list[Any]:
        timers = context.timer_service
        timers.register_processing_time_timer(timers.current_processing_time() + value[1])
        return []

    def on_timer(self, timestamp: int, key: str, context: RuntimeContext) -> list[Any]:
        return [_fired(key, timestamp, context)]


class SilentTimer(KeyedProcessFunction[str, tuple[str, int], tuple[Any, ...]]):
    """Registers a timer per record and has no ``on_timer``: it cannot emit from its timers."""

    def process(self, key: str, value: tuple[str, int], context: RuntimeContext) -> list[Any]:
        context.timer_service.register_event_time_timer(1)
        return []
