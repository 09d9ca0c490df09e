"""Property-based tests of timers: the local runner against a plain reference model.

A hypothesis state machine registers and deletes event- and processing-time timers on several
keys, moves the watermark and the processing time, lets ``on_timer`` register follow-up timers,
and now and then checkpoints and restores at another parallelism. The model is Flink's timer
semantics written out directly: a set of (key, timestamp) per domain; an advance fires, domain
by domain (processing time first), the smallest due timer until none is due, and a firing may
add a timer. The firings must be the model's, in the model's order within each instance (ties:
key group, then key bytes); every key's pending timers, and each domain's earliest timer, must
match after every step.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import fsspec
import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from statetier.backend import ValueStateDescriptor
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext, TimeDomain
from statetier.backend.keygroups import assign_to_key_group
from statetier.backend.local_runner import LocalRunner
from statetier.backend.serializers import DEFAULT_SERIALIZER
from statetier.backend.ttl import ManualClock

MAX_PARALLELISM = 8
KEYS: list[Any] = ["a", "b", 7, ("t", 1), "e"]
DOMAINS = list(TimeDomain)
SETTINGS = settings(max_examples=40, stateful_step_count=30, deadline=None, database=None)


class TimerScript(KeyedProcessFunction[Any, Any, Any]):
    """Records are commands: ("reg"|"del", domain value, ts) or ("chain", step)."""

    def open(self, context: RuntimeContext) -> None:
        self.chain = context.get_state(ValueStateDescriptor[int]("chain"))

    def process(self, key: Any, value: Any, context: RuntimeContext) -> list[Any]:
        timers = context.timer_service
        if value[0] == "chain":
            self.chain.update(value[1] or None)
            return []
        command, domain, ts = value
        event = domain == TimeDomain.EVENT_TIME.value
        if command == "reg":
            if event:
                timers.register_event_time_timer(ts)
            else:
                timers.register_processing_time_timer(ts)
        elif event:
            timers.delete_event_time_timer(ts)
        else:
            timers.delete_processing_time_timer(ts)
        return []

    def on_timer(self, timestamp: int, key: Any, context: RuntimeContext) -> Iterable[Any]:
        domain = context.time_domain
        assert domain is not None
        step = self.chain.value()
        if step:
            if domain is TimeDomain.EVENT_TIME:
                context.timer_service.register_event_time_timer(timestamp + step)
            else:
                context.timer_service.register_processing_time_timer(timestamp + step)
        return [(domain.value, timestamp, key)]


def order(timer: tuple[Any, int]) -> tuple[int, int, bytes]:
    """Which of two due timers fires first: timestamp, then key group, then key bytes."""
    key, ts = timer
    return ts, assign_to_key_group(key, MAX_PARALLELISM), DEFAULT_SERIALIZER.dumps(key)


class TimerModel:
    """Flink's timer semantics, directly: per domain a set of (key, timestamp)."""

    def __init__(self) -> None:
        self.timers: dict[TimeDomain, set[tuple[Any, int]]] = {d: set() for d in DOMAINS}
        self.chain: dict[Any, int] = {}
        self.time = {TimeDomain.EVENT_TIME: -(1 << 63), TimeDomain.PROCESSING_TIME: 0}

    def advance(self, watermark: int, processing_time: int) -> list[tuple[str, int, Any]]:
        self.time[TimeDomain.EVENT_TIME] = max(self.time[TimeDomain.EVENT_TIME], watermark)
        self.time[TimeDomain.PROCESSING_TIME] = max(
            self.time[TimeDomain.PROCESSING_TIME], processing_time
        )
        fired = []
        for domain in (TimeDomain.PROCESSING_TIME, TimeDomain.EVENT_TIME):
            pending = self.timers[domain]
            while due := [t for t in pending if t[1] <= self.time[domain]]:
                key, ts = min(due, key=order)
                pending.discard((key, ts))
                fired.append((domain.value, ts, key))
                if self.chain.get(key):
                    pending.add((key, ts + self.chain[key]))
        return fired


class TimerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.uri = f"memory://statetier-timer-props-{uuid.uuid4().hex}"
        self.clock = ManualClock(0)
        self.model = TimerModel()
        self.watermark = -(1 << 63)
        self.runner = self._runner(2)

    def _runner(self, parallelism: int) -> LocalRunner:
        return LocalRunner(
            TimerScript,
            parallelism,
            max_parallelism=MAX_PARALLELISM,
            checkpoint_uri=self.uri,
            clock=self.clock,
        )

    def teardown(self) -> None:
        self.runner.close()
        fs, root = fsspec.core.url_to_fs(self.uri)
        if fs.exists(root):
            fs.rm(root, recursive=True)

    @rule(
        key=st.sampled_from(KEYS),
        domain=st.sampled_from(DOMAINS),
        ahead=st.integers(-5, 40),
        delete=st.booleans(),
    )
    def register_or_delete(self, key: Any, domain: TimeDomain, ahead: int, delete: bool) -> None:
        ts = max(self.model.time[domain], 0) + ahead  # some already due, many colliding
        self.runner.process([(key, ("del" if delete else "reg", domain.value, ts))])
        if delete:
            self.model.timers[domain].discard((key, ts))
        else:
            self.model.timers[domain].add((key, ts))

    @rule(key=st.sampled_from(KEYS), step=st.sampled_from([0, 0, 3, 10]))
    def set_chain(self, key: Any, step: int) -> None:
        self.runner.process([(key, ("chain", step))])
        self.model.chain[key] = step

    @rule(event_step=st.integers(0, 30), processing_step=st.integers(0, 30))
    def advance(self, event_step: int, processing_step: int) -> None:
        self.watermark = max(self.watermark, 0) + event_step
        self.clock.advance(processing_step)
        fired = self.runner.advance_time(self.watermark)
        expected = self.model.advance(self.watermark, self.clock.now_ms())
        # instance by instance; within one, the model's order (each instance evolves alone)
        by_instance = [
            [timer for timer in expected if self._owner(timer[2]) == index]
            for index in range(self.runner.parallelism)
        ]
        assert fired == [timer for timers in by_instance for timer in timers]

    def _owner(self, key: Any) -> int:
        kg = assign_to_key_group(key, MAX_PARALLELISM)
        return kg * self.runner.parallelism // MAX_PARALLELISM

    @rule(parallelism=st.integers(1, 4))
    def checkpoint_and_restore(self, parallelism: int) -> None:
        self.runner.checkpoint()
        self.runner.close()
        self.runner = self._runner(parallelism)

    @invariant()
    def pending_timers_match(self) -> None:
        for domain in DOMAINS:
            found: set[tuple[Any, int]] = set()
            for instance in self.runner.instances:
                for key in KEYS:
                    if assign_to_key_group(key, MAX_PARALLELISM) in instance.keyed.key_groups:
                        instance.keyed.set_current_key(key)
                        found.update((key, ts) for ts in instance.timers.timers(domain))
            assert found == self.model.timers[domain]

    @invariant()
    def earliest_timer_matches(self) -> None:
        """What a runtime asks to know when to move time next: the earliest live timer."""
        for domain in DOMAINS:
            earliest = [i.timers.earliest(domain) for i in self.runner.instances]
            found = min((ts for ts in earliest if ts is not None), default=None)
            assert found == min((ts for _, ts in self.model.timers[domain]), default=None)


TestTimersAgainstModel = TimerMachine.TestCase
TestTimersAgainstModel.settings = SETTINGS
