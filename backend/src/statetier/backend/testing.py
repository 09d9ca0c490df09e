"""Testing keyed functions: a clock that moves when told to, and a harness around a function.

:class:`FunctionHarness` plays the runtime for a :class:`~statetier.backend.KeyedProcessFunction`
in a unit test, as Flink's ``KeyedOneInputStreamOperatorTestHarness`` does for an operator: feed
it records one by one, move the watermark and the processing time, and look at what came out,
at any key's state and at its timers; checkpoint it and restart it from the checkpoint, at the
same or another parallelism. It is the :class:`~statetier.backend.LocalRunner` underneath (the
runtime the examples use), with a :class:`ManualClock` and a checkpoint in memory, so a test
exercises the code path a job runs, without sleeping and without files.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from typing import Any

from statetier.backend.config import StatetierConfig
from statetier.backend.descriptors import StateKind
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext
from statetier.backend.local_runner import LocalRunner
from statetier.backend.runtime import FunctionFactory, FunctionInstance
from statetier.backend.timers import TimeDomain
from statetier.backend.ttl import ManualClock

__all__ = ["FunctionHarness", "ManualClock"]

_harnesses = itertools.count()


def _factory(function: KeyedProcessFunction[Any, Any, Any] | FunctionFactory) -> FunctionFactory:
    """A factory from a function object (one instance only) or a factory (a class)."""
    if isinstance(function, KeyedProcessFunction):
        made = False

        def one() -> KeyedProcessFunction[Any, Any, Any]:
            nonlocal made
            if made:
                raise ValueError(
                    "a function object runs as one instance; pass its class (or a factory) "
                    "to run it at parallelism > 1 or to restart the harness"
                )
            made = True
            return function

        return one
    return function


class FunctionHarness:
    """Runs ``function`` (a function object, or a class or factory) at ``parallelism``.

    Each call returns the output it produced; :attr:`output` keeps all of it. Processing time is
    :attr:`clock`'s (a :class:`ManualClock` starting at ``start_ms``); the watermark moves only by
    :meth:`advance_watermark`. Checkpoints go to ``checkpoint_uri`` (default: a fresh in-memory
    location), so :meth:`restart` resumes from the last :meth:`checkpoint`.
    """

    def __init__(
        self,
        function: KeyedProcessFunction[Any, Any, Any] | FunctionFactory,
        *,
        parallelism: int = 1,
        max_parallelism: int | None = None,
        start_ms: int = 0,
        clock: ManualClock | None = None,
        checkpoint_uri: str | None = None,
        config: StatetierConfig | None = None,
    ) -> None:
        self._function = function
        self._factory = _factory(function)
        self.clock = clock if clock is not None else ManualClock(start_ms)
        self.checkpoint_uri = checkpoint_uri or (
            f"memory://statetier-testing/{os.getpid()}-{next(_harnesses)}"
        )
        # The in-memory checkpoint this harness made: deleted by close(), unless a restart
        # took it over. A checkpoint_uri the test gave is never deleted.
        self._owns_checkpoint = checkpoint_uri is None
        self._config = config
        self.runner = LocalRunner(
            self._factory,
            parallelism,
            max_parallelism=max_parallelism,
            checkpoint_uri=self.checkpoint_uri,
            clock=self.clock,
            config=config,
        )
        self.output: list[Any] = []

    # ------------------------------------------------------------------ input and time

    def process(self, key: Any, value: Any) -> list[Any]:
        """Hand one record to the function; what it returned."""
        return self.process_all([(key, value)])

    def process_all(self, records: Iterable[tuple[Any, Any]]) -> list[Any]:
        """Hand ``(key, value)`` records to the function, in order per instance."""
        return self._emitted(self.runner.process(records))

    def advance_watermark(self, watermark: int) -> list[Any]:
        """Move event time to ``watermark`` (ms); the output of the event-time timers it fires."""
        return self._emitted(self.runner.advance_time(watermark=watermark))

    def advance_processing_time(self, ms: int) -> list[Any]:
        """Move the clock ``ms`` forward; the output of the processing-time timers it fires."""
        self.clock.advance(ms)
        return self._emitted(self.runner.advance_time())

    def end_of_input(self) -> list[Any]:
        """The input is over: fire every event-time timer (a batch job's last watermark)."""
        return self._emitted(self.runner.end_of_input())

    def _emitted(self, records: list[Any]) -> list[Any]:
        self.output.extend(records)
        return records

    # ------------------------------------------------------------------ what a test looks at

    def state(self, name: str, key: Any) -> Any:
        """``key``'s value of the state ``name``, read as the function reads it: a value (or
        None), a list, a reduced or aggregated result, a dict for a map state.

        A read is a read: with a TTL that renews on read, it renews; an expired value is gone.
        """
        instance = self._instance(key)
        table = instance.keyed.tables.get(name)
        if table is None:
            raise KeyError(f"the function has registered no state named {name!r}")
        handle: Any = instance.keyed.get_state(table.descriptor)
        instance.keyed.set_current_key(key)
        kind = table.descriptor.kind
        if kind is StateKind.VALUE:
            return handle.value()
        if kind is StateKind.MAP:
            return dict(handle.items())
        return handle.get()

    def keys(self, name: str) -> list[Any]:
        """The keys that hold a value of the state ``name``, on every instance."""
        found: list[Any] = []
        for instance in self.runner.instances:
            if name in instance.keyed.tables:
                found.extend(instance.keyed.keys(name))
        return found

    def event_time_timers(self, key: Any) -> list[int]:
        """``key``'s event-time timers that have not fired, ascending."""
        return self._timers(key, TimeDomain.EVENT_TIME)

    def processing_time_timers(self, key: Any) -> list[int]:
        """``key``'s processing-time timers that have not fired, ascending."""
        return self._timers(key, TimeDomain.PROCESSING_TIME)

    def _timers(self, key: Any, domain: TimeDomain) -> list[int]:
        instance = self._instance(key)
        instance.keyed.set_current_key(key)
        return instance.timers.timers(domain)

    @property
    def functions(self) -> list[KeyedProcessFunction[Any, Any, Any]]:
        """The function objects, one per instance, in instance order."""
        return [instance.function for instance in self.runner.instances]

    def context(self, key: Any) -> RuntimeContext:
        """The context of the instance that owns ``key``, with ``key`` current: its handles
        (``context.get_state``) read and write ``key``'s state, as in ``process``."""
        instance = self._instance(key)
        instance.context.set_current_key(key)
        return instance.context

    def _instance(self, key: Any) -> FunctionInstance:
        return self.runner.instance_for(key)

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self) -> int:
        """Snapshot and commit every instance's state (an epoch ends); the epoch's number."""
        return self.runner.checkpoint().epoch

    def restart(self, parallelism: int | None = None) -> FunctionHarness:
        """A new harness on the last checkpoint, as after a crash: this one is closed, what it
        did after its last :meth:`checkpoint` is lost, the clock goes on. ``parallelism``: the
        new one's (default: unchanged), which rescales the state."""
        if isinstance(self._function, KeyedProcessFunction):
            raise ValueError(
                "a harness made with a function object cannot restart (the object keeps what it "
                "held); make the harness with the function's class or a factory"
            )
        owns, self._owns_checkpoint = self._owns_checkpoint, False
        self.close()
        restarted = FunctionHarness(
            self._function,
            parallelism=parallelism or self.runner.parallelism,
            clock=self.clock,
            checkpoint_uri=self.checkpoint_uri,
            config=self._config,
        )
        restarted._owns_checkpoint = owns
        return restarted

    def close(self) -> None:
        """Finish pending checkpoints, release what the instances hold (spill files) and drop
        the in-memory checkpoint the harness made (so a test suite's harnesses do not pile up
        in memory)."""
        self.runner.close()
        if self._owns_checkpoint and self.runner.store is not None:
            self._owns_checkpoint = False
            fs, root = self.runner.store.fs, self.runner.store.root
            if fs.exists(root):
                fs.rm(root, recursive=True)

    def __enter__(self) -> FunctionHarness:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
