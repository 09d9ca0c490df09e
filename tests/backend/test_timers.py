"""Timers as in Flink's KeyedProcessFunction, on FunctionInstance and the local runner.

The behaviour followed is Flink's TimerService / InternalTimerServiceImpl: timers belong to the
current key, one per (key, timestamp) and domain; a processing-time timer fires once processing
time reaches it, an event-time timer once the watermark does; due timers fire in timestamp order
with the key current, may emit output and register timers (which fire in the same advance when
already due); deleting one that does not exist is a no-op; timers are keyed state in key groups
(checkpointed, restored and rescaled with them).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from statetier.backend import (
    ListStateDescriptor,
    NoCurrentKeyError,
    StateRegistrationError,
    ValueStateDescriptor,
    load_config,
)
from statetier.backend.functions import KeyedProcessFunction, RuntimeContext, TimeDomain
from statetier.backend.keyed_backend import EVENT_TIMER_STATE, PROCESSING_TIMER_STATE
from statetier.backend.keygroups import assign_to_key_group
from statetier.backend.local_runner import LocalRunner
from statetier.backend.runtime import FunctionInstance
from statetier.backend.serializers import DEFAULT_SERIALIZER
from statetier.backend.snapshot import SnapshotStore
from statetier.backend.timers import MIN_WATERMARK
from statetier.backend.ttl import ManualClock

EVENT = TimeDomain.EVENT_TIME
PROC = TimeDomain.PROCESSING_TIME
FIXTURE = Path(__file__).parent / "data" / "pre-timers-checkpoint"


class Scripted(KeyedProcessFunction[Any, Any, Any]):
    """Each record is a command for its key's timers; every firing is reported with the key's
    state, so a test sees that the key's state is in scope.

    Commands: ("event"|"proc", ts) registers, ("del-event"|"del-proc", ts) deletes, ("note", v)
    writes the key's note, ("chain", n) makes each firing register another timer n ms later.
    """

    def open(self, context: RuntimeContext) -> None:
        self.note = context.get_state(ValueStateDescriptor[Any]("note"))
        self.chain = context.get_state(ValueStateDescriptor[int]("chain"))

    def process(self, key: Any, value: Any, context: RuntimeContext) -> list[Any]:
        command, arg = value
        timers = context.timer_service
        if command == "event":
            timers.register_event_time_timer(arg)
        elif command == "proc":
            timers.register_processing_time_timer(arg)
        elif command == "del-event":
            timers.delete_event_time_timer(arg)
        elif command == "del-proc":
            timers.delete_processing_time_timer(arg)
        elif command == "note":
            self.note.update(arg)
        elif command == "chain":
            self.chain.update(arg)
        return []

    def on_timer(self, timestamp: int, key: Any, context: RuntimeContext) -> Iterable[Any]:
        assert context.current_key == key
        domain = context.time_domain
        assert domain is not None
        step = self.chain.value()
        if step:
            if domain is EVENT:
                context.timer_service.register_event_time_timer(timestamp + step)
            else:
                context.timer_service.register_processing_time_timer(timestamp + step)
        yield (domain.value, timestamp, key, self.note.value())


def instance(clock: ManualClock | None = None, **kwargs: Any) -> FunctionInstance:
    return FunctionInstance(Scripted, 0, 1, 16, clock=clock or ManualClock(0), **kwargs)


def run(inst: FunctionInstance, *records: tuple[Any, Any]) -> None:
    assert inst.process(records) == []


# --------------------------------------------------------------------------- firing


def test_event_time_timers_fire_when_the_watermark_reaches_them_in_timestamp_order() -> None:
    inst = instance()
    run(inst, ("b", ("note", "B")), ("b", ("event", 30)), ("a", ("event", 20)))
    run(inst, ("c", ("event", 10)), ("a", ("event", 40)))
    assert inst.advance_time(watermark=9) == []
    assert inst.advance_time(watermark=30) == [
        ("event-time", 10, "c", None),
        ("event-time", 20, "a", None),
        ("event-time", 30, "b", "B"),  # the key's state is in scope in on_timer
    ]
    assert inst.advance_time(watermark=30) == []  # each timer fires once
    assert inst.advance_time(watermark=100) == [("event-time", 40, "a", None)]


def test_processing_time_timers_follow_the_processing_time() -> None:
    clock = ManualClock(1_000)
    inst = instance(clock)
    assert inst.timers.current_processing_time() == 1_000
    run(inst, ("k", ("proc", 1_500)), ("k", ("event", 1_200)))
    assert inst.advance_time() == []  # the clock has not moved; no watermark yet
    clock.advance(500)
    assert inst.advance_time() == [("processing-time", 1_500, "k", None)]
    assert inst.timers.current_processing_time() == 1_500
    assert inst.timers.current_watermark() == MIN_WATERMARK  # event time did not move


def test_an_explicit_processing_time_is_the_epochs_clock() -> None:
    inst = instance(ManualClock(0))
    run(inst, ("k", ("proc", 50)))
    inst.set_time(processing_time=60)  # e.g. Spark's batch timestamp
    assert inst.timers.current_processing_time() == 60
    assert inst.advance_time(processing_time=60) == [("processing-time", 50, "k", None)]


def test_processing_time_timers_fire_before_event_time_timers_of_one_advance() -> None:
    inst = instance()
    run(inst, ("a", ("event", 5)), ("b", ("proc", 7)))
    assert inst.advance_time(watermark=10, processing_time=10) == [
        ("processing-time", 7, "b", None),
        ("event-time", 5, "a", None),
    ]


def test_same_key_and_timestamp_twice_is_one_timer_but_domains_are_separate() -> None:
    inst = instance()
    run(inst, ("k", ("event", 5)), ("k", ("event", 5)), ("k", ("proc", 5)), ("k", ("proc", 5)))
    assert inst.timers.count(EVENT) == 1 and inst.timers.count(PROC) == 1
    assert inst.advance_time(watermark=5, processing_time=5) == [
        ("processing-time", 5, "k", None),
        ("event-time", 5, "k", None),
    ]


def test_the_same_timestamp_on_two_keys_is_two_timers() -> None:
    inst = instance()
    run(inst, ("a", ("event", 5)), ("b", ("event", 5)))
    fired = inst.advance_time(watermark=5)
    assert sorted(key for _, _, key, _ in fired) == ["a", "b"]
    # ties are ordered by key group, then key bytes: the same at every parallelism
    groups = [assign_to_key_group(key, 16) for _, _, key, _ in fired]
    assert groups == sorted(groups)


def test_delete_and_re_register() -> None:
    inst = instance()
    run(inst, ("k", ("event", 5)), ("k", ("event", 6)), ("k", ("del-event", 5)))
    run(inst, ("k", ("del-event", 99)), ("other", ("del-proc", 5)))  # absent: no-op (Flink)
    assert inst.advance_time(watermark=10) == [("event-time", 6, "k", None)]
    run(inst, ("k", ("event", 20)), ("k", ("del-event", 20)), ("k", ("event", 20)))
    assert inst.advance_time(watermark=30) == [("event-time", 20, "k", None)]
    run(inst, ("k", ("proc", 40)), ("k", ("del-proc", 40)))
    assert inst.advance_time(processing_time=50) == []
    assert inst.timers.count(EVENT) == 0 and inst.timers.count(PROC) == 0


def test_the_earliest_timer_skips_deleted_and_fired_ones() -> None:
    inst = instance()
    assert inst.timers.earliest(EVENT) is None and inst.timers.earliest(PROC) is None
    run(inst, ("k", ("event", 5)), ("j", ("event", 8)), ("k", ("proc", 70)))
    assert inst.timers.earliest(EVENT) == 5 and inst.timers.earliest(PROC) == 70
    run(inst, ("k", ("del-event", 5)))
    assert inst.timers.earliest(EVENT) == 8
    inst.advance_time(watermark=8)
    assert inst.timers.earliest(EVENT) is None and inst.timers.earliest(PROC) == 70


def test_timers_moved_and_deleted_on_many_keys_fire_in_order_at_their_last_place() -> None:
    """Sessions move each key's timer later on every record; here 3,000 keys' timers are moved,
    some moved earlier again, most deleted (enough to rebuild the firing index from the state
    mid-way), then time advances in steps: every timer left fires once, at its last place, in
    (timestamp, key group, key bytes) order, and ``earliest`` names the next one each time."""
    inst = instance()
    keys = [f"user-{i:05d}" for i in range(3_000)]
    model: dict[str, set[int]] = {}
    for i, key in enumerate(keys):
        run(inst, (key, ("event", 1_000 + i % 97)))
        model[key] = {1_000 + i % 97}
    for step in range(1, 4):  # move later: delete the key's timer, register it further on
        for i, key in enumerate(keys):
            (old,) = model[key]
            new = old + 50 * step + i % 13
            run(inst, (key, ("del-event", old)), (key, ("event", new)))
            model[key] = {new}
    for i, key in enumerate(keys[:300]):  # a second, earlier timer on some keys
        run(inst, (key, ("event", 900 + i % 7)))
        model[key].add(900 + i % 7)
    for key in keys[300:2_700]:  # most keys stop (the index has to drop their entries)
        for ts in sorted(model.pop(key)):
            run(inst, (key, ("del-event", ts)))
    expected = sorted(
        (ts, assign_to_key_group(key, 16), key.encode(), key) for key in model for ts in model[key]
    )
    assert inst.timers.count(EVENT) == len(expected)
    fired: list[tuple[int, str]] = []
    for watermark in range(900, 1_400, 37):
        assert inst.timers.earliest(EVENT) == min(t[0] for t in expected[len(fired) :])
        fired += [(ts, key) for _, ts, key, _ in inst.advance_time(watermark=watermark)]
        assert all(ts <= watermark for ts, _ in fired)
    fired += [(ts, key) for _, ts, key, _ in inst.end_of_input()]
    assert fired == [(ts, key) for ts, _, _, key in expected]
    assert inst.timers.count(EVENT) == 0 and inst.timers.earliest(EVENT) is None


def test_the_firing_index_stays_bounded_when_a_timer_keeps_moving_earlier() -> None:
    """A timer moved earlier leaves its old heap entry behind (the index is lazy); a key that
    moves its one timer earlier 5,000 times must not leave 5,000 entries: the index is rebuilt
    from the state once it holds more than two entries per key with timers (plus the slack),
    and the timer fires once."""
    inst = instance()
    run(inst, ("other", ("event", 50_000)))
    ts = 20_000
    run(inst, ("k", ("event", ts)))
    for _ in range(5_000):
        run(inst, ("k", ("del-event", ts)), ("k", ("event", ts - 1)))
        ts -= 1
    queue = inst.timers  # the service is its event-time queue
    assert inst.timers.count(EVENT) == 2
    assert len(queue._heap) <= 2 * 2 + 1024 + 1, len(queue._heap)
    assert inst.advance_time(watermark=ts) == [("event-time", ts, "k", None)]
    assert inst.end_of_input() == [("event-time", 50_000, "other", None)]


def test_the_entries_of_deleted_timers_go_once_new_keys_grow_the_index() -> None:
    """Deleting keeps no count and leaves the heap alone: the entries of keys whose timers were
    all deleted stay (no more than the keys that had timers left), until new keys' entries grow
    the heap past two per key with timers then (plus the slack). Then it is rebuilt from the
    state, the dead entries go, and only the live timers fire."""
    inst = instance()
    run(inst, *[(f"gone-{i}", ("event", 1_000 + i)) for i in range(5_000)])
    run(inst, *[(f"gone-{i}", ("del-event", 1_000 + i)) for i in range(5_000)])
    queue = inst.timers  # the service is its event-time queue
    assert inst.timers.count(EVENT) == 0 and len(queue._heap) == 5_000  # lazy: still there
    run(inst, *[(f"new-{i}", ("event", 500 + i)) for i in range(4_000)])
    assert inst.timers.count(EVENT) == 4_000
    assert len(queue._heap) == len(queue._bound) == 4_000  # one entry per live key, no other
    fired = [(ts, key) for _, ts, key, _ in inst.end_of_input()]
    assert fired == [(500 + i, f"new-{i}") for i in range(4_000)]


def test_timers_at_the_ends_of_the_64_bit_range_fire_in_order() -> None:
    """The firing order (timestamp, key group, key bytes: the key serializer's) holds for
    negative timestamps and at both ends of the range, with keys of several key groups and of
    one key group sharing each timestamp."""
    inst = instance()
    stamps = [MIN_WATERMARK, MIN_WATERMARK + 1, -(2**40), -1, 0, 1, 2**40, 2**63 - 1]
    keys = [f"k{i}" for i in range(12)]
    run(inst, *[(key, ("event", ts)) for ts in reversed(stamps) for key in keys])
    fired = [(ts, key) for _, ts, key, _ in inst.end_of_input()]
    expected = sorted(
        (ts, assign_to_key_group(key, 16), DEFAULT_SERIALIZER.dumps(key), key)
        for ts in stamps
        for key in keys
    )
    assert fired == [(ts, key) for ts, _, _, key in expected]


def test_a_key_whose_last_timer_was_deleted_shares_no_timers_with_the_next_key() -> None:
    """The list of timers a key no longer has is reused for the next key that gets one: the two
    keys' timers stay apart."""
    inst = instance()
    run(inst, ("a", ("event", 5)), ("a", ("del-event", 5)), ("b", ("event", 7)))
    run(inst, ("a", ("event", 9)), ("b", ("event", 8)))
    inst.keyed.set_current_key("a")
    assert inst.timers.timers(EVENT) == [9]
    inst.keyed.set_current_key("b")
    assert inst.timers.timers(EVENT) == [7, 8]
    assert [(ts, key) for _, ts, key, _ in inst.end_of_input()] == [(7, "b"), (8, "b"), (9, "a")]


def test_a_timer_already_due_fires_at_the_next_advance() -> None:
    """Flink: a timer registered at or before the current watermark fires at the next
    watermark; here at the next advance_time, even with the watermark unchanged."""
    inst = instance()
    inst.advance_time(watermark=100, processing_time=100)
    run(inst, ("k", ("event", 50)), ("k", ("proc", 50)))
    assert inst.advance_time() == [
        ("processing-time", 50, "k", None),
        ("event-time", 50, "k", None),
    ]


def test_on_timer_may_register_timers_which_fire_in_the_same_advance_when_due() -> None:
    inst = instance()
    run(inst, ("k", ("chain", 10)), ("k", ("event", 0)))
    fired = inst.advance_time(watermark=35)
    assert [ts for _, ts, _, _ in fired] == [0, 10, 20, 30]
    assert inst.timers.count(EVENT) == 1  # the one at 40 waits for its watermark
    assert inst.advance_time(watermark=40) == [("event-time", 40, "k", None)]


def test_time_never_goes_back() -> None:
    inst = instance(ManualClock(500))
    inst.advance_time(watermark=100)
    inst.advance_time(watermark=50, processing_time=10)
    assert inst.timers.current_watermark() == 100
    assert inst.timers.current_processing_time() == 500


def test_end_of_input_fires_every_event_time_timer() -> None:
    inst = instance()
    run(inst, ("k", ("event", 10**15)), ("k", ("proc", 10**15)))
    assert inst.end_of_input() == [("event-time", 10**15, "k", None)]
    assert inst.timers.count(PROC) == 1  # processing time did not reach it


def test_a_function_without_on_timer_drops_its_timers_silently() -> None:
    class NoHandler(KeyedProcessFunction[str, int, Any]):
        def process(self, key: str, value: int, context: RuntimeContext) -> list[Any]:
            context.timer_service.register_event_time_timer(value)
            return []

    inst = FunctionInstance(NoHandler, 0, 1, 16)
    inst.process([("k", 3)])
    assert inst.advance_time(watermark=3) == []  # Flink's default onTimer does nothing
    assert inst.timers.count(EVENT) == 0


# --------------------------------------------------------------------------- errors


def test_timers_need_a_current_key() -> None:
    inst = instance()
    with pytest.raises(NoCurrentKeyError, match="set_current_key"):
        inst.timers.register_event_time_timer(5)
    with pytest.raises(NoCurrentKeyError):
        inst.timers.delete_processing_time_timer(5)


@pytest.mark.parametrize("bad", [1.5, "10", True, None, 1 << 63, -(1 << 63) - 1])
@pytest.mark.parametrize("stored", [[], [5], [5, 9]])
def test_a_timer_timestamp_is_a_64_bit_int(bad: Any, stored: list[int]) -> None:
    """Refused whether the key has timers or not (its bound is then checked first), and the
    key's timers stay as they were."""
    inst = instance()
    inst.keyed.set_current_key("k")
    for stamp in stored:
        inst.timers.register_event_time_timer(stamp)
    with pytest.raises(TypeError, match="timer timestamp is an int"):
        inst.timers.register_event_time_timer(bad)
    assert inst.timers.timers(EVENT) == stored


@pytest.mark.parametrize("bad", [1.0, True, "1", None, 1 << 63])
@pytest.mark.parametrize("stored", [[], [1], [1, 2]])
def test_a_deleted_timer_timestamp_is_a_64_bit_int_too(bad: Any, stored: list[int]) -> None:
    """Equal is not the same: 1.0 and True equal the timer at 1, and delete refuses both
    whether the key has that timer (alone or among others) or none, and leaves it."""
    inst = instance()
    inst.keyed.set_current_key("k")
    timers = inst.timers
    for stamp in stored:
        timers.register_event_time_timer(stamp)
    with pytest.raises(TypeError, match="timer timestamp is an int"):
        timers.delete_event_time_timer(bad)
    assert timers.timers(EVENT) == stored
    for stamp in stored:  # and an int deletes each, the one timer too
        timers.delete_event_time_timer(stamp)
        timers.delete_event_time_timer(stamp)  # gone: nothing to delete, no error
    assert timers.timers(EVENT) == []


@pytest.mark.parametrize("name", [EVENT_TIMER_STATE, PROCESSING_TIMER_STATE])
def test_the_timer_state_names_are_taken(name: str) -> None:
    inst = instance()
    with pytest.raises(StateRegistrationError, match="taken by statetier's timers"):
        inst.keyed.get_state(ValueStateDescriptor[int](name))


def test_unused_timers_add_no_state() -> None:
    inst = instance()
    run(inst, ("k", ("note", 1)))
    assert inst.keyed.state_names() == ["chain", "note"]


# --------------------------------------------------------------------------- timers are state


def test_timers_of_spilled_key_groups_fire(tmp_path: Path) -> None:
    config = load_config(
        {"spill.enabled": True, "spill.dirs": str(tmp_path), "memory.budget": "64g"}, env={}
    )
    inst = instance(config=config)
    keys = [f"k{i}" for i in range(40)]
    run(inst, *((key, ("note", key.upper())) for key in keys))
    run(inst, *((key, ("event", i)) for i, key in enumerate(keys)))
    spill = inst.spill
    assert spill is not None
    for key_group in inst.keyed.key_groups:
        assert spill.spill_key_group(key_group)
    run(inst, ("k0", ("del-event", 0)), ("late", ("event", 100)))  # writes to spilled groups
    fired = inst.advance_time(watermark=1_000)
    assert fired == [
        *(("event-time", i, key, key.upper()) for i, key in enumerate(keys) if i),
        ("event-time", 100, "late", None),
    ]
    assert len(spill.spilled_key_groups()) == 16  # they fired from disk
    inst.close()


def _timer_runner(uri: str, parallelism: int, clock: ManualClock) -> LocalRunner:
    return LocalRunner(Scripted, parallelism, max_parallelism=16, checkpoint_uri=uri, clock=clock)


def test_timers_restore_at_another_parallelism_and_fire_once(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    clock = ManualClock(0)
    keys = [f"key-{i}" for i in range(30)]
    runner = _timer_runner(uri, 2, clock)
    runner.run_epoch([(key, ("event", 100 + i)) for i, key in enumerate(keys)], watermark=0)
    runner.run_epoch([(key, ("proc", 5_000 + i)) for i, key in enumerate(keys[:10])])
    runner.close()

    for parallelism in (3, 1, 5):  # each restore starts from the same committed epoch 2
        restored = _timer_runner(uri, parallelism, ManualClock(0))
        assert restored.restored_epoch == 2
        for inst in restored.instances:  # every timer on the instance owning its key group
            for key in keys:
                if assign_to_key_group(key, 16) in inst.keyed.key_groups:
                    inst.keyed.set_current_key(key)
                    i = keys.index(key)
                    assert inst.timers.timers(EVENT) == [100 + i]
                    assert inst.timers.timers(PROC) == ([5_000 + i] if i < 10 else [])
        fired = restored.advance_time(watermark=1_000, processing_time=10_000)
        event = sorted((ts, key) for domain, ts, key, _ in fired if domain == "event-time")
        proc = sorted((ts, key) for domain, ts, key, _ in fired if domain == "processing-time")
        assert event == [(100 + i, key) for i, key in enumerate(keys)]
        assert proc == [(5_000 + i, key) for i, key in enumerate(keys[:10])]
        assert restored.advance_time(watermark=10**9, processing_time=10**9) == []
        restored.close()


def test_a_keys_timers_are_checkpointed_as_the_sorted_list_they_always_were(tmp_path: Path) -> None:
    """On the heap a key's one timer is a bare int (timers._Stamps); the checkpoint still holds
    the sorted list of its timestamps, one timer too, as older checkpoints and every reader of
    them (the state source, compaction, older versions) expect."""
    from statetier.backend.keygroups import KeyGroupRange
    from statetier.backend.snapshot.reading import read_stored, read_timers

    uri = f"file://{tmp_path}"
    runner = _timer_runner(uri, 2, ManualClock(0))
    runner.run_epoch([("one", ("event", 10)), *[("three", ("event", t)) for t in (30, 10, 20)]])
    runner.run_epoch([("moved", ("event", 50)), ("moved", ("del-event", 50))])
    runner.run_epoch([("moved", ("event", 70)), ("three", ("del-event", 20))])
    runner.close()
    store = SnapshotStore(uri)
    manifest = store.manifest()
    stored = {
        DEFAULT_SERIALIZER.loads(key): DEFAULT_SERIALIZER.loads(value)
        for _, key, value in read_stored(store, manifest, EVENT_TIMER_STATE, KeyGroupRange(0, 15))
    }
    assert stored == {"one": [10], "three": [10, 30], "moved": [70]}
    timers = sorted(
        (t.key, t.timestamp) for t in read_timers(store, manifest, KeyGroupRange(0, 15))
    )
    assert timers == [("moved", 70), ("one", 10), ("three", 10), ("three", 30)]
    restored = _timer_runner(uri, 1, ManualClock(0))
    (inst,) = restored.instances
    for key, stamps in stored.items():
        inst.keyed.set_current_key(key)
        assert inst.timers.timers(EVENT) == stamps
    fired = [(ts, key) for _, ts, key, _ in restored.advance_time(watermark=100)]
    assert fired == [(10, "one"), (10, "three"), (30, "three"), (70, "moved")]
    restored.close()


def test_run_epoch_fires_the_watermarks_timers_before_its_records_and_late_ones_after(
    tmp_path: Path,
) -> None:
    """Flink fires the timers a watermark makes due when the watermark arrives, before the
    records after it; an epoch's records arrived after its watermark. A timer the records set
    at or before that watermark fires at the end of the same epoch."""
    runner = _timer_runner(f"file://{tmp_path}", 1, ManualClock(0))
    runner.run_epoch([("k", ("note", "old")), ("k", ("event", 10))])
    fired = runner.run_epoch([("k", ("note", "new")), ("k", ("event", 5))], watermark=10)
    assert fired == [("event-time", 10, "k", "old"), ("event-time", 5, "k", "new")]
    runner.close()


def test_fired_timers_are_gone_after_the_next_checkpoint(tmp_path: Path) -> None:
    """A timer fired in an epoch is removed from state in that epoch: a restore from that
    epoch's checkpoint does not fire it again (incremental snapshots carry the removal)."""
    uri = f"file://{tmp_path}"
    runner = _timer_runner(uri, 2, ManualClock(0))
    runner.run_epoch([("a", ("event", 10)), ("b", ("event", 20)), ("c", ("event", 30))])
    assert sorted(k for _, _, k, _ in runner.run_epoch([], watermark=20)) == ["a", "b"]
    runner.close()
    restored = _timer_runner(uri, 3, ManualClock(0))
    assert [k for _, _, k, _ in restored.advance_time(watermark=100)] == ["c"]
    restored.close()


def test_a_checkpoint_written_before_timers_restores(tmp_path: Path) -> None:
    """The fixture is a checkpoint of statetier before timers (see data/README.md): it restores
    at another parallelism, its state and operator state intact, and the restored job then
    uses timers, checkpoints them and restores them again."""
    shutil.copytree(FIXTURE, tmp_path / "ckpt")
    uri = f"file://{tmp_path / 'ckpt'}"

    class LastSeenWithTimeout(KeyedProcessFunction[str, int, Any]):
        def open(self, context: RuntimeContext) -> None:
            self.last = context.get_state(ValueStateDescriptor[int]("last_seen"))
            self.offsets = context.get_list_state(ListStateDescriptor[int]("offsets"))

        def process(self, key: str, value: int, context: RuntimeContext) -> list[Any]:
            self.last.update(value)
            context.timer_service.register_event_time_timer(value + 1_000)
            return [(key, "previous", self.offsets.get())] if value < 0 else []

        def on_timer(self, timestamp: int, key: str, context: RuntimeContext) -> list[Any]:
            return [(key, "timeout", self.last.value())]

    runner = LocalRunner(LastSeenWithTimeout, 3, checkpoint_uri=uri, clock=ManualClock(0))
    assert runner.restored_epoch == 2 and runner.max_parallelism == 8
    last_seen = {}
    for inst in runner.instances:
        handle = inst.keyed.get_state(ValueStateDescriptor[int]("last_seen"))
        for key in inst.keyed.keys("last_seen"):
            inst.keyed.set_current_key(key)
            last_seen[key] = handle.value()
    assert last_seen == {f"user-{i}": {1: 7000, 4: 7500}.get(i, 1000 * i) for i in range(6)}
    offsets = sorted(x for inst in runner.instances for x in inst.function.offsets.get())  # type: ignore[attr-defined]
    assert offsets == sorted([1000 * i for i in range(6)] + [7000, 7500])
    assert runner.run_epoch([("user-2", 9_000)], watermark=0) == []
    runner.close()
    assert EVENT_TIMER_STATE in SnapshotStore(uri).manifest(3).states
    again = LocalRunner(LastSeenWithTimeout, 2, checkpoint_uri=uri, clock=ManualClock(0))
    assert again.advance_time(watermark=10_000) == [("user-2", "timeout", 9_000)]
    again.close()


# --------------------------------------------------------------------------- sessions


GAP = 1_000


class Sessions(KeyedProcessFunction[str, int, tuple[str, int, int, int]]):
    """Event-time sessionization: a session closes GAP ms of event time after its last event."""

    def open(self, context: RuntimeContext) -> None:
        self.session = context.get_state(ValueStateDescriptor[list[int]]("session"))

    def process(self, key: str, value: int, context: RuntimeContext) -> list[Any]:
        session = self.session.value()
        timers = context.timer_service
        out = []
        if session is not None:
            timers.delete_event_time_timer(session[1] + GAP)
            if value - session[1] >= GAP:  # over, though the watermark has not said so yet
                out.append((key, *session))
                session = None
        if session is None:
            session = [value, value, 0]
        session = [min(session[0], value), max(session[1], value), session[2] + 1]
        self.session.update(session)
        timers.register_event_time_timer(session[1] + GAP)
        return out

    def on_timer(self, timestamp: int, key: str, context: RuntimeContext) -> list[Any]:
        start, end, count = self.session.value() or [0, 0, 0]
        self.session.clear()
        return [(key, start, end, count)]


def sessions_oracle(events: list[tuple[str, int]]) -> list[tuple[str, int, int, int]]:
    """Sessions by sorting each key's events and cutting at gaps >= GAP (all events on time)."""
    by_key: dict[str, list[int]] = {}
    for key, ts in events:
        by_key.setdefault(key, []).append(ts)
    out = []
    for key, stamps in by_key.items():
        stamps.sort()
        start = prev = stamps[0]
        count = 0
        for ts in stamps:
            if ts - prev >= GAP:
                out.append((key, start, prev, count))
                start, count = ts, 0
            prev = ts
            count += 1
        out.append((key, start, prev, count))
    return sorted(out)


def test_sessionization_emits_every_session_once_across_a_restart(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    pauses = ((5_000, 6_500), (12_000, 13_800), (16_000, 16_900))  # every key's sessions end
    times = [t for t in range(0, 20_000, 170) if not any(a <= t < b for a, b in pauses)]
    events = [(f"u{(i * 7) % 5}", t) for i, t in enumerate(times)] + [("solo", 100)]
    events.sort(key=lambda event: event[1])
    batches = [events[i : i + 20] for i in range(0, len(events), 20)]
    out: list[Any] = []
    runner = LocalRunner(Sessions, 2, max_parallelism=16, checkpoint_uri=uri)
    for n, batch in enumerate(batches):
        if n == 3:  # restart on the committed state, at another parallelism
            runner.close()
            runner = LocalRunner(Sessions, 3, max_parallelism=16, checkpoint_uri=uri)
        # the watermark of a batch: the largest event time seen before it (bounded lateness 0)
        watermark = max(ts for _, ts in events[: 20 * n]) if n else None
        out.extend(runner.run_epoch([(k, t) for k, t in batch], watermark=watermark))
    out.extend(runner.end_of_input())
    runner.close()
    assert sorted(out) == sessions_oracle(events)


def test_a_key_group_function_sets_timers_and_gets_on_timer_rows() -> None:
    """The per-key-group form (what the Spark state host runs) uses the same service: it makes
    a key current itself, and FunctionInstance.advance_time calls its on_timer."""
    pa = pytest.importorskip("pyarrow")
    from statetier.backend.spark.functions import KeyGroupFunction

    class LastClick(KeyGroupFunction):
        def open(self, context: RuntimeContext) -> None:
            self.last = context.get_state(ValueStateDescriptor[int]("last"))

        def process_key_group(self, key_group: int, records: Any, context: RuntimeContext) -> None:
            users, stamps = records["user"].to_pylist(), records["ts"].to_pylist()
            for user, ts in zip(users, stamps, strict=True):
                context.keyed_state.set_current_key(user)
                self.last.update(ts)
                context.timer_service.register_event_time_timer(ts + 100)

        def on_timer(self, timestamp: int, key: str, context: RuntimeContext) -> list[Any]:
            return [(key, self.last.value(), timestamp)]

    inst = FunctionInstance(LastClick, 0, 1, 16)  # type: ignore[arg-type]  # as the host does
    table = pa.table({"user": ["u1", "u2", "u1"], "ts": [10, 20, 50]})
    inst.function.process_key_group(0, table, inst.context)  # type: ignore[attr-defined]
    assert inst.advance_time(watermark=149) == [("u1", 50, 110), ("u2", 20, 120)]
    assert inst.advance_time(watermark=150) == [("u1", 50, 150)]
